"""Every analysis table as CSV or JSON, every chart as SVG: the page's own URL with ``?format=csv|json|svg``.

The export is built from the very rows the page shows, so the file and the table cannot disagree.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.http import content_disposition_header
from django.utils.text import slugify

from analysis import charts
from common import numbers

FORMATS = ("csv", "json", "svg")
ROW_UNIT = "<row>"  # a column's values are in the unit the row's own "unit" column names


@dataclass(frozen=True)
class Cell:
    """A table cell as the page shows it: the readable text (common.numbers) and the exact value for its tooltip."""

    text: str
    exact: str = ""
    numeric: bool = False


@dataclass
class Table:
    """Rows of exact values (what the exports hold) and, per column, the unit they are in (``units``: a unit, or
    ROW_UNIT for the row's "unit" column; a number in a column with none is a plain count). The page shows every
    number through common.numbers in its unit, with the exact value on hover; columns in ``export_only`` (the
    stored unit, once the numbers carry theirs) are left off the page."""

    slug: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)
    network: bool = False  # byte rates of a network transfer: shown in bits
    export_only: tuple[str, ...] = ()
    empty: str = ""  # why there are no rows, where the page knows better than "no succeeded runs"
    headings: dict[str, str] = field(default_factory=dict)  # a column's heading on the page, where its name is terse

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, (_plain(v) for v in row), strict=True)) for row in self.rows]

    @property
    def shown_columns(self) -> list[str]:
        return [self.headings.get(c, c) for c in self.columns if c not in self.export_only]

    def display(self) -> list[list[Cell]]:
        """The rows as the page shows them."""
        shown = [i for i, c in enumerate(self.columns) if c not in self.export_only]
        unit_at = self.columns.index("unit") if "unit" in self.columns else None
        out = []
        for row in self.rows:
            cells = []
            for i in shown:
                unit = self.units.get(self.columns[i])
                if unit == ROW_UNIT:
                    unit = str(row[unit_at] or "") if unit_at is not None else ""
                cells.append(_cell(row[i], unit, network=self.network))
            out.append(cells)
        return out


def _cell(value: Any, unit: str | None, *, network: bool) -> Cell:
    if value is None or value == "":
        return Cell(numbers.DASH, numeric=unit is not None)  # aligned with the numbers of its column
    if isinstance(value, bool):
        return Cell("yes" if value else "no")
    if not isinstance(value, int | float):
        return Cell(str(value))
    if unit is None:
        return Cell(numbers.plain(value), numbers.raw(value), True)
    return Cell(numbers.quantity(value, unit, network=network), numbers.raw(value, unit), True)


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: such a number is exported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _attachment(body: str | bytes, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(True, filename) or ""
    return response


def export(
    request: HttpRequest, *, name: str, tables: list[Table], figure: charts.Figure | None = None
) -> HttpResponse | str | None:
    """The download asked for by ``?format=``; None for the page itself; a message when it cannot be given."""
    fmt = request.GET.get("format", "").strip().lower()
    if not fmt or fmt == "html":
        return None
    if fmt not in FORMATS:
        return f"format={fmt!r} is not one of {', '.join(FORMATS)}"
    base = slugify(name) or "analysis"
    if fmt == "svg":
        if figure is None:
            return "this page has no chart to download yet"
        return _attachment(charts.svg(figure, standalone=True), "image/svg+xml", f"{base}.svg")
    wanted = request.GET.get("table", "").strip()
    table = next((t for t in tables if t.slug == wanted), None) if wanted else (tables[0] if tables else None)
    if table is None:
        known = ", ".join(t.slug for t in tables) or "none here yet"
        return f"table={wanted!r} is not a table of this page ({known})" if wanted else "this page has no table yet"
    filename = f"{base}-{table.slug}"
    if fmt == "json":
        body = json.dumps({"title": table.title, "columns": table.columns, "rows": table.records()}, indent=1)
        return _attachment(body, "application/json", f"{filename}.json")
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(table.columns)
    writer.writerows([["" if v is None else v for v in row] for row in table.rows])
    return _attachment(out.getvalue(), "text/csv; charset=utf-8", f"{filename}.csv")
