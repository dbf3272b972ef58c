"""Telemetry storage on PostgreSQL: ingest rate, bytes per sample on disk, downsampled and zoomed reads (issue 5).

    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/rackbench .venv/bin/python bench/telemetry_ingest.py

The server and credentials come from DATABASE_URL; the data goes to a scratch database, ``rackbench_bench``,
which Django's test-database machinery creates and migrates first and drops at the end: the database that
DATABASE_URL names is not touched (it need not even exist). The role needs CREATEDB.

Synthetic data shaped like seed 000's RoCE links: every millisecond, a few packets of background traffic, and at
each training batch (every ~100 ms) a burst of 2-6 ms at ~80 Gbps; about 3 Gbps on average. Timestamps are read
by a sampler that keeps its 1 ms cadence with 20-60 us of wake-up jitter (``--timestamps``: ``ns``, as
clock_gettime gives them, ``us`` rounded to microseconds, or ``regular``, exactly on the tick).

Measured: ingest of 600 s x 8 NICs x 3 nodes (24 series, 14.4 M samples) through telemetry.services, its size on
disk (pg_total_relation_size of the chunk table, TOAST and indexes included), then one 14.4 M-sample series:
ingest, reading all of it downsampled to 2000 points, a zoomed 2 s window at full resolution, its summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from campaigns.models import Campaign, Run  # noqa: E402
from telemetry import charts, selectors, services  # noqa: E402
from telemetry.models import Chunk, Series, SeriesKind  # noqa: E402

SCRATCH_DATABASE = "rackbench_bench"
MS = 1_000_000
START_NS = 1_767_225_600 * 10**9  # 2026-01-01
Row = tuple[str, str, str]  # what, result, target


def link_counter(n: int, rng: np.random.Generator, *, timestamps: str) -> tuple[np.ndarray, np.ndarray]:
    """n samples of a RoCE port's byte counter every 1 ms: idle background, ~80 Gbps bursts every ~100 ms."""
    ticks = START_NS + np.arange(n, dtype=np.int64) * MS
    if timestamps == "regular":
        ts = ticks
    else:
        ts = ticks + rng.integers(20_000, 60_000, n)
        if timestamps == "us":
            ts = ts // 1000 * 1000
    per_ms = rng.poisson(3, n) * 4158 + rng.poisson(4, n) * 78  # 4 KiB-MTU frames and acks
    at = int(rng.integers(0, 100))
    while at < n:
        length = int(rng.integers(2, 7))
        per_ms[at : at + length] += (10_000_000 * rng.uniform(0.95, 1.0, len(per_ms[at : at + length]))).astype(
            np.int64
        )
        at += int(rng.normal(100, 5))
    return ts, int(rng.integers(0, 10**12)) + np.cumsum(per_ms)


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """The median wall time of ``repeat`` calls, and the last call's result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def chunk_table_bytes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [Chunk._meta.db_table])
        return int(cursor.fetchone()[0])


def payload_bytes(series: list[Series]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT sum(octet_length(data)) FROM {Chunk._meta.db_table} WHERE series_id = ANY(%s)",
            [[s.pk for s in series]],
        )
        return int(cursor.fetchone()[0])


def append(run: Run, host: str, name: str, labels: dict[str, str], ts: np.ndarray, values: np.ndarray) -> Series:
    return services.series_append(
        run=run,
        host=host,
        name=name,
        labels=labels,
        unit="B",
        kind=SeriesKind.COUNTER,
        timestamps_ns=ts,
        values=values,
        interval_ns=MS,  # as the sampler ingest gives it: timestamps stored to 10 µs
    )


def ingest_links(run: Run, args: argparse.Namespace, rng: np.random.Generator) -> tuple[list[Series], list[Row]]:
    n = args.seconds * 1000
    print(f"generating {args.nodes} nodes x {args.nics} NICs x {n:,} samples ...", flush=True)
    data = {
        (f"node{h}", f"mlx5_{i}"): link_counter(n, rng, timestamps=args.timestamps)
        for h in range(args.nodes)
        for i in range(args.nics)
    }
    total = n * len(data)
    elapsed, series = timed(lambda: [append(run, h, "rdma.rx_bytes", {"nic": nic}, *data[h, nic]) for h, nic in data])
    on_disk = chunk_table_bytes()
    return series, [
        (f"ingest {len(data)} series x {n:,} samples", f"{total / elapsed:,.0f} samples/s", "≥ 1,000,000"),
        ("on disk (chunk table, TOAST, indexes)", f"{on_disk / total:.2f} B/sample", "≤ 2"),
        ("  of which encoded chunk data", f"{payload_bytes(series) / total:.2f} B/sample", ""),
    ]


def ingest_long(run: Run, n: int, args: argparse.Namespace, rng: np.random.Generator) -> tuple[Series, Row]:
    print(f"generating one series of {n:,} samples ...", flush=True)
    ts, values = link_counter(n, rng, timestamps=args.timestamps)
    elapsed, series = timed(lambda: append(run, "node0", "rdma.rx_bytes", {"nic": "long"}, ts, values))
    return series, (f"ingest one series of {n:,} samples", f"{n / elapsed:,.0f} samples/s", "≥ 1,000,000")


def reads(big: Series, small: Series) -> list[Row]:
    rows = []
    elapsed, window = timed(lambda: selectors.series_window(series=big, max_points=2000), repeat=3)
    assert not window.full_resolution and len(window.t_ns) == 2000
    rows.append((f"read {big.sample_count:,} samples as 2000 min/max points", f"{elapsed:.2f} s", "about 1 s"))
    assert big.first_ns is not None and big.last_ns is not None
    middle = (big.first_ns + big.last_ns) // 2
    elapsed, zoom = timed(
        lambda: selectors.series_window(series=big, start_ns=middle, end_ns=middle + 2000 * MS - 1), repeat=5
    )
    assert zoom.full_resolution
    rows.append((f"read a 2 s window at full resolution ({len(zoom.t_ns)} points)", f"{elapsed * 1000:.1f} ms", ""))
    elapsed, _ = timed(lambda: selectors.series_window(series=small, max_points=2000), repeat=3)
    rows.append((f"read one {small.sample_count:,}-sample series as 2000 points", f"{elapsed * 1000:.0f} ms", ""))
    assert big.first_ns is not None and big.last_ns is not None
    first_ns, last_ns = big.first_ns, big.last_ns
    elapsed, drawn = timed(lambda: charts.chart(big, start_ns=first_ns, end_ns=last_ns), repeat=3)
    assert drawn.band
    rows.append((f"run-page chart of {big.sample_count:,} samples (SVG band)", f"{elapsed:.2f} s", "about 1 s"))
    elapsed, summary = timed(lambda: selectors.series_summary(series=big))
    rows.append((f"summary (mean, p99, max) of {big.sample_count:,} samples", f"{elapsed:.2f} s", ""))
    gbps = [stat * 8 / 1e9 for stat in (summary.mean, summary.p99, summary.max)]
    print("long series, Gbps: mean {:.2f}, p99 {:.1f}, max {:.1f}".format(*gbps))
    return rows


def bench(args: argparse.Namespace) -> list[Row]:
    rng = np.random.default_rng(0)
    campaign = Campaign.objects.create(name="telemetry-bench")
    run = Run.objects.create(campaign=campaign, sequence=1, point=0, repetition=1)
    series, rows = ingest_links(run, args, rng)
    big, row = ingest_long(run, args.seconds * 1000 * args.nodes * args.nics, args, rng)
    return [*rows, row, *reads(big, series[0])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--nics", type=int, default=8)
    parser.add_argument("--timestamps", choices=["ns", "us", "regular"], default="ns")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("run with DATABASE_URL=postgres://... : the targets are PostgreSQL's")
    connection.settings_dict.setdefault("TEST", {})["NAME"] = SCRATCH_DATABASE
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        rows = bench(args)
    finally:
        connection.creation.destroy_test_db(SCRATCH_DATABASE, verbosity=0)
    print(f"\ntelemetry storage, timestamps {args.timestamps}, {os.cpu_count()} CPUs, PostgreSQL\n")
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':>18}  target")
    for what, result, target in rows:
        print(f"{what:<{width}}  {result:>18}  {target}")


if __name__ == "__main__":
    main()
