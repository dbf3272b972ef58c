"""Every state change of campaigns and runs, the app's one entry point for views, API views, tasks and commands.

The campaign lifecycle (launch, advance, rerun, finish, cancel) lives here; the definition
(campaigns/definition.py), the node queue (campaigns/reservations.py) and the runs' own transitions
(campaigns/runs.py) in their modules, whose services this module gives too. Transitions are conditional updates
(``filter(pk=..., status__in=OLD).update(status=NEW)``) whose row count is checked, so a redelivered or duplicated
task does no harm."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import transaction
from django.utils import timezone

from campaigns import dispatch, planning
from campaigns.definition import (
    DEFINITION_FIELDS as DEFINITION_FIELDS,
)
from campaigns.definition import (
    Definition as Definition,
)
from campaigns.definition import (
    campaign_apply as campaign_apply,
)
from campaigns.definition import (
    campaign_clone as campaign_clone,
)
from campaigns.definition import (
    campaign_definition_check as campaign_definition_check,
)
from campaigns.definition import (
    in_team as in_team,
)
from campaigns.definition import (
    preset_instantiate as preset_instantiate,
)
from campaigns.definition import (
    select_nodes as select_nodes,
)
from campaigns.drift import campaign_drift_gate
from campaigns.errors import CampaignError as CampaignError
from campaigns.models import (
    RUN_ACTIVE,
    RUN_TERMINAL,
    Campaign,
    CampaignStatus,
    NodeLease,
    Run,
    RunHost,
    RunStatus,
    Statistic,
)
from campaigns.reservations import (
    _has_busy_run,
    _reservation_take,
)
from campaigns.reservations import (
    campaign_advance_soon as campaign_advance_soon,
)
from campaigns.reservations import (
    campaign_release as campaign_release,
)
from campaigns.reservations import (
    campaign_transition as campaign_transition,
)
from campaigns.reservations import (
    campaign_wind_down as campaign_wind_down,
)
from campaigns.reservations import (
    queue_ahead as queue_ahead,
)
from campaigns.runs import (
    lease_release_by_hand as lease_release_by_hand,
)
from campaigns.runs import (
    results_import as results_import,
)
from campaigns.runs import (
    run_finish as run_finish,
)
from campaigns.runs import (
    run_heartbeat as run_heartbeat,
)
from campaigns.runs import (
    run_kill_confirmed as run_kill_confirmed,
)
from campaigns.runs import (
    run_kill_request as run_kill_request,
)
from campaigns.runs import (
    run_kill_unconfirmed as run_kill_unconfirmed,
)
from campaigns.runs import (
    run_killed as run_killed,
)
from campaigns.runs import (
    run_lease_release as run_lease_release,
)
from campaigns.runs import (
    run_lease_renew as run_lease_renew,
)
from campaigns.runs import (
    run_lease_take as run_lease_take,
)
from campaigns.runs import (
    run_live_log_watch as run_live_log_watch,
)
from campaigns.runs import (
    run_mark_failed as run_mark_failed,
)
from campaigns.runs import (
    run_new_poll_token as run_new_poll_token,
)
from campaigns.runs import (
    run_poll_claim as run_poll_claim,
)
from campaigns.runs import (
    run_provenance_merge as run_provenance_merge,
)
from campaigns.runs import (
    run_store_collected as run_store_collected,
)
from campaigns.runs import (
    run_store_results as run_store_results,
)
from campaigns.runs import (
    run_transition as run_transition,
)
from campaigns.runs import (
    stale_runs as stale_runs,
)
from inventory.crypto import encrypt
from inventory.models import Node

log = logging.getLogger(__name__)


def campaign_target_nodes(*, campaign: Campaign) -> list[Node]:
    """The nodes a run of the campaign uses: the named ones plus active nodes with a selected tag."""
    return select_nodes(list(campaign.nodes.all()), list(campaign.node_tags.all()), campaign.team)


def campaign_launch(*, campaign: Campaign, user: Any = None) -> Campaign:
    """Create every run of the campaign and start the first; draft -> running."""
    nodes = campaign_target_nodes(campaign=campaign)
    if not nodes:
        raise CampaignError("the campaign selects no active node", field="nodes")
    usable = campaign.usable_node_statuses
    unusable = [n.name for n in nodes if n.status not in usable]
    if unusable:
        raise CampaignError(f"nodes not active (maintenance or retired): {', '.join(unusable)}", field="nodes")
    if campaign.status == CampaignStatus.DRAFT:  # a launched one is refused below, without collecting facts
        campaign_drift_gate(campaign=campaign, nodes=nodes)
    with transaction.atomic():
        now = timezone.now()
        if not campaign_transition(
            campaign=campaign, old=CampaignStatus.DRAFT, new=CampaignStatus.RUNNING, launched_at=now, waiting_since=now
        ):
            campaign.refresh_from_db()
            raise CampaignError(f"campaign {campaign.name} is already {campaign.status}", conflict=True)
        if campaign.container:
            _campaign_key_pair(campaign)
        planned = planning.plan(
            campaign.matrix,
            campaign.fixed,
            campaign.rules,
            repetitions=campaign.repetitions,
            warmup_runs=campaign.warmup_runs,
        )
        runs = Run.objects.bulk_create(
            Run(
                campaign=campaign,
                sequence=p.sequence,
                point=p.point,
                params=p.params,
                repetition=p.repetition,
                is_warmup=p.is_warmup,
            )
            for p in planned
        )
        campaign.reserved_nodes.set(_create_run_hosts(runs, nodes))
        campaign_advance_soon(campaign_id=campaign.pk)
    campaign.refresh_from_db()
    return campaign


def campaign_advance(*, campaign_id: int) -> str:
    """Take the campaign's nodes when it is its turn, then start its next pending run once nothing of it is active.

    Returns what happened: "started", "waiting" (in the queue for its nodes), "paused" (the next run needs a node
    that is not active), "active" (a run of it is under way), "finished" or "idle" (not running).
    """
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().filter(pk=campaign_id).first()
        if campaign is None or campaign.status != CampaignStatus.RUNNING:
            return "idle"
        if campaign.waiting_since is not None and not _reservation_take(campaign):
            return "waiting"
        if _has_busy_run(campaign):
            return "active"
        run = campaign.runs.filter(status=RunStatus.PENDING).order_by("sequence").first()
        if run is None:
            campaign_finish(campaign=campaign)
            return "finished"
        node_ids = {n for n in run.hosts.values_list("node_id", flat=True) if n}
        nodes = Node.objects.select_for_update(no_key=True, of=("self",)).filter(pk__in=node_ids).order_by("pk")
        usable = campaign.usable_node_statuses
        if any(n.status not in usable for n in nodes):
            return "paused"  # until the node is active again (the reconciler advances running campaigns)
        suspect = next((n for n in nodes if n.suspect_since is not None), None)
        if suspect is not None:  # the circuit breaker: fail fast instead of going through the retries again
            run_finish(
                run_id=run.pk,
                status=RunStatus.FAILED,
                error=f"not started: node {suspect.name} does not answer since "
                f"{timezone.localtime(suspect.suspect_since):%Y-%m-%d %H:%M:%S} ({suspect.suspect_reason})",
            )
            return "failed"
        held = NodeLease.objects.filter(node_id__in=node_ids, held_for__isnull=False).select_related("node").first()
        if held is not None:  # a job of an earlier run may still be running there: never measure beside it
            run_finish(
                run_id=run.pk,
                status=RunStatus.FAILED,
                error=f"not started: node {held.node.name} is kept because the kill of run {held.held_for_id} there "
                f"is not confirmed ({held.held_reason}); a job may still be running on it",
            )
            return "failed"
        if node_ids - set(campaign.leases.values_list("node_id", flat=True)):
            # Never start a run on a node the campaign does not hold (its reservation predates a change of
            # its nodes): it queues for the missing ones first.
            campaign.reserved_nodes.add(*node_ids)
            campaign.waiting_since = timezone.now()
            campaign.save(update_fields=["waiting_since"])
            if not _reservation_take(campaign):
                return "waiting"
        now = timezone.now()
        Run.objects.filter(pk=run.pk, status=RunStatus.PENDING).update(
            status=RunStatus.QUEUED, queued_at=now, heartbeat_at=now
        )
        transaction.on_commit(partial(dispatch.runner().start, run.pk))
    return "started"


def run_collected(*, run_id: int, status: str, error: str = "") -> bool:
    """``run_finish`` for a run whose job ended and was collected, called by the task that collected it. Where a run
    of its campaign is waiting, the campaign goes on at once in that task (``campaign_advance``: its next run queued
    and that run's start task sent), not in an advance task of its own: one hop through the broker less between two
    runs. Otherwise (the campaign ends: judged, torn down), or should that advance fail, its advance task is sent as
    usual; should the task die after the run is finished, the reconciler advances the campaign."""
    return run_finish(run_id=run_id, status=status, error=error, then=_advance_here)


def _advance_here(campaign_id: int) -> None:
    if not Run.objects.filter(campaign_id=campaign_id, status=RunStatus.PENDING).exists():
        campaign_advance_soon(campaign_id=campaign_id)
        return
    try:
        campaign_advance(campaign_id=campaign_id)
    except Exception:  # noqa: BLE001 - the advance task takes it over, as it does every other advance
        log.warning("campaign %s: its advance task takes over", campaign_id, exc_info=True)
        campaign_advance_soon(campaign_id=campaign_id)


def _campaign_key_pair(campaign: Campaign) -> None:
    """A fresh SSH key pair for this launch (never baked into an image, stored only encrypted)."""
    private = Ed25519PrivateKey.generate()
    openssh = serialization.PrivateFormat.OpenSSH
    private_text = private.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption()).decode()
    public_text = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    campaign.ssh_private_key_encrypted = encrypt(private_text)
    campaign.ssh_public_key = f"{public_text.decode()} rackbench-campaign-{campaign.pk}"
    campaign.save(update_fields=["ssh_private_key_encrypted", "ssh_public_key"])


def campaign_finish(*, campaign: Campaign) -> bool:
    """running -> succeeded (every run succeeded) or failed; only when no run is left to do."""
    if campaign.runs.exclude(status__in=RUN_TERMINAL).exists():
        return False
    failed = campaign.runs.exclude(status=RunStatus.SUCCEEDED).exists()
    status = CampaignStatus.FAILED if failed else CampaignStatus.SUCCEEDED
    done = campaign_transition(campaign=campaign, old=CampaignStatus.RUNNING, new=status, finished_at=timezone.now())
    if not done:
        return False
    campaign.status = status
    _suite_step_ended(campaign)
    from campaigns.baselines import campaign_judge

    verdict = campaign_judge(campaign=campaign)
    if verdict is None or verdict.final:  # else: suspected regressions are being re-run, the campaign goes on
        campaign_wind_down(campaign=campaign)
    return True


def _suite_step_ended(campaign: Campaign) -> None:
    """A health suite's step ended: its run's actions may be due (analysis.health.suite_run_ended decides)."""
    if campaign.is_health_check:
        transaction.on_commit(partial(dispatch.suite_step_ended(), campaign.pk))


def campaign_rerun(*, campaign: Campaign, points: list[int] | None = None, failed: bool = False) -> list[Run]:
    """Run more of a finished campaign: new attempts of its failed runs (``failed``), or fresh repetitions of
    matrix ``points`` (a suspected regression measured again). The campaign goes back to running.

    A campaign that still holds its nodes (a re-run decided as it ends) keeps them and runs on them; any other
    joins the back of the queue for the nodes it selects now."""
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().get(pk=campaign.pk)
        if campaign.status not in (CampaignStatus.SUCCEEDED, CampaignStatus.FAILED):
            raise CampaignError(f"campaign {campaign.name} is {campaign.status}; only a finished one re-runs",
                                conflict=True)  # fmt: skip
        runs = list(campaign.runs.order_by("sequence"))
        sequence = runs[-1].sequence if runs else 0
        if failed:  # one new attempt per repetition that never succeeded, after its latest attempt
            succeeded = {(r.point, r.repetition, r.is_warmup) for r in runs if r.status == RunStatus.SUCCEEDED}
            latest = {(r.point, r.repetition, r.is_warmup): r for r in runs if r.status != RunStatus.SUCCEEDED}
            planned = [
                (r.point, r.params, r.repetition, r.is_warmup, r.attempt + 1)
                for key, r in latest.items()
                if key not in succeeded
            ]
        else:  # fresh repetitions of each chosen point, numbered after its last one
            measured = [r for r in runs if not r.is_warmup and r.point in set(points or [])]
            point_params = {r.point: r.params for r in measured}
            top = {p: max(r.repetition for r in measured if r.point == p) for p in point_params}
            planned = [
                (p, point_params[p], top[p] + i + 1, False, 1)
                for p in sorted(point_params)
                for i in range(campaign.repetitions)
            ]
        if not planned:
            raise CampaignError("nothing to re-run: " + ("no failed run" if failed else "no such matrix point"),
                                field="points" if not failed else "")  # fmt: skip
        holding = campaign.leases.exists()
        nodes = (
            sorted(campaign.reserved_nodes.all(), key=lambda n: n.name)
            if holding
            else campaign_target_nodes(campaign=campaign)
        )
        new = Run.objects.bulk_create(
            Run(campaign=campaign, sequence=sequence + i + 1, point=point, params=params, repetition=rep,
                is_warmup=warm, attempt=attempt)
            for i, (point, params, rep, warm, attempt) in enumerate(planned)
        )  # fmt: skip
        used = _create_run_hosts(new, nodes)
        queue = {} if holding else {"waiting_since": timezone.now()}
        if not holding:
            campaign.reserved_nodes.set(used)
        campaign_transition(
            campaign=campaign, old=campaign.status, new=CampaignStatus.RUNNING, finished_at=None, **queue
        )
        campaign_advance_soon(campaign_id=campaign.pk)
    return new


def _create_run_hosts(runs: list[Run], nodes: list[Node]) -> list[Node]:
    """Each run's hosts; returns the nodes the runs use (the ones a launch reserves)."""
    hosts = RunHost.objects.bulk_create(
        RunHost(run=run, node=node, host=node.name, address=node.address, command="", remote_dir="")
        for run in runs
        for node in planning.nodes_for(run.params, nodes)
    )
    return list({h.node.pk: h.node for h in hosts if h.node}.values())


def campaign_cancel(*, campaign: Campaign) -> Campaign:
    """Cancel a running campaign: pending runs are cancelled, active ones killed on their hosts, and its nodes
    given back once that is done (its place in the queue at once)."""
    with transaction.atomic():
        if not campaign_transition(
            campaign=campaign, old=CampaignStatus.RUNNING, new=CampaignStatus.CANCELLED, finished_at=timezone.now()
        ):
            campaign.refresh_from_db()
            raise CampaignError(f"campaign {campaign.name} is {campaign.status}, not running", conflict=True)
        now = timezone.now()
        campaign.runs.filter(status=RunStatus.PENDING).update(
            status=RunStatus.CANCELLED, finished_at=now, error="campaign cancelled"
        )
        active = list(campaign.runs.filter(status__in=RUN_ACTIVE).values_list("pk", flat=True))
        for run_id in active:
            run_finish(run_id=run_id, status=RunStatus.CANCELLED, error="cancelled by the user", kill=True)
        campaign_wind_down(campaign=campaign)
        _suite_step_ended(campaign)
    campaign.refresh_from_db()
    return campaign


def campaign_set_statistic(*, campaign: Campaign, statistic: str) -> Campaign:
    """Sum the campaign's points up by ``statistic`` (mean or median) from now on, in whatever state it is: the choice
    changes how its numbers are read, never what was measured. Verdicts already stored keep the statistic they used."""
    if statistic not in Statistic.values:
        raise CampaignError(f"must be one of {', '.join(Statistic.values)}, got {statistic!r}", field="statistic")
    Campaign.objects.filter(pk=campaign.pk).update(statistic=statistic)
    campaign.statistic = statistic
    return campaign
