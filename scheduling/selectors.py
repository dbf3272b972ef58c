"""Reads for the scheduling pages: schedules and their next times, a campaign's place in the queue, the timeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from accounts.selectors import Scope
from campaigns.models import Campaign, CampaignStatus
from campaigns.services import queue_ahead, select_nodes
from inventory.models import Node, NodeStatus
from scheduling import recurrence
from scheduling.models import Firing, Schedule, ScheduleKind
from scheduling.services import display_tz


def schedule_list(*, scope: Scope) -> QuerySet[Schedule]:
    """The schedules of the scope's teams with their firing counts (one query)."""
    schedules = Schedule.objects.select_related("campaign", "created_by").annotate(
        fired=Count("firings"),
        failed=Count("firings", filter=~Q(firings__error="")),
        last_fired_at=Max("firings__fired_at"),
    )
    return scope.filter(schedules, "campaign__team")


def next_runs(
    schedule: Schedule, *, count: int = 5, after: datetime | None = None, until: datetime | None = None
) -> list[datetime]:
    """When the schedule fires next (in the display time zone); nothing while it is disabled."""
    after = after or timezone.now()
    if not schedule.enabled:
        return []
    if schedule.kind == ScheduleKind.ONCE:
        run_at = schedule.run_at
        due = run_at is not None and run_at > after and (until is None or run_at <= until)
        return [timezone.localtime(run_at, display_tz())] if due and run_at else []
    return recurrence.next_times(schedule.cron, after=after, tz=display_tz(), count=count, until=until)


def schedule_firings(*, schedule: Schedule, limit: int = 50) -> QuerySet[Firing]:
    return schedule.firings.select_related("campaign")[:limit]


# --- the queue ------------------------------------------------------------------------------------


@dataclass
class Holder:
    """A campaign as a reader may see it: another team's campaign has no name."""

    campaign: Campaign
    visible: bool
    nodes: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # nodes kept for a kill that is not confirmed, with the reason

    @property
    def label(self) -> str:
        return self.campaign.name if self.visible else "another team's campaign"


def _lease_holder(node: Node) -> Campaign | None:
    lease = getattr(node, "lease", None)  # the reverse one-to-one raises an AttributeError when there is none
    return lease.campaign if lease is not None else None


def _kept(node: Node) -> list[str]:
    """Why the node's lease is kept past its campaign (a kill that is not confirmed), as the queue shows it."""
    lease = getattr(node, "lease", None)
    if lease is None or lease.held_for_id is None:
        return []
    return [f"{node.name}: the kill of run {lease.held_for_id} is not confirmed, a job may still be running there "
            f"({lease.held_reason})"]  # fmt: skip


def campaign_queue(*, campaign: Campaign, scope: Scope | None = None) -> dict[str, Any] | None:
    """What a running campaign waits for, or None when it waits for nothing (two queries; none unless running).
    A holder is named when ``scope`` sees it (without a scope: when it is shared or of the campaign's team).

    ``waiting``: it is in the queue for its nodes; ``position`` (1 = next) counts the campaigns served before
    it (``campaigns.services.queue_ahead``); ``holders``: who holds the nodes it wants; ``inactive``: its nodes
    in maintenance or retired (a campaign never uses those: it waits until they are active again, or, when it
    runs already, its next run does: ``paused``).
    """
    if campaign.status != CampaignStatus.RUNNING:
        return None
    nodes = list(campaign.reserved_nodes.select_related("lease__campaign").order_by("name"))
    inactive = [n for n in nodes if n.status != NodeStatus.ACTIVE]
    if campaign.waiting_since is None:
        return {"waiting": False, "paused": True, "inactive": inactive} if inactive else None
    holders: dict[int, Holder] = {}
    for node in nodes:
        holder = _lease_holder(node)
        if holder is not None and holder.pk != campaign.pk:
            visible = scope.sees(holder.team_id) if scope else holder.team_id in (None, campaign.team_id)
            entry = holders.setdefault(holder.pk, Holder(holder, visible))
            entry.nodes.append(node.name)
            entry.kept += _kept(node)
    return {
        "waiting": True,
        "paused": False,
        "since": campaign.waiting_since,
        "position": queue_ahead(campaign=campaign).count() + 1,
        "holders": list(holders.values()),
        "inactive": inactive,
    }


# --- the timeline ---------------------------------------------------------------------------------

TIMELINE_WIDTH = 480  # SVG pixels for the next 24 h


@dataclass
class TimelineRow:
    node: Node
    holder: Holder | None = None
    waiting: list[Holder] = field(default_factory=list)
    firings: list[dict[str, Any]] = field(default_factory=list)


def _schedule_node_ids(schedule: Schedule, nodes: list[Node]) -> list[int]:
    """The nodes a firing of the schedule would use, by ``campaigns.services.select_nodes`` (the rule a launch
    follows), its tagged ones picked from ``nodes`` (loaded with their tags): no query."""
    campaign = schedule.campaign
    named, tags = list(campaign.nodes.all()), list(campaign.node_tags.all())
    return [n.pk for n in select_nodes(named, tags, campaign.team, among=nodes)]


def timeline(*, scope: Scope, now: datetime | None = None, hours: int = 24) -> list[TimelineRow]:
    """For each node the scope sees: the campaign holding it now, the campaigns waiting for it (in queue
    order) and the schedules that fire within ``hours`` and would use it. Other teams' campaigns and schedules
    are shown without their names. A fixed number of queries, whatever the number of nodes and schedules."""
    now = now or timezone.now()
    until = now + timedelta(hours=hours)
    nodes = list(scope.filter(Node.objects.select_related("lease__campaign").prefetch_related("tags")).order_by("name"))
    rows = {n.pk: TimelineRow(node=n) for n in nodes}
    for row in rows.values():
        holder = _lease_holder(row.node)
        if holder is not None:
            row.holder = Holder(holder, scope.sees(holder.team_id), kept=_kept(row.node))
    through = Campaign.reserved_nodes.through.objects
    waits = (
        through.filter(node_id__in=rows, campaign__status=CampaignStatus.RUNNING, campaign__waiting_since__isnull=False)
        .select_related("campaign")
        .order_by("campaign__waiting_since", "campaign_id")
    )
    for wait in waits:
        rows[wait.node_id].waiting.append(Holder(wait.campaign, scope.sees(wait.campaign.team_id)))
    schedules = Schedule.objects.filter(enabled=True).select_related("campaign__team")
    for schedule in schedules.prefetch_related("campaign__nodes", "campaign__node_tags"):
        times = next_runs(schedule, after=now, until=until, count=100)
        if not times:
            continue
        visible = scope.sees(schedule.campaign.team_id)
        for node_id in _schedule_node_ids(schedule, nodes):
            if node_id not in rows:
                continue  # a node the scope does not see
            for at in times:
                x = round((at - now).total_seconds() / (hours * 3600) * TIMELINE_WIDTH, 1)
                rows[node_id].firings.append({"at": at, "schedule": schedule, "visible": visible, "x": x})
    for row in rows.values():
        row.firings.sort(key=lambda f: f["at"])
    return list(rows.values())
