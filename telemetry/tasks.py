"""Telemetry work after a run has ended (the "default" queue: it does not touch the run's hosts)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from campaigns.models import Run
from telemetry import services

log = logging.getLogger(__name__)


def enqueue_prometheus_pull(run_id: int) -> None:
    """Pull the run's Prometheus queries a little later (RACKBENCH_PROMETHEUS_DELAY), when Prometheus is set up."""
    if settings.RACKBENCH["PROMETHEUS_URL"]:
        run_prometheus_pull_task.apply_async((run_id,), countdown=settings.RACKBENCH["PROMETHEUS_DELAY"])


@shared_task(soft_time_limit=300, time_limit=330)
def run_prometheus_pull_task(run_id: int) -> None:
    """Each query has its own HTTP timeout (RACKBENCH_PROMETHEUS_TIMEOUT); a pull that fails only warns."""
    run = Run.objects.select_related("campaign").filter(pk=run_id).first()
    if run is None:
        return
    outcome = services.run_prometheus_pull(run=run)
    if outcome["warnings"]:
        log.warning("run %s: prometheus: %s", run_id, "; ".join(outcome["warnings"]))
    services.run_telemetry_note(run_id=run_id, key="prometheus", outcome=outcome)
