"""Pages at scale: compare, scaling, sweep and storage pages, the campaign page and the dashboard over 10,000-run
campaigns and a million result rows, timed through the Django test client; and the chart of a 1,000,000-point
series (issue 6, section 5).

    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/rackbench .venv/bin/python bench/analysis_pages.py

The server and credentials come from DATABASE_URL; the data goes to a scratch database, ``rackbench_bench_analysis``,
which Django's test-database machinery creates and migrates first and drops at the end (the role needs CREATEDB).

Data: two fio campaigns ("before" and "after") of 100 matrix points x 50 repetitions = 5,000 runs each, every run
with 8 aggregate metrics and the same 8 for each of its 2 hosts; and a third of 10 points (numjobs 1..512) x 1,000
repetitions = 10,000 runs on 100 hosts, whose per-host bandwidth makes 1,000,000 result rows.
"""

from __future__ import annotations

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
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_test_environment  # noqa: E402

from accounts.services import team_add_member, team_create  # noqa: E402
from analysis import charts  # noqa: E402
from campaigns.models import Campaign, CampaignStatus, Run, RunStatus  # noqa: E402

SCRATCH_DATABASE = "rackbench_bench_analysis"
METRICS = ("bw_bytes", "iops", "read_bw_bytes", "read_iops", "read_lat_mean_ns", "read_lat_p50_ns",
           "read_lat_p99_ns", "read_lat_p99.9_ns")  # fmt: skip


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    """The median wall time of ``repeat`` calls (after one warm-up call), and the last call's result."""
    result = fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def make_campaign(team: Any, name: str, axes: dict[str, list[Any]], repetitions: int) -> Campaign:
    """A succeeded campaign with its runs (bulk), one per point and repetition, in matrix order."""
    campaign = Campaign.objects.create(name=name, kind="fio", team=team, matrix=[[k, v] for k, v in axes.items()],
                                       repetitions=repetitions, status=CampaignStatus.SUCCEEDED)  # fmt: skip
    (first_axis, first), (second_axis, second) = list(axes.items())
    points = [{first_axis: a, second_axis: b} for a in first for b in second]
    Run.objects.bulk_create(
        (Run(campaign=campaign, sequence=i * repetitions + r, point=i, params=params, repetition=r + 1,
             status=RunStatus.SUCCEEDED) for i, params in enumerate(points) for r in range(repetitions)),
        batch_size=5000,
    )  # fmt: skip
    return campaign


def add_results(campaign: Campaign, *, metrics: tuple[str, ...], hosts: int, scale: float, aggregate: bool) -> None:
    """Results straight in SQL (a million rows in seconds): per host h1..hN, and the aggregate when asked."""
    host_rows = "SELECT 'h' || h FROM generate_series(1, %s) h" + (" UNION ALL SELECT ''" if aggregate else "")
    with connection.cursor() as cursor:
        for metric in metrics:
            cursor.execute(
                f"""INSERT INTO campaigns_result (run_id, name, value, unit, host, labels)
                    SELECT r.id, %s, %s * (1 + r.point) * (0.95 + random() * 0.1), '', hosts.name, '{{}}'::jsonb
                    FROM campaigns_run r CROSS JOIN ({host_rows}) AS hosts(name)
                    WHERE r.campaign_id = %s""",
                [metric, scale, hosts, campaign.pk],
            )
        cursor.execute("ANALYZE campaigns_result")
        cursor.execute("ANALYZE campaigns_run")


def page(client: Client, url: str, repeat: int = 3) -> tuple[float, int, int]:
    """The page's median time, its size and the queries of one request."""

    def get() -> Any:
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response

    with CaptureQueriesContext(connection) as queries:
        took, response = timed(get, repeat)
    return took, len(response.content), len(queries) // (repeat + 1)  # timed() warms up with one more call


def in_scratch_database(name: str, bench: Callable[[], None]) -> None:
    """Run ``bench`` in a PostgreSQL database of its own, made for it and dropped after (the benches of bench/)."""
    if connection.vendor != "postgresql":
        sys.exit("run this with DATABASE_URL pointing at a PostgreSQL server")
    setup_test_environment()
    connection.settings_dict.setdefault("TEST", {})["NAME"] = name
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        bench()
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)


