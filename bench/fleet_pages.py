"""The fleet view at scale: its page, CSV export and API over a campaign of 1,000 nodes x 20 metrics (issue 18:
target under 300 ms), and the link matrix of a 64-node all-pairs campaign, timed through the Django test client.

    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/rackbench .venv/bin/python bench/fleet_pages.py

The data goes to a scratch database, ``rackbench_bench_fleet``, created, migrated and dropped here (needs CREATEDB).

Data: one matrix point, 3 repetitions; each run has 20 per-host metrics for each of 1,000 hosts (60,000 rows), one
host 30 % below the others on one metric. The link campaign: 64 hosts, every ordered pair, 3 repetitions (12,096).
The GPU campaign: 125 hosts of 8 GPUs, 10 per-GPU metrics (30,000 rows), one GPU at a third of the others on one.

Each URL is requested once to warm up, then RACKBENCH_BENCH_REPEAT (default 10) rounds of every URL in turn.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from bench.analysis_pages import bench_member, in_scratch_database  # noqa: E402
from campaigns.models import Campaign, CampaignStatus, Run, RunStatus  # noqa: E402

SCRATCH_DATABASE = "rackbench_bench_fleet"
REPEAT = int(os.environ.get("RACKBENCH_BENCH_REPEAT", "10"))


@dataclass
class Timing:
    """One URL's requests: wall and CPU time of this (Django) process, size, queries, garbage collections."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    database: list[float] = field(default_factory=list)  # the queries' time, as the client waited for them
    size: int = 0
    queries: int = 0
    collections: Counter[int] = field(default_factory=Counter)

    def line(self, label: str, requests: int) -> str:
        p95 = statistics.quantiles(self.wall, n=20, method="inclusive")[-1] if len(self.wall) > 1 else self.wall[0]
        collected = " ".join(f"{self.collections[g] / requests:.1f}" for g in range(3))
        return (f"{label:<38} {statistics.median(self.wall) * 1000:5.0f} ms wall (p95 {p95 * 1000:5.0f}) "
                f"{statistics.median(self.cpu) * 1000:5.0f} ms cpu (least {min(self.cpu) * 1000:4.0f}) "
                f"{statistics.median(self.database) * 1000:4.0f} ms in queries "
                f"{self.size / 1024:5.0f} KiB {self.queries} queries, gc {collected}")  # fmt: skip


def pages(client: Client, urls: dict[str, str], repeat: int = REPEAT) -> dict[str, Timing]:
    """Each URL requested once to warm up, then ``repeat`` rounds of every URL in turn, so that a burst of load on
    the shared machine falls on all of them alike: median and 95th percentile wall time, median and least CPU time,
    the time spent in queries (PostgreSQL's, and fetching their rows), size, queries and garbage collections
    (generations 0, 1, 2) per request. On a loaded machine the CPU time is the steadier number, its least the
    steadiest."""
    timings = {label: Timing() for label in urls}
    current: list[Counter[int]] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and current:
            current[0][info["generation"]] += 1

    gc.callbacks.append(count)
    try:
        for round_ in range(repeat + 1):
            for label, url in urls.items():
                timing = timings[label]
                current[:] = [timing.collections]
                with CaptureQueriesContext(connection) as queries:
                    started, started_cpu = time.perf_counter(), time.process_time()
                    response = client.get(url)
                    took, took_cpu = time.perf_counter() - started, time.process_time() - started_cpu
                assert response.status_code == 200, (url, response.status_code)
                timing.size, timing.queries = len(response.content), len(queries)
                if round_:  # the first round warms up
                    timing.wall.append(took)
                    timing.cpu.append(took_cpu)
                    timing.database.append(sum(float(q["time"]) for q in queries.captured_queries))
    finally:
        gc.callbacks.remove(count)
    return timings


