"""Every state change of campaigns and runs.

Transitions are conditional updates (``filter(pk=..., status__in=OLD).update(status=NEW)``) whose row
count is checked, so a redelivered or duplicated task does no harm.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import Team
from accounts.selectors import may_share
from campaigns import dispatch, planning
from campaigns import spec as spec_module
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
from campaigns.spec import SpecError
from common.errors import ApplicationError
from inventory.crypto import encrypt
from inventory.models import Node, NodeStatus, StorageSystem, Tag
from plugins.benchmarks.base import Metric, ParamError
from plugins.mounts import validate_mounts

log = logging.getLogger(__name__)


class CampaignError(ApplicationError, ValueError):
    """An action that cannot be done; ``conflict`` marks an invalid state transition (HTTP 409)."""


# --- definition ---------------------------------------------------------------------------------


def in_team(queryset: QuerySet[Any], team: Team | None) -> QuerySet[Any]:
    """What a campaign of ``team`` may use: shared inventory, and its own team's (a shared campaign: shared only)."""
    return queryset.filter(Q(team=None) | Q(team=team)) if team is not None else queryset.filter(team=None)


@dataclass
class Definition:
    """A campaign definition checked against the inventory and built on its hosts, nothing saved: ``campaign`` is
    an unsaved row with every field set (or the existing draft's pk), ``nodes``/``tags`` what it names, ``targets``
    the nodes its runs use."""

    campaign: Campaign
    nodes: list[Node]
    tags: list[Tag]
    targets: list[Node]


def campaign_definition_check(*, data: dict[str, Any], owner: Any = None, team: Team | None = None) -> Definition:
    """Everything ``campaign_apply`` checks, without writing: the spec, the run limit, the inventory it names, the
    team rules, and every point built on its hosts (a refusal names the field). Previews call it; apply calls it
    and saves."""
    spec = spec_module.validate(data)
    limit = settings.RACKBENCH["MAX_RUNS_PER_CAMPAIGN"]
    size = planning.product_size(spec["matrix"], spec["rules"])
    count = (
        planning.run_count(
            spec["matrix"],
            spec["fixed"],
            spec["rules"],
            repetitions=spec["repetitions"],
            warmup_runs=spec["warmup_runs"],
        )
        if size <= limit * 10
        else size * (spec["repetitions"] + spec["warmup_runs"])
    )
    if count > limit:
        raise SpecError("matrix", f"expands to {count:,} runs, more than the limit of {limit:,} (RACKBENCH_MAX_RUNS)")
    nodes = _resolve_nodes(spec["nodes"], team)
    tags = _resolve_tags(spec["node_tags"], team)
    storage = _resolve_storage(spec["storage"], team)
    targets = select_nodes(nodes, tags, team)
    _check_node_axis(spec, available=len(targets))
    if spec["mounts"]:
        try:
            spec["mounts"] = validate_mounts(spec["mounts"], storage)
        except ParamError as exc:
            raise SpecError(exc.field, exc.message) from None
    login_node = spec["launcher"].get("login_node")
    if login_node and not in_team(Node.objects.filter(name=login_node), team).exists():
        raise SpecError("launcher.login_node", f"no node named {login_node!r} in the inventory")
    if spec["flush_storage"] and storage is None:
        raise SpecError("cache.flush_storage", "is true but the campaign names no storage system")
    existing = Campaign.objects.filter(name=spec["name"], team=team).first()
    _check_may_define(existing, team=team, owner=owner)
    campaign = Campaign(pk=existing.pk if existing else None, name=spec["name"], owner=owner, team=team)
    campaign.description = spec["description"]
    campaign.kind = spec["kind"]
    campaign.matrix = spec["matrix"]
    campaign.fixed = spec["fixed"]
    campaign.env = spec["env"]
    campaign.mounts = spec["mounts"]
    campaign.container = spec["container"]
    campaign.launcher = spec["launcher"]
    campaign.telemetry = spec["telemetry"]
    campaign.rules = spec["rules"]
    campaign.storage = storage
    campaign.repetitions = spec["repetitions"]
    campaign.warmup_runs = spec["warmup_runs"]
    campaign.flush_clients = spec["flush_clients"]
    campaign.flush_storage = spec["flush_storage"]
    campaign.run_timeout_s = spec["timeout"]
    campaign.family = spec["family"]
    campaign.verdict = spec["verdict"]
    _check_builds(campaign, spec, targets)
    return Definition(campaign, nodes, tags, targets)


