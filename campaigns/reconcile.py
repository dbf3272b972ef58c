"""The reconciler: what no task is doing any more gets done.

Runs no task has worked on for RACKBENCH_STALE_AFTER seconds, whose step lease has run out, are resumed or failed;
running campaigns with nothing active are advanced; lost kills are sent again; nodes kept for a kill that was not
confirmed get it again; suspect nodes are probed; an ended campaign whose teardown was lost gives its nodes back.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from campaigns import dispatch, services
from campaigns.models import RUN_ACTIVE, Campaign, CampaignStatus, NodeLease, Run, RunStatus
from inventory.models import Node

log = logging.getLogger(__name__)


def runs_reconcile() -> dict[str, int]:
    """Find runs no task has worked on for RACKBENCH_STALE_AFTER seconds, whose step lease has run out, and resume
    or fail them (a step still at work renews its lease, so a slow step is never run twice).

    A run is resumed from the step it was in (its remote state lives in files on the host, so a
    killed worker loses nothing); after RACKBENCH_MAX_RESUMES resumes it fails with the reason.
    Running campaigns with nothing active are advanced, so none waits forever.
    """
    runner = dispatch.runner()
    cfg = settings.RACKBENCH
    counts = {"resumed": 0, "failed": 0, "advanced": 0, "kills resent": 0, "kills retried": 0, "released": 0}
    for run in services.stale_runs(older_than=cfg["STALE_AFTER"]).select_related("campaign"):
        if run.resumes >= cfg["MAX_RESUMES"]:
            error = (
                f"abandoned: no worker made progress on this run for {cfg['STALE_AFTER']:g} s, "
                f"after {run.resumes} resumes (status was {run.status})"
            )
            if services.run_mark_failed(run_id=run.pk, error=error, kill=True):  # what it left on its hosts
                counts["failed"] += 1
            continue
        updated = (
            type(run)
            .objects.filter(pk=run.pk, status=run.status, heartbeat_at=run.heartbeat_at, lease_until=run.lease_until)
            .update(resumes=run.resumes + 1, heartbeat_at=timezone.now())
        )
        if not updated:
            continue
        log.warning("run %s: no progress while %s; resuming", run.pk, run.status)
        counts["resumed"] += 1
        if run.status in (RunStatus.QUEUED, RunStatus.PREPARING):
            runner.start(run.pk)
        elif run.status == RunStatus.RUNNING:
            runner.poll(run.pk, services.run_new_poll_token(run_id=run.pk))
        else:
            runner.collect(run.pk)
    for campaign in Campaign.objects.filter(status=CampaignStatus.RUNNING).exclude(runs__status__in=RUN_ACTIVE):
        services.campaign_advance_soon(campaign_id=campaign.pk)
        counts["advanced"] += 1
    now = timezone.now()
    stale = now - timedelta(seconds=cfg["STALE_AFTER"])
    for run_id in Run.objects.filter(kill_pending=True, heartbeat_at__lt=stale).values_list("pk", flat=True):
        services.run_heartbeat(run_id=run_id)
        runner.kill(run_id)  # its kill task was lost
        counts["kills resent"] += 1
    if Node.objects.filter(suspect_since__isnull=False).exists():
        runner.reprobe_suspect_nodes()  # a suspect node that answers again is used again
    # A node kept for a kill that is not confirmed: the kill is tried again (once per task) before anyone gets it.
    unconfirmed = NodeLease.objects.filter(held_for__kill_pending=False, held_for__heartbeat_at__lt=stale)
    for run_id in unconfirmed.values_list("held_for_id", flat=True).distinct():
        services.run_heartbeat(run_id=run_id)
        runner.kill(run_id, once=True)
        counts["kills retried"] += 1
    # An ended campaign holding nodes with no kill left: its teardown task was lost (none runs longer than its
    # hard time limit), so its nodes are given back.
    lost = now - timedelta(seconds=cfg["STALE_AFTER"] + runner.teardown_time_limit())
    ended = Campaign.objects.exclude(status=CampaignStatus.RUNNING).filter(
        leases__isnull=False, leases__held_for__isnull=True, finished_at__lt=lost
    )
    for campaign_id in ended.exclude(runs__kill_pending=True).values_list("pk", flat=True).distinct():
        if services.campaign_release(campaign_id=campaign_id):
            counts["released"] += 1
    return counts
