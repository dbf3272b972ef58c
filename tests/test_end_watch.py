"""The end of a short benchmark is noticed as it happens, not at the next poll (RACKBENCH_POLL_WAIT)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from django.conf import settings

from campaigns import services
from campaigns.models import CampaignStatus
from tests.conftest import ROOT, Worker, finished, purge_broker, spare_broker, worker_env
from tests.test_campaign_e2e import fio_campaign

POLL_INTERVAL_S = 30  # the own worker's RACKBENCH_POLL_INTERVAL: without the watch, the end is noticed no sooner


def run_on_own_worker(name: str, **env: str) -> Any:
    """A one-run campaign (fio for 1 s on two lab nodes) on a worker of its own whose polls come every 30 s."""
    broker = spare_broker(0, settings.CELERY_BROKER_URL)
    purge_broker(broker)
    environment = worker_env(CELERY_BROKER_URL=broker, RACKBENCH_POLL_INTERVAL=str(POLL_INTERVAL_S), **env)
    fixed = {"bs": "64k", "size": "8M", "runtime": 1, "time_based": 1}
    campaign = services.campaign_apply(data=fio_campaign(name, ["lab1", "lab2"], fixed=fixed))
    worker = Worker(f"watch-{name}", environment)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "campaign", "run", name], cwd=ROOT, env=environment, check=True, timeout=60
        )
        return finished(campaign, timeout=150)
    finally:
        worker.kill()
        purge_broker(broker)


def test_a_short_run_ends_when_its_job_does_not_at_the_next_poll(lab: dict[str, Any]) -> None:
    campaign = run_on_own_worker("watched", RACKBENCH_POLL_WAIT="10")
    assert campaign.status == CampaignStatus.SUCCEEDED
    run = campaign.runs.get()
    # Polls every 30 s would notice a 1 s job 30 s after it started at the soonest; the first poll's watch sees it
    # end. Only that bound tells the two apart: how much sooner it ends depends on the machine's load.
    assert (run.finished_at - run.started_at).total_seconds() < POLL_INTERVAL_S