def bench_member() -> tuple[Any, Any]:
    """A team and a member of it, who requests the pages."""
    from django.contrib.auth import get_user_model

    team = team_create(name="bench")
    user = get_user_model().objects.create_user("bench", password="bench-pw-1")
    team_add_member(team=team, user=user)
    return team, user


def main() -> None:
    in_scratch_database(SCRATCH_DATABASE, run_bench)


def run_bench() -> None:
    team, user = bench_member()
    started = time.perf_counter()
    axes = {"numjobs": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "bs": ["4k", "8k", "16k", "32k", "64k", "128k",
                                                                       "256k", "512k", "1m", "2m"]}  # fmt: skip
    before = make_campaign(team, "fio-before", axes, 50)
    after = make_campaign(team, "fio-after", axes, 50)
    for c in (before, after):
        add_results(c, metrics=METRICS, hosts=2, scale=1e8, aggregate=True)
    wide = make_campaign(team, "fio-100-hosts", {"rw": ["read"], "numjobs": axes["numjobs"]}, 1000)
    add_results(wide, metrics=("bw_bytes",), hosts=100, scale=1e8, aggregate=False)
    add_results(wide, metrics=("bw_bytes",), hosts=0, scale=1e10, aggregate=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM campaigns_result")
        results = cursor.fetchone()[0]
    print(f"data: {Run.objects.count():,} runs, {results:,} result rows, made in {time.perf_counter() - started:.0f} s")

    client = Client()
    client.force_login(user)
    urls = [
        ("compare, 2 campaigns x 5,000 runs (800 rows)", f"/compare/?campaign={before.pk}&campaign={after.pk}"),
        ("compare as CSV", f"/compare/?campaign={before.pk}&campaign={after.pk}&format=csv"),
        ("scaling, 2 x 5,000 runs, bw_bytes vs numjobs", f"/analysis/scaling/?campaign={before.pk}"
                                                          f"&campaign={after.pk}&metric=bw_bytes&x=numjobs"),
        ("sweep, 10,000 runs x 100 hosts = 1,000,000 rows, per node",
         f"/analysis/sweep/?campaign={wide.pk}&metric=bw_bytes&x=numjobs&hosts=per-node"),
        ("sweep, the same, aggregate and per node", f"/analysis/sweep/?campaign={wide.pk}&metric=bw_bytes&x=numjobs"
                                                     "&hosts=both"),
        ("sweep as SVG", f"/analysis/sweep/?campaign={wide.pk}&metric=bw_bytes&x=numjobs&hosts=both&format=svg"),
        ("storage demand + sizing, measured by a 5,000-run fio campaign", f"/analysis/storage/?measured={before.pk}"
                                                                           "&per_gpu=100&gpus=48"),
        ("campaign page, 10,000 runs (grid of every run, 50 in the table)", f"/campaigns/{wide.pk}/"),
        ("campaign page, 5,000 runs x 8 aggregate metrics, last table page", f"/campaigns/{before.pk}/?page=100"),
        ("dashboard", "/"),
        ("campaign list", "/campaigns/"),
    ]  # fmt: skip
    print(f"{'page':<66} {'median s':>9} {'KiB':>7} {'queries':>8}")
    for what, url in urls:
        took, size, queries = page(client, url)
        print(f"{what:<66} {took:>9.3f} {size / 1024:>7.0f} {queries:>8}")

    n = 1_000_000
    x = np.arange(n, dtype=np.float64)
    y = 100 + 10 * np.sin(x / 5000) + np.where(np.arange(n) % 7919 == 0, 50.0, 0.0)
    xs, ys = x.tolist(), y.tolist()

    def draw() -> tuple[str, dict[str, Any]]:
        fig = charts.Figure("a million points", "sample", "value", [charts.Line("series", xs, ys)])
        return charts.svg(fig), fig.as_json()

    took, (svg, data) = timed(draw)
    print(f"{'chart of a 1,000,000-point series (SVG + uPlot JSON)':<66} {took:>9.3f} {len(svg) / 1024:>7.0f} "
          f"{0:>8}  ({len(data['data'][0])} buckets)")  # fmt: skip


if __name__ == "__main__":
    main()