def _check_may_define(existing: Campaign | None, *, team: Team | None, owner: Any) -> None:
    if existing and existing.status != CampaignStatus.DRAFT:
        raise CampaignError(
            f"campaign {existing.name} is {existing.status}; a launched campaign cannot be changed "
            f"(clone it: manage.py campaign clone {existing.name} NEW_NAME)",
            conflict=True,
        )
    if existing is None and team is None and owner is not None and not may_share(user=owner):
        raise CampaignError(
            "choose one of your teams: only staff create campaigns shared with every team", field="team"
        )


def campaign_apply(*, data: dict[str, Any], owner: Any = None, team: Team | None = None) -> Campaign:
    """Create or update a campaign of ``team`` from its definition (campaign as code). All or nothing."""
    checked = campaign_definition_check(data=data, owner=owner, team=team)
    fields = checked.campaign
    with transaction.atomic():
        # Names are unique per team: another team's campaign of that name is none of this one's business.
        campaign = Campaign.objects.select_for_update().filter(name=fields.name, team=team).first()
        _check_may_define(campaign, team=team, owner=owner)  # again, under the lock: a twin may have got there
        if campaign is None:
            campaign = fields
            campaign.pk = None
        else:
            for name in DEFINITION_FIELDS:
                setattr(campaign, name, getattr(fields, name))
        campaign.save()
        campaign.nodes.set(checked.nodes)
        campaign.node_tags.set(checked.tags)
    return campaign


DEFINITION_FIELDS = (
    "description", "kind", "matrix", "fixed", "env", "mounts", "container", "launcher", "telemetry", "rules",
    "storage", "repetitions", "warmup_runs", "flush_clients", "flush_storage", "run_timeout_s", "family", "verdict",
)  # fmt: skip


def _check_builds(campaign: Campaign, spec: dict[str, Any], targets: list[Node]) -> None:
    """Every point built on its hosts as its runs will build it; a refusal names the field."""
    from campaigns.selectors import campaign_build_check

    try:
        campaign_build_check(campaign=campaign, nodes=targets)
    except ParamError as exc:
        raise SpecError(spec_module.field_of(spec, exc.field), exc.message) from None


def select_nodes(
    explicit: list[Node], tags: list[Tag], team: Team | None, *, among: Iterable[Node] | None = None
) -> list[Node]:
    """The named nodes plus every active node of the team (or shared) with one of the tags, in name order (runs
    use it). The tagged nodes are picked from ``among`` when given: nodes loaded with their tags
    (``prefetch_related("tags")``), so that a page resolves many campaigns over one list of nodes without a query
    each (the timeline); else from the inventory. The rule is stated once, here, for both."""
    tag_ids = {t.pk for t in tags}
    if among is None:
        among = Node.objects.filter(tags__in=tag_ids).distinct().prefetch_related("tags") if tag_ids else []
    teams = {None, team.pk if team else None}  # as in_team
    nodes = {n.pk: n for n in explicit}
    for node in among:
        if node.status == NodeStatus.ACTIVE and node.team_id in teams and tag_ids & {t.pk for t in node.tags.all()}:
            nodes.setdefault(node.pk, node)
    return sorted(nodes.values(), key=lambda n: n.name)


def _check_node_axis(spec: dict[str, Any], *, available: int) -> None:
    counts = [v for name, values in spec["matrix"] if name == "nodes" for v in values]
    counts += [spec["fixed"]["nodes"]] if "nodes" in spec["fixed"] else []
    too_many = [c for c in counts if isinstance(c, int) and c > available]
    if too_many:
        field = "fixed.nodes" if "nodes" in spec["fixed"] else "matrix.nodes"
        raise SpecError(field, f"asks for {max(too_many)} nodes but the campaign selects {available}")


def _resolve_nodes(names: list[str], team: Team | None) -> list[Node]:
    found = {n.name: n for n in in_team(Node.objects.filter(name__in=names), team)}
    for i, name in enumerate(names):
        if name not in found:
            raise SpecError(f"nodes[{i}]", f"no node named {name!r} in the inventory")
    return [found[n] for n in names]


def _resolve_tags(names: list[str], team: Team | None) -> list[Tag]:
    """Tags carried by nodes the campaign may use: another team's tags are as unknown as missing ones."""
    usable = in_team(Node.objects.all(), team)
    found = {t.name: t for t in Tag.objects.filter(name__in=names, nodes__in=usable).distinct()}
    for i, name in enumerate(names):
        if name not in found:
            raise SpecError(f"node_tags[{i}]", f"no node carries the tag {name!r}")
    return [found[n] for n in names]


def _resolve_storage(name: str, team: Team | None) -> StorageSystem | None:
    if not name:
        return None
    storage = in_team(StorageSystem.objects.filter(name=name), team).first()
    if storage is None:
        raise SpecError("storage", f"no storage system named {name!r} in the inventory")
    return storage


