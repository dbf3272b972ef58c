"""Every state change of a run: conditional transitions, step leases, kills (confirmed or not), results stored
exactly once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from campaigns import dispatch, planning
from campaigns.errors import CampaignError
from campaigns.models import (
    RUN_ACTIVE,
    RUN_TERMINAL,
    Campaign,
    CampaignStatus,
    NodeLease,
    Result,
    Run,
    RunHost,
    RunStatus,
)
from campaigns.reservations import campaign_advance_soon, campaign_release, campaign_wind_down
from plugins.benchmarks.base import Benchmark, Metric, ParamError, get_benchmark

log = logging.getLogger(__name__)


def run_transition(*, run_id: int, old: Iterable[str], new: str, **fields: Any) -> bool:
    """Move a run from one of ``old`` to ``new``; False (and no change) when it was elsewhere."""
    fields.setdefault("heartbeat_at", timezone.now())
    return bool(Run.objects.filter(pk=run_id, status__in=list(old)).update(status=new, **fields))


def run_heartbeat(*, run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now())


def run_finish(
    *, run_id: int, status: str, error: str = "", kill: bool = False, then: Callable[[int], None] | None = None
) -> bool:
    """Put an active run in a terminal state and let its campaign go on (on the nodes it still holds).

    With ``kill``, its processes are killed on its hosts first (``run_killed`` lets the campaign go on then).
    A cancelled run keeps no results (a collect stores them only while the run is collecting, under a lock on its
    row, so none comes after this). ``then``: how the campaign goes on once this commits (called with its id);
    by default its advance task is sent.
    """
    assert status in RUN_TERMINAL
    with transaction.atomic():
        done = run_transition(
            run_id=run_id,
            old=[RunStatus.PENDING, *RUN_ACTIVE],
            new=status,
            finished_at=timezone.now(),
            error=error[:10_000],
            kill_pending=kill,
        )
        if done and status == RunStatus.CANCELLED:
            Result.objects.filter(run_id=run_id).delete()  # stored by a collect that the cancel overtook
        if done and kill:
            transaction.on_commit(partial(dispatch.runner().kill, run_id))
        elif done:
            campaign_id, kind = Run.objects.values_list("campaign_id", "campaign__kind").get(pk=run_id)
            if status == RunStatus.SUCCEEDED and _asks_follow_up(kind):
                _run_follow_up(run_id)
            if then is None:
                campaign_advance_soon(campaign_id=campaign_id)
            else:
                transaction.on_commit(partial(then, campaign_id))
    return done


def _asks_follow_up(kind: str) -> bool:
    """Whether the benchmark may ask for a run after one that succeeded (it has a ``follow_up`` of its own)."""
    try:
        return type(get_benchmark(kind)).follow_up is not Benchmark.follow_up
    except ParamError:
        return False


def _run_follow_up(run_id: int) -> Run | None:
    """The run a benchmark asks for after this one succeeded (``Benchmark.follow_up``: a localisation's second
    pass), added as the campaign's next run on the same hosts. In ``run_finish``'s transaction, once per run."""
    run = Run.objects.select_related("campaign").get(pk=run_id)
    metrics = [
        Metric(name=r.name, value=r.value, unit=r.unit, host=r.host, labels=r.labels)
        for r in run.results.exclude(host="")
    ]
    try:
        asked = get_benchmark(run.campaign.kind).follow_up(planning.benchmark_params(run.params), metrics)
    except ParamError as exc:  # never keeps the run from finishing
        log.error("run %s: no follow-up run: %s", run.pk, exc)
        return None
    if asked is None:
        return None
    params = {**run.params, **asked}  # run-level parameters (nodes, env.*) kept
    last = Run.objects.filter(campaign_id=run.campaign_id).order_by("-sequence").values_list("sequence", flat=True)
    follow = Run.objects.create(
        campaign_id=run.campaign_id,
        sequence=last[0] + 1,
        point=run.point,
        params=params,
        repetition=run.repetition,
        is_warmup=run.is_warmup,
    )
    RunHost.objects.bulk_create(
        RunHost(run=follow, node_id=h.node_id, host=h.host, address=h.address, command="", remote_dir="")
        for h in run.hosts.all()
    )
    return follow


def run_kill_request(*, run_id: int) -> None:
    """Kill an ended run's processes again (they were started after it ended: cancelled while starting)."""
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(kill_pending=True)
        transaction.on_commit(partial(dispatch.runner().kill, run_id))


def run_killed(*, run_id: int) -> None:
    """The kill of an ended run is done (or given up): its campaign goes on, or winds down if it has ended."""
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().filter(runs__pk=run_id).first()
        if campaign is None or not Run.objects.filter(pk=run_id, kill_pending=True).update(kill_pending=False):
            return  # a repeated kill: already done
        if campaign.status == CampaignStatus.RUNNING:
            campaign_advance_soon(campaign_id=campaign.pk)
        elif campaign.is_terminal:
            campaign_wind_down(campaign=campaign)


