"""CSV for pipelines: ``?format=csv`` (or ``Accept: text/csv``) on the results, statistics, comparisons and verdicts.

One row per record; a nested value becomes dotted columns (``params.bs``, ``baseline.mean``), a list a JSON cell.
Values are written exactly as stored (no rounding, no unit prefix): the pages round, exports never do. A view
says what its rows are with ``csv_rows(data)``; otherwise a list, or a page's ``results``, is the rows.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from rest_framework.renderers import BaseRenderer


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}.") if value else {name: ""})
        elif isinstance(value, list | tuple):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = "" if value is None else value
    return out


def to_csv(rows: list[Mapping[str, Any]]) -> str:
    flat = [flatten(row) for row in rows]
    columns: dict[str, None] = {}
    for row in flat:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
    return out.getvalue()


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        context = renderer_context or {}
        view, response = context.get("view"), context.get("response")
        failed = response is not None and response.status_code >= 400
        csv_rows = getattr(view, "csv_rows", None)
        if not failed and csv_rows is not None:
            rows = csv_rows(data)
        elif isinstance(data, Mapping) and isinstance(data.get("results"), list) and not failed:
            rows = data["results"]
        elif isinstance(data, list):
            rows = data
        else:
            rows = [data] if data is not None else []
        return to_csv(rows).encode()