def preset_instantiate(
    *,
    slug: str,
    name: str,
    nodes: list[str] | None = None,
    node_tags: list[str] | None = None,
    storage: str = "",
    owner: Any = None,
    team: Team | None = None,
) -> list[Campaign]:
    """Create the campaigns of a preset against this inventory, all of them or none."""
    from campaigns.presets import preset_get

    preset = preset_get(slug)
    if preset is None:
        raise SpecError("preset", f"no preset named {slug!r}")
    if "storage" in preset.needs and not storage:
        raise SpecError("storage", f"preset {slug} needs a storage system")
    created = []
    with transaction.atomic():
        for part in preset.campaigns:
            data = preset.definition(part, name=name)
            if Campaign.objects.filter(name=data["name"], team=team).exists():
                raise SpecError("name", f"a campaign named {data['name']!r} already exists")
            data.update(nodes=nodes or [], node_tags=node_tags or [], storage=storage)
            created.append(campaign_apply(data=data, owner=owner, team=team))
    return created


def campaign_clone(*, campaign: Campaign, name: str, owner: Any = None) -> Campaign:
    """A draft copy of ``campaign`` in the same team and family (a clone measures the same thing again)."""
    from campaigns.selectors import campaign_spec

    data = campaign_spec(campaign=campaign)
    data["name"] = name
    if Campaign.objects.filter(name=name, team=campaign.team).exists():
        raise SpecError("name", f"a campaign named {name!r} already exists")
    data.setdefault("family", campaign.family_name)
    return campaign_apply(data=data, owner=owner, team=campaign.team)


# --- launch and node reservations ---------------------------------------------------------------


def campaign_target_nodes(*, campaign: Campaign) -> list[Node]:
    """The nodes a run of the campaign uses: the named ones plus active nodes with a selected tag."""
    return select_nodes(list(campaign.nodes.all()), list(campaign.node_tags.all()), campaign.team)


def campaign_transition(*, campaign: Campaign, old: str, new: str, **fields: Any) -> bool:
    """Move a campaign from ``old`` to ``new``; False (and no change) when it was in another state."""
    return bool(Campaign.objects.filter(pk=campaign.pk, status=old).update(status=new, **fields))


def campaign_launch(*, campaign: Campaign, user: Any = None) -> Campaign:
    """Create every run of the campaign and start the first; draft -> running."""
    nodes = campaign_target_nodes(campaign=campaign)
    if not nodes:
        raise CampaignError("the campaign selects no active node", field="nodes")
    unusable = [n.name for n in nodes if n.status != NodeStatus.ACTIVE]
    if unusable:
        raise CampaignError(f"nodes not active (maintenance or retired): {', '.join(unusable)}", field="nodes")
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
        if any(n.status != NodeStatus.ACTIVE for n in nodes):
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


def campaign_advance_soon(*, campaign_id: int) -> None:
    """Advance the campaign in a task once the current transaction commits (every state change that may let a
    campaign go on ends with this)."""
    from campaigns.tasks import campaign_advance_task

    transaction.on_commit(partial(campaign_advance_task.delay, campaign_id))


def _has_busy_run(campaign: Campaign) -> bool:
    """A run of the campaign is under way, or one whose processes are still being killed: its nodes are in use."""
    return campaign.runs.filter(Q(status__in=RUN_ACTIVE) | Q(kill_pending=True)).exists()


def queue_ahead(*, campaign: Campaign) -> QuerySet[Campaign]:
    """The waiting campaigns served before ``campaign`` (first come, first served, per node).

    They joined the queue earlier (ties: lower id), want at least one of its nodes, and could start once their
    nodes are free: a campaign waiting for a node in maintenance does not hold up the ones behind it meanwhile.
    Empty when ``campaign`` is not waiting.
    """
    since = campaign.waiting_since
    if since is None or campaign.status != CampaignStatus.RUNNING:
        return Campaign.objects.none()
    through = Campaign.reserved_nodes.through.objects
    unusable = through.exclude(node__status=NodeStatus.ACTIVE).values("campaign_id")
    return (
        Campaign.objects.filter(Q(waiting_since__lt=since) | Q(waiting_since=since, pk__lt=campaign.pk))
        .filter(status=CampaignStatus.RUNNING, reserved_nodes__in=through.filter(campaign=campaign).values("node_id"))
        .exclude(pk__in=unusable)
        .distinct()
    )