def _append_error(run_id: int, note: str) -> None:
    error = Run.objects.values_list("error", flat=True).get(pk=run_id)
    if note not in error:
        Run.objects.filter(pk=run_id).update(error=f"{error}\n{note}".strip()[:10_000])


def run_kill_unconfirmed(*, run_id: int, hosts: dict[str, str]) -> None:
    """The kill of an ended run is not confirmed on ``hosts`` (host -> why: unreachable, pids that outlived
    SIGKILL): a job of it may still be running there. Each such node stays held by the run's campaign, even after
    the campaign ends, until the reconciler confirms the kill (``run_kill_confirmed``) or an operator releases it
    (``lease_release_by_hand``); the run's error says so."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("campaign").get(pk=run_id)
        now = timezone.now()
        nodes = dict(run.hosts.filter(node__isnull=False).values_list("host", "node_id"))
        for host, why in sorted(hosts.items()):
            if host not in nodes:
                continue  # a storage system's statistics loop: no node to hold
            fields = {"held_for": run, "held_reason": why[:2000]}
            if not NodeLease.objects.filter(node_id=nodes[host], campaign=run.campaign).update(**fields):
                NodeLease.objects.get_or_create(node_id=nodes[host], defaults={"campaign": run.campaign, **fields})
            NodeLease.objects.filter(node_id=nodes[host], held_for=run, held_since=None).update(held_since=now)
        where = "; ".join(f"{host}: {why}" for host, why in sorted(hosts.items()))
        _append_error(
            run_id,
            f"the kill is not confirmed on {where}. A job of this run may still be running there; the node is kept "
            "from other campaigns until the kill is confirmed or an operator releases it.",
        )


def run_kill_confirmed(*, run_id: int) -> None:
    """The run's kill is confirmed on every host: the nodes an unconfirmed kill kept are free again (given back
    when their campaign has ended)."""
    with transaction.atomic():
        held = NodeLease.objects.select_for_update().filter(held_for_id=run_id)
        campaign_ids = set(held.values_list("campaign_id", flat=True))
        if not campaign_ids:
            return
        held.update(held_for=None, held_reason="", held_since=None)
        _append_error(run_id, f"The kill was confirmed at {timezone.now():%Y-%m-%d %H:%M:%S %Z}; the node is free.")
    for campaign_id in campaign_ids:
        if not campaign_release(campaign_id=campaign_id):
            campaign_advance_soon(campaign_id=campaign_id)


def lease_release_by_hand(*, lease: NodeLease, user: Any = None) -> bool:
    """An operator gives back a node kept for a kill that is not confirmed (they checked the node, or it is gone
    for good); False when the lease is not kept for that any more."""
    with transaction.atomic():
        row = NodeLease.objects.select_for_update().filter(pk=lease.pk, held_for__isnull=False).first()
        if row is None:
            return False
        run_id, campaign_id = row.held_for_id, row.campaign_id
        NodeLease.objects.filter(pk=row.pk).update(held_for=None, held_reason="", held_since=None)
        if run_id is not None:
            by = f" by {user}" if user else ""
            _append_error(run_id, f"Node {lease.node} released by hand{by}, without a confirmed kill.")
        if not campaign_release(campaign_id=campaign_id):
            campaign_advance_soon(campaign_id=campaign_id)
    return True


def run_mark_failed(*, run_id: int, error: str, kill: bool = False) -> bool:
    return run_finish(run_id=run_id, status=RunStatus.FAILED, error=error, kill=kill)


def run_new_poll_token(*, run_id: int) -> str:
    token = uuid.uuid4().hex
    Run.objects.filter(pk=run_id).update(poll_token=token, heartbeat_at=timezone.now())
    return token


def run_poll_claim(*, run_id: int, token: str) -> str | None:
    """Hand a running run's poll chain on: the new token, or None when ``token`` is no longer the chain's (a
    duplicated poll message, or a chain that a resume replaced), whose poll then stops."""
    new = uuid.uuid4().hex
    claimed = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, poll_token=token).update(
        poll_token=new, heartbeat_at=timezone.now()
    )
    return new if claimed else None


def run_lease_take(*, run_id: int, owner: str, status: Iterable[str], seconds: float) -> bool:
    """Take the run's step lease for ``seconds`` while the run is in one of ``status``; False when another task
    holds it (that task is working on the step: its duplicate backs off)."""
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now) | Q(lease_owner=owner)
    return bool(
        Run.objects.filter(free, pk=run_id, status__in=list(status)).update(
            lease_owner=owner, lease_until=now + timedelta(seconds=seconds), heartbeat_at=now
        )
    )


def run_lease_renew(*, run_id: int, owner: str, seconds: float) -> bool:
    """Extend a held step lease (the step is still being worked on); False when it is no longer ours."""
    now = timezone.now()
    return bool(
        Run.objects.filter(pk=run_id, lease_owner=owner).update(
            lease_until=now + timedelta(seconds=seconds), heartbeat_at=now
        )
    )


def run_lease_release(*, run_id: int, owner: str) -> None:
    Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_owner="", lease_until=None)


def run_live_log_watch(*, run_id: int) -> None:
    """Someone watches the run's output: its poll task stores the end of it for a while (runners.execution)."""
    Run.objects.filter(pk=run_id).update(live_log_wanted_at=timezone.now())


