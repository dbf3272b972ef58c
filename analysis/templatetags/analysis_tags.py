"""Numbers as the analysis tables show them."""

from __future__ import annotations

from html import escape
from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from analysis.reports import CompareRow
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


def _qty(value: Any, unit: str, *, plain_unit: bool = False) -> str:
    """campaigns' ``qty`` filter as a string: the value in its best prefix, the exact value on hover.

    ``plain_unit``: the unit holds nothing HTML reads as markup, and then neither does the text of a number in it
    (digits, separators, a prefix, that unit), which is not escaped again (thousands of cells on a compare page)."""
    text = numbers.quantity(value, unit)
    exact = numbers.raw(value, unit)
    if not (plain_unit and isinstance(value, int | float)):
        text, exact = escape(text), escape(exact)
    return f'<span class="qty" title="{exact}">{text}</span>' if exact else text


@register.filter
def point_items(points: list[dict[str, Any]]) -> SafeString:
    """The compare form's checkbox of each point of a campaign (analysis.selectors.point_choices, with its ``value``
    and whether it is ``checked``): a filter, not a template loop, as two large campaigns offer hundreds."""
    return mark_safe("\n".join(  # every text escaped
        f'<label class="picker-item" title="{escape(p["all_params"])}"><input type="checkbox" name="point" '
        f'value="{escape(p["value"])}"{" checked" if p["checked"] else ""}>\n'
        f'        <span>point {p["point"]}</span> <span class="muted small picker-name">{escape(p["params"])}</span>'
        "</label>"
        for p in points
    ))  # fmt: skip


@register.filter
def compare_rows(rows: list[CompareRow]) -> SafeString:
    """Every row of the compare table, one per line (``compare_row``): one call for the table, not one template
    loop step per row."""
    return mark_safe("\n".join(compare_row(row) for row in rows))  # each row escaped by compare_row


def compare_row(row: CompareRow) -> SafeString:
    """One row of the compare table: its point, metric and direction, then each set's cell (the value by the
    comparison's statistic ± its standard deviation, n, and the judged change).

    A filter that writes the row, not template tags for each cell: a comparison of two large campaigns has
    thousands of cells, and resolving each of their variables through the template engine was most of the page's
    time (issue 16)."""
    unit = row.unit
    plain = escape(unit) == unit
    direction = "↑ higher is better" if row.higher_is_better else "↓ lower is better"
    parts = [
        f'<tr><td class="params long-name">{escape(row.params or numbers.DASH)}</td>'
        f'<td><code>{escape(row.metric)}</code> <span class="muted small">{escape(unit)}</span>'
        f'<div class="muted small direction">{direction}</div></td>'
    ]
    for i, (cell, change) in enumerate(row.cells):
        shown = (
            f'{_qty(cell["value"], unit, plain_unit=plain)} <span class="muted small">± '
            f"{_qty(cell['stdev'], unit, plain_unit=plain)}, n={cell['n']}</span>"
            if cell
            else numbers.DASH
        )
        judged = f'<div class="change">{escape(change.text)}</div>' if i else ""
        parts.append(f'<td class="num {change.css}" title="{escape(change.reason)}">{shown}{judged}</td>')
    parts.append("</tr>")
    return mark_safe("".join(parts))  # every text above escaped
