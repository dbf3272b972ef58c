"""Reads of telemetry: windows of a series downsampled for drawing, and summaries.

Counters are read as rates per second: each rate is the counter's increase over one sampling interval, stamped
at the interval's end (so a counter of n samples gives n - 1 rates). Gauges are read as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
from django.db.models import Max, Min, Sum

from campaigns.models import Result
from telemetry import codec
from telemetry.models import Chunk, Series, SeriesKind, labels_key


@dataclass(frozen=True)
class SeriesWindow:
    """What to draw of a series between start_ns and end_ns (inclusive).

    At full resolution (``bucket_ns == 0``) one point per sample, ``min == max``; otherwise one point per
    non-empty bucket of ``bucket_ns``, stamped at the bucket's start, with the least and greatest sample in it.
    """

    start_ns: int
    end_ns: int
    bucket_ns: int
    t_ns: codec.IntArray
    min: codec.FloatArray
    max: codec.FloatArray
    unit: str

    @property
    def full_resolution(self) -> bool:
        return self.bucket_ns == 0

    def points(self) -> list[tuple[int, float, float]]:
        """(t_ns, min, max) per point, for JSON."""
        return list(zip(self.t_ns.tolist(), self.min.tolist(), self.max.tolist(), strict=True))


@dataclass(frozen=True)
class SeriesSummary:
    """Of the rates for a counter (whose mean is its total increase over the whole time), else of the samples."""

    count: int
    mean: float | None
    p99: float | None
    max: float | None
    unit: str


class _ChunkMeta(NamedTuple):
    pk: int
    t0_ns: int
    t1_ns: int
    samples: int
    min: float | None
    max: float | None


class _Buckets(NamedTuple):
    ids: codec.IntArray
    min: codec.FloatArray
    max: codec.FloatArray


class _Part(NamedTuple):
    """A chunk's share of a window: its buckets, and its samples in the window when there are few."""

    buckets: _Buckets
    samples: tuple[codec.IntArray, codec.FloatArray] | None


T = TypeVar("T")
DECODING_THREADS = min(4, os.cpu_count() or 1)
_EMPTY_INT = np.empty(0, dtype=np.int64)
_EMPTY_FLOAT = np.empty(0, dtype=np.float64)


