"""Stored point summaries (campaigns.models.PointSummary, kept by PostgreSQL triggers) are never stale: after every
way results and runs change (a run succeeding through the services, results stored after the summary, a cancelled
run, a re-run, a run or its results deleted, a campaign deleted, two runs of a point ending at once), the table holds
what its definition computes from the rows, and compare shows what the Python path computes from every repetition."""

from __future__ import annotations

import threading
from itertools import count
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client

from campaigns import baselines, selectors, services
from campaigns.models import Campaign, CampaignStatus, PointSummary, Result, Run, RunStatus
from plugins.benchmarks.base import Metric
from tests.test_compare_sql import assert_same

_sequence = count(1)
SUMMARY = ("campaign_id", "point", "name", "labels_text", "unit", "n", "mean", "stdev", "low", "high", "median")


def make_campaign(team: Any, name: str, values: dict[str, list[float]]) -> Campaign:
    """A succeeded fio campaign, one point per bs, one succeeded run per value (bw_bytes aggregate, a labelled one, a
    per-host row and a per-job row), and a warm-up and a failed run at each point, all written with the ORM."""
    c = Campaign.objects.create(name=name, kind="fio", team=team, matrix=[["bs", list(values)]],
                                status=CampaignStatus.SUCCEEDED)  # fmt: skip
    for point, (bs, series) in enumerate(values.items()):
        runs = [(i + 1, False, RunStatus.SUCCEEDED, v) for i, v in enumerate(series)]
        runs += [(0, True, RunStatus.SUCCEEDED, 1e9), (len(series) + 1, False, RunStatus.FAILED, -1e9)]
        for repetition, warmup, status, value in runs:
            run = add_run(c, point, bs, status=status, repetition=repetition, is_warmup=warmup)
            Result.objects.bulk_create(Result(run=run, **m.as_dict()) for m in metrics(value))
    return c


def add_run(c: Campaign, point: int, bs: str, *, status: str, repetition: int = 1, is_warmup: bool = False) -> Run:
    return Run.objects.create(campaign=c, sequence=next(_sequence), point=point, params={"bs": bs},
                              repetition=repetition, is_warmup=is_warmup, status=status)  # fmt: skip


def metrics(value: float) -> list[Metric]:
    return [
        Metric("bw_bytes", value, "B/s"),
        Metric("lat_ns", value / 3, "ns", labels={"phase": "read"}),
        Metric("bw_bytes", value / 2, "B/s", host="n1"),
        Metric("bw_bytes", 7.0, "B/s", labels={"job": "j1"}),
    ]


def stored(*campaigns: Campaign) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    rows = PointSummary.objects.filter(campaign__in=campaigns).values_list(*SUMMARY)
    return {row[:4]: row[4:] for row in rows}


