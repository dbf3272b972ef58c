"""Numbers as the analysis tables show them."""

from __future__ import annotations

from typing import Any

from django import template

from common import numbers

register = template.Library()


@register.filter
def num(value: Any) -> str:
    """A number with no unit (common.numbers.plain): whole numbers exact, others 4 significant digits; "—" for
    nothing; anything else as it is."""
    if value is None or value == "":
        return numbers.DASH
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return numbers.plain(value)