def run_provenance_merge(*, run_id: int, update: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Change the run's provenance under a row lock: ``update`` changes the stored provenance in place, and what it
    leaves is saved and returned.

    Every writer after the run's preparation goes through here: writers that read, merge and write on their own (the
    telemetry collection and a Prometheus pull that end together) would lose each other's keys. ``update`` runs
    with the row locked: it must only merge, never wait on a remote host.
    """
    with transaction.atomic():
        provenance = dict(Run.objects.select_for_update().values_list("provenance", flat=True).get(pk=run_id))
        update(provenance)
        Run.objects.filter(pk=run_id).update(provenance=provenance)
    return provenance


def run_store_results(*, run: Run, metrics: list[Metric], status: str = RunStatus.COLLECTING) -> int:
    """Replace the run's results while it is in ``status`` (collecting: a run cancelled meanwhile keeps none).

    Under a lock on the run's row, so two collects of one run (a duplicated task) store its results once, one
    after the other; the unique constraint on results enforces it. Returns how many were stored (0: none, the
    run was no longer collecting).
    """
    with transaction.atomic():
        if not Run.objects.select_for_update().filter(pk=run.pk, status=status).exists():
            return 0
        run.results.all().delete()
        rows = Result.objects.bulk_create(
            Result(run=run, name=m.name, value=m.value, unit=m.unit, host=m.host, labels=m.labels) for m in metrics
        )
    return len(rows)


def run_store_collected(
    *,
    run: Run,
    hosts: list[RunHost],
    tails: tuple[str, str],
    metrics: list[Metric],
    update: Callable[[dict[str, Any]], None],
) -> int:
    """What a collect found, stored in one transaction under a lock on the run's row: each of ``hosts``' output and
    exit code (as set on the rows), the run's tails of them (stdout, stderr), its provenance changed by ``update``
    (which must only merge, as for ``run_provenance_merge``), and its results while it is collecting (as
    ``run_store_results``: a run cancelled meanwhile keeps none, two collects of one run store them once). Returns
    how many results were stored."""
    with transaction.atomic():
        status, provenance = Run.objects.select_for_update().values_list("status", "provenance").get(pk=run.pk)
        provenance = dict(provenance)
        update(provenance)
        RunHost.objects.bulk_update(hosts, ["stdout", "stderr", "exit_code"], batch_size=200)
        Run.objects.filter(pk=run.pk).update(stdout_tail=tails[0], stderr_tail=tails[1], provenance=provenance)
        if status != RunStatus.COLLECTING:
            return 0
        run.results.all().delete()
        rows = Result.objects.bulk_create(
            Result(run=run, name=m.name, value=m.value, unit=m.unit, host=m.host, labels=m.labels) for m in metrics
        )
    return len(rows)


def results_import(*, campaign: Campaign, kind: str, outputs: list[tuple[str, str]]) -> Run:
    """Store results of a run made by hand outside rackbench (one output per host: (host, text)).

    The run is added to the campaign as a succeeded run flagged ``imported`` in its provenance; the
    campaign's status is left alone.
    """
    from plugins.benchmarks.base import get_benchmark

    if kind != campaign.kind:
        raise CampaignError(f"campaign {campaign.name} is a {campaign.kind} campaign, not {kind}", field="kind")
    benchmark = get_benchmark(kind)
    per_host: list[Metric] = []
    for host, text in outputs:
        per_host += benchmark.parse(text, host=host)
    metrics = per_host + benchmark.aggregate(per_host)
    with transaction.atomic():
        last = campaign.runs.select_for_update().order_by("-sequence").first()
        now = timezone.now()
        run = Run.objects.create(
            campaign=campaign,
            sequence=(last.sequence if last else 0) + 1,
            point=0,
            params={},
            repetition=1,
            status=RunStatus.SUCCEEDED,
            started_at=now,
            finished_at=now,
            provenance={"imported": True, "files": [h for h, _ in outputs]},
        )
        RunHost.objects.bulk_create(
            RunHost(run=run, host=host, address="", command="(imported)", remote_dir="", stdout=text)
            for host, text in outputs
        )
        run_store_results(run=run, metrics=metrics, status=RunStatus.SUCCEEDED)
    return run


def stale_runs(*, older_than: float) -> Any:
    """Active runs no task has worked on for ``older_than`` seconds and whose step lease (if any) has expired: a
    step still being worked on, however slowly, renews its lease and is never taken for lost."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than)
    return (
        Run.objects.filter(status__in=RUN_ACTIVE)
        .filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at=None))
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    )
