"""Compare's statistics aggregated in SQL (count, avg, stddev_samp, min, max, percentile_cont) are those the Python
path computes from every repetition: whole campaigns point by point, chosen runs and points pooled, by mean and by
median; and SQLite, without an exact median, takes the Python path."""

from __future__ import annotations

from itertools import count
from typing import Any
from unittest import mock

import pytest

from campaigns import baselines, selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus

pytestmark = pytest.mark.django_db
_sequence = count(1)


def campaign(team: Any, name: str, points: dict[str, list[float]], *, statistic: str = "mean") -> Campaign:
    """A succeeded fio campaign: one point per bs, one run per value (bw_bytes and iops aggregates, a labelled
    aggregate, a per-host row and a per-job row), a warm-up and a failed run left out."""
    c = Campaign.objects.create(name=name, kind="fio", team=team, matrix=[["bs", list(points)]], family="f",
                                status=CampaignStatus.SUCCEEDED, statistic=statistic)  # fmt: skip
    for point, (bs, values) in enumerate(points.items()):
        extra = [(0, True, RunStatus.SUCCEEDED, 1e9), (len(values) + 1, False, RunStatus.FAILED, -1e9)]
        runs = [(i + 1, False, RunStatus.SUCCEEDED, v) for i, v in enumerate(values)] + extra
        for repetition, warmup, status, value in runs:
            run = Run.objects.create(campaign=c, sequence=next(_sequence), point=point, params={"bs": bs, "size": "1M"},
                                     repetition=repetition, is_warmup=warmup, status=status)  # fmt: skip
            Result.objects.bulk_create([
                Result(run=run, name="bw_bytes", value=value, unit="B/s"),
                Result(run=run, name="iops", value=value / 4096 + repetition, unit="IOPS"),
                Result(run=run, name="lat_ns", value=value / 3, unit="ns", labels={"phase": "read"}),
                Result(run=run, name="bw_bytes", value=value / 2, unit="B/s", host="n1"),
                Result(run=run, name="bw_bytes", value=7.0, unit="B/s", labels={"job": "j1"}),
            ])  # fmt: skip
    return c


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-12, abs=1e-12), where
    else:
        assert a == b, where


BEFORE = {"4k": [100.0, 104.5, 98.25, 101.0], "64k": [5e8, 5.1e8, 4.9e8], "1m": [2e9], "2m": [3.0, 3.0, 3.0]}
AFTER = {"4k": [80.0, 81.5, 200.0, 79.0, 90.0], "64k": [5.5e8, 5.4e8, 5.6e8], "1m": [1.9e9, 2.1e9], "8m": [1.0]}


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_sql_and_python_give_the_same_comparison_of_whole_campaigns(team: Any, statistic: str) -> None:
    before = campaign(team, "before", BEFORE, statistic=statistic)
    after = campaign(team, "after", AFTER)
    sets: list[tuple[str, Campaign, list[int] | None]] = [("a", before, None), ("b", after, None)]

    in_sql = selectors.compare(sets=sets, in_sql=True)
    in_python = selectors.compare(sets=sets, in_sql=False)

    assert in_sql["statistic"] == statistic
    assert len(in_sql["rows"]) == 3 * 5  # bw_bytes, iops, lat_ns{phase=read} at 5 distinct bs
    assert_same(in_python, in_sql)


def test_sql_and_python_give_the_same_comparison_of_chosen_runs_and_points(team: Any) -> None:
    before = campaign(team, "before", BEFORE)
    after = campaign(team, "after", AFTER)
    ok = Run.objects.filter(status=RunStatus.SUCCEEDED, is_warmup=False)
    runs = list(ok.filter(campaign=before).values_list("pk", flat=True)[:5])
    point = list(ok.filter(campaign=after, point=0).values_list("pk", flat=True))
    sets: list[tuple[str, Campaign, list[int] | None]] = [("runs", before, runs), ("point", after, point)]

    for statistic in ("mean", "median"):
        in_sql = selectors.compare(sets=sets, statistic=statistic, in_sql=True)
        assert_same(selectors.compare(sets=sets, statistic=statistic, in_sql=False), in_sql)
        assert {r["metric"] for r in in_sql["rows"]} == {"bw_bytes", "iops", "lat_ns{phase=read}"}


