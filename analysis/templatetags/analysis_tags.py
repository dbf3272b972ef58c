"""Numbers as the analysis tables show them."""

from __future__ import annotations

import math
from typing import Any

from django import template

register = template.Library()


@register.filter
def num(value: Any) -> str:
    """Four significant digits, thousands separated, no exponent for large values; "—" for nothing."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "—"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
