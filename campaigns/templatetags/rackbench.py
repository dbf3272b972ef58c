from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from campaigns import selectors
from common import numbers

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


@register.filter
def qty(value: Any, unit: str = "") -> SafeString:
    """A measured value in its unit family's best prefix ("2.14 GB/s", "7.71 ms"), the exact value on hover."""
    text = numbers.quantity(value, unit or "")
    exact = numbers.raw(value, unit or "")
    return format_html('<span class="qty" title="{}">{}</span>', exact, text) if exact else format_html("{}", text)


@register.filter
def measure(result: Any) -> SafeString:
    """qty of anything with value, unit and name (a Result, a telemetry summary): network byte rates in bits."""
    name = getattr(result, "name", "") or ""
    text = numbers.quantity(result.value, result.unit, network=numbers.is_network(name))
    return format_html('<span class="qty" title="{}">{}</span>', numbers.raw(result.value, result.unit), text)


@register.filter
def measure_of(result: Any, series: str) -> SafeString:
    """measure of a telemetry summary Result, network byte rates in bits by its series' name; "—" for none."""
    if result is None or result == "":
        return format_html("{}", numbers.DASH)
    text = numbers.quantity(result.value, result.unit, network=numbers.is_network(series))
    return format_html('<span class="qty" title="{}">{}</span>', numbers.raw(result.value, result.unit), text)


@register.filter
def qty_text(value: Any, unit: str = "") -> str:
    """qty as plain text, for attributes and option labels."""
    return numbers.quantity(value, unit or "")
