"""The node queue: a running campaign holds its nodes (one ``NodeLease`` row per node, unique) from its first run
until it has wound down; campaigns waiting for a node take it in queue order (``Campaign.waiting_since``) under
row locks, and are advanced the moment it is given back."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from campaigns import dispatch
from campaigns.models import (
    RUN_ACTIVE,
    Campaign,
    CampaignStatus,
    NodeLease,
)
from inventory.models import Node, NodeStatus

log = logging.getLogger(__name__)


def campaign_transition(*, campaign: Campaign, old: str, new: str, **fields: Any) -> bool:
    """Move a campaign from ``old`` to ``new``; False (and no change) when it was in another state."""
    return bool(Campaign.objects.filter(pk=campaign.pk, status=old).update(status=new, **fields))


def _has_busy_run(campaign: Campaign) -> bool:
    """A run of the campaign is under way, or one whose processes are still being killed: its nodes are in use."""
    return campaign.runs.filter(Q(status__in=RUN_ACTIVE) | Q(kill_pending=True)).exists()


def campaign_advance_soon(*, campaign_id: int) -> None:
    """Advance the campaign in a task once the current transaction commits (every state change that may let a
    campaign go on ends with this)."""
    transaction.on_commit(partial(dispatch.advance(), campaign_id))


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
    usable = campaign.usable_node_statuses
    taken = all(n.status in usable for n in nodes) and not queue_ahead(campaign=campaign).exists()
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