def campaign(team: Any, name: str, kind: str) -> Campaign:
    made = Campaign.objects.create(name=name, kind=kind, team=team, repetitions=3, status=CampaignStatus.SUCCEEDED,
                                   matrix=[["numjobs", [1]]])  # fmt: skip
    Run.objects.bulk_create(Run(campaign=made, sequence=r, point=0, params={"numjobs": 1}, repetition=r + 1,
                                status=RunStatus.SUCCEEDED) for r in range(3))  # fmt: skip
    return made


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def run_bench() -> None:
    print(load())

    team, user = bench_member()
    client = Client()
    client.force_login(user)

    wide = campaign(team, "fleet-1000x20", "fio")
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO campaigns_result (run_id, name, value, unit, host, labels)
               SELECT r.id, 'metric_' || m, 1000 * (0.97 + random() * 0.06) * (CASE WHEN h = 417 AND m = 3 THEN 0.7
                      ELSE 1 END), 'B/s', 'node' || h, '{}'::jsonb
               FROM campaigns_run r, generate_series(1, 20) m, generate_series(1, 1000) h
               WHERE r.campaign_id = %s""",
            [wide.pk],
        )
        links = campaign(team, "links-64", "iperf3")
        cursor.execute(
            """INSERT INTO campaigns_result (run_id, name, value, unit, host, labels)
               SELECT r.id, 'throughput_bps', 9.4e8 * (0.97 + random() * 0.06) * (CASE WHEN s = 7 OR d = 7 THEN 0.3
                      ELSE 1 END), 'bit/s', 'node' || s,
                      jsonb_build_object('peer', 'node' || d, 'direction', 'send', 'round', 0)
               FROM campaigns_run r, generate_series(1, 64) s, generate_series(1, 64) d
               WHERE r.campaign_id = %s AND s <> d""",
            [links.pk],
        )
        gpus = campaign(team, "gpus-1000x10", "nvidia_smi")
        cursor.execute(
            """INSERT INTO campaigns_result (run_id, name, value, unit, host, labels)
               SELECT r.id, 'gpu.metric_' || m || '.mean', 1000 * (0.97 + random() * 0.06) * (CASE WHEN h = 41 AND g = 3
                      AND m = 2 THEN 0.33 ELSE 1 END), 'MHz', 'node' || h, jsonb_build_object('gpu', g)
               FROM campaigns_run r, generate_series(1, 10) m, generate_series(1, 125) h, generate_series(0, 7) g
               WHERE r.campaign_id = %s""",
            [gpus.pk],
        )
        cursor.execute("ANALYZE campaigns_result")

    urls = {
        "fleet page, 1,000 nodes x 20 metrics": f"/analysis/campaigns/{wide.pk}/fleet/",
        "fleet CSV (every cell)": f"/analysis/campaigns/{wide.pk}/fleet/?format=csv&table=cells",
        "fleet API": f"/api/v1/campaigns/{wide.pk}/fleet/",
        "fleet page, 125 nodes x 8 GPUs x 10": f"/analysis/campaigns/{gpus.pk}/fleet/",
        "fleet API, 125 nodes x 8 GPUs x 10": f"/api/v1/campaigns/{gpus.pk}/fleet/",
        "link matrix page, 64 nodes": f"/analysis/campaigns/{links.pk}/links/",
        "link matrix API": f"/api/v1/campaigns/{links.pk}/links/",
    }
    for label, timing in pages(client, urls).items():
        print(timing.line(label, REPEAT + 1))
    named = client.get(f"/api/v1/campaigns/{wide.pk}/fleet/").json()["outliers"]
    linked = client.get(f"/api/v1/campaigns/{links.pk}/links/").json()["outliers"]
    suspects = client.get(f"/api/v1/campaigns/{gpus.pk}/fleet/").json()["device_outliers"]
    print(f"outliers named: fleet {named}, links {linked}, GPUs {suspects}")
    print(load())


def main() -> None:
    in_scratch_database(SCRATCH_DATABASE, run_bench)


if __name__ == "__main__":
    main()
