"""``{% run_telemetry run %}``: a run's telemetry charts, for the run page (which campaigns renders without
importing telemetry: campaigns sits below it)."""

from __future__ import annotations

from typing import Any

from django import template

from telemetry.charts import run_charts

register = template.Library()


@register.inclusion_tag("telemetry/_charts.html", takes_context=True)
def run_telemetry(context: template.Context, run: Any) -> dict[str, Any]:
    request = context.get("request")
    params = request.GET if request is not None else {}
    series = list(run.series.order_by("host", "name", "labels_key"))
    return {"run": run, "request": request, **run_charts(series, params.get("t0"), params.get("t1"))}
