"""A worker killed in the middle of a run: the reconciler resumes the run from the files on the host."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Run, RunStatus
from tests.conftest import ROOT, Worker, group_alive, purge_broker, spare_broker, wait_for, worker_env
from tests.test_campaign_e2e import fio_campaign

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def own_broker() -> str:
    """A broker database of its own, so the session's worker never takes these tasks."""
    base = settings.CELERY_BROKER_URL
    if not base.startswith("redis://"):
        pytest.fail("this test needs Redis (scripts/test sets CELERY_BROKER_URL)")
    url = spare_broker(0, base)
    purge_broker(url)
    return url


def run_then_kill_the_worker(env: dict[str, str], name: str, node: str, runtime: int) -> tuple[Campaign, Run]:
    """Launch a one-run campaign on its own worker, wait until the run is running, then SIGKILL that worker."""
    fixed = {"bs": "64k", "size": "8M", "runtime": runtime, "time_based": 1}
    campaign = services.campaign_apply(data=fio_campaign(name, [node], fixed=fixed))
    doomed = Worker(f"doomed-{name}", env)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "campaign", "run", name], cwd=ROOT, env=env, check=True, timeout=60
        )
        run = wait_for(lambda: Run.objects.filter(campaign=campaign, status=RunStatus.RUNNING).first(), what="running")
    finally:
        doomed.kill()
    return campaign, run


def test_it_resumes_a_run_whose_worker_was_killed(lab: dict[str, Any]) -> None:
    env = worker_env(
        CELERY_BROKER_URL=own_broker(),
        RACKBENCH_STALE_AFTER="3",
        RACKBENCH_RECONCILE_EVERY="1",
        RACKBENCH_POLL_INTERVAL="1",
    )
    campaign, run = run_then_kill_the_worker(env, "survivor", "lab1", runtime=6)

    rescuer = Worker("rescuer", env, beat=True)
    try:

        def done() -> bool:
            campaign.refresh_from_db()
            return campaign.is_terminal

        wait_for(done, timeout=90, what="the campaign to finish after the worker was killed")
    finally:
        rescuer.stop()
    run.refresh_from_db()
    assert campaign.status == CampaignStatus.SUCCEEDED, run.error
    assert run.resumes >= 1
    assert run.results.filter(name="read_bw_bytes", host="lab1").exists()
    assert Campaign.objects.get(pk=campaign.pk).finished_at is not None


def test_it_fails_a_run_with_a_reason_when_it_cannot_be_resumed(lab: dict[str, Any]) -> None:
    env = worker_env(
        CELERY_BROKER_URL=own_broker(),
        RACKBENCH_STALE_AFTER="2",
        RACKBENCH_RECONCILE_EVERY="1",
        RACKBENCH_MAX_RESUMES="0",
    )
    campaign, run = run_then_kill_the_worker(env, "abandoned", "lab2", runtime=30)

    rescuer = Worker("rescuer2", env, beat=True)
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).is_terminal, timeout=60, what="the reconciler to fail the run")
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED
        assert "abandoned: no worker made progress" in run.error
        wait_for(lambda: Campaign.objects.get(pk=campaign.pk).is_terminal, timeout=60, what="the campaign to end")
    finally:
        rescuer.stop()
    pid = run.hosts.get().pid
    wait_for(lambda: not group_alive(pid), timeout=60, what="the abandoned fio to be killed")
