from __future__ import annotations

from typing import Any

from django import template

from telemetry.grafana import grafana_url

register = template.Library()


@register.simple_tag
def run_grafana_url(run: Any) -> str:
    """The run's window in Grafana, or "" when RACKBENCH_GRAFANA_URL is not set."""
    return grafana_url(run.started_at, run.finished_at)
