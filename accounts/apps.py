from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_secrets_set, checks.Tags.security, deploy=True)


def check_secrets_set(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: the secrets must come from the environment, not the data directory's generated ones
    (machines that share the database must share them; a lost data directory must not lose every key)."""
    return [
        checks.Error(
            f"{name} is not set: the one generated into the data directory is in use",
            id="accounts.E001",
            hint="set it in the production environment (README, Configuration)",
        )  # fmt: skip
        for name in getattr(settings, "SECRETS_GENERATED", [])
    ]
