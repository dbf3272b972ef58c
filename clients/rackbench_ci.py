#!/usr/bin/env python3
"""rackbench CI client: create a campaign, launch it, follow it to its end and judge it against its baseline.

It needs nothing but Python 3.9+'s standard library, so that a pipeline can carry this one file:

    python3 rackbench_ci.py run --url https://rackbench.example --file campaign.yaml --junit rackbench.xml

Exit codes: 0 pass, 1 regression, 2 error (see ``exit_code``). Run ``rackbench_ci.py run --help`` for the options
and docs/ci.md in the rackbench repository for pipeline examples.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2

CAMPAIGN_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# Worst last: a campaign's outcome is the worst of its verdict's outcome and its items' outcomes.
OUTCOME_RANK = {"pass": 0, "improvement": 1, "inconclusive": 2, "regression": 3}

# Seconds to wait before each retry of a transient failure (then scaled by a random jitter of 0.5..1.5).
RETRY_DELAYS: tuple[float, ...] = (1.0, 3.0, 9.0)
TRANSIENT_STATUS = frozenset({502, 503, 504})
REQUEST_TIMEOUT_S = 60.0
DEFAULT_TIMEOUT_S = 6 * 3600.0
# socket.timeout is TimeoutError from Python 3.10 on, but a separate OSError in 3.9.
TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, socket.timeout)


class CiError(Exception):
    """Anything that ends a campaign's follow-up (or the whole run) with exit code 2."""

    kind = "error"


class UsageError(CiError):
    """Bad command-line arguments."""


class ApiError(CiError):
    """An answer of the API in its one error shape, ``{"message": ..., "extra": {...}}``, or no answer at all."""

    kind = "api-error"

    def __init__(self, where: str, status: int | None, message: str, extra: Mapping[str, Any] | None = None):
        self.status = status
        self.message = message
        self.extra = dict(extra or {})
        text = f"{where}: " + (f"HTTP {status}: " if status else "") + message
        if self.extra:
            text += " " + json.dumps(self.extra, sort_keys=True, default=str)
        if status in (401, 403):
            text += " (check --token / RACKBENCH_TOKEN and the token's scope)"
        super().__init__(text)


class _Transient(Exception):
    """A failure worth retrying; ``unsent`` when the request certainly never reached the application."""

    def __init__(self, what: str, *, unsent: bool, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.unsent = unsent
        self.retry_after = retry_after  # the server's Retry-After (a 429), in seconds


# --- the HTTP API ---------------------------------------------------------------------------------------


class Api:
    """The rackbench REST API (``/api/v1/``) with bearer-token authentication and retries of transient failures."""

    def __init__(self, base_url: str, token: str, *, insecure: bool = False, note: Callable[[str], None]) -> None:
        self.base_url = base_url
        self.token = token
        self.note = note
        self.context: ssl.SSLContext | None = None
        if insecure:
            self.context = ssl.create_default_context()
            self.context.check_hostname = False
            self.context.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: Any = None, *, headers: Mapping[str, str] | None = None) -> Any:
        """Send one request and return its decoded JSON answer; raise ``ApiError`` for any error answer.

        Connection failures and 502/503/504 are retried with backoff. A request that may be replayed (a GET, or a
        POST whose Idempotency-Key the server deduplicates) is retried after any of them; another POST (create,
        verdict) only when it certainly did not reach the application (connection refused, 503), so that a
        retry never creates a second campaign.
        """
        replayable = method == "GET" or "Idempotency-Key" in (headers or {})
        attempt = 0
        while True:
            try:
                return self._send(method, path, body, headers or {})
            except _Transient as exc:
                if attempt == len(RETRY_DELAYS) or not (replayable or exc.unsent):
                    tries = f" (after {attempt + 1} attempts)" if attempt else ""
                    raise ApiError(f"{method} {path}", None, f"{exc}{tries}") from None
                delay = RETRY_DELAYS[attempt] * random.uniform(0.5, 1.5)
                if exc.retry_after is not None:
                    delay = min(max(delay, exc.retry_after), 120.0)
                attempt += 1
                self.note(f"{method} {path}: {exc}; retry {attempt}/{len(RETRY_DELAYS)} in {delay:.1f} s")
                time.sleep(delay)

    def _send(self, method: str, path: str, body: Any, headers: Mapping[str, str]) -> Any:
        url = self.base_url + path
        request = urllib.request.Request(
            url,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/json",
                "Content-Type": "application/json",
                "User-Agent": "rackbench-ci/1",
                **headers,
            },
        )
        where = f"{method} {path}"
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=self.context) as response:
                return _decode_json(response.read(), where, response.status)
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            if exc.code in TRANSIENT_STATUS:
                raise _Transient(f"HTTP {exc.code}", unsent=exc.code == 503) from None
            if exc.code == 429:  # throttled before the view ran: nothing happened, send it again when told
                wait = exc.headers.get("Retry-After", "")
                raise _Transient("HTTP 429 (too many requests)", unsent=True,
                                 retry_after=float(wait) if wait.isdigit() else None) from None  # fmt: skip
            raise ApiError(where, exc.code, *_error_fields(payload)) from None
        except urllib.error.URLError as exc:
            if _is_transient(exc.reason):
                raise _Transient(f"cannot reach {url}: {exc.reason}", unsent=_is_refused(exc.reason)) from None
            hint = " (--insecure skips TLS verification)" if isinstance(exc.reason, ssl.SSLError) else ""
            raise ApiError(where, None, f"cannot reach {url}: {exc.reason}{hint}") from None
        except (OSError, http.client.HTTPException) as exc:
            # Raised while reading the answer: the request did reach the server.
            if isinstance(exc, http.client.HTTPException) or _is_transient(exc):
                raise _Transient(f"{url}: {exc or type(exc).__name__}", unsent=False) from None
            raise ApiError(where, None, f"{url}: {exc}") from None


def _is_transient(reason: object) -> bool:
    return isinstance(reason, (ConnectionError, *TIMEOUT_ERRORS))


