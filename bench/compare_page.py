"""The compare page of two 5,000-run campaigns, its statistics read from the stored point summaries against computed
in Python from every repetition (issue 16, item 6: goal p95 under 200 ms), timed through the Django test client.

    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/rackbench .venv/bin/python bench/compare_page.py

Data (bench/analysis_pages.py's): two fio campaigns of 100 matrix points x 50 repetitions = 5,000 runs each, every
run with 8 aggregate metrics (80,000 aggregate rows in all) and the same 8 for each of its 2 hosts. The data goes
to a scratch database, ``rackbench_bench_compare``, created, migrated and dropped at the end; the results go in by
SQL, and the triggers of campaigns' migration 0019 summarise each point as they do.

Each path serves the page ``REQUESTS`` times after one warm-up request; p50 and p95 are of those wall times. The
Python path is what the page did before issue 16 (every repetition fetched); the SQL path reads one stored summary
per point and metric (campaigns.models.PointSummary). "heap" says whether the process's objects were left to the
collector as the bench found them ("as is") or frozen as rackbench/wsgi.py freezes a server process's once the
application is loaded ("frozen"); "full GCs" counts the full collections the requests set off.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench.analysis_pages import METRICS, add_results, bench_member, in_scratch_database, make_campaign  # noqa: E402
from campaigns import baselines  # noqa: E402

SCRATCH_DATABASE = "rackbench_bench_compare"
REQUESTS = 30


def percentile(times: list[float], q: float) -> float:
    """The q-th percentile by linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(times)
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def serve(client: Client, url: str) -> tuple[list[float], list[float], int, int, int]:
    """Wall times and this (Django) process's CPU times of REQUESTS requests (after a warm-up), the page's size, the
    queries of one request and the full collections of all of them. The CPU time leaves out PostgreSQL's work and
    the waits of a loaded machine."""
    client.get(url)
    times, cpu, full = [], [], []

    def count_full(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    gc.callbacks.append(count_full)
    try:
        with CaptureQueriesContext(connection) as queries:
            for _ in range(REQUESTS):
                started, started_cpu = time.perf_counter(), time.process_time()
                response = client.get(url)
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - started_cpu)
                assert response.status_code == 200, (url, response.status_code)
    finally:
        gc.callbacks.remove(count_full)
    return times, cpu, len(response.content), len(queries) // REQUESTS, len(full)


def run_bench() -> None:
    team, user = bench_member()
    started = time.perf_counter()
    axes = {"numjobs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "bs": ["4k", "8k", "16k", "32k", "64k", "128k",
                                                                       "256k", "512k", "1m", "2m"]}  # fmt: skip
    before = make_campaign(team, "fio-before", axes, 50)
    after = make_campaign(team, "fio-after", axes, 50)
    for c in (before, after):
        add_results(c, metrics=METRICS, hosts=2, scale=1e8, aggregate=True)
    print(f"data: 2 x 5,000 runs, {2 * 5000 * len(METRICS):,} aggregate rows, made in "
          f"{time.perf_counter() - started:.0f} s; {REQUESTS} requests per line after a warm-up")  # fmt: skip

    client = Client()
    client.force_login(user)
    pages = [
        ("compare page, by mean", f"/compare/?campaign={before.pk}&campaign={after.pk}"),
        ("compare page, by median", f"/compare/?campaign={before.pk}&campaign={after.pk}&statistic=median"),
        ("compare page as CSV", f"/compare/?campaign={before.pk}&campaign={after.pk}&format=csv"),
        ("compare API (JSON)", f"/api/v1/compare/?campaigns={before.pk},{after.pk}"),
    ]
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'page':<28} {'path':<7} {'heap':<7} {'p50 s':>6} {'p95 s':>6} {'mean s':>6} {'cpu p50':>8} "
          f"{'cpu p95':>8} {'KiB':>5} {'queries':>7} {'full GCs':>8}")  # fmt: skip
    for what, url in pages:
        for path, in_sql, frozen in (("python", False, False), ("sql", True, False), ("sql", True, True)):
            if frozen:  # as rackbench/wsgi.py leaves a server process
                gc.collect()
                gc.freeze()
            try:
                with mock.patch.object(baselines, "summaries_in_sql", return_value=in_sql):
                    times, cpu, size, queries, full = serve(client, url)
            finally:
                gc.unfreeze()
            print(f"{what:<28} {path:<7} {'frozen' if frozen else 'as is':<7} {percentile(times, 0.5):>6.3f} "
                  f"{percentile(times, 0.95):>6.3f} {statistics.fmean(times):>6.3f} {percentile(cpu, 0.5):>8.3f} "
                  f"{percentile(cpu, 0.95):>8.3f} {size / 1024:>5.0f} {queries:>7} {full:>8}")  # fmt: skip
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    in_scratch_database(SCRATCH_DATABASE, run_bench)


if __name__ == "__main__":
    main()
