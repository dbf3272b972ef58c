"""A campaign's definition: checked against the spec, the inventory and the team rules, every point built on its
hosts, then saved (``campaign_apply``); presets and clones go through the same path."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet

from accounts.models import Team
from accounts.selectors import may_share
from campaigns import planning
from campaigns import spec as spec_module
from campaigns.drift import golden_node
from campaigns.errors import CampaignError
from campaigns.models import (
    Campaign,
    CampaignStatus,
)
from campaigns.presets import preset_get
from campaigns.selectors import campaign_build_check, campaign_spec
from campaigns.spec import SpecError
from inventory.models import Node, NodeStatus, StorageSystem, Tag
from plugins.benchmarks.base import ParamError
from plugins.mounts import validate_mounts

log = logging.getLogger(__name__)


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
    nodes, tags, storage = _resolve_inventory(spec, team)
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
    if spec["rules"].get("drift"):
        golden_node(spec["rules"]["drift"], team)  # the golden node exists
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
    campaign.statistic = spec["statistic"]
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
    "statistic",
)  # fmt: skip


def _check_builds(campaign: Campaign, spec: dict[str, Any], targets: list[Node]) -> None:
    """Every point built on its hosts as its runs will build it; a refusal names the field."""
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


def _resolve_inventory(spec: dict[str, Any], team: Team | None) -> tuple[list[Node], list[Tag], StorageSystem | None]:
    """The nodes, tags and storage system the spec names, as the team may use them."""
    usable = in_team(Node.objects.all(), team)
    nodes = _resolve(usable, spec["nodes"], field="nodes[{i}]", missing="no node named {name} in the inventory")
    # Tags carried by nodes the campaign may use: another team's tags are as unknown as missing ones.
    carried = Tag.objects.filter(nodes__in=usable).distinct()
    tags = _resolve(carried, spec["node_tags"], field="node_tags[{i}]", missing="no node carries the tag {name}")
    storages = in_team(StorageSystem.objects.all(), team)
    missing = "no storage system named {name} in the inventory"
    storage = _resolve(storages, [spec["storage"]], field="storage", missing=missing)[0] if spec["storage"] else None
    return nodes, tags, storage


M = TypeVar("M", Node, Tag, StorageSystem)


def _resolve(queryset: QuerySet[M], names: list[str], *, field: str, missing: str) -> list[M]:
    """The rows of ``queryset`` named ``names``, in that order. The first name not found is refused at ``field``
    with ``missing`` (templates: ``{i}`` the name's index, ``{name}`` the name)."""
    found = {row.name: row for row in queryset.filter(name__in=names)}
    for i, name in enumerate(names):
        if name not in found:
            raise SpecError(field.format(i=i), missing.format(name=repr(name)))
    return [found[n] for n in names]


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
    data = campaign_spec(campaign=campaign)
    data["name"] = name
    if Campaign.objects.filter(name=name, team=campaign.team).exists():
        raise SpecError("name", f"a campaign named {name!r} already exists")
    data.setdefault("family", campaign.family_name)
    return campaign_apply(data=data, owner=owner, team=campaign.team)