def _is_refused(reason: object) -> bool:
    return isinstance(reason, ConnectionRefusedError)


def _decode_json(payload: bytes, where: str, status: int) -> Any:
    if not payload.strip():
        return {}
    try:
        return json.loads(payload)
    except ValueError:
        raise ApiError(where, status, f"the answer is not JSON (is --url right?): {_excerpt(payload)}") from None


def _error_fields(payload: bytes) -> tuple[str, dict[str, Any]]:
    """The message and extra of an error answer; a proxy's HTML page becomes a short excerpt."""
    try:
        data = json.loads(payload)
    except ValueError:
        return _excerpt(payload) or "(empty answer)", {}
    if isinstance(data, dict) and "message" in data:
        extra = data.get("extra")
        return str(data["message"]), extra if isinstance(extra, dict) else {}
    if isinstance(data, dict) and "detail" in data:
        return str(data["detail"]), {}
    return _excerpt(payload), {}


def _excerpt(payload: bytes, limit: int = 200) -> str:
    text = " ".join(payload.decode("utf-8", "replace").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- one campaign, followed from launch to verdict ----------------------------------------------------------


@dataclass
class Tracked:
    """What the client knows about one campaign; ``done`` once it has its verdict or has failed."""

    campaign: dict[str, Any]
    done: bool = False
    verdict: dict[str, Any] | None = None
    no_baseline: str | None = None
    error: str | None = None
    error_type: str = ""
    started_at: float = 0.0  # time.time() at launch, for the JUnit timestamp
    started: float = 0.0  # time.monotonic() at launch
    ended: float = 0.0
    progress: str = ""
    fleet: dict[str, Any] | None = None  # the node-level verdict (GET .../fleet/), with --fleet-threshold

    @property
    def name(self) -> str:
        return str(self.campaign.get("name") or f"campaign {self.campaign.get('id', '?')}")

    @property
    def duration(self) -> float:
        return max(0.0, self.ended - self.started) if self.started else 0.0

    def finish(self) -> None:
        self.done = True
        self.ended = time.monotonic()

    def fail(self, message: str, error_type: str = "error") -> None:
        self.error, self.error_type = message, error_type
        self.finish()


@dataclass(frozen=True)
class Policy:
    """What the verdicts are asked for, and how their outcomes become an exit code."""

    baseline: int | None = None
    threshold_pct: float | None = None
    alpha: float | None = None
    fail_on_inconclusive: bool = False
    require_baseline: bool = False
    fleet_threshold: float | None = None  # judge every node against the fleet too; an outlier or suspect fails (exit 1)

    def verdict_request(self) -> dict[str, Any]:
        """The body of ``POST .../verdict/``: only the options given, the server's policy fills in the rest."""
        body = {"baseline": self.baseline, "threshold_pct": self.threshold_pct, "alpha": self.alpha}
        return {k: v for k, v in body.items() if v is not None}


class Console:
    """Progress and the summary on stdout; errors on stderr, one line each."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet

    def info(self, line: str) -> None:
        if not self.quiet:
            print(line, flush=True)

    def result(self, line: str) -> None:
        print(line, flush=True)

    def note(self, line: str) -> None:
        if not self.quiet:
            print(f"rackbench-ci: {line}", file=sys.stderr, flush=True)

    def error(self, line: str) -> None:
        print(f"rackbench-ci: error: {line}", file=sys.stderr, flush=True)


def create_campaigns(api: Api, args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise CiError(f"{args.file}: {exc.strerror}") from None
        body: dict[str, Any] = {"yaml": text}
        if args.family:
            body["family"] = args.family
        if args.name:  # a new name per pipeline run, the file unchanged
            body["name"] = args.name
        created = _campaign_json(api.call("POST", "/api/v1/campaigns/", body), "POST /api/v1/campaigns/")
        # A family the server dropped would leave the campaign without baseline: a silent pass.
        if args.family and created.get("family", args.family) != args.family:
            raise CiError(
                f"campaign {created.get('name')} (#{created['id']}) was created in family {created['family']!r}, "
                f"not {args.family!r}: set family: in the YAML file instead"
            )
        return [created]
    path = f"/api/v1/presets/{urllib.parse.quote(args.preset, safe='')}/instantiate/"
    body = {"name": args.name, "nodes": args.nodes, "node_tags": args.node_tags}
    if args.storage:
        body["storage"] = args.storage
    created = api.call("POST", path, body)
    campaigns = created.get("campaigns") if isinstance(created, dict) else None
    if not isinstance(campaigns, list) or not campaigns:
        raise CiError(f"POST {path}: the answer lists no campaigns")
    return [_campaign_json(c, f"POST {path}") for c in campaigns]


def _campaign_json(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("id"), int):
        raise CiError(f"{where}: the answer is not a campaign: {_excerpt(json.dumps(data).encode())}")
    return data


def launch(api: Api, t: Tracked, key: str) -> None:
    """Launch with ``Idempotency-Key: <key>-<id>``: a retried launch gets the first answer back, not a 409."""
    cid = t.campaign["id"]
    t.started_at, t.started = time.time(), time.monotonic()
    answer = api.call("POST", f"/api/v1/campaigns/{cid}/launch/", headers={"Idempotency-Key": f"{key}-{cid}"})
    if isinstance(answer, dict) and answer.get("id") == cid:
        t.campaign = answer


def step(api: Api, t: Tracked, policy: Policy, console: Console) -> None:
    """One poll of a campaign that is not done: its status, then its verdict once it has ended.

    The server judges a campaign as it ends (re-running suspected regressions first, while it still reads
    "running"), so a succeeded campaign's verdict is final.
    """
    cid = t.campaign["id"]
    t.campaign = _campaign_json(api.call("GET", f"/api/v1/campaigns/{cid}/"), f"GET /api/v1/campaigns/{cid}/")
    _show_progress(t, console)
    status = t.campaign.get("status")
    if status == "succeeded":
        _verdict(api, t, policy)
        if policy.fleet_threshold is not None:
            _fleet(api, t, policy.fleet_threshold)
    elif status in CAMPAIGN_TERMINAL:
        t.fail(f"campaign {status}: {_runs(t.campaign)}", f"campaign-{status}")


def _verdict(api: Api, t: Tracked, policy: Policy) -> None:
    """The verdict the server stored when the campaign ended; a fresh one only when this pipeline asks for other
    options (``--baseline``, ``--threshold``, ``--alpha``) or none was stored (the family had no baseline)."""
    path = f"/api/v1/campaigns/{t.campaign['id']}/verdict/"
    options = policy.verdict_request()
    verdict = None
    if not options:
        try:
            verdict = api.call("GET", path)
        except ApiError as exc:
            if exc.status != 404:
                raise
    if verdict is None:
        try:
            verdict = api.call("POST", path, options)
        except ApiError as exc:
            if exc.status == 404 and exc.extra.get("reason") == "no-baseline":
                t.no_baseline = exc.message
                t.finish()
                return
            raise
    t.verdict = _verdict_json(verdict, path)
    t.finish()


def _fleet(api: Api, t: Tracked, threshold: float) -> None:
    """The node-level verdict: every node against the campaign's fleet, outliers named with their evidence."""
    path = f"/api/v1/campaigns/{t.campaign['id']}/fleet/?threshold={threshold:g}"
    data = api.call("GET", path)
    if not isinstance(data, dict) or not isinstance(data.get("outliers"), list):
        raise CiError(f"{path}: the answer is not a fleet view: {_excerpt(json.dumps(data).encode())}")
    t.fleet = data


def _outliers(t: Tracked) -> list[dict[str, Any]]:
    """The nodes the fleet view names: outliers, and suspects (a node with an outlier GPU or NIC)."""
    nodes = t.fleet.get("nodes") if t.fleet else None
    named = ("outlier", "suspect")
    return [n for n in nodes if isinstance(n, dict) and n.get("verdict") in named] if isinstance(nodes, list) else []


def _verdict_json(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict) or data.get("outcome") not in OUTCOME_RANK:
        raise CiError(f"{where}: the answer is not a verdict: {_excerpt(json.dumps(data).encode())}")
    return data


def _runs(campaign: Mapping[str, Any]) -> str:
    return (
        f"{campaign.get('run_done', '?')}/{campaign.get('run_total', '?')} runs done, "
        f"{campaign.get('run_failed', 0)} failed"
    )


def _show_progress(t: Tracked, console: Console) -> None:
    line = f"[{t.name}] {_runs(t.campaign)} ({t.campaign.get('status', '?')})"
    if line != t.progress:
        t.progress = line
        console.info(line)


def follow(
    api: Api, tracked: list[Tracked], policy: Policy, *, poll_s: float, timeout_s: float, console: Console
) -> None:
    """Poll every campaign that is not done until all are, or until ``timeout_s`` has passed since the call.

    An API error ends the follow-up of the campaign it concerns, not of the others.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        for t in tracked:
            if t.done:
                continue
            try:
                step(api, t, policy, console)
            except CiError as exc:
                t.fail(str(exc), exc.kind)
            if t.error:
                console.error(f"{t.name}: {t.error}")
        pending = [t for t in tracked if not t.done]
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            for t in pending:
                t.fail(f"timed out after {_duration_text(timeout_s)} waiting for it to end", "timeout")
                console.error(f"{t.name}: {t.error}")
            return
        time.sleep(min(poll_s, left))


# --- outcomes and exit codes ---------------------------------------------------------------------------------


def campaign_outcome(t: Tracked) -> str:
    """``error``, ``no baseline``, or the worst of the verdict's outcome and its items' outcomes."""
    if t.error:
        return "error"
    if t.verdict is None and _outliers(t):
        return "regression"
    if t.verdict is None:
        return "no baseline" if t.no_baseline is not None else "error"
    outcomes = [str(t.verdict.get("outcome"))] + [str(i.get("outcome")) for i in _items(t.verdict)]
    if _outliers(t):
        outcomes.append("regression")  # a node below its fleet fails the campaign as a regression would
    return max(outcomes, key=lambda o: OUTCOME_RANK.get(o, -1))


def campaign_exit(t: Tracked, policy: Policy) -> int:
    outcome = campaign_outcome(t)
    if outcome == "error" or (outcome == "no baseline" and policy.require_baseline):
        return EXIT_ERROR
    if outcome == "regression" or (outcome == "inconclusive" and policy.fail_on_inconclusive):
        return EXIT_REGRESSION
    return EXIT_PASS


def exit_code(tracked: Sequence[Tracked], policy: Policy) -> int:
    """The worst campaign decides: an error (2) wins over a regression (1), since the answer is then incomplete."""
    return max((campaign_exit(t, policy) for t in tracked), default=EXIT_ERROR)


def _items(verdict: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = verdict.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


# --- the summary table ----------------------------------------------------------------------------------------

TABLE_HEADER = ("campaign", "point", "metric", "baseline", "candidate", "change", "p", "outcome")
RIGHT_ALIGNED = frozenset({"baseline", "candidate", "change", "p"})


def summary_lines(tracked: Sequence[Tracked], policy: Policy, base_url: str, *, table: bool = True) -> list[str]:
    """The results table (one row per matrix point and metric), then one line per campaign and the overall one."""
    lines = format_table([TABLE_HEADER, *(row for t in tracked for row in _rows(t))]) if table else []
    for t in tracked:
        lines.append(f"{t.name}: {_campaign_line(t)}" + (f"  {ui_link(base_url, t)}" if "id" in t.campaign else ""))
    code = exit_code(tracked, policy)
    worst = max((campaign_outcome(t) for t in tracked), key=_severity, default="error")
    lines.append(f"overall: {worst} (exit {code})")
    return lines


def _severity(outcome: str) -> int:
    return {"error": 10, "no baseline": 1}.get(outcome, OUTCOME_RANK.get(outcome, 0))


def _rows(t: Tracked) -> list[tuple[str, ...]]:
    if t.verdict is None:
        return [(t.name, "-", "-", "-", "-", "-", "-", campaign_outcome(t))]
    return [
        (
            t.name,
            point_label(item),
            f"{item.get('metric', '?')}",  # the values carry the unit
            _num(_value(item.get("baseline"), _statistic(t.verdict)), item.get("unit", "")),
            _num(_value(item.get("candidate"), _statistic(t.verdict)), item.get("unit", "")),
            "-" if item.get("change_pct") is None else f"{item['change_pct']:+.1f}%",
            _p(item.get("p_value")),
            str(item.get("outcome", "?")),
        )
        for item in _items(t.verdict)
    ]


def format_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns as wide as their widest cell; numbers right-aligned so that their digits line up."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_HEADER))]
    right = [name in RIGHT_ALIGNED for name in TABLE_HEADER]
    return [
        "  ".join(cell.rjust(widths[i]) if right[i] else cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]


def _campaign_line(t: Tracked) -> str:
    if t.error:
        return f"error: {t.error}"
    if t.verdict is None:
        return f"no baseline: {t.no_baseline}" + _fleet_text(t)
    counts = t.verdict.get("counts")
    if not isinstance(counts, dict):
        counts = {}
        for item in _items(t.verdict):
            counts[item.get("outcome")] = counts.get(item.get("outcome"), 0) + 1
    shown = ", ".join(f"{counts[o]} {o}" for o in OUTCOME_RANK if counts.get(o))
    line = campaign_outcome(t) + (f" ({shown})" if shown else "")
    baseline = t.verdict.get("baseline_campaign")
    if isinstance(baseline, dict):
        line += f" against {baseline.get('name')} (#{baseline.get('id')})"
    line += f", by the {_statistic(t.verdict)} of each side's repetitions"
    differences: list[Any] = next(
        (i["differences"] for i in _items(t.verdict) if isinstance(i.get("differences"), list)), []
    )
    if differences:  # the server judged nothing across different configurations: say what differs
        line += "; not comparable: " + "; ".join(str(d) for d in differences)
    return line + _fleet_text(t)


def _fleet_text(t: Tracked) -> str:
    """The node-level verdict after the campaign's: each outlier node with its worst evidence, each suspect node
    with its outlier device (``node3 suspect: gpu3 gpu.sm_clock_mhz.mean at 33% of the fleet's GPUs``)."""
    if t.fleet is None:
        return ""
    found, suspects = [], []
    for node in _outliers(t):
        if node.get("verdict") == "outlier":
            found.append(f"{node.get('node')} ({_worst(node.get('evidence'), 'the fleet')})")
            continue
        devices = node.get("devices")
        named = []
        for d in (d for d in (devices if isinstance(devices, list) else []) if isinstance(d, dict)):
            peers = "the fleet's " + str(d.get("kind", "device")).upper() + "s"
            named.append(f"{d.get('name', '?')} {_worst(d.get('evidence'), peers)}")
        suspects.append(f"{node.get('node')} suspect: {'; '.join(named) or 'an outlier device'}")
    parts = []
    if found:
        parts.append(f"{len(found)} outlier{'s' if len(found) != 1 else ''}: {', '.join(found)}")
    parts += suspects
    return f"; nodes: {', '.join(parts)}" if parts else "; nodes: none below the fleet"


def _worst(evidence: Any, fleet: str) -> str:
    """The worst evidence in words: its metric and its share of the fleet's median."""
    worst = evidence[0] if isinstance(evidence, list) and evidence and isinstance(evidence[0], dict) else {}
    value, median = worst.get("value"), worst.get("fleet_median")
    share = f" at {value / median:.0%} of {fleet}" if isinstance(value, (int, float)) and median else ""
    return f"{worst.get('metric', '?')}{share}"


def ui_link(base_url: str, t: Tracked) -> str:
    return f"{base_url}/campaigns/{t.campaign['id']}/"


def point_label(item: Mapping[str, Any]) -> str:
    """``k=v,k=v`` of the matrix point's parameters, in the order the server gave them."""
    params = item.get("params")
    if not isinstance(params, dict) or not params:
        return f"point {item.get('point', '?')}"
    return ",".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in params.items())


def _statistic(verdict: Mapping[str, Any]) -> str:
    """What the verdict summed each side up by: the campaign's statistic (verdicts before it existed: the mean)."""
    policy = verdict.get("policy")
    return str(policy.get("statistic") or "mean") if isinstance(policy, dict) else "mean"


def _value(stats: Any, statistic: str) -> float | None:
    return stats.get(statistic) if isinstance(stats, dict) else None


def _num(value: Any, unit: str = "") -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-"
    return quantity(value, unit or "")


def _p(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


# --- numbers ----------------------------------------------------------------------------------------------------
# A copy of rackbench's one number formatter (common/numbers.py: quantity and what it uses), so that this file
# stands alone; tests/test_ci_client.py checks the two agree on a wide range of values and units.

_DASH = "-"

# unit as stored -> (family, factor to the family's base unit)
_UNITS: dict[str, tuple[str, float]] = {
    # byte rates, decimal
    "B/s": ("byte_rate", 1.0), "bytes/s": ("byte_rate", 1.0), "kB/s": ("byte_rate", 1e3), "KB/s": ("byte_rate", 1e3),
    "MB/s": ("byte_rate", 1e6), "GB/s": ("byte_rate", 1e9), "TB/s": ("byte_rate", 1e12),
    # byte rates, binary
    "KiB/s": ("byte_rate_iec", 1024.0), "MiB/s": ("byte_rate_iec", 1024.0**2), "GiB/s": ("byte_rate_iec", 1024.0**3),
    # bit rates
    "bit/s": ("bit_rate", 1.0), "bits/s": ("bit_rate", 1.0), "bps": ("bit_rate", 1.0),
    "kbit/s": ("bit_rate", 1e3), "Mbit/s": ("bit_rate", 1e6), "Mb/s": ("bit_rate", 1e6), "Mbps": ("bit_rate", 1e6),
    "Gbit/s": ("bit_rate", 1e9), "Gb/s": ("bit_rate", 1e9), "Gbps": ("bit_rate", 1e9),
    # sizes: plain bytes (memory, files) and binary multiples in IEC, decimal multiples in SI
    "B": ("bytes_iec", 1.0), "bytes": ("bytes_iec", 1.0), "KiB": ("bytes_iec", 1024.0),
    "MiB": ("bytes_iec", 1024.0**2), "GiB": ("bytes_iec", 1024.0**3), "TiB": ("bytes_iec", 1024.0**4),
    "kB": ("bytes_si", 1e3), "KB": ("bytes_si", 1e3), "MB": ("bytes_si", 1e6), "GB": ("bytes_si", 1e9),
    "TB": ("bytes_si", 1e12),
    # time
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "µs": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0),
    "min": ("time", 60.0), "h": ("time", 3600.0),
    # physical
    "Hz": ("frequency", 1.0), "kHz": ("frequency", 1e3), "MHz": ("frequency", 1e6), "GHz": ("frequency", 1e9),
    "W": ("power", 1.0), "kW": ("power", 1e3),
    "%": ("percent", 1.0),
    "C": ("celsius", 1.0), "°C": ("celsius", 1.0),
}  # fmt: skip

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_IEC = ((1024.0**4, "Ti"), (1024.0**3, "Gi"), (1024.0**2, "Mi"), (1024.0, "Ki"), (1.0, ""))
# family -> (prefixes, unit after the prefix)
_PREFIXED = {
    "byte_rate": (_SI, "B/s"),
    "byte_rate_iec": (_IEC, "B/s"),
    "bit_rate": (_SI, "bit/s"),
    "bytes_iec": (_IEC, "B"),
    "bytes_si": (_SI, "B"),
    "frequency": (_SI, "Hz"),
    "power": (_SI, "W"),
}
# time: (seconds at or above which this unit is used, unit, seconds per unit), largest first
_TIME = ((7200.0, "h", 3600.0), (600.0, "min", 60.0), (1.0, "s", 1.0), (1e-3, "ms", 1e-3), (1e-6, "µs", 1e-6),
         (0.0, "ns", 1e-9))  # fmt: skip
# a unit with no prefix family whose values are counts of things (shown as integers when they are whole)
_COUNTS = {"", "count", "elements", "ranks", "nodes", "results", "samples", "epochs", "packets", "gpus", "GPUs"}


def family(unit: str) -> str:
    """The unit family of ``unit``: byte_rate, bit_rate, bytes_iec, time, percent, rate (of things), count..."""
    if unit in _UNITS:
        return _UNITS[unit][0]
    if unit.endswith("/s") or unit == "IOPS":
        return "rate"
    return "count" if unit in _COUNTS else "other"


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, fixed point (never an exponent), thousands separated."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(digits - 1 - magnitude, 0)
    text = f"{value:,.{decimals}f}"
    # rounding can add a digit (9.996 -> "10.00"): say it with the right number of digits
    if decimals and len(text.replace(",", "").replace("-", "").replace(".", "").lstrip("0")) > digits:
        text = f"{value:,.{decimals - 1}f}"
    return text


def _prefixed(base: float, prefixes: tuple[tuple[float, str], ...], suffix: str) -> tuple[str, str]:
    step = prefixes[-2][0]  # 1000 or 1024
    for factor, prefix in prefixes:
        if abs(base) >= factor or factor == 1.0:
            mantissa = base / factor
            text = significant(mantissa)
            # 999.7 MB/s rounds to "1,000": one prefix up reads better ("1.00 GB/s")
            if abs(float(text.replace(",", ""))) >= step and factor != prefixes[0][0]:
                index = [f for f, _ in prefixes].index(factor)
                factor, prefix = prefixes[index - 1]
                text = significant(base / factor)
            return text, prefix + suffix
    raise AssertionError("unreachable: the last prefix has factor 1")


def _time(seconds: float) -> tuple[str, str]:
    if seconds == 0:
        return "0", "s"
    size = abs(seconds)
    for i, (floor, unit, per) in enumerate(_TIME):
        if size >= floor:
            text = significant(seconds / per)
            if unit in ("ns", "µs", "ms") and abs(float(text.replace(",", ""))) >= 1000:  # 999.7 µs -> "1.00 ms"
                _, unit, per = _TIME[i - 1]
                text = significant(seconds / per)
            return text, unit
    raise AssertionError("unreachable: the last time unit has floor 0")


def _counted(value: float, suffix: str) -> tuple[str, str]:
    """Things and rates of things: up to 9,999 in plain digits (whole counts exact), then k, M, G."""
    suffix = "" if suffix == "count" else suffix
    if abs(value) < 9_999.5:
        if float(value).is_integer():
            return f"{int(value):,}", suffix
        return significant(value, 4 if abs(value) >= 1000 else 3), suffix
    for factor, prefix in _SI:
        if abs(value) >= factor:
            text = significant(value / factor)
            if abs(float(text.replace(",", ""))) >= 1000 and factor != _SI[0][0]:
                factor, prefix = _SI[[f for f, _ in _SI].index(factor) - 1]
                text = significant(value / factor)
            return text + prefix, suffix
    raise AssertionError("unreachable")


def split(value: Any, unit: str = "", *, network: bool = False) -> tuple[str, str]:
    """``value`` (in ``unit``) as (number text, display unit); (_DASH, "") for nothing or a non-number."""
    if value is None or isinstance(value, bool) or value == "":
        return _DASH, ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value), unit
    if not math.isfinite(number):
        return _DASH, ""
    unit = unit or ""
    kind = family(unit)
    if kind in ("byte_rate", "byte_rate_iec") and network:
        number, kind = number * _UNITS[unit][1] * 8, "bit_rate"
        unit = "bit/s"
    if kind in _PREFIXED:
        prefixes, suffix = _PREFIXED[kind]
        return _prefixed(number * _UNITS[unit][1], prefixes, suffix)
    if kind == "time":
        return _time(number * _UNITS[unit][1])
    if kind == "percent":
        return significant(number), "%"
    if kind == "celsius":
        return significant(number), "°C"
    if kind in ("rate", "count"):
        return _counted(number, unit)
    return _counted(number, unit) if float(number).is_integer() else (significant(number, 4), unit)


