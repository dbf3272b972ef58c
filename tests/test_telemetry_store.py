"""Telemetry storage: the chunk codec, appending series in chunks, downsampled window reads and summaries.

Timings live in bench/telemetry_ingest.py; here only what is deterministic, the bytes on disk included.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns.models import Campaign, Result, Run
from campaigns.services import run_provenance_merge
from telemetry import codec, selectors, services
from telemetry.models import Chunk, Series, SeriesKind

MS = 1_000_000
START_NS = 1_767_225_600 * 10**9
INT64 = np.iinfo(np.int64)


def link_counter(n: int, *, seed: int = 0, jitter: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """A RoCE port's byte counter every 1 ms (seed 000): background packets, ~80 Gbps bursts every ~100 ms."""
    rng = np.random.default_rng(seed)
    ts = START_NS + np.arange(n, dtype=np.int64) * MS
    if jitter:
        ts += rng.integers(20_000, 60_000, n)
    per_ms = rng.poisson(3, n) * 4158 + rng.poisson(4, n) * 78
    for at in range(int(rng.integers(0, 100)), n, 100):
        burst = per_ms[at : at + int(rng.integers(2, 7))]
        burst += (10_000_000 * rng.uniform(0.95, 1.0, len(burst))).astype(np.int64)
    return ts, 10**12 + np.cumsum(per_ms)