def series_window(
    *, series: Series, start_ns: int | None = None, end_ns: int | None = None, max_points: int = 2000
) -> SeriesWindow:
    """The series between start_ns and end_ns (default: all of it) in at most ``max_points`` points.

    Reads only the chunks that overlap the window. When the window holds at most ``max_points`` samples they
    come at full resolution; otherwise the window is cut into ``max_points`` equal buckets, each drawn as its
    min and max (which keeps every spike visible, unlike averaging). A chunk that lies whole inside one bucket
    is not decoded at all: its stored min/max stand for it.
    """
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    start = series.first_ns if start_ns is None else start_ns
    end = series.last_ns if end_ns is None else end_ns
    if start is None or end is None or start > end:
        return SeriesWindow(start or 0, end or 0, 0, _EMPTY_INT, _EMPTY_FLOAT, _EMPTY_FLOAT, series.rate_unit)
    metas = [
        _ChunkMeta(*row)
        for row in Chunk.objects.filter(series=series, t0_ns__lte=end, t1_ns__gte=start)
        .order_by("seq")
        .values_list("pk", "t0_ns", "t1_ns", "count", "min", "max")
    ]
    width = -(-(end - start + 1) // max_points)
    inside = [m for m in metas if start <= m.t0_ns and m.t1_ns <= end]
    from_stats: set[int] = set()
    if sum(m.samples for m in inside) > max_points:  # buckets for sure: a chunk within one needs no decoding
        from_stats = {
            m.pk for m in inside if m.min is not None and (m.t0_ns - start) // width == (m.t1_ns - start) // width
        }

    def part(chunk: codec.Decoded) -> _Part:
        t, y = _readings(series.kind, chunk)
        low, high = np.searchsorted(t, start, "left"), np.searchsorted(t, end, "right")
        t, y = t[low:high], y[low:high]
        return _Part(bucketed(t, y, start=start, width=width), (t, y) if len(t) <= max_points else None)

    decoded = iter(list(_each_chunk(series, part, pks=[m.pk for m in metas if m.pk not in from_stats])))
    parts = []
    for meta in metas:
        if meta.pk in from_stats:
            assert meta.min is not None and meta.max is not None
            bucket = np.array([(meta.t0_ns - start) // width], dtype=np.int64)
            parts.append(_Part(_Buckets(bucket, np.array([meta.min]), np.array([meta.max])), None))
        else:
            parts.append(next(decoded))
    samples = [p.samples for p in parts if p.samples is not None]
    if len(samples) == len(parts) and sum(len(t) for t, _y in samples) <= max_points:
        t = np.concatenate([t for t, _y in samples]) if samples else _EMPTY_INT
        y = np.concatenate([y for _t, y in samples]) if samples else _EMPTY_FLOAT
        return SeriesWindow(start, end, 0, t, y, y, series.rate_unit)
    merged = _merged([p.buckets for p in parts])
    return SeriesWindow(start, end, width, start + merged.ids * width, merged.min, merged.max, series.rate_unit)


def _each_chunk(series: Series, fn: Callable[[codec.Decoded], T], *, pks: list[int] | None = None) -> Iterator[T]:
    """``fn`` of each chunk of the series (all, or those of ``pks``) in order.

    Chunks are decoded on a few threads (zlib and numpy release the GIL: two cores read a 14-million-sample
    series in about 60% of the time), while the later ones still arrive from the database. Every compressed
    chunk is held until decoded (50 MB for 14 million samples); what ``fn`` returns should be small.
    """
    rows = Chunk.objects.filter(series=series)
    if pks is not None:
        rows = rows.filter(pk__in=pks)
    data = rows.order_by("seq").values_list("data", flat=True).iterator(chunk_size=8)
    with ThreadPoolExecutor(max_workers=DECODING_THREADS) as pool:
        yield from pool.map(lambda blob: fn(codec.decode(blob)), data)


def _readings(kind: str, chunk: codec.Decoded) -> tuple[codec.IntArray, codec.FloatArray]:
    """A chunk as the series is read: rates for a counter, the samples for a gauge."""
    if kind == SeriesKind.COUNTER:
        ends, rates, _increments = codec.counter_rates(chunk)
        return ends, rates
    return chunk.timestamps_ns, chunk.values.astype(np.float64, copy=False)


def bucketed(t: codec.IntArray, y: codec.FloatArray, *, start: int, width: int) -> _Buckets:
    ids = (t - start) // width
    return _reduced(ids, y, y)


def _reduced(ids: codec.IntArray, low: codec.FloatArray, high: codec.FloatArray) -> _Buckets:
    """Min and max per run of equal, sorted bucket ids."""
    if not ids.size:
        return _Buckets(_EMPTY_INT, _EMPTY_FLOAT, _EMPTY_FLOAT)
    firsts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    return _Buckets(ids[firsts], np.minimum.reduceat(low, firsts), np.maximum.reduceat(high, firsts))


def _merged(parts: list[_Buckets]) -> _Buckets:
    """Chunks in order give bucket ids in order; a bucket that spans two chunks is merged here."""
    if not parts:
        return _Buckets(_EMPTY_INT, _EMPTY_FLOAT, _EMPTY_FLOAT)
    return _reduced(
        np.concatenate([p.ids for p in parts]),
        np.concatenate([p.min for p in parts]),
        np.concatenate([p.max for p in parts]),
    )


def series_summary(*, series: Series) -> SeriesSummary:
    """Mean, 99th percentile and max of the series as it is read (rates for a counter), over all of it."""

    def readings(chunk: codec.Decoded) -> tuple[codec.FloatArray, float]:
        if series.kind == SeriesKind.COUNTER:
            _ends, rates, increments = codec.counter_rates(chunk)
            return rates, float(increments.sum())
        return chunk.values.astype(np.float64, copy=False), 0.0

    parts = list(_each_chunk(series, readings))
    y = np.concatenate([p[0] for p in parts]) if parts else _EMPTY_FLOAT
    if not y.size:
        return SeriesSummary(0, None, None, None, series.rate_unit)
    if series.kind == SeriesKind.COUNTER:
        assert series.first_ns is not None and series.last_ns is not None
        mean = sum(p[1] for p in parts) * 1e9 / (series.last_ns - series.first_ns)
    else:
        mean = float(y.mean())
    return SeriesSummary(len(y), mean, float(np.percentile(y, 99)), float(y.max()), series.rate_unit)


@dataclass(frozen=True)
class SeriesOverview:
    """A series with what its chunks' stored statistics say of it, read without decoding a sample; ``p99`` is the
    one the run's results hold (recorded when the series was summarised, None for series that are not)."""

    series: Series
    count: int
    mean: float | None
    min: float | None
    max: float | None
    p99: float | None


def run_series_overview(*, run_id: int) -> list[SeriesOverview]:
    """Every series of a run with its summary, in three queries whatever the number of series."""
    series = list(Series.objects.filter(run_id=run_id).order_by("host", "name", "labels_key"))
    stats: dict[int, dict[str, Any]] = {
        row["series_id"]: dict(row)
        for row in Chunk.objects.filter(series__run_id=run_id)
        .values("series_id")
        .annotate(low=Min("min"), high=Max("max"), total=Sum("sum"))
    }
    p99s = {
        (host, name.removesuffix(".p99"), labels_key(labels)): value
        for host, name, labels, value in Result.objects.filter(run_id=run_id, name__endswith=".p99").values_list(
            "host", "name", "labels", "value"
        )
    }
    overviews = []
    for s in series:
        row = stats.get(s.pk, {})
        total = row.get("total")
        if s.kind == SeriesKind.COUNTER:
            span = (s.last_ns or 0) - (s.first_ns or 0)
            mean = total * 1e9 / span if total is not None and span > 0 else None
            count = max(s.sample_count - 1, 0)  # rates
        else:
            mean = total / s.sample_count if total is not None and s.sample_count else None
            count = s.sample_count
        p99 = p99s.get((s.host, s.name, s.labels_key))
        overviews.append(SeriesOverview(s, count, mean, row.get("low"), row.get("high"), p99))
    return overviews
