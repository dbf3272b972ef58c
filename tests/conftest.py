"""Shared fixtures: persona users, the built-in lab (real sshd nodes) and a real Celery worker process.

The worker is a separate ``celery worker`` process on the same broker (Redis in scripts/test) and the
same test database as the tests, so tests that use it are transactional (their commits must be seen).
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test.utils import override_settings

from rackbench.celery import app as celery_app

pytest_plugins = ["tests.browser"]

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
LAB_PORT = int(os.environ.get("RACKBENCH_TEST_LAB_PORT", "2231"))
LAB_NODES = 4
# Redis databases for the workers some tests start on a broker of their own (scripts/test's own is 15); parallel
# sessions on one machine give each other different ones.
SPARE_BROKER_DBS = [int(n) for n in os.environ.get("RACKBENCH_TEST_SPARE_BROKER_DBS", "14,13").split(",")]


def spare_broker(index: int, base: str) -> str:
    """The URL of spare broker database ``index`` on the Redis server of ``base``."""
    return base.rsplit("/", 1)[0] + f"/{SPARE_BROKER_DBS[index]}"


# The netns lab (each node in its own network namespace, on a bridge): its own port, so its own /24 of 198.18.0.0/15
# and its own bridge and namespace names, apart from other sessions' labs.
NETNS_LAB_PORT = LAB_PORT + 1
NETNS_LAB_NODES = 6


def wait_for(predicate: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.2, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")


def finished(campaign: Any, timeout: float = 120) -> Any:
    """Wait until the campaign has ended (whatever its outcome) and wound down: its kills done and its nodes given
    back, so no worker still writes for it when the test's database is flushed. Returns it refreshed."""

    def done() -> bool:
        campaign.refresh_from_db()
        return (
            campaign.is_terminal
            and not campaign.leases.exists()
            and not campaign.runs.filter(kill_pending=True).exists()
        )

    wait_for(done, timeout=timeout, what=f"campaign {campaign.name} to end")
    return campaign


def launch_and_wait(data: dict[str, Any], timeout: float = 150) -> Any:
    """Apply a campaign definition, launch it and wait until it has ended."""
    from campaigns import services

    return finished(services.campaign_launch(campaign=services.campaign_apply(data=data)), timeout)


def group_alive(pgid: int | None) -> bool:
    """Whether a process group has a live (not zombie) member on this machine, where the lab nodes run.

    Zombies are left out: in containers whose PID 1 does not reap orphans, killed processes linger as such.
    """
    if pgid is None:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test database, with the SSH threads' database pool (runners.database) closed before the
    database is dropped: PostgreSQL refuses to drop a database that has connections."""
    yield
    from runners import database

    database.pool_close()


@pytest.fixture(scope="session", autouse=True)
def _cheap_password_hashing() -> Iterator[None]:
    """Passwords hashed as in production but with few iterations (see tests/hashers.py)."""
    with override_settings(PASSWORD_HASHERS=["tests.hashers.FewIterationsPBKDF2PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def _fresh_rate_counts() -> Iterator[None]:
    """The API's throttles count requests in the cache (per process here): each test starts with none counted."""
    from django.core.cache import cache

    cache.clear()
    yield


# --- personas -------------------------------------------------------------------------------------


@pytest.fixture
def team(db: Any) -> Any:
    """The owner's team ("blue"); the outsider is in another one ("red")."""
    from accounts.services import team_create

    return team_create(name="blue")


@pytest.fixture
def owner(django_user_model: Any, team: Any) -> Any:
    from accounts.services import team_add_member

    user = django_user_model.objects.create_user("owner", password="pw-owner-123")
    team_add_member(team=team, user=user, role="admin")
    return user


@pytest.fixture
def member(django_user_model: Any, team: Any) -> Any:
    from accounts.services import team_add_member

    user = django_user_model.objects.create_user("member", password="pw-member-123")
    team_add_member(team=team, user=user)
    return user


@pytest.fixture
def outsider(django_user_model: Any) -> Any:
    from accounts.services import team_add_member, team_create

    user = django_user_model.objects.create_user("outsider", password="pw-outsider-123")
    team_add_member(team=team_create(name="red"), user=user)
    return user