def quantity(value: Any, unit: str = "", *, network: bool = False) -> str:
    """``value`` (in ``unit``) as one readable text: "2.14 GB/s", "7.71 ms", "1.23M IOPS", "—" for nothing."""
    text, shown = split(value, unit, network=network)
    if not shown:
        return text
    return f"{text}{shown}" if shown == "%" else f"{text} {shown}"


# --- JUnit XML --------------------------------------------------------------------------------------------------


def junit_xml(tracked: Sequence[Tracked], policy: Policy, base_url: str) -> bytes:
    """One <testsuite> per campaign, one <testcase> per matrix point and metric, in the common JUnit schema.

    A regression is a <failure>; an inconclusive item is <skipped> (a <failure> with --fail-on-inconclusive); a
    campaign that failed, was cancelled, timed out or met an API error is one <testcase> with an <error>.
    """
    root = ET.Element("testsuites", name="rackbench")
    for t in tracked:
        suite = _sub(root, "testsuite", name=t.name, timestamp=_timestamp(t), time=f"{t.duration:.3f}")
        _properties(suite, t, base_url)
        _cases(suite, t, policy)
        _count(suite)
    _count(root)
    root.set("time", f"{sum(t.duration for t in tracked):.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def _properties(suite: ET.Element, t: Tracked, base_url: str) -> None:
    props = {"campaign_id": t.campaign.get("id"), "url": ui_link(base_url, t) if "id" in t.campaign else None}
    if t.verdict is not None:
        baseline = t.verdict.get("baseline_campaign")
        policy = t.verdict.get("policy")
        policy = policy if isinstance(policy, dict) else {}
        props.update(
            baseline=f"{baseline.get('name')} (#{baseline.get('id')})" if isinstance(baseline, dict) else None,
            method=f"{t.verdict.get('method')} v{t.verdict.get('method_version')}",
            **{k: policy.get(k) for k in ("threshold_pct", "alpha", "min_repetitions")},
        )
    properties = _sub(suite, "properties")
    for name, value in props.items():
        if value is not None:
            _sub(properties, "property", name=name, value=str(value))


def _cases(suite: ET.Element, t: Tracked, policy: Policy) -> None:
    if t.error:
        case = _sub(suite, "testcase", classname=t.name, name="campaign", time=f"{t.duration:.3f}")
        _sub(case, "error", t.error, message=t.error, type=t.error_type or "error")
    elif t.verdict is None:
        case = _sub(suite, "testcase", classname=t.name, name="baseline", time="0")
        if policy.require_baseline:
            _sub(case, "error", message=str(t.no_baseline), type="no-baseline")
        else:
            _sub(case, "skipped", message=str(t.no_baseline))
    else:
        for item in _items(t.verdict):
            _item_case(suite, t, item, policy)


def _item_case(suite: ET.Element, t: Tracked, item: Mapping[str, Any], policy: Policy) -> None:
    case = _sub(suite, "testcase", classname=f"{t.name}.{item.get('metric', '?')}", name=point_label(item), time="0")
    outcome = item.get("outcome")
    reason = str(item.get("reason") or f"{item.get('metric')}: {outcome}")
    if outcome == "regression" or (outcome == "inconclusive" and policy.fail_on_inconclusive):
        _sub(case, "failure", _item_details(item, t.verdict or {}), message=reason, type=str(outcome))
    elif outcome == "inconclusive":
        _sub(case, "skipped", message=reason)
    else:
        _sub(case, "system-out", reason)


def _item_details(item: Mapping[str, Any], verdict: Mapping[str, Any]) -> str:
    """The numbers behind an item's outcome, for the text of its <failure>."""
    better = "higher" if item.get("higher_is_better", True) else "lower"
    change = "-" if item.get("change_pct") is None else f"{item['change_pct']:+.2f}%"
    baseline = verdict.get("baseline_campaign")
    against = f" ({baseline.get('name')} #{baseline.get('id')})" if isinstance(baseline, dict) else ""
    lines = [
        f"{item.get('metric')} [{item.get('unit', '')}, {better} is better] at {point_label(item)}: {change}",
        f"baseline{against}: {_stats(item.get('baseline'), item.get('unit', ''))}",
        f"candidate: {_stats(item.get('candidate'), item.get('unit', ''))}",
        f"p={item.get('p_value')} ({item.get('test', '?')}); policy: {json.dumps(verdict.get('policy', {}))}",
        str(item.get("reason", "")),
    ]
    return "\n".join(lines)


def _stats(stats: Any, unit: str = "") -> str:
    if not isinstance(stats, dict):
        return "none"
    shown = {k: _num(stats.get(k), unit) for k in ("mean", "median", "stdev", "min", "max") if k in stats}
    return " ".join([f"n={stats.get('n')}", *(f"{k}={v}" for k, v in shown.items()), f"cv={_num(stats.get('cv'))}"])


def _count(element: ET.Element) -> None:
    """Set tests/failures/errors/skipped on a <testsuite> from its cases, or on <testsuites> from its suites."""
    if element.tag == "testsuite":
        cases = element.findall("testcase")
        counts = {tag: sum(1 for c in cases if c.find(tag) is not None) for tag in ("failure", "error", "skipped")}
        totals = {"tests": len(cases), "failures": counts["failure"], "errors": counts["error"]}
        totals["skipped"] = counts["skipped"]
    else:
        suites = element.findall("testsuite")
        totals = {k: sum(int(s.get(k, "0")) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    for name, value in totals.items():
        element.set(name, str(value))


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, {k: _xml_safe(v) for k, v in attrs.items()})
    if text is not None:
        element.text = _xml_safe(text)
    return element


def _xml_safe(text: str) -> str:
    """Characters XML 1.0 cannot carry, even escaped (most controls, lone surrogates), become U+FFFD.

    ElementTree escapes markup but writes these as they are, which makes the document unreadable.
    """
    return "".join(
        c if c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd" or c >= "\U00010000" else "\ufffd"
        for c in text
    )


def _timestamp(t: Tracked) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t.started_at or time.time()))