def rates(ts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a counter reads as, computed plainly: (interval ends, increase per second), resets to zero."""
    increments = np.diff(values)
    increments = np.where(increments < 0, values[1:], increments)
    return ts[1:], increments * 1e9 / np.diff(ts)


def min_max_buckets(t: np.ndarray, y: np.ndarray, start: int, end: int, max_points: int) -> tuple[Any, ...]:
    width = -(-(end - start + 1) // max_points)
    keep = (t >= start) & (t <= end)
    ids = (t[keep] - start) // width
    buckets = np.unique(ids)
    lows = np.array([y[keep][ids == b].min() for b in buckets])
    highs = np.array([y[keep][ids == b].max() for b in buckets])
    return start + buckets * width, lows, highs


def round_trip(ts: np.ndarray, values: np.ndarray, **kwargs: Any) -> codec.Decoded:
    return codec.decode(codec.encode(np.asarray(ts, dtype=np.int64), np.asarray(values), **kwargs))


# The codec


def test_it_round_trips_a_link_counter_exactly_in_under_four_bytes_a_sample() -> None:
    ts, values = link_counter(65_536)
    data = codec.encode(ts, values)
    decoded = codec.decode(data)
    assert decoded.values.dtype == np.int64
    assert np.array_equal(decoded.timestamps_ns, ts)
    assert np.array_equal(decoded.values, values)
    assert len(data) / len(ts) < 3.7


def test_it_stores_a_steady_sampler_s_timestamps_in_almost_nothing() -> None:
    ts, values = link_counter(65_536, jitter=False)
    steady = len(codec.encode(ts, values))
    jittery_us = len(codec.encode(ts + np.random.default_rng(1).integers(20, 60, len(ts)) * 1000, values))
    jittery_ns = len(codec.encode(ts + np.random.default_rng(1).integers(20_000, 60_000, len(ts)), values))
    assert steady < 1.8 * len(ts)
    assert steady < jittery_us < jittery_ns


def test_it_round_trips_irregular_timestamps() -> None:
    rng = np.random.default_rng(2)
    ts = START_NS + np.cumsum(rng.integers(1, 10**10, 5000))
    values = rng.integers(-(10**15), 10**15, 5000)
    decoded = round_trip(ts, values)
    assert np.array_equal(decoded.timestamps_ns, ts)
    assert np.array_equal(decoded.values, values)


@pytest.mark.parametrize("values", [[], [7], [7, 3]], ids=["empty", "one", "two"])
@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_it_round_trips_tiny_chunks(values: list[int], dtype: type) -> None:
    ts = START_NS + np.arange(len(values), dtype=np.int64) * MS
    decoded = round_trip(ts, np.array(values, dtype=dtype))
    assert decoded.values.dtype == dtype
    assert np.array_equal(decoded.timestamps_ns, ts)
    assert np.array_equal(decoded.values, values)
    assert decoded.prev_t_ns is None and decoded.prev_value is None


def test_it_round_trips_counter_resets_and_wraps_exactly() -> None:
    values = np.array([10, 2**32 - 5, 3, 0, 0, 2**40, 5, INT64.max, INT64.min, -1, 0, INT64.max], dtype=np.int64)
    ts = np.array([INT64.min, -5, 0, 1, 2, 3, 10**18, 2 * 10**18, 3 * 10**18, INT64.max - 2, INT64.max - 1, INT64.max])
    decoded = round_trip(ts, values)
    assert np.array_equal(decoded.values, values)
    assert np.array_equal(decoded.timestamps_ns, ts)


def test_it_round_trips_every_float_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([[0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1e308], rng.normal(50, 20, 3000)])
    ts = START_NS + np.arange(len(values), dtype=np.int64) * MS
    decoded = round_trip(ts, values)
    assert decoded.values.dtype == np.float64
    assert np.array_equal(decoded.values.view(np.int64), values.view(np.int64))


def test_it_stores_integral_floats_as_integers_and_gives_floats_back() -> None:
    values = np.cumsum(np.random.default_rng(4).integers(0, 300, 10_000)).astype(np.float64)
    ts = START_NS + np.arange(len(values), dtype=np.int64) * MS
    data = codec.encode(ts, values)
    decoded = codec.decode(data)
    assert decoded.values.dtype == np.float64
    assert np.array_equal(decoded.values, values)
    assert len(data) < 2 * len(values)


def test_it_quantizes_floats_to_the_precision_given() -> None:
    values = np.random.default_rng(5).uniform(0, 100, 10_000)
    ts = START_NS + np.arange(len(values), dtype=np.int64) * MS
    exact, quantized = codec.encode(ts, values), codec.encode(ts, values, precision=0.01)
    decoded = codec.decode(quantized)
    assert np.abs(decoded.values - values).max() <= 0.005 + 1e-9
    assert len(quantized) < len(exact) / 2


def test_it_carries_the_sample_before_the_chunk() -> None:
    decoded = round_trip([2 * MS, 3 * MS], [150, 175], prev=(MS, 100))
    assert (decoded.prev_t_ns, decoded.prev_value) == (MS, 100)
    ends, per_second, increments = codec.counter_rates(decoded)
    assert ends.tolist() == [2 * MS, 3 * MS]
    assert per_second.tolist() == [50_000.0, 25_000.0]
    assert increments.tolist() == [50, 25]
    floats = round_trip([2 * MS], [1.5], prev=(MS, 0.25))
    assert floats.prev_value == 0.25


def test_it_reads_a_counter_decrease_as_a_reset_to_zero() -> None:
    increments = codec.counter_increments(np.array([100, 150, 20, 30, 2**32 - 1, 4], dtype=np.int64), 90)
    assert increments.tolist() == [10, 50, 20, 10, 2**32 - 31, 4]


def test_it_refuses_a_chunk_of_unequal_lengths() -> None:
    with pytest.raises(ValueError):
        codec.encode(np.arange(3, dtype=np.int64), np.arange(2))


# Appending series


@pytest.fixture
def run(db: None) -> Run:
    campaign = Campaign.objects.create(name="telemetry")
    return Run.objects.create(campaign=campaign, sequence=1, point=0, repetition=1)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(services, "CHUNK_SAMPLES", 1000)
    return 1000


def append(run: Run, ts: Any, values: Any, *, kind: str = SeriesKind.COUNTER, **kwargs: Any) -> Series:
    return services.series_append(
        run=run,
        host=kwargs.pop("host", "node0"),
        name=kwargs.pop("name", "rdma.rx_bytes"),
        labels=kwargs.pop("labels", {"nic": "mlx5_0"}),
        unit="B",
        kind=kind,
        timestamps_ns=ts,
        values=values,
        **kwargs,
    )


def test_it_cuts_a_series_into_chunks_of_at_most_chunk_samples(run: Run, small_chunks: int) -> None:
    ts, values = link_counter(2 * small_chunks + 5)
    series = append(run, ts, values)
    series.refresh_from_db()
    assert (series.sample_count, series.first_ns, series.last_ns) == (len(ts), ts[0], ts[-1])
    assert series.interval_ns == pytest.approx(MS, abs=40_000)
    chunks = list(series.chunks.order_by("seq"))
    assert [(c.seq, c.count) for c in chunks] == [(0, 1000), (1, 1000), (2, 5)]
    assert [(c.t0_ns, c.t1_ns) for c in chunks] == [(ts[0], ts[999]), (ts[1000], ts[1999]), (ts[2000], ts[-1])]
    decoded = [codec.decode(c.data) for c in chunks]
    assert np.array_equal(np.concatenate([d.values for d in decoded]), values)
    assert decoded[0].prev_t_ns is None
    assert (decoded[1].prev_t_ns, decoded[1].prev_value) == (ts[999], values[999])


def test_it_keeps_each_chunk_s_rate_statistics(run: Run, small_chunks: int) -> None:
    ts, values = link_counter(2500)
    series = append(run, ts, values)
    _t, per_second = rates(ts, values)
    increments = np.diff(values)
    chunks = series.chunks.order_by("seq")
    for chunk, rows in zip(chunks, [slice(0, 999), slice(999, 1999), slice(1999, 2499)], strict=True):
        assert chunk.min == pytest.approx(per_second[rows].min())
        assert chunk.max == pytest.approx(per_second[rows].max())
        assert chunk.sum == increments[rows].sum()


def test_it_keeps_a_gauge_s_statistics_of_its_samples(run: Run) -> None:
    values = np.random.default_rng(6).uniform(0, 100, 300)
    series = append(run, START_NS + np.arange(300) * MS, values, kind=SeriesKind.GAUGE, name="cpu.util")
    chunk = series.chunks.get()
    assert (chunk.min, chunk.max) == (values.min(), values.max())
    assert chunk.sum == pytest.approx(values.sum())


def test_it_appends_after_the_last_sample_and_keeps_rates_across_appends(run: Run, small_chunks: int) -> None:
    ts, values = link_counter(1500)
    append(run, ts[:700], values[:700])
    series = append(run, ts[700:], values[700:])
    series.refresh_from_db()
    assert series.sample_count == 1500
    assert [(c.seq, c.count) for c in series.chunks.order_by("seq")] == [(0, 700), (1, 800)]
    window = selectors.series_window(series=series, max_points=5000)
    assert np.array_equal(window.t_ns, rates(ts, values)[0])
    assert np.allclose(window.max, rates(ts, values)[1])
    with pytest.raises(ValueError, match="already has samples"):
        append(run, ts[-1:], values[-1:])


def test_it_appends_without_decoding_the_series_last_chunk(run: Run, small_chunks: int, decodes: list[int]) -> None:
    ts, values = link_counter(1500)
    for part in np.array_split(np.arange(1500), 5):
        series = append(run, ts[part], values[part])
    assert decodes == []
    series.refresh_from_db()
    assert (series.last_ns, series.last_value) == (ts[-1], values[-1])
    decoded = [codec.decode(c.data) for c in series.chunks.order_by("seq")]
    assert [(d.prev_t_ns, d.prev_value) for d in decoded[1:]] == [
        (ts[i - 1], values[i - 1]) for i in range(300, 1500, 300)
    ]


def test_it_decodes_the_last_chunk_of_a_series_stored_without_its_last_value(
    run: Run, small_chunks: int, decodes: list[int]
) -> None:
    ts, values = link_counter(1500)
    series = append(run, ts[:700], values[:700])
    Series.objects.filter(pk=series.pk).update(last_value=None)  # as the rows stored before it was kept

    series = append(run, ts[700:], values[700:])

    assert decodes == [700]
    window = selectors.series_window(series=series, max_points=5000)
    assert np.allclose(window.max, rates(ts, values)[1])


def test_it_carries_any_last_value_exactly_into_the_next_chunk(run: Run) -> None:
    floats = [0.1, 1 / 3, 2.0**-1074, 1.7976931348623157e308, -12345.678901234567]
    integers = [2**53 + 1, 2**63 - 1, -(2**63)]
    for name, numbers in (("gpu.power", floats), ("mem.used", integers)):
        for i, number in enumerate(numbers):
            append(run, [START_NS + i * MS], np.array([number]), kind=SeriesKind.GAUGE, name=name)
        series = Series.objects.get(run=run, name=name)
        assert series.last_value == numbers[-1] and type(series.last_value) is type(numbers[-1])
        carried = [codec.decode(c.data).prev_value for c in series.chunks.order_by("seq")[1:]]
        assert carried == numbers[:-1]


@pytest.mark.parametrize(
    ("ts", "values", "message"),
    [
        ([1, 3, 2], [1, 2, 3], "strictly increasing"),
        ([1, 2, 2], [1, 2, 3], "strictly increasing"),
        ([1.5, 2.5], [1, 2], "integers"),
        ([1, 2], [1.0, np.nan], "finite"),
        ([1, 2], [1], "one length"),
        ([1, 2], ["a", "b"], "numbers"),
    ],
)
def test_it_refuses_samples_it_cannot_store(run: Run, ts: list[Any], values: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        append(run, ts, values)
    assert not Chunk.objects.exists()


def test_it_refuses_to_change_a_series_kind(run: Run) -> None:
    append(run, [1, 2], [1, 2])
    with pytest.raises(ValueError, match="counter"):
        append(run, [3, 4], [1, 2], kind=SeriesKind.GAUGE)


def test_it_tells_series_apart_by_host_name_and_labels(run: Run) -> None:
    append(run, [1, 2], [1, 2])
    append(run, [1, 2], [1, 2], labels={"nic": "mlx5_1"})
    append(run, [1, 2], [1, 2], host="node1")
    append(run, [3, 4], [3, 4], labels={"nic": "mlx5_0"})
    assert Series.objects.filter(run=run).count() == 3


def test_it_takes_four_bytes_a_sample_or_less_on_disk_in_postgresql(run: Run) -> None:
    """pg_total_relation_size counts the chunk table with its TOAST table and every index."""
    assert connection.vendor == "postgresql"

    def chunk_table_bytes() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_total_relation_size(%s)", [Chunk._meta.db_table])
            return int(cursor.fetchone()[0])

    before = chunk_table_bytes()
    samples = 0
    for nic in range(4):
        ts, values = link_counter(2 * services.CHUNK_SAMPLES, seed=nic)
        append(run, ts, values, labels={"nic": f"mlx5_{nic}"})
        samples += len(ts)
    assert (chunk_table_bytes() - before) / samples <= 4.0


# Reading windows


@pytest.fixture
def counter(run: Run, small_chunks: int) -> tuple[Series, np.ndarray, np.ndarray]:
    ts, values = link_counter(10_000)
    values[5000:] -= values[5000] - 7  # the counter resets to 7 in the middle
    return append(run, ts, values), ts, values


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many samples each decoded chunk held."""
    counts: list[int] = []
    decode = codec.decode

    def counting(data: Any) -> codec.Decoded:
        decoded = decode(data)
        counts.append(len(decoded.timestamps_ns))
        return decoded

    monkeypatch.setattr(codec, "decode", counting)
    return counts


def test_it_reads_a_small_window_at_full_resolution_from_the_chunks_it_overlaps(
    counter: tuple[Series, np.ndarray, np.ndarray], decodes: list[int]
) -> None:
    series, ts, values = counter
    t, per_second = rates(ts, values)
    window = selectors.series_window(series=series, start_ns=int(ts[2990]), end_ns=int(ts[4100]), max_points=2000)
    assert window.full_resolution
    assert window.unit == "B/s"
    assert np.array_equal(window.t_ns, ts[2990:4101])
    assert np.array_equal(window.min, window.max)
    assert np.allclose(window.min, per_second[2989:4100], rtol=1e-12)
    assert len(decodes) == 3  # chunks 2, 3 and 4 of 10


def test_it_reads_a_large_window_as_min_and_max_per_bucket(
    counter: tuple[Series, np.ndarray, np.ndarray], decodes: list[int]
) -> None:
    series, ts, values = counter
    start, end = int(ts[1500]), int(ts[8200])
    window = selectors.series_window(series=series, start_ns=start, end_ns=end, max_points=500)
    assert not window.full_resolution
    assert len(window.t_ns) == 500
    bucket_starts, lows, highs = min_max_buckets(*rates(ts, values), start, end, 500)
    assert np.array_equal(window.t_ns, bucket_starts)
    assert np.allclose(window.min, lows, rtol=1e-12)
    assert np.allclose(window.max, highs, rtol=1e-12)
    assert len(decodes) == 8  # chunks 1 to 8 of 10
    assert window.points()[0] == (bucket_starts[0], pytest.approx(lows[0]), pytest.approx(highs[0]))


def test_it_reads_a_whole_series_by_default_keeping_the_bursts(counter: tuple[Series, np.ndarray, np.ndarray]) -> None:
    series, ts, values = counter
    window = selectors.series_window(series=series, max_points=300)
    bucket_starts, lows, highs = min_max_buckets(*rates(ts, values), int(ts[0]), int(ts[-1]), 300)
    assert np.array_equal(window.t_ns, bucket_starts)
    assert np.allclose(window.min, lows, rtol=1e-12)
    assert np.allclose(window.max, highs, rtol=1e-12)
    assert window.max.max() > 9e9  # 80 Gbps bursts of a few ms stay visible at 300 points for 10 s


def test_it_draws_chunks_within_one_bucket_from_their_statistics(
    counter: tuple[Series, np.ndarray, np.ndarray], decodes: list[int]
) -> None:
    series, ts, values = counter
    start, end = int(ts[0]) - 1, int(ts[-1])
    window = selectors.series_window(series=series, start_ns=start, end_ns=end, max_points=3)
    bucket_starts, lows, highs = min_max_buckets(*rates(ts, values), start, end, 3)
    assert np.array_equal(window.t_ns, bucket_starts)
    assert np.allclose(window.min, lows, rtol=1e-12)
    assert np.allclose(window.max, highs, rtol=1e-12)
    assert len(decodes) < 10  # only the chunks that straddle two buckets


def test_it_reads_a_gauge_as_its_samples(run: Run, small_chunks: int) -> None:
    values = np.random.default_rng(7).uniform(0, 100, 4000)
    ts = START_NS + np.arange(4000, dtype=np.int64) * MS
    series = append(run, ts, values, kind=SeriesKind.GAUGE, name="cpu.util", labels={"core": "3"})
    assert selectors.series_window(series=series, max_points=4000).min.tolist() == values.tolist()
    window = selectors.series_window(series=series, max_points=100)
    bucket_starts, lows, highs = min_max_buckets(ts, values, int(ts[0]), int(ts[-1]), 100)
    assert np.array_equal(window.t_ns, bucket_starts)
    assert window.min.tolist() == lows.tolist()
    assert window.max.tolist() == highs.tolist()
    assert window.unit == "B"


def test_it_reads_nothing_outside_the_series(counter: tuple[Series, np.ndarray, np.ndarray], run: Run) -> None:
    series, ts, _values = counter
    assert not len(selectors.series_window(series=series, start_ns=0, end_ns=int(ts[0]) - 1).t_ns)
    assert not len(selectors.series_window(series=series, start_ns=int(ts[5]), end_ns=int(ts[4])).t_ns)
    empty = append(run, [], [], name="empty")
    assert not len(selectors.series_window(series=empty).t_ns)
    assert selectors.series_summary(series=empty).count == 0


# Summaries


def test_it_summarizes_a_counter_by_its_rates(counter: tuple[Series, np.ndarray, np.ndarray]) -> None:
    series, ts, values = counter
    _t, per_second = rates(ts, values)
    summary = selectors.series_summary(series=series)
    increase = np.diff(values)[np.diff(values) >= 0].sum() + 7
    assert summary.count == len(ts) - 1
    assert summary.mean == pytest.approx(increase * 1e9 / (ts[-1] - ts[0]))
    assert summary.p99 == pytest.approx(np.percentile(per_second, 99))
    assert summary.max == pytest.approx(per_second.max())
    assert 2e8 < summary.mean < 6e8  # about 3 Gbps on average, seed 000's links
    assert summary.unit == "B/s"


def test_it_summarizes_a_gauge_by_its_samples(run: Run) -> None:
    values = np.random.default_rng(8).uniform(0, 100, 3000)
    series = append(run, START_NS + np.arange(3000) * MS, values, kind=SeriesKind.GAUGE, name="gpu.util")
    summary = selectors.series_summary(series=series)
    assert (summary.count, summary.max) == (3000, values.max())
    assert summary.mean == pytest.approx(values.mean())
    assert summary.p99 == pytest.approx(np.percentile(values, 99))


def test_it_records_summaries_as_results_of_the_run(counter: tuple[Series, np.ndarray, np.ndarray], run: Run) -> None:
    series, ts, values = counter
    services.run_telemetry_summarize(run=run)
    services.run_telemetry_summarize(run=run)
    results = {r.name: r for r in Result.objects.filter(run=run)}
    assert sorted(results) == ["rdma.rx_bytes.max", "rdma.rx_bytes.mean", "rdma.rx_bytes.p99"]
    peak = results["rdma.rx_bytes.max"]
    assert (peak.host, peak.labels, peak.unit) == ("node0", {"nic": "mlx5_0"}, "B/s")
    assert peak.value == pytest.approx(rates(ts, values)[1].max())


def test_it_replaces_earlier_summaries_in_one_statement(run: Run) -> None:
    kept = [
        Result.objects.create(run=run, name="bw", value=1.0, unit="B/s", host="node0", labels={"nic": "mlx5_0"}),
        Result.objects.create(run=run, name="rdma.rx_bytes.max", value=1.0, unit="B/s", host="node0"),
        Result.objects.create(run=run, name="rdma.rx_bytes.max", value=1.0, unit="B/s", host="node1"),
    ]  # none of them a summary of one of the run's series
    for nic in range(3):
        append(run, [1, 2, 3], [10, 20, 40], labels={"nic": f"mlx5_{nic}"})
    services.run_telemetry_summarize(run=run)

    with CaptureQueriesContext(connection) as queries:
        services.run_telemetry_summarize(run=run)

    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 1
    summaries = Result.objects.filter(run=run, host="node0", labels__has_key="nic", name__startswith="rdma.")
    assert summaries.count() == 9
    assert Result.objects.filter(pk__in=[r.pk for r in kept]).count() == 3


# Provenance


@pytest.mark.django_db(transaction=True)
def test_two_workers_noting_a_run_s_provenance_at_once_keep_each_other_s_notes() -> None:
    """The telemetry collection and a Prometheus pull end together, each on its own connection: the second waits
    for the first one's row lock, instead of merging into what it read before the first one wrote."""
    campaign = Campaign.objects.create(name="provenance")
    run = Run.objects.create(campaign=campaign, sequence=1, point=0, repetition=1, provenance={"params": {"bs": 1}})
    first_inside, second_started, second_done = threading.Event(), threading.Event(), threading.Event()
    second_pid: list[int] = []
    failures: list[BaseException] = []

    def backend_pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])

    def second_waits_for_me() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid() = ANY(pg_blocking_pids(%s))", [second_pid[0]])
            return bool(cursor.fetchone()[0])

    def collected(provenance: dict[str, Any]) -> None:
        first_inside.set()
        second_started.wait(30)
        deadline = time.monotonic() + 30  # a safety net: the loop ends as soon as the second writer is seen
        while not second_done.is_set() and not second_waits_for_me() and time.monotonic() < deadline:
            time.sleep(0.01)
        provenance["telemetry"] = {**provenance.get("telemetry", {}), "collected": {"series": 24}}

    def in_thread(work: Callable[[], None]) -> threading.Thread:
        def target() -> None:
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                failures.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    def pull() -> None:
        second_pid.append(backend_pid())
        second_started.set()
        services.run_telemetry_note(run_id=run.pk, key="prometheus", outcome={"series": 2, "warnings": ["down"]})
        second_done.set()

    first = in_thread(lambda: run_provenance_merge(run_id=run.pk, update=collected))
    assert first_inside.wait(30)
    second = in_thread(pull)
    first.join(60)
    second.join(60)

    assert not failures
    run.refresh_from_db()
    assert run.provenance == {
        "params": {"bs": 1},
        "telemetry": {
            "collected": {"series": 24},
            "prometheus": {"series": 2, "warnings": ["down"]},
            "warnings": ["prometheus: down"],
        },
    }


