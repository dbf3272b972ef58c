from __future__ import annotations

from datetime import datetime

from django import template

register = template.Library()


@register.filter
def duration(start: datetime | None, end: datetime | None) -> str:
    """'4.2 s', '3 min 07 s' or '2 h 05 min' between two datetimes; '—' when either is missing."""
    if not start or not end:
        return "—"
    seconds = max((end - start).total_seconds(), 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