def recomputed(*campaigns: Campaign) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """What the table's definition (the view the triggers refresh each point from) computes from the rows now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(SUMMARY)} FROM campaigns_pointsummary_live WHERE campaign_id = ANY(%s)",
                       [[c.pk for c in campaigns]])  # fmt: skip
        return {row[:4]: row[4:] for row in cursor.fetchall()}


def assert_fresh(*campaigns: Campaign) -> None:
    """The stored summaries are the recomputed ones (the sums of the mean and stdev taken in another order: to the
    last bits), and compare reads from them exactly what the Python path computes from every repetition."""
    now, fresh = stored(*campaigns), recomputed(*campaigns)
    assert set(now) == set(fresh)
    for key, (unit, n, mean, stdev, low, high, median) in fresh.items():
        assert now[key][:2] == (unit, n) and now[key][4:] == (low, high, median), key
        assert now[key][2] == pytest.approx(mean, rel=1e-12), key
        assert now[key][3] == (stdev if stdev is None else pytest.approx(stdev, rel=1e-12)), key
    sets: list[tuple[str, Campaign, list[int] | None]] = [(c.name, c, None) for c in campaigns]
    if len(sets) > 1:
        assert_same(selectors.compare(sets=sets, in_sql=False), selectors.compare(sets=sets))


def cell(c: Campaign, bs: str, metric: str = "bw_bytes") -> baselines.Summary:
    summaries = baselines.campaigns_point_summaries(campaigns=[c])
    assert summaries is not None
    return summaries[c.pk][baselines.Key(f'{{"bs": "{bs}"}}', metric)]


def collected(c: Campaign, point: int, bs: str, value: float) -> Run:
    """A run of ``c`` at ``point`` that ran and is collecting, its results stored by the service a collect calls."""
    run = add_run(c, point, bs, status=RunStatus.COLLECTING, repetition=90 + point)
    assert services.run_store_results(run=run, metrics=metrics(value)) == len(metrics(value))
    return run


BEFORE = {"4k": [100.0, 104.5, 98.25, 101.0], "64k": [5e8, 5.1e8, 4.9e8], "1m": [2e9]}
AFTER = {"4k": [80.0, 81.5, 200.0, 79.0, 90.0], "64k": [5.5e8, 5.4e8, 5.6e8], "1m": [1.9e9, 2.1e9]}


@pytest.fixture
def pair(team: Any) -> tuple[Campaign, Campaign]:
    return make_campaign(team, "before", BEFORE), make_campaign(team, "after", AFTER)


@pytest.mark.django_db
def test_it_summarises_every_point_as_its_results_are_written_leaving_out_warm_ups_failures_hosts_and_jobs(
    pair: tuple[Campaign, Campaign],
) -> None:
    before, after = pair
    assert len(stored(before, after)) == 2 * 3 * 2  # bw_bytes and lat_ns{phase=read} at 3 points each
    four_k = cell(after, "4k")
    assert (four_k.stats.n, four_k.stats.median, four_k.stats.min, four_k.stats.max) == (5, 81.5, 79.0, 200.0)
    assert four_k.stats.mean == pytest.approx(106.1)
    assert cell(before, "1m").stats.stdev == 0.0  # one value: stddev_samp is NULL, the statistics say 0
    assert_fresh(before, after)


@pytest.mark.django_db
def test_a_run_that_succeeds_through_the_services_counts_once_it_has_succeeded(
    pair: tuple[Campaign, Campaign],
) -> None:
    before, after = pair
    run = collected(after, 0, "4k", 1000.0)

    assert cell(after, "4k").stats.n == 5  # collecting: not a statistic yet
    assert_fresh(before, after)
    assert services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)

    assert (cell(after, "4k").stats.n, cell(after, "4k").stats.max) == (6, 1000.0)
    assert_fresh(before, after)


@pytest.mark.django_db
def test_results_stored_after_the_summary_are_counted(pair: tuple[Campaign, Campaign]) -> None:
    """Results written to a run that already succeeded (an import, a late summary, a hand-written row) refresh its
    point: the summary is never older than the results."""
    before, after = pair
    run = Run.objects.filter(campaign=after, point=1, status=RunStatus.SUCCEEDED, is_warmup=False).first()
    assert run is not None
    Result.objects.create(run=run, name="iops", value=12.5, unit="IOPS")
    assert cell(after, "64k", "iops").stats.n == 1
    Result.objects.filter(run=run, name="bw_bytes", host="").update(value=9e8)
    assert cell(after, "64k").stats.max == 9e8
    imported = services.results_import(campaign=after, kind="fio", outputs=[])  # a run of point 0, no output
    services.run_store_results(run=imported, metrics=metrics(50.0), status=RunStatus.SUCCEEDED)

    assert (cell(after, "4k").stats.n, cell(after, "4k").stats.min) == (6, 50.0)
    assert_fresh(before, after)


@pytest.mark.django_db
def test_a_cancelled_run_never_counts_even_when_its_results_were_stored_first(
    pair: tuple[Campaign, Campaign],
) -> None:
    before, after = pair
    run = collected(after, 0, "4k", 1e6)

    assert services.run_finish(run_id=run.pk, status=RunStatus.CANCELLED)

    assert not Result.objects.filter(run=run).exists()
    assert (cell(after, "4k").stats.n, cell(after, "4k").stats.max) == (5, 200.0)
    assert_fresh(before, after)


@pytest.mark.django_db
def test_a_re_run_point_counts_its_new_repetitions_with_the_old_ones(pair: tuple[Campaign, Campaign]) -> None:
    before, after = pair
    after.repetitions = 2
    after.save(update_fields=["repetitions"])

    reruns = services.campaign_rerun(campaign=after, points=[1])
    for value, run in zip((6e8, 6.2e8), reruns, strict=True):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.COLLECTING)
        services.run_store_results(run=run, metrics=metrics(value))
        assert services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)

    assert (cell(after, "64k").stats.n, cell(after, "64k").stats.max) == (5, 6.2e8)
    assert_fresh(before, after)


@pytest.mark.django_db
def test_a_deleted_run_or_deleted_results_leave_the_summary(pair: tuple[Campaign, Campaign]) -> None:
    before, after = pair
    four_k = Run.objects.filter(campaign=after, point=0, status=RunStatus.SUCCEEDED, is_warmup=False)
    highest = four_k.get(results__name="bw_bytes", results__host="", results__value=200.0)

    highest.delete()
    assert (cell(after, "4k").stats.n, cell(after, "4k").stats.max) == (4, 90.0)
    assert_fresh(before, after)

    Result.objects.filter(run__in=four_k.exclude(repetition=1)).delete()
    assert (cell(after, "4k").stats.n, cell(after, "4k").stats.mean) == (1, 80.0)
    assert_fresh(before, after)

    Run.objects.filter(campaign=after, point=2).delete()  # the last runs of a point: its rows go
    assert not PointSummary.objects.filter(campaign=after, point=2).exists()
    assert_fresh(before, after)


@pytest.mark.django_db
def test_a_deleted_campaign_leaves_no_summary_behind(pair: tuple[Campaign, Campaign]) -> None:
    before, after = pair

    with transaction.atomic():  # the foreign keys are checked at the commit of this savepoint's transaction
        after.delete()

    assert not PointSummary.objects.filter(campaign_id=after.pk).exists()
    assert_fresh(before)


@pytest.mark.django_db
def test_the_compare_page_its_csv_and_the_api_show_a_change_made_after_their_first_reading(
    pair: tuple[Campaign, Campaign], owner: Any, outsider: Any
) -> None:
    before, after = pair
    client = Client()
    client.force_login(owner)
    page = f"/compare/?campaign={before.pk}&campaign={after.pk}"
    api = f"/api/v1/compare/?campaigns={before.pk},{after.pk}"

    def four_k() -> tuple[str, dict[str, Any]]:
        csv = client.get(page + "&format=csv").content.decode()
        rows = client.get(api).json()["rows"]
        row = next(r for r in rows if r["metric"] == "bw_bytes" and r["params"] == {"bs": "4k"})
        return next(line for line in csv.splitlines() if "4k" in line and "bw_bytes" in line), row["values"][1]

    line, shown = four_k()
    assert (shown["n"], shown["max"]) == (5, 200.0) and ",5," in line
    Run.objects.filter(campaign=after, point=0, results__value=200.0).delete()
    line, shown = four_k()
    assert (shown["n"], shown["max"], shown["mean"]) == (4, 90.0, 82.625) and ",4," in line and "82.62" in line
    assert "n=4" in client.get(page).content.decode()
    for url in (page, page + "&format=csv"):
        assert Client().get(url).status_code == 302
        outside = Client()
        outside.force_login(outsider)
        assert outside.get(url).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_runs_of_one_point_that_succeed_at_once_are_both_counted(team: Any) -> None:
    """Two transactions end a run of the same point each. The second one's refresh waits for the first to commit and
    then sees its run: the summary counts both, whichever commits first."""
    c = make_campaign(team, "together", {"4k": [1.0, 2.0]})
    first, second = (collected(c, 0, "4k", value) for value in (10.0, 20.0))
    first_done, go = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def finish(run: Run, wait_for: threading.Event | None, then: threading.Event | None) -> None:
        try:
            with transaction.atomic():
                Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # the triggers refresh the point
                if then is not None:
                    then.set()
                if wait_for is not None:
                    assert wait_for.wait(120)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    one = threading.Thread(target=finish, args=(first, go, first_done))
    one.start()
    assert first_done.wait(60)  # the first transaction has refreshed the point and not committed yet
    two = threading.Thread(target=finish, args=(second, None, None))
    two.start()
    waiting = False
    for _ in range(600):  # the second one waits for the first (pg_locks says so), then the first commits
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            waiting = cursor.fetchone()[0] > 0
        if waiting or not two.is_alive():
            break
        threading.Event().wait(0.1)
    go.set()
    one.join(120)
    two.join(120)

    assert not errors and waiting
    assert cell(c, "4k").stats.n == 4
    assert_fresh(c)


@pytest.mark.django_db(transaction=True)
def test_the_migration_summarises_the_results_already_stored(team: Any) -> None:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    executor.migrate([("campaigns", "0018_campaign_drift_report_suite_actions")])
    try:
        c = make_campaign(team, "older", BEFORE)  # no triggers and no table yet: the rows alone
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)

    assert len(stored(c)) == 3 * 2
    assert cell(c, "4k").stats.n == 4
    assert_fresh(c)
