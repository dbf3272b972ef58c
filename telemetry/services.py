"""Storing telemetry: samples are cut into chunks, encoded (telemetry.codec) and written in one COPY."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from campaigns.models import Result, Run, RunStatus
from campaigns.services import run_provenance_merge
from plugins.benchmarks.base import ParamError
from telemetry import codec, prometheus, selectors
from telemetry.models import Chunk, Series, SeriesKind, SeriesSource, labels_key

CHUNK_SAMPLES = 65_536

_COPY_COLUMNS = ("series_id", "seq", "t0_ns", "t1_ns", "count", "min", "max", "sum", "data")
_COPY_TYPES = ("int8", "int4", "int8", "int8", "int4", "float8", "float8", "float8", "bytea")
SUMMARY_STATS = ("mean", "p99", "max")


def series_append(
    *,
    run: Run,
    host: str,
    name: str,
    labels: dict[str, Any],
    unit: str,
    kind: str,
    timestamps_ns: npt.ArrayLike,
    values: npt.ArrayLike,
    interval_ns: int | None = None,
    precision: float | None = None,
    source: str = SeriesSource.SAMPLER,
) -> Series:
    """Append samples to a series of the run, creating it on first use.

    ``timestamps_ns`` are integers (ns since the epoch), strictly increasing and after the series' last sample;
    ``values`` are integers (exact) or finite floats (exact, or quantized to ``precision`` when given: see
    telemetry.codec). ``interval_ns`` is the nominal sampling interval (default: the median of the first ones);
    when given, timestamps are stored to 1/100 of it (``time_quantum``).
    Each call writes whole chunks of up to CHUNK_SAMPLES samples: append in large batches to keep chunks full.
    """
    ts, vals = _validated(timestamps_ns, values)
    if kind not in SeriesKind.values:
        raise ValueError(f"unknown series kind {kind!r}")
    if precision is not None and vals.dtype.kind == "f":
        vals = np.rint(vals / precision) * precision  # the stored values, so that chunk statistics match reads
    if interval_ns:
        ts, vals = _on_time_grid(ts, vals, interval_ns)
    with transaction.atomic():
        series, created = Series.objects.select_for_update().get_or_create(
            run=run,
            host=host,
            name=name,
            labels_key=labels_key(labels),
            defaults={
                "labels": labels,
                "unit": unit,
                "kind": kind,
                "source": source,
                "interval_ns": interval_ns or 0,
            },
        )
        if not created and (series.kind, series.unit) != (kind, unit):
            raise ValueError(f"{series} is a {series.kind} in {series.unit!r}, not a {kind} in {unit!r}")
        if not len(ts):
            return series
        if interval_ns and series.last_ns is not None and len(ts) and ts[0] == series.last_ns:
            ts, vals = ts[1:], vals[1:]  # rounded onto the series' last timestamp: a second read within the quantum
            if not len(ts):
                return series
        if series.last_ns is not None and ts[0] <= series.last_ns:
            raise ValueError(f"{series} already has samples up to {series.last_ns} ns, at or after {ts[0]} ns")
        seq, prev = _series_tail(series)
        _chunks_insert(_chunks(series=series, timestamps_ns=ts, values=vals, seq=seq, prev=prev, precision=precision))
        series.sample_count += len(ts)
        series.first_ns = int(ts[0]) if series.first_ns is None else series.first_ns
        series.last_ns = int(ts[-1])
        series.last_value = vals[-1].item()
        if not series.interval_ns and len(ts) > 1:
            series.interval_ns = int(np.median(np.diff(ts[:CHUNK_SAMPLES])))
        series.save(update_fields=["sample_count", "first_ns", "last_ns", "last_value", "interval_ns"])
    return series


def time_quantum(interval_ns: int) -> int:
    """The precision timestamps are stored to: the largest power of ten at most 1/100 of the sampling interval
    (10 µs at 1 ms, 10 ms at 1 s). A sampler's wake-up jitter below it is noise that would otherwise cost most of
    a sample's bytes on disk (2.1 of 3.5 B at 1 ms with 20-60 µs of jitter); a rate over one interval moves by at
    most 1% for it."""
    if interval_ns < 100:
        return 1
    return int(10 ** int(np.floor(np.log10(interval_ns / 100))))


def _on_time_grid(ts: codec.IntArray, vals: npt.NDArray[Any], interval_ns: int) -> tuple[codec.IntArray, Any]:
    """Timestamps rounded to ``time_quantum(interval_ns)``; a sample that rounding makes collide with the one
    before it (two reads within the quantum) is left out, so timestamps stay strictly increasing."""
    quantum = time_quantum(interval_ns)
    if quantum == 1 or not ts.size:
        return ts, vals
    rounded = (ts + quantum // 2) // quantum * quantum
    keep = np.ones(rounded.size, dtype=bool)
    keep[1:] = np.diff(rounded) > 0
    return (rounded, vals) if keep.all() else (rounded[keep], vals[keep])


def _validated(timestamps_ns: npt.ArrayLike, values: npt.ArrayLike) -> tuple[codec.IntArray, npt.NDArray[Any]]:
    ts = np.asarray(timestamps_ns)
    vals = np.asarray(values)
    if ts.ndim != 1 or vals.shape != ts.shape:
        raise ValueError(f"timestamps and values must be two sequences of one length, not {ts.shape} and {vals.shape}")
    if ts.size and ts.dtype.kind not in "iu":
        raise ValueError("timestamps must be integers (ns)")
    if vals.size and vals.dtype.kind not in "iubf":
        raise ValueError("values must be numbers")
    ts = ts.astype(np.int64, copy=False)
    vals = vals.astype(np.float64 if vals.dtype.kind == "f" else np.int64, copy=False)
    if ts.size > 1 and not (np.diff(ts) > 0).all():
        raise ValueError("timestamps must be strictly increasing")
    if vals.dtype.kind == "f" and not np.isfinite(vals).all():
        raise ValueError("values must be finite")
    return ts, vals


def _series_tail(series: Series) -> tuple[int, tuple[int, int | float] | None]:
    """The next chunk number and the series' last sample, which the next chunk carries for counter rates.

    The last sample is the series row's own (``last_ns``, ``last_value``); only a series stored before rows kept
    their last value has its last chunk decoded.
    """
    last = Chunk.objects.filter(series=series).order_by("-seq").values_list("seq", flat=True).first()
    if last is None:
        return 0, None
    if series.last_ns is not None and series.last_value is not None:
        return last + 1, (series.last_ns, series.last_value)
    decoded = codec.decode(Chunk.objects.values_list("data", flat=True).get(series=series, seq=last))
    return last + 1, (int(decoded.timestamps_ns[-1]), decoded.values[-1].item())


def _chunks(
    *,
    series: Series,
    timestamps_ns: codec.IntArray,
    values: npt.NDArray[Any],
    seq: int,
    prev: tuple[int, int | float] | None,
    precision: float | None,
) -> list[Chunk]:
    chunks = []
    for start in range(0, len(timestamps_ns), CHUNK_SAMPLES):
        t = timestamps_ns[start : start + CHUNK_SAMPLES]
        v = values[start : start + CHUNK_SAMPLES]
        data = codec.encode(t, v, prev=prev, precision=precision)
        low, high, total = _chunk_stats(series.kind, codec.Decoded(t, v, *(prev or (None, None))))
        chunks.append(
            Chunk(
                series=series,
                seq=seq,
                t0_ns=int(t[0]),
                t1_ns=int(t[-1]),
                count=len(t),
                min=low,
                max=high,
                sum=total,
                data=data,
            )
        )
        prev = (int(t[-1]), v[-1].item())
        seq += 1
    return chunks


def _chunk_stats(kind: str, chunk: codec.Decoded) -> tuple[float | None, float | None, float]:
    """(min, max, sum) as Chunk documents them; no min/max for a counter's first sample alone."""
    if kind == SeriesKind.COUNTER:
        _ends, rates, increments = codec.counter_rates(chunk)
        if not rates.size:
            return None, None, 0.0
        return float(rates.min()), float(rates.max()), float(increments.sum())
    values = chunk.values
    return float(values.min()), float(values.max()), float(values.sum())