# --- command line --------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage, so that an argument error is one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _duration(text: str) -> float:
    """Seconds, or a number followed by s, m or h (``90``, ``30m``, ``6h``)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1.0)
    try:
        value = float(number) * unit
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"not a positive duration: {text!r} (seconds, or like 30m, 6h)")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def _probability(text: str) -> float:
    value = _positive(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"not between 0 and 1: {text!r}")
    return value


def _campaign_id(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"not a campaign id: {text!r}")
    return int(text)


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _duration_text(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def build_parser(env: Mapping[str, str], prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Run a rackbench campaign from CI and judge it against its baseline.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    run = commands.add_parser(
        "run",
        help="create, launch and follow a campaign, then print its verdict",
        description="Create a campaign (from a YAML file or a preset), launch it, follow it until it ends and "
        "compare it with its baseline. Exit code: 0 pass, 1 regression, 2 error.",
    )
    server = run.add_argument_group("server")
    server.add_argument("--url", default=env.get("RACKBENCH_URL"), help="rackbench base URL (env RACKBENCH_URL)")
    server.add_argument("--token", default=env.get("RACKBENCH_TOKEN"), help="API token (env RACKBENCH_TOKEN)")
    server.add_argument("--insecure", action="store_true", help="do not verify the server's TLS certificate")
    what = run.add_argument_group("what to run (--file or --preset)")
    source = what.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", metavar="YAML", help="campaign definition, sent as it is")
    source.add_argument("--preset", metavar="SLUG", help="a preset applied to your inventory (needs --name)")
    what.add_argument(
        "--name", help="name of the campaign a preset creates (a suite adds -PART), or a new name for --file's"
    )
    what.add_argument("--nodes", type=_csv, default=[], metavar="A,B", help="preset: comma-separated node names")
    what.add_argument("--node-tags", type=_csv, default=[], metavar="T1,T2", help="preset: comma-separated tags")
    what.add_argument("--storage", metavar="NAME", help="preset: storage system name")
    what.add_argument("--family", metavar="NAME", help="--file: the family whose baseline it is compared with")
    judge = run.add_argument_group("verdict")
    judge.add_argument(
        "--baseline", type=_campaign_id, metavar="ID", help="compare with this campaign, not the family's baseline"
    )
    judge.add_argument("--threshold", type=_positive, metavar="PCT", help="smallest change that counts, in %%")
    judge.add_argument("--alpha", type=_probability, metavar="A", help="significance level of the test")
    judge.add_argument("--fail-on-inconclusive", action="store_true", help="inconclusive items fail (exit 1)")
    judge.add_argument("--require-baseline", action="store_true", help="no baseline is an error (exit 2)")
    judge.add_argument(
        "--fleet-threshold",
        type=_positive,
        metavar="SCORE",
        help="also judge every node against the campaign's fleet (robust score, e.g. 3.5): an outlier node, or a "
        "node with an outlier GPU or NIC (suspect), fails (exit 1)",
    )
    output = run.add_argument_group("output and pacing")
    output.add_argument("--junit", metavar="PATH", help="write a JUnit XML report there")
    output.add_argument("--quiet", action="store_true", help="no progress; only errors and the final lines")
    output.add_argument(
        "--poll-interval", type=_duration, default=5.0, metavar="S", help="seconds between polls (default: 5)"
    )
    output.add_argument(
        "--timeout", type=_duration, default=DEFAULT_TIMEOUT_S, metavar="S", help="give up after S (default: 6h)"
    )
    output.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="launches send Idempotency-Key KEY-<campaign id> (default: from GitHub/GitLab CI variables, or random)",
    )
    _suite_parser(commands, env)
    return parser


def _suite_parser(commands: Any, env: Mapping[str, str]) -> None:
    suite = commands.add_parser(
        "suite",
        help="run a health suite on nodes and gate on its verdict per node",
        description="Launch a health suite (quick, acceptance) on nodes, follow it until every step has ended and "
        "print each node's verdict with its reasons. Exit code: 0 every node healthy (or suspect), 1 a node "
        "failed (or was suspect, with --fail-on-suspect), 2 error.",
    )
    suite.add_argument("suite", metavar="SUITE", help="the suite's name (quick, acceptance)")
    suite.add_argument("--url", default=env.get("RACKBENCH_URL"), help="rackbench base URL (env RACKBENCH_URL)")
    suite.add_argument("--token", default=env.get("RACKBENCH_TOKEN"), help="API token (env RACKBENCH_TOKEN)")
    suite.add_argument("--insecure", action="store_true", help="do not verify the server's TLS certificate")
    suite.add_argument("--nodes", type=_csv, required=True, metavar="A,B", help="comma-separated node names")
    suite.add_argument("--name", default="", help="the suite run's name (default: SUITE-date-time)")
    suite.add_argument("--steps", type=_csv, default=[], metavar="S1,S2", help="some of the suite's steps")
    suite.add_argument("--team", help="the team it runs in, when the token's user has several")
    suite.add_argument("--fail-on-suspect", action="store_true", help="a suspect node fails too (exit 1)")
    suite.add_argument("--maintenance", action="store_true", help="failed nodes to maintenance, clean ones back")
    suite.add_argument("--slurm-login-node", default="", metavar="NODE", help="drain failed nodes in Slurm there")
    suite.add_argument("--quiet", action="store_true", help="no progress; only errors and the final lines")
    suite.add_argument("--poll-interval", type=_duration, default=5.0, metavar="S", help="seconds between polls")
    suite.add_argument("--timeout", type=_duration, default=DEFAULT_TIMEOUT_S, metavar="S", help="give up after S")


def run_suite(args: argparse.Namespace) -> int:
    """Launch the suite, follow it to its end, print each node's verdict, act if asked, and gate on the verdicts."""
    console = Console(quiet=args.quiet)
    api = Api(base_url(args.url), args.token, insecure=args.insecure, note=console.note)
    body: dict[str, Any] = {"nodes": args.nodes, "name": args.name, "steps": args.steps}
    if args.team:
        body["team"] = args.team
    query = f"?team={urllib.parse.quote(args.team)}" if args.team else ""
    try:
        launched = api.call("POST", f"/api/v1/suites/{urllib.parse.quote(args.suite)}/run/", body)
        name = str(launched["name"])
        console.info(f"[{name}] launched: {', '.join(c['name'] for c in launched['campaigns'])}")
        path = f"/api/v1/suite-runs/{urllib.parse.quote(name)}/{query}"
        deadline = time.monotonic() + args.timeout
        outcome = api.call("GET", path)
        while not outcome.get("finished"):
            if time.monotonic() > deadline:
                raise CiError(f"suite run {name} has not ended after {args.timeout:g} s")
            time.sleep(args.poll_interval)
            outcome = api.call("GET", path)
        for line in suite_lines(outcome):
            console.result(line)
        if args.maintenance or args.slurm_login_node:
            act = {"maintenance": args.maintenance, "slurm_login_node": args.slurm_login_node}
            done = api.call("POST", f"/api/v1/suite-runs/{urllib.parse.quote(name)}/act/{query}", act)
            for action in done.get("actions", []):
                console.result(f"{action['node']}: {action['action']} ({action['reason']})")
    except (CiError, KeyError, TypeError) as exc:
        console.error(f"suite {args.suite}: {exc}")
        return EXIT_ERROR
    counts = outcome.get("counts") or {}
    failing = counts.get("failed", 0) + (counts.get("suspect", 0) if args.fail_on_suspect else 0)
    return EXIT_REGRESSION if failing else EXIT_PASS