# --- the lab ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def lab_dir() -> Iterator[Path]:
    """Real sshd lab nodes for the whole session, in their own directory and on their own port."""
    from runners import lab

    # Not under pytest's tmp dir: sshd reads authorized_keys as the lab user, who cannot enter a 0700 dir.
    path = Path(tempfile.mkdtemp(prefix="rackbench-test-lab-"))
    path.chmod(0o755)
    previous = settings.RACKBENCH["LAB_DIR"]
    settings.RACKBENCH["LAB_DIR"] = path
    lab.lab_up(LAB_NODES, port=LAB_PORT, lab_dir=path)
    yield path
    lab.lab_down(lab_dir=path)
    settings.RACKBENCH["LAB_DIR"] = previous
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def lab(lab_dir: Path, transactional_db: None) -> dict[str, Any]:
    """The lab registered in this test's (transactional) database: nodes lab1..lab4 and storage lab-local."""
    from inventory.models import Node, StorageSystem

    call_command("lab", "up", "--nodes", str(LAB_NODES), "--port", str(LAB_PORT), stdout=io.StringIO())
    nodes = {n.name: n for n in Node.objects.filter(tags__name="lab")}
    return {"nodes": nodes, "storage": StorageSystem.objects.get(name="lab-local"), "dir": lab_dir}


WIDE_LAB_PORT = LAB_PORT + 3  # the netns lab has LAB_PORT + 1
WIDE_LAB_NODES = 40


