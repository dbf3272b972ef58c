"""Series pulled from Prometheus over a run's time window, stored like the samplers' own (source "prometheus").

Queries come from the campaign (``telemetry: {prometheus: [{name:, query:, step:}]}``) and from a file of queries
pulled for every run (RACKBENCH_PROMETHEUS_QUERIES); a campaign's query replaces a default of the same name. A
query holding ``{host}`` or ``{address}`` is asked once per host of the run with the host's node name or address
put in (a plain text replacement: PromQL's own braces are left alone), and its series are stored under that host;
the others are asked once and stored under their ``instance`` label (or "prometheus"). Every series is a gauge
named ``prom.<name>`` in the query's ``unit``, its Prometheus labels kept. Counters are best asked as ``rate()``.

Prometheus never decides a run's outcome: what cannot be pulled is a warning in the run's provenance.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

from common.durations import duration_ns
from plugins.benchmarks.base import ParamError
from plugins.telemetry import validate_queries

MAX_POINTS = 11_000  # Prometheus refuses a query_range of more points per series than this
SUBSTITUTIONS = ("{host}", "{address}")
PREFIX = "prom."


class PrometheusError(Exception):
    """Prometheus could not answer a query: unreachable, an HTTP error, or its own "status": "error"."""


@dataclass(frozen=True)
class Query:
    name: str
    query: str
    step_ns: int | None = None
    unit: str = ""

    @property
    def per_host(self) -> bool:
        return any(token in self.query for token in SUBSTITUTIONS)

    def for_host(self, host: str, address: str) -> str:
        return self.query.replace("{host}", host).replace("{address}", address)


def default_queries() -> list[dict[str, Any]]:
    """The queries pulled for every run, from the file RACKBENCH_PROMETHEUS_QUERIES names (none without one)."""
    path = settings.RACKBENCH["PROMETHEUS_QUERIES"]
    if not path:
        return []
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ParamError("RACKBENCH_PROMETHEUS_QUERIES", f"cannot read {path}: {exc}") from None
    return validate_queries(data or [], "RACKBENCH_PROMETHEUS_QUERIES")


def queries_for(telemetry: dict[str, Any]) -> list[Query]:
    """The run's queries: the defaults, then the campaign's (which replace defaults of the same name)."""
    merged = {q["name"]: q for q in default_queries()}
    merged.update({q["name"]: q for q in telemetry.get("prometheus", [])})
    return [
        Query(q["name"], q["query"], duration_ns(q["step"], "step") if "step" in q else None, q.get("unit", ""))
        for q in merged.values()
    ]


def step_seconds(query: Query, telemetry: dict[str, Any], start: datetime, end: datetime) -> float:
    """The query's step, else the campaign's sampling interval, else RACKBENCH_PROMETHEUS_STEP; never so short that
    the window holds more points than Prometheus answers."""
    if query.step_ns:
        step = query.step_ns / 1e9
    elif telemetry.get("interval"):
        step = duration_ns(telemetry["interval"], "telemetry.interval") / 1e9
    else:
        step = settings.RACKBENCH["PROMETHEUS_STEP"]
    return max(step, (end - start).total_seconds() / (MAX_POINTS - 1))


def query_range(expr: str, *, start: datetime, end: datetime, step_s: float) -> list[dict[str, Any]]:
    """Prometheus' ``/api/v1/query_range`` answer for one expression: its list of {metric, values}."""
    url = settings.RACKBENCH["PROMETHEUS_URL"]
    params = {
        "query": expr,
        "start": f"{start.timestamp():.3f}",
        "end": f"{end.timestamp():.3f}",
        "step": f"{step_s:g}",
    }
    timeout = settings.RACKBENCH["PROMETHEUS_TIMEOUT"]
    request = urllib.request.Request(
        f"{url}/api/v1/query_range",
        data=urllib.parse.urlencode(params).encode(),  # POST: long queries do not fit in a URL
        headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        # Prometheus answers a bad query with 400 and a JSON error: its message says more than the status does.
        raise PrometheusError(_error_text(exc.read()) or f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PrometheusError(f"{url} cannot be reached: {reason}") from None
    try:
        answer = json.loads(body)
    except ValueError:
        raise PrometheusError(f"{url} did not answer JSON: {body[:200]!r}") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise PrometheusError(_error_text(body) or f"unexpected answer: {body[:200]!r}")
    data = answer.get("data") or {}
    if data.get("resultType") != "matrix":
        raise PrometheusError(f"the query gives a {data.get('resultType')}, not a range of samples")
    return list(data.get("result") or [])


def _error_text(body: bytes) -> str:
    try:
        answer = json.loads(body)
    except ValueError:
        return ""
    if isinstance(answer, dict) and answer.get("status") == "error":
        return f"{answer.get('errorType', 'error')}: {answer.get('error', '')}"
    return ""


def samples(values: list[list[Any]]) -> tuple[list[int], list[float]]:
    """A series' [[seconds, "value"], ...] as ns timestamps and finite floats (NaN and ±Inf are left out)."""
    timestamps, numbers = [], []
    for stamp, text in values:
        value = float(text)
        if math.isfinite(value):
            timestamps.append(round(float(stamp) * 1e9))
            numbers.append(value)
    return timestamps, numbers