# Admin


def test_the_admin_lists_series_and_chunks_read_only(
    admin_client: Client, counter: tuple[Series, np.ndarray, np.ndarray]
) -> None:
    series, _ts, _values = counter
    for model in ("series", "chunk"):
        assert admin_client.get(reverse(f"admin:telemetry_{model}_changelist")).status_code == 200
        assert admin_client.get(reverse(f"admin:telemetry_{model}_add")).status_code == 403
    assert admin_client.get(reverse("admin:telemetry_series_change", args=[series.pk])).status_code == 200


def test_it_stores_timestamps_to_a_hundredth_of_the_sampling_interval(run: Run) -> None:
    assert [services.time_quantum(i) for i in (50, 1_000_000, 100_000_000, 1_000_000_000)] == [1, 10_000, 10**6, 10**7]
    ts, values = link_counter(5000)  # 1 ms with 20-60 µs of wake-up jitter, ns resolution
    series = append(run, ts, values, interval_ns=MS)
    decoded = [codec.decode(bytes(c.data)) for c in series.chunks.order_by("seq")]
    kept = np.concatenate([d.timestamps_ns for d in decoded])
    assert (kept % 10_000 == 0).all() and (np.diff(kept) > 0).all()
    assert np.abs(kept - ts).max() <= 5_000  # within half the quantum of what the sampler read
    assert len(kept) == series.sample_count == len(ts)


def test_a_second_read_within_the_quantum_is_left_out_not_refused(run: Run) -> None:
    append(run, [1_000_000_000, 1_001_000_000], [1, 2], interval_ns=MS)
    series = append(run, [1_001_004_000, 1_002_000_000], [3, 4], interval_ns=MS)  # rounds onto the last sample
    series.refresh_from_db()
    assert (series.sample_count, series.last_ns, series.last_value) == (3, 1_002_000_000, 4)