def suite_lines(outcome: Mapping[str, Any]) -> list[str]:
    """One line per node (verdict and reasons), its evidence below; the counts last."""
    lines = []
    for node in outcome.get("nodes", []):
        lines.append(
            f"{node['node']}: {node['verdict']}" + (f" ({', '.join(node['reasons'])})" if node["reasons"] else "")
        )
        lines += [f"    {e['code']}: {e['detail']}" for e in node.get("evidence", [])]
    counts = outcome.get("counts") or {}
    lines.append(", ".join(f"{counts.get(k, 0)} {k}" for k in ("healthy", "suspect", "failed")))
    return lines


def check_arguments(args: argparse.Namespace) -> None:
    if not args.url:
        raise UsageError("no server: give --url or set RACKBENCH_URL")
    if not args.url.startswith(("http://", "https://")):
        raise UsageError(f"--url must start with http:// or https://, not {args.url!r}")
    if not args.token:
        raise UsageError("no token: give --token or set RACKBENCH_TOKEN")
    if args.command == "suite":
        return
    if args.preset and not args.name:
        raise UsageError("--preset needs --name")
    if args.file:
        given = [f"--{o.replace('_', '-')}" for o in ("nodes", "node_tags", "storage") if getattr(args, o)]
        if given:
            raise UsageError(f"{', '.join(given)} apply to --preset only (a YAML file says it all)")
    if args.preset and args.family:
        raise UsageError("--family applies to --file only (a preset sets the family of each campaign it creates)")


