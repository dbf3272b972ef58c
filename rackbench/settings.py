"""rackbench settings: every value comes from the environment (see README, "Configuration").

With no variables at all the project runs on embedded defaults: a SQLite file and a Celery
filesystem queue under ``RACKBENCH_DATA_DIR`` (``./var``), so a newcomer needs no server.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from rackbench.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("RACKBENCH_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _persistent_secret(filename: str, factory: Callable[[], str]) -> str:
    """A secret generated once and kept in the data directory, for zero-configuration development."""
    path = DATA_DIR / filename
    if not path.exists():
        path.write_text(factory())
        path.chmod(0o600)
    return path.read_text().strip()


# Off unless asked for (scripts/demo does): tracebacks and settings are never shown by default.
DEBUG = env_bool("RACKBENCH_DEBUG", False)
# Unset secrets are generated once into the data directory, so a single machine runs with no configuration;
# ``manage.py check --deploy`` fails until they are set (accounts.apps), as several machines must share them.
SECRETS_GENERATED = [name for name in ("RACKBENCH_SECRET_KEY", "RACKBENCH_ENCRYPTION_KEYS") if not env_str(name, "")]
SECRET_KEY = env_str("RACKBENCH_SECRET_KEY", "") or _persistent_secret("secret_key", lambda: secrets.token_urlsafe(50))
ALLOWED_HOSTS = env_list("RACKBENCH_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("RACKBENCH_CSRF_TRUSTED_ORIGINS", [])

# HTTPS behind a TLS-terminating proxy (README, "Deploying with docker"): all off by default, for plain-HTTP
# development; the production environment turns them on.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("RACKBENCH_SECURE_COOKIES", False)
if env_bool("RACKBENCH_TRUST_X_FORWARDED_PROTO", False):  # only behind a proxy that sets it
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("RACKBENCH_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]  # Prometheus inside the stack scrapes over plain HTTP, with its token
SECURE_HSTS_SECONDS = env_int("RACKBENCH_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("RACKBENCH_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("RACKBENCH_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "accounts",
    "inventory",
    "campaigns",
    "runners",
    "telemetry",
    "api",
    "django_celery_beat",
    "scheduling",
    "analysis",
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: it answers a locked-out login with 429
]

# Login throttling (django-axes): after RACKBENCH_LOGIN_FAILURES wrong passwords for one user name from one address,
# that pair is locked out for RACKBENCH_LOGIN_COOLOFF_MINUTES, even with the right password; a success resets the count.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("RACKBENCH_LOGIN_FAILURES", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("RACKBENCH_LOGIN_COOLOFF_MINUTES", 15.0, minimum=0.01))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_IPWARE_PROXY_COUNT = env_int(
    "RACKBENCH_PROXY_COUNT", 0, minimum=0
)  # proxies in front whose X-Forwarded-For counts
AXES_VERBOSE = False

# The API's request rates (per token, else per signed-in user; per address for anonymous requests): DRF throttles.
# Counted in CACHES: with several web processes, set RACKBENCH_CACHE_URL to a Redis shared by them.
_cache_url = env_str("RACKBENCH_CACHE_URL", "")
if _cache_url and not _cache_url.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured(f"RACKBENCH_CACHE_URL={_cache_url!r} must be a redis:// URL (or empty: per process)")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}
    if _cache_url
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

ROOT_URLCONF = "rackbench.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "rackbench.wsgi.application"

_database_url = env_str("DATABASE_URL", "")
if _database_url:
    try:
        _db = dj_database_url.parse(_database_url, conn_max_age=env_int("RACKBENCH_DB_CONN_MAX_AGE", 60, minimum=0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL Django understands: {exc}") from None
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(DATA_DIR / "rackbench.sqlite3"),
        # Web server, worker and beat share the file: wait for locks, take write locks up front.
        "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("RACKBENCH_TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("RACKBENCH_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on every request when it is missing
# Until collectstatic has filled STATIC_ROOT (the docker image does), static/ is served directly: development needs
# neither DEBUG nor collectstatic.
WHITENOISE_USE_FINDERS = DEBUG or not any(STATIC_ROOT.iterdir())
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"


def _rate(name: str, default: str) -> str:
    """A DRF rate: requests per second, minute, hour or day (``240/minute``)."""
    value = env_str(name, default)
    if not re.match(r"^[0-9]+/(s|sec|second|m|min|minute|h|hour|d|day)$", value):
        raise ImproperlyConfigured(f"{name}={value!r} must be a rate such as 240/minute (per s, minute, hour, day)")
    return value


REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "api.authentication.TokenScopePermission",
    ],
    "DEFAULT_PAGINATION_CLASS": "api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PARSER_CLASSES": ["api.parsers.StrictJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "api.negotiation.Negotiation",  # names a format it does not offer
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["api.throttles.TokenOrUserThrottle", "api.throttles.AnonThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "user": _rate("RACKBENCH_API_RATE", "240/minute"),
        "anon": _rate("RACKBENCH_API_ANON_RATE", "30/minute"),
    },  # fmt: skip
}
SPECTACULAR_SETTINGS = {
    "TITLE": "rackbench API",
    "DESCRIPTION": "Inventory, campaigns, runs, results, baselines and verdicts. Every error answers "
    '{"message": ..., "extra": {...}}.',
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # System fonts: ReDoc's own (Montserrat, Roboto) would come from Google Fonts, and nothing here is loaded from the
    # internet (templates/drf_spectacular/redoc.html drops the links).
    "REDOC_UI_SETTINGS": {
        "theme": {
            "typography": {
                "fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif",
                "headings": {"fontFamily": "system-ui, -apple-system, 'Segoe UI', sans-serif"},
                "code": {"fontFamily": "ui-monospace, 'DejaVu Sans Mono', monospace"},
            }
        }
    },
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "api.schema.add_error_responses"],
    # Two choice sets share the field name "kind": name each, or the schema gets a hashed name and a warning.
    "ENUM_NAME_OVERRIDES": {
        "StorageKindEnum": "inventory.models.StorageKind",
        "SeriesKindEnum": "telemetry.models.SeriesKind",
    },
}

# --- Celery -------------------------------------------------------------------------------------
_queue_dir = DATA_DIR / "queue"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    if (
        CELERY_BROKER_URL == "filesystem://"
    ):  # the queue has no host; naming one spares kombu's warning on every connect
        CELERY_BROKER_URL = "filesystem://localhost/"
    for sub in ("in", "processed", "control"):
        (_queue_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "in"),
        "data_folder_out": str(_queue_dir / "in"),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),  # kombu's default is ./control, wherever we run
        "store_processed": False,
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("RACKBENCH_VISIBILITY_TIMEOUT", 3600, minimum=60)}
CELERY_TASK_IGNORE_RESULT = True  # the database row is the truth, never a Celery result
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {"runners.tasks.*": {"queue": "ssh"}}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = 300
CELERY_TASK_TIME_LIMIT = 360
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE = {
    "reconcile-runs": {
        "task": "campaigns.tasks.reconcile_runs",
        "schedule": env_float("RACKBENCH_RECONCILE_EVERY", 10.0, minimum=1.0),
    },
}
CELERY_TASK_ALWAYS_EAGER = False
# Beat reads its schedule from the database (django-celery-beat): the schedules of scheduling/ and the entries of
# CELERY_BEAT_SCHEDULE, which beat copies there each time it starts. Cron schedules are read in TIME_ZONE.
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE

# --- rackbench ----------------------------------------------------------------------------------
RACKBENCH: dict[str, Any] = {
    # Fernet keys (comma-separated, newest first) that encrypt credentials at rest.
    "ENCRYPTION_KEYS": env_list("RACKBENCH_ENCRYPTION_KEYS", []),
    "MAX_RUNS_PER_CAMPAIGN": env_int("RACKBENCH_MAX_RUNS", 10_000, minimum=1),
    # Signs each verdict webhook (X-Rackbench-Signature: sha256=HMAC of the body); empty: unsigned.
    "WEBHOOK_SECRET": env_str("RACKBENCH_WEBHOOK_SECRET", ""),
    # Guards /metrics (Authorization: Bearer <token>); empty: /metrics answers 403 unless METRICS_OPEN says it may
    # be read by anyone (it shows every team's counts).
    "METRICS_TOKEN": env_str("RACKBENCH_METRICS_TOKEN", ""),
    "METRICS_OPEN": env_bool("RACKBENCH_METRICS_OPEN", False),
    # Verdict webhooks to loopback, private, link-local or otherwise internal addresses are refused unless allowed.
    "WEBHOOK_ALLOW_PRIVATE": env_bool("RACKBENCH_WEBHOOK_ALLOW_PRIVATE", False),
    "SSH_CONNECT_TIMEOUT": env_float("RACKBENCH_SSH_CONNECT_TIMEOUT", 10.0, minimum=0.1),
    "SSH_COMMAND_TIMEOUT": env_float("RACKBENCH_SSH_COMMAND_TIMEOUT", 120.0, minimum=0.1),
    "SSH_KEEPALIVE": env_int("RACKBENCH_SSH_KEEPALIVE", 15, minimum=0),
    # Seconds a pooled SSH connection is reused; the next use opens a new one, which checks the pinned host key again.
    "SSH_MAX_AGE": env_float("RACKBENCH_SSH_MAX_AGE", 300.0, minimum=0.0),
    "SSH_FANOUT": env_int("RACKBENCH_SSH_FANOUT", 64, minimum=1),
    # Database connections a process's SSH threads share (runners/database.py): a process holds at most this + 1.
    "DB_POOL_SIZE": env_int("RACKBENCH_DB_POOL_SIZE", 4, minimum=1),
    "POLL_INTERVAL": env_float("RACKBENCH_POLL_INTERVAL", 2.0, minimum=0.05),
    "POLL_WAIT": env_float("RACKBENCH_POLL_WAIT", 10.0, minimum=0.0),
    "RETRY_MAX": env_int("RACKBENCH_RETRY_MAX", 3, minimum=0),
    # The start barrier (runners/lifecycle.py): a run's main commands start at one instant, now + a margin of at least
    # START_MARGIN seconds and START_MARGIN_FACTOR times the measured time of one command on all its hosts; a host
    # whose submit comes more than START_TOLERANCE seconds after that instant refuses, and the start is redone whole.
    "START_MARGIN": env_float("RACKBENCH_START_MARGIN", 0.05, minimum=0.0),
    "START_MARGIN_FACTOR": env_float("RACKBENCH_START_MARGIN_FACTOR", 3.0, minimum=0.0),
    "START_TOLERANCE": env_float("RACKBENCH_START_TOLERANCE", 0.05, minimum=0.0),
    # Whether a later run whose preparation is one round trip per host is started in that round trip (the instant
    # chosen as it is sent); else (the default: measured no faster here, see the README) prepared, then submitted.
    "START_FOLD": env_bool("RACKBENCH_START_FOLD", False),
    "RETRY_BACKOFF": env_float("RACKBENCH_RETRY_BACKOFF", 2.0, minimum=0.0),
    "STALE_AFTER": env_float("RACKBENCH_STALE_AFTER", 30.0, minimum=1.0),
    # Seconds a step's lease lasts; the task at work renews it every third of that (runners.tasks._step_lease).
    "STEP_LEASE": env_float("RACKBENCH_STEP_LEASE", 15.0, minimum=0.3),
    # Seconds a node's facts are trusted by a campaign's drift gate; older ones are collected again before a launch.
    "FACTS_MAX_AGE": env_float("RACKBENCH_FACTS_MAX_AGE", 3600.0, minimum=0.0),
    "MAX_RESUMES": env_int("RACKBENCH_MAX_RESUMES", 3, minimum=0),
    "REMOTE_ROOT": env_str("RACKBENCH_REMOTE_ROOT", ".rackbench"),
    "LAB_DIR": Path(env_str("RACKBENCH_LAB_DIR", str(DATA_DIR / "lab"))),
    # Prometheus pulled after each run (telemetry.prometheus); empty: no pull.
    "PROMETHEUS_URL": env_str("RACKBENCH_PROMETHEUS_URL", "").rstrip("/"),
    # A YAML file listing queries pulled for every run ([{name:, query:, step:}]); empty: only the campaigns' own.
    "PROMETHEUS_QUERIES": env_str("RACKBENCH_PROMETHEUS_QUERIES", ""),
    "PROMETHEUS_STEP": env_float("RACKBENCH_PROMETHEUS_STEP", 15.0, minimum=0.001),
    "PROMETHEUS_TIMEOUT": env_float("RACKBENCH_PROMETHEUS_TIMEOUT", 10.0, minimum=0.1),
    # Seconds between a run's end and the pull: the last scrapes of the run land in Prometheus meanwhile.
    "PROMETHEUS_DELAY": env_float("RACKBENCH_PROMETHEUS_DELAY", 30.0, minimum=0.0),
    # Grafana linked from each run page over the run's time window; empty: no link.
    "GRAFANA_URL": env_str("RACKBENCH_GRAFANA_URL", "").rstrip("/"),
    "GRAFANA_DASHBOARD": env_str("RACKBENCH_GRAFANA_DASHBOARD", ""),
}
for _name in ("PROMETHEUS_URL", "GRAFANA_URL"):
    if RACKBENCH[_name] and not RACKBENCH[_name].startswith(("http://", "https://")):
        raise ImproperlyConfigured(f"RACKBENCH_{_name}={RACKBENCH[_name]!r} must start with http:// or https://")
if not RACKBENCH["ENCRYPTION_KEYS"]:
    from cryptography.fernet import Fernet

    RACKBENCH["ENCRYPTION_KEYS"] = [_persistent_secret("encryption_key", lambda: Fernet.generate_key().decode())]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("RACKBENCH_LOG_LEVEL", "INFO")},
    "loggers": {"paramiko": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}
