from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class TelemetryConfig(AppConfig):
    name = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_prometheus_queries)


def check_prometheus_queries(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A bad RACKBENCH_PROMETHEUS_QUERIES file is said at start-up, not found out after the first run."""
    from plugins.benchmarks.base import ParamError
    from telemetry.prometheus import default_queries

    try:
        default_queries()
    except ParamError as exc:
        return [checks.Error(str(exc), id="telemetry.E001")]
    return []