def _chunks_insert(chunks: Sequence[Chunk]) -> None:
    """COPY in binary on PostgreSQL; elsewhere (SQLite), bulk_create.

    Measured with bench/telemetry_ingest.py on 4.8 million samples of one series: 4.3 million samples/s with
    COPY, 3.2 million with bulk_create (whose client-side parameters send each chunk as an escaped literal).
    """
    if connection.vendor != "postgresql":
        Chunk.objects.bulk_create(chunks, batch_size=64)
        return
    table = connection.ops.quote_name(Chunk._meta.db_table)
    statement = f"COPY {table} ({', '.join(_COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    with connection.cursor() as cursor, cursor.cursor.copy(statement) as copy:
        copy.set_types(_COPY_TYPES)
        for c in chunks:
            copy.write_row((c.series_id, c.seq, c.t0_ns, c.t1_ns, c.count, c.min, c.max, c.sum, c.data))


def run_telemetry_summarize(
    *, run: Run, skip: Collection[str] = (), sources: Collection[str] | None = None
) -> list[Result]:
    """Record each series' mean, p99 and max (of the rate, for counters) as results of the run.

    Named ``<series name>.<stat>`` with the series' host and labels, e.g. ``net.rx_bytes.max`` in B/s: the peak
    link throughput over one sampling interval. Series named in ``skip`` (details such as per-core utilisation,
    whose summaries would swamp the results) are left out; with ``sources``, only series from those sources are
    summarised. Recording again replaces what an earlier call recorded.
    """
    if Run.objects.filter(pk=run.pk, status=RunStatus.CANCELLED).exists():
        return []  # a cancelled run keeps no results (its series stay, as evidence)
    results = []
    rows = Series.objects.filter(run=run).exclude(name__in=skip)
    if sources is not None:
        rows = rows.filter(source__in=sources)
    earlier = Q()  # every summary an earlier call recorded: deleted in one statement
    with transaction.atomic():
        for series in rows.order_by("host", "name", "labels_key"):
            names = [f"{series.name}.{stat}" for stat in SUMMARY_STATS]
            earlier |= Q(host=series.host, name__in=names, labels=series.labels)
            summary = selectors.series_summary(series=series)
            results += _summary_results(run, series, names, (summary.mean, summary.p99, summary.max))
        if earlier:
            Result.objects.filter(earlier, run=run).delete()
        Result.objects.bulk_create(results)
    return results