def _reservation_take(campaign: Campaign) -> bool:
    """Lease every node the waiting ``campaign`` reserves, if they are active and free and it is its turn.

    Called with the campaign's row locked. The node rows are locked too (in id order, so two campaigns never
    deadlock), which orders this check against a concurrent change of a node's status; the lease's unique
    constraint settles a race for a node between two campaigns. True once it holds them all.
    """
    nodes = list(
        Node.objects.select_for_update(no_key=True, of=("self",)).filter(reserving_campaigns=campaign).order_by("pk")
    )
    held = set(campaign.leases.values_list("node_id", flat=True))
    taken = all(n.status == NodeStatus.ACTIVE for n in nodes) and not queue_ahead(campaign=campaign).exists()
    if taken:
        try:
            with transaction.atomic():
                NodeLease.objects.bulk_create(NodeLease(node=n, campaign=campaign) for n in nodes if n.pk not in held)
        except IntegrityError:  # another campaign holds one of them
            taken = False
    if not taken:
        if held and not _has_busy_run(campaign):
            _reservation_release(campaign, requeue=True)  # a waiting campaign holds nothing: no deadlock
        return False
    campaign_transition(campaign=campaign, old=CampaignStatus.RUNNING, new=CampaignStatus.RUNNING, waiting_since=None)
    campaign.waiting_since = None
    return True


def _reservation_release(campaign: Campaign, *, requeue: bool = False) -> None:
    """Give the campaign's nodes back (and take it out of the queue unless ``requeue``); the waiting campaigns
    that want one of its nodes are advanced as soon as this commits."""
    node_ids = set(campaign.reserved_nodes.values_list("pk", flat=True))
    node_ids |= set(campaign.leases.values_list("node_id", flat=True))
    campaign.leases.filter(held_for__isnull=True).delete()  # a node with a kill not confirmed stays held
    if not requeue:
        Campaign.objects.filter(pk=campaign.pk).update(waiting_since=None)
    waiting = (
        Campaign.objects.filter(status=CampaignStatus.RUNNING, waiting_since__isnull=False, reserved_nodes__in=node_ids)
        .exclude(pk=campaign.pk)
        .order_by("waiting_since", "pk")
        .values_list("pk", "waiting_since")
        .distinct()
    )
    for waiting_id, _ in waiting:
        campaign_advance_soon(campaign_id=waiting_id)


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
    from campaigns.baselines import campaign_judge

    verdict = campaign_judge(campaign=campaign)
    if verdict is None or verdict.final:  # else: suspected regressions are being re-run, the campaign goes on
        campaign_wind_down(campaign=campaign)
    return True


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


def campaign_wind_down(*, campaign: Campaign) -> str:
    """An ended campaign gives its nodes back only once nothing of it is left on them.

    Its runs' kills come first (each calls this again when it is done), then its containers are stopped and its
    storage unmounted (a task that calls ``campaign_release`` at its end), then its leases go and the waiting
    campaigns advance. So the next campaign never measures beside this one's dying processes or teardown.
    Returns what happened: "killing", "tearing down" or "released". The reconciler releases a campaign whose
    teardown task was lost.
    """
    if campaign.runs.filter(kill_pending=True).exists():
        return "killing"
    if campaign.mounts or campaign.container:
        transaction.on_commit(partial(dispatch.runner().teardown, campaign.pk))
        return "tearing down"
    _reservation_release(campaign)
    return "released"


def campaign_release(*, campaign_id: int) -> bool:
    """Give an ended campaign's nodes back (its teardown is done); nothing when it runs again (a re-run)."""
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().filter(pk=campaign_id).first()
        if campaign is None or campaign.status == CampaignStatus.RUNNING:
            return False
        _reservation_release(campaign)
    return True


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
    campaign.refresh_from_db()
    return campaign


# --- runs -----------------------------------------------------------------------------------------


def run_transition(*, run_id: int, old: Iterable[str], new: str, **fields: Any) -> bool:
    """Move a run from one of ``old`` to ``new``; False (and no change) when it was elsewhere."""
    fields.setdefault("heartbeat_at", timezone.now())
    return bool(Run.objects.filter(pk=run_id, status__in=list(old)).update(status=new, **fields))


def run_heartbeat(*, run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(heartbeat_at=timezone.now())


def run_finish(*, run_id: int, status: str, error: str = "", kill: bool = False) -> bool:
    """Put an active run in a terminal state and let its campaign go on (on the nodes it still holds).

    With ``kill``, its processes are killed on its hosts first (``run_killed`` lets the campaign go on then).
    A cancelled run keeps no results (a collect stores them only while the run is collecting, under a lock on its
    row, so none comes after this).
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
            campaign_advance_soon(campaign_id=Run.objects.values_list("campaign_id", flat=True).get(pk=run_id))
    return done


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
