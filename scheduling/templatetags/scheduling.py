from __future__ import annotations

from typing import Any

from django import template

from accounts.selectors import scope_for
from campaigns.models import Campaign
from scheduling import selectors

register = template.Library()


@register.simple_tag(takes_context=True)
def campaign_queue(context: template.Context, campaign: Campaign) -> dict[str, Any] | None:
    """``{% campaign_queue campaign as queue %}``: what the campaign waits for (see selectors.campaign_queue),
    holders named as the viewer may see them."""
    request = context.get("request")
    scope = scope_for(request) if request is not None else None
    return selectors.campaign_queue(campaign=campaign, scope=scope)