def _summary_results(run: Run, series: Series, names: Iterable[str], stats: Iterable[float | None]) -> list[Result]:
    return [
        Result(run=run, name=name, value=value, unit=series.rate_unit, host=series.host, labels=series.labels)
        for name, value in zip(names, stats, strict=True)
        if value is not None
    ]


def run_prometheus_pull(*, run: Run) -> dict[str, Any]:
    """Pull the run's Prometheus queries over its time window and store every series they give (replacing what an
    earlier pull of the same query stored), then summarise them into results like the samplers' series.

    Never raises for Prometheus' sake: each query that fails is a warning, recorded with the outcome in the run's
    provenance (``telemetry.prometheus``). Returns that outcome.
    """
    telemetry = run.campaign.telemetry or {}
    outcome: dict[str, Any] = {"url": settings.RACKBENCH["PROMETHEUS_URL"], "series": 0, "samples": 0, "warnings": []}
    try:
        queries = prometheus.queries_for(telemetry)
    except ParamError as exc:
        queries = []
        outcome["warnings"].append(str(exc))
    start, end = run.started_at, run.finished_at or timezone.now()
    if not queries or not outcome["url"] or start is None:
        return outcome
    hosts = list(run.hosts.order_by("host").values_list("host", "address"))
    outcome["window"] = [start.isoformat(), end.isoformat()]
    for query in queries:
        step = prometheus.step_seconds(query, telemetry, start, end)
        name = prometheus.PREFIX + query.name
        asks = [(h, query.for_host(h, a)) for h, a in hosts] if query.per_host else [(None, query.query)]
        for host, expr in asks:
            try:
                result = prometheus.query_range(expr, start=start, end=end, step_s=step)
            except prometheus.PrometheusError as exc:
                outcome["warnings"].append(f"{query.name}{f' on {host}' if host else ''}: {exc}")
                continue  # what an earlier pull stored stays
            earlier = Series.objects.filter(run=run, source=SeriesSource.PROMETHEUS, name=name)
            (earlier.filter(host=host) if host else earlier).delete()
            for item in result:
                labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
                timestamps, values = prometheus.samples(item.get("values") or [])
                if not timestamps:
                    continue
                where = host or labels.get("instance") or "prometheus"
                series_append(
                    run=run, host=where[:100], name=name, labels=labels,
                    unit=query.unit, kind=SeriesKind.GAUGE, timestamps_ns=np.array(timestamps, dtype=np.int64),
                    values=np.array(values, dtype=np.float64), interval_ns=round(step * 1e9),
                    source=SeriesSource.PROMETHEUS,
                )  # fmt: skip
                outcome["series"] += 1
                outcome["samples"] += len(timestamps)
    run_telemetry_summarize(run=run, sources=[SeriesSource.PROMETHEUS])
    return outcome


def run_telemetry_note(
    *, run_id: int, key: str, outcome: dict[str, Any], topic: str | None = None, warnings: Iterable[str] | None = None
) -> None:
    """Record ``outcome`` as ``provenance.telemetry.<key>``; ``warnings`` (the outcome's own by default) replace the
    earlier ones of ``topic`` (``key`` by default) in ``provenance.telemetry.warnings``, each as "<topic>: ..."."""
    topic = topic or key
    said = [f"{topic}: {w}" for w in (outcome["warnings"] if warnings is None else warnings)]

    def note(provenance: dict[str, Any]) -> None:
        telemetry = dict(provenance.get("telemetry") or {})
        telemetry[key] = outcome
        kept = [w for w in telemetry.get("warnings", []) if not w.startswith(f"{topic}: ")]
        telemetry["warnings"] = kept + said
        provenance["telemetry"] = telemetry

    run_provenance_merge(run_id=run_id, update=note)