@pytest.fixture(scope="session")
def wide_lab_dir() -> Iterator[Path]:
    """A lab of WIDE_LAB_NODES loopback sshd nodes (127.0.3.N) for the session: for fan-outs wider than the pools."""
    from runners import lab

    path = Path(tempfile.mkdtemp(prefix="rackbench-test-widelab-"))
    path.chmod(0o755)
    lab.lab_up(WIDE_LAB_NODES, port=WIDE_LAB_PORT, base_address="127.0.3.0", lab_dir=path)
    yield path
    lab.lab_down(lab_dir=path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def wide_lab(wide_lab_dir: Path, transactional_db: None, settings: Any) -> dict[str, Any]:
    """The wide lab registered in this test's (transactional) database: nodes lab1..labN."""
    from inventory.models import Node

    settings.RACKBENCH = {**settings.RACKBENCH, "LAB_DIR": wide_lab_dir}
    call_command("lab", "up", "--nodes", str(WIDE_LAB_NODES), stdout=io.StringIO(), stderr=io.StringIO())
    return {"nodes": {n.name: n for n in Node.objects.filter(tags__name="lab")}, "dir": wide_lab_dir}


@pytest.fixture(scope="session")
def netns_lab_dir() -> Iterator[Path]:
    """Real sshd nodes, each in its own network namespace joined to a bridge, for the whole session.

    Skips where namespaces cannot be made (the lab then falls back to loopback, which has no links to degrade).
    """
    from runners import lab

    path = Path(tempfile.mkdtemp(prefix="rackbench-test-netlab-"))
    path.chmod(0o755)
    nodes = lab.lab_up(NETNS_LAB_NODES, port=NETNS_LAB_PORT, lab_dir=path, network=lab.NETNS)
    if nodes[0].network != lab.NETNS:
        lab.lab_down(lab_dir=path)
        shutil.rmtree(path, ignore_errors=True)
        pytest.skip("network namespaces cannot be made here (needs root and iproute2)")
    yield path
    lab.lab_down(lab_dir=path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def netns_lab(netns_lab_dir: Path, transactional_db: None, settings: Any) -> Iterator[dict[str, Any]]:
    """The netns lab registered in this test's (transactional) database, every fault healed before and after."""
    from inventory.models import Node, StorageSystem
    from runners import lab

    settings.RACKBENCH = {**settings.RACKBENCH, "LAB_DIR": netns_lab_dir}
    lab.lab_heal(lab_dir=netns_lab_dir)
    call_command("lab", "up", "--nodes", str(NETNS_LAB_NODES), stdout=io.StringIO(), stderr=io.StringIO())
    nodes = {n.name: n for n in Node.objects.filter(tags__name="lab")}
    yield {"nodes": nodes, "storage": StorageSystem.objects.get(name="lab-local"), "dir": netns_lab_dir}
    lab.lab_heal(lab_dir=netns_lab_dir)


# --- the embedded default: SQLite -------------------------------------------------------------------------


def without_configuration(data_dir: Path) -> dict[str, str]:
    """This process's environment without any database, broker or rackbench setting but the data directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "RACKBENCH_"))}
    env["RACKBENCH_DATA_DIR"] = str(data_dir)
    return env


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory whose SQLite database ``manage.py migrate`` made with no configuration at all, for the tests
    of that default to copy (:func:`sqlite_data_dir`): migrating SQLite takes tens of seconds on a loaded machine."""
    data_dir = tmp_path_factory.mktemp("sqlite-migrated")
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=ROOT, env=without_configuration(data_dir), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert migrate.returncode == 0, migrate.stderr
    return data_dir


def sqlite_data_dir(migrated: Path, data_dir: Path) -> Path:
    """``data_dir`` made with a copy of the migrated database (and only that: its own keys and queue come with use)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for path in migrated.glob("rackbench.sqlite3*"):
        shutil.copy(path, data_dir / path.name)
    return data_dir


# --- a real Celery worker -----------------------------------------------------------------------------


def worker_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process that shares this test session's database and broker."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        pytest.fail("tests with a Celery worker need PostgreSQL: run them with scripts/test (sets DATABASE_URL)")
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        RACKBENCH_ENCRYPTION_KEYS=",".join(settings.RACKBENCH["ENCRYPTION_KEYS"]),
        RACKBENCH_POLL_INTERVAL="0.3",
        RACKBENCH_POLL_WAIT="2",  # short runs are noticed as they end; no worker held long
        RACKBENCH_RETRY_MAX="1",
        RACKBENCH_RETRY_BACKOFF="0.2",
        RACKBENCH_SSH_CONNECT_TIMEOUT="3",
        RACKBENCH_DB_CONN_MAX_AGE="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


class Worker:
    def __init__(self, name: str, env: dict[str, str], *, beat: bool = False, concurrency: int = 3) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.name = name
        self.log_path = ARTIFACTS / f"worker-{name}.log"
        argv = [
            sys.executable, "-m", "celery", "-A", "rackbench", "worker", "-Q", "default,ssh", "-n", f"{name}@%h",
            "-c", str(concurrency), "--loglevel", "INFO", "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        if beat:
            argv += ["-B", "--schedule", str(ARTIFACTS / f"beat-{name}.db")]
        self.log = open(self.log_path, "w")  # noqa: SIM115 - the worker writes to it until stop()
        self.proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        wait_for(self._ready, timeout=60, interval=0.3, what=f"worker {name} to start (log: {self.log_path})")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"worker {self.name} exited with {self.proc.returncode}: {self.log_path.read_text()[-3000:]}")
        return " ready." in self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children), as a crash or an OOM kill would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


def purge_broker(url: str) -> None:
    """Empty a test broker database, unacknowledged messages of earlier sessions included."""
    if url.startswith("redis://"):
        redis.Redis.from_url(url).flushdb()
    else:
        with celery_app.connection_for_write() as conn:
            for queue in ("default", "ssh"):
                conn.default_channel.queue_purge(queue)


@pytest.fixture(scope="session")
def celery_worker_process(django_db_setup: None, django_db_blocker: Any) -> Iterator[Worker]:
    """One real worker for the session, consuming both queues from the real broker."""
    with django_db_blocker.unblock():
        env = worker_env()
    purge_broker(env["CELERY_BROKER_URL"])
    worker = Worker("main", env)
    yield worker
    worker.stop()
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        # Worker processes (this one and the ones tests kill) may leave sessions behind for a moment:
        # close them, or the test database cannot be dropped.
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def worker(celery_worker_process: Worker, transactional_db: None) -> Worker:
    return celery_worker_process
