"""The compare page of two 5,000-run campaigns, its statistics aggregated in SQL against computed in Python from
every repetition (issue 16, item 6: goal p95 under 200 ms), timed through the Django test client.

    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/rackbench .venv/bin/python bench/compare_page.py

Data (bench/analysis_pages.py's): two fio campaigns of 100 matrix points x 50 repetitions = 5,000 runs each, every
run with 8 aggregate metrics (80,000 aggregate rows in all) and the same 8 for each of its 2 hosts. The data goes
to a scratch database, ``rackbench_bench_compare``, created, migrated and dropped at the end.

Each path serves the page ``REQUESTS`` times after one warm-up request; p50 and p95 are of those wall times. The
Python path is what the page did before (every repetition fetched); the SQL path is taken by PostgreSQL.
"""

from __future__ import annotations

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


def serve(client: Client, url: str) -> tuple[list[float], list[float], int, int]:
    """Wall times and this (Django) process's CPU times of REQUESTS requests (after a warm-up), the page's size and
    the queries of one request. The CPU time leaves out PostgreSQL's work and the waits of a loaded machine."""
    client.get(url)
    times, cpu = [], []
    with CaptureQueriesContext(connection) as queries:
        for _ in range(REQUESTS):
            started, started_cpu = time.perf_counter(), time.process_time()
            response = client.get(url)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
            assert response.status_code == 200, (url, response.status_code)
    return times, cpu, len(response.content), len(queries) // REQUESTS


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
    print(f"{'page':<28} {'path':<7} {'p50 s':>6} {'p95 s':>6} {'mean s':>6} {'cpu p50':>8} {'cpu p95':>8} "
          f"{'KiB':>5} {'queries':>7}")  # fmt: skip
    for what, url in pages:
        for path, in_sql in (("python", False), ("sql", True)):
            with mock.patch.object(baselines, "summaries_in_sql", return_value=in_sql):
                times, cpu, size, queries = serve(client, url)
            print(f"{what:<28} {path:<7} {percentile(times, 0.5):>6.3f} {percentile(times, 0.95):>6.3f} "
                  f"{statistics.fmean(times):>6.3f} {percentile(cpu, 0.5):>8.3f} {percentile(cpu, 0.95):>8.3f} "
                  f"{size / 1024:>5.0f} {queries:>7}")  # fmt: skip
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def main() -> None:
    in_scratch_database(SCRATCH_DATABASE, run_bench)


if __name__ == "__main__":
    main()
