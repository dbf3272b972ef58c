from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from campaigns import selectors

register = template.Library()


@register.filter
def chips(params: dict[str, Any] | None, fixed: dict[str, Any] | None = None) -> SafeString:
    """A point's parameters as ``key=value`` chips, the campaign's fixed ones left out (a filter, not an
    include: a statistics table of a large campaign draws hundreds of them)."""
    shown = [(key, value) for key, value in (params or {}).items() if key not in (fixed or {})]
    return format_html_join(" ", "<code>{}={}</code>", shown)


@register.filter
def duration(start: datetime | None, end: datetime | None) -> str:
    """'4.2 s', '3 min 07 s' or '2 h 05 min' between two datetimes; '—' when either is missing."""
    if not start or not end:
        return "—"
    return seconds(end - start)


@register.filter
def seconds(value: float | timedelta | None) -> str:
    """A number of seconds (or a timedelta) as '4.2 s', '3 min 07 s' or '2 h 05 min'; '—' for None."""
    if value is None:
        return "—"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    value = max(value, 0.0)
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def eta(campaign: Any) -> float | None:
    """Seconds left for a campaign annotated by selectors.with_live_counts; None before a run has ended."""
    return selectors.eta_seconds(mean=campaign.run_mean, total=campaign.run_total, done=campaign.run_done)