@pytest.mark.parametrize("statistic", ["mean", "median"])
def test_the_page_s_comparison_shows_the_same_cells_with_the_median_left_out_of_the_sql_of_chosen_runs_by_mean(
    team: Any, statistic: str
) -> None:
    """The /compare/ page reads each cell's value, stdev and n only (every_statistic=False): whole campaigns come from
    their stored summaries, median included; chosen runs by mean are aggregated without it. Every other number is the
    Python path's, on skewed repetitions (80, 81.5, 200, 79, 90)."""
    before = campaign(team, "before", BEFORE, statistic=statistic)
    after = campaign(team, "after", AFTER)
    whole: list[tuple[str, Campaign, list[int] | None]] = [("a", before, None), ("b", after, None)]
    ok = Run.objects.filter(status=RunStatus.SUCCEEDED, is_warmup=False)
    chosen: list[tuple[str, Campaign, list[int] | None]] = [
        ("a", before, list(ok.filter(campaign=before, point=0).values_list("pk", flat=True))),
        ("b", after, list(ok.filter(campaign=after, point=0).values_list("pk", flat=True))),
    ]

    for sets, median_left_out in ((whole, False), (chosen, statistic == "mean")):
        shown = selectors.compare(sets=sets, in_sql=True, every_statistic=False)
        expected = selectors.compare(sets=sets, in_sql=False)

        cells = [cell for row in shown["rows"] for cell in row["values"] if cell]
        assert cells and all((cell["median"] is None) == median_left_out for cell in cells)
        if median_left_out:
            for row in expected["rows"]:
                for cell in row["values"]:
                    if cell:
                        cell["median"] = None
        assert_same(expected, shown)
        four_k = next(r for r in shown["rows"] if r["metric"] == "bw_bytes" and r["params"].get("bs", "4k") == "4k")
        assert four_k["values"][1]["value"] == pytest.approx(81.5 if statistic == "median" else 106.1)


def test_the_sql_path_reads_one_row_per_point_and_metric_not_one_per_repetition(team: Any) -> None:
    before = campaign(team, "before", BEFORE)
    after = campaign(team, "after", AFTER)
    summaries = baselines.campaigns_point_summaries(campaigns=[before, after])

    assert summaries is not None
    four_k = summaries[after.pk][baselines.Key('{"bs": "4k"}', "bw_bytes")]
    assert (four_k.stats.n, four_k.stats.median, four_k.stats.max) == (5, 81.5, 200.0)
    assert four_k.stats.mean == pytest.approx(106.1)


def test_without_an_exact_median_in_the_database_compare_takes_the_python_path(team: Any) -> None:
    before = campaign(team, "before", BEFORE, statistic="median")
    after = campaign(team, "after", AFTER)
    sets: list[tuple[str, Campaign, list[int] | None]] = [("a", before, None), ("b", after, None)]
    expected = selectors.compare(sets=sets, in_sql=False)

    with mock.patch.object(baselines, "summaries_in_sql", return_value=False):
        assert baselines.campaigns_point_summaries(campaigns=[before]) is None
        assert_same(expected, selectors.compare(sets=sets))


def test_points_of_one_campaign_with_the_same_axes_are_pooled_by_the_python_path(team: Any) -> None:
    c = Campaign.objects.create(name="twice", kind="fio", team=team, matrix=[["bs", ["4k"]]],
                                status=CampaignStatus.SUCCEEDED)  # fmt: skip
    for point, value in ((0, 1.0), (0, 2.0), (1, 10.0)):  # two points measuring bs=4k (a derived axis left out)
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=point, params={"bs": "4k"},
                                 repetition=1, status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.create(run=run, name="bw_bytes", value=value, unit="B/s")
    other = campaign(team, "other", {"4k": [5.0, 6.0]})

    assert baselines.campaigns_point_summaries(campaigns=[c]) is None
    result = selectors.compare(sets=[("a", c, None), ("b", other, None)], statistic="median")
    bw = next(r for r in result["rows"] if r["metric"] == "bw_bytes")
    assert (bw["values"][0]["n"], bw["values"][0]["median"]) == (3, 2.0)


def test_the_campaign_statistics_are_the_same_aggregated_in_sql_or_in_python(team: Any) -> None:
    c = campaign(team, "summary", AFTER, statistic="median")

    in_sql = selectors.campaign_summary(campaign=c)
    with mock.patch.object(baselines, "summaries_in_sql", return_value=False):
        in_python = selectors.campaign_summary(campaign=c)

    assert len(in_sql) == 3 * len(AFTER)
    assert_same(in_python, in_sql)
    four_k = next(r for r in in_sql if r["metric"] == "bw_bytes" and r["params"]["bs"] == "4k")
    assert (four_k["statistic"], four_k["value"], four_k["params"]) == ("median", 81.5, {"bs": "4k", "size": "1M"})
