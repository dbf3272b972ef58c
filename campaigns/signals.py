"""A node set back to active wakes the campaigns that wait for it or paused on it.

A node's status is changed in the admin, through the API or by an import, all of them a model save, so this is a
``post_save`` receiver rather than a service every one of those paths would have to remember to call.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from campaigns.models import Campaign, CampaignStatus
from campaigns.services import campaign_advance_soon
from inventory.models import Node, NodeStatus


def node_back_to_active(sender: type[Node], instance: Node, created: bool, **kwargs: Any) -> None:
    was = getattr(instance, "status_loaded", None)
    instance.status_loaded = instance.status
    if created or instance.status != NodeStatus.ACTIVE or was in (None, NodeStatus.ACTIVE):
        return
    wanting = (
        Campaign.objects.filter(status=CampaignStatus.RUNNING)
        .filter(Q(reserved_nodes=instance) | Q(leases__node=instance))
        .values_list("pk", flat=True)
        .distinct()
    )
    for campaign_id in wanting:
        campaign_advance_soon(campaign_id=campaign_id)
