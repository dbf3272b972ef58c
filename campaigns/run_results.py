"""A run's results as its page shows them: the benchmark's headline numbers first, then the other aggregates, then
per host, then the telemetry summaries in their own section (one row per series, idle ones folded away).

Pure: takes the run's Result rows and its benchmark's ``headline`` and ``totals`` (plugins.benchmarks.base), so
the same sections come out for any page or test.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TELEMETRY_STATS = ("mean", "p99", "max")  # telemetry.services.SUMMARY_STATS: "<series>.<stat>"


@dataclass
class TelemetryRow:
    """One telemetry series of one host: its mean, p99 and max (as the run's Result rows stored them)."""

    host: str
    series: str
    labels: dict[str, Any]
    unit: str
    stats: dict[str, Any] = field(default_factory=dict)  # stat -> Result

    @property
    def idle(self) -> bool:
        return all(r.value == 0 for r in self.stats.values())


@dataclass
class Sections:
    headline: list[Any]
    aggregates: list[Any]
    per_host: list[tuple[str, list[Any]]]
    telemetry: list[TelemetryRow]
    idle: list[TelemetryRow]
    hidden: int  # rows left out because another row says the same (a total equal to its one part, a lone job)


def _telemetry_name(name: str) -> tuple[str, str] | None:
    series, _, stat = name.rpartition(".")
    return (series, stat) if series and "." in series and stat in TELEMETRY_STATS else None


def _echoes(results: Sequence[Any], totals: Mapping[str, Sequence[str]]) -> set[int]:
    """Rows that repeat another: a total whose only present part it equals (fio's bw_bytes of a read-only job is its
    read_bw_bytes), and a host's only labelled row of a metric equal to the host's unlabelled one (fio's one job)."""
    by_key = {(r.host, r.name, _labels_key(r.labels)): r for r in results}
    echoed = set()
    for r in results:
        parts = [by_key.get((r.host, part, _labels_key(r.labels))) for part in totals.get(r.name, ())]
        present = [p for p in parts if p is not None]
        if len(present) == 1 and present[0].value == r.value:
            echoed.add(id(r))
    labelled: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in results:
        if r.labels:
            labelled[(r.host, r.name)].append(r)
    for (host, name), rows in labelled.items():
        plain = by_key.get((host, name, ""))
        if plain is not None and len(rows) == 1 and rows[0].value == plain.value:
            echoed.add(id(rows[0]))
    return echoed


def _labels_key(labels: Mapping[str, Any] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))


def run_sections(
    results: Iterable[Any], *, headline: Sequence[str] = (), totals: Mapping[str, Sequence[str]] | None = None
) -> Sections:
    rows = list(results)
    telemetry: dict[tuple[str, str, str], TelemetryRow] = {}
    measured = []
    for r in rows:
        named = _telemetry_name(r.name)
        if named is None:
            measured.append(r)
            continue
        key = (r.host, named[0], _labels_key(r.labels))
        row = telemetry.setdefault(key, TelemetryRow(r.host, named[0], dict(r.labels or {}), r.unit))
        row.stats[named[1]] = r
    echoed = _echoes(measured, totals or {})
    shown = [r for r in measured if id(r) not in echoed]
    aggregates = [r for r in shown if not r.host]
    order = {name: i for i, name in enumerate(headline)}
    head = sorted((r for r in aggregates if r.name in order and not r.labels), key=lambda r: order[r.name])
    if not head:  # a plug-in that names no headline: every unlabelled aggregate is one
        head = [r for r in aggregates if not r.labels]
    chosen = {id(r) for r in head}
    hosts: dict[str, list[Any]] = defaultdict(list)
    for r in shown:
        if r.host:
            hosts[r.host].append(r)
    series = sorted(telemetry.values(), key=lambda t: (t.host, t.series, _labels_key(t.labels)))
    return Sections(
        headline=head,
        aggregates=[r for r in aggregates if id(r) not in chosen],
        per_host=sorted(hosts.items()),
        telemetry=[t for t in series if not t.idle],
        idle=[t for t in series if t.idle],
        hidden=len(echoed),
    )
