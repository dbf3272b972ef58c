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

FORMATS = ("csv", "json", "svg")


@dataclass
class Table:
    slug: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, (_plain(v) for v in row), strict=True)) for row in self.rows]


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
