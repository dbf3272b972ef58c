from __future__ import annotations

from typing import Any

from django import template

from campaigns.models import Campaign
from scheduling import selectors

register = template.Library()


@register.simple_tag
def campaign_queue(campaign: Campaign) -> dict[str, Any] | None:
    """``{% campaign_queue campaign as queue %}``: what the campaign waits for (see selectors.campaign_queue)."""
    return selectors.campaign_queue(campaign=campaign)