def default_idempotency_key(env: Mapping[str, str]) -> str:
    """The CI job's identity when there is one (same for a network retry, new for a new run or attempt)."""
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_RUN_ATTEMPT"):
        return f"github-{env['GITHUB_RUN_ID']}-{env['GITHUB_RUN_ATTEMPT']}"
    if env.get("CI_PIPELINE_ID") and env.get("CI_JOB_ID"):
        return f"gitlab-{env['CI_PIPELINE_ID']}-{env['CI_JOB_ID']}"
    return str(uuid.uuid4())


def base_url(url: str) -> str:
    """The server's root: a trailing slash or ``/api/v1`` given by mistake is dropped."""
    url = url.rstrip("/")
    return url[: -len("/api/v1")] if url.endswith("/api/v1") else url


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    console = Console(quiet=args.quiet)
    url = base_url(args.url)
    api = Api(url, args.token, insecure=args.insecure, note=console.note)
    policy = Policy(
        args.baseline,
        args.threshold,
        args.alpha,
        args.fail_on_inconclusive,
        args.require_baseline,
        args.fleet_threshold,
    )
    try:
        tracked = [Tracked(c) for c in create_campaigns(api, args)]
    except CiError as exc:
        console.error(str(exc))
        tracked = [Tracked({"name": args.name or args.file or args.preset})]
        tracked[0].fail(str(exc), exc.kind)
    key = args.idempotency_key or default_idempotency_key(env)
    for t in tracked:
        if t.done:
            continue
        try:
            launch(api, t, key)
            console.info(f"[{t.name}] launched: {ui_link(url, t)}")
        except CiError as exc:
            t.fail(str(exc), exc.kind)
            console.error(f"{t.name}: {t.error}")
    follow(api, tracked, policy, poll_s=args.poll_interval, timeout_s=args.timeout, console=console)
    for line in summary_lines(tracked, policy, url, table=not args.quiet):
        console.result(line)
    if args.junit:
        try:
            with open(args.junit, "wb") as f:
                f.write(junit_xml(tracked, policy, url))
        except OSError as exc:
            console.error(f"{args.junit}: {exc.strerror}")
            return EXIT_ERROR
    return exit_code(tracked, policy)


def main(argv: Sequence[str] | None = None, *, prog: str = "rackbench_ci.py") -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command and return the exit code."""
    env = os.environ
    try:
        args = build_parser(env, prog).parse_args(argv)
        check_arguments(args)
    except UsageError as exc:
        Console(quiet=False).error(f"{exc} (see {prog} run --help)")
        return EXIT_ERROR
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_PASS
    return run_suite(args) if args.command == "suite" else run(args, env)


if __name__ == "__main__":
    sys.exit(main())
