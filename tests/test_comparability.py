"""Comparable or said so: a verdict or a comparison across different configurations (kind, fixed parameters, node
hardware, software stack) is inconclusive and lists what differs, on the compare page, in the API and in the verdict."""

from __future__ import annotations

from itertools import count
from typing import Any

import pytest
from django.test import Client

from campaigns import baselines, comparability
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus

pytestmark = pytest.mark.django_db
_sequence = count(1)
UNITS = {"bw_bytes": "B/s", "iops": "IOPS"}


def finished(team: Any, name: str, fixed: dict[str, Any], values: dict[str, list[float]], *,
             node: dict[str, Any] | None = None, tool: str = "fio-3.33") -> Campaign:  # fmt: skip
    """A succeeded fio campaign of one point, its runs' provenance naming the node and the tool as runs record them."""
    c = Campaign.objects.create(name=name, kind="fio", team=team, fixed=fixed, matrix=[["rw", ["read"]]],
                                family="ci-nas", status=CampaignStatus.SUCCEEDED)  # fmt: skip
    hardware = node or {"cpu_model": "EPYC 7742", "cpu_cores": 128, "ram_mb": 1048576, "gpu_count": 8,
                        "gpu_model": "A100"}  # fmt: skip
    for i in range(len(next(iter(values.values())))):
        provenance = {"hosts": {"n1": {"kernel": "Linux 6.1.0 x86_64", "tool_version": tool, "node": hardware}}}
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=0, params={"rw": "read", **fixed},
                                 repetition=i + 1, status=RunStatus.SUCCEEDED, provenance=provenance)  # fmt: skip
        Result.objects.bulk_create(
            Result(run=run, name=m, value=v[i], unit=UNITS[m], host="", labels={}) for m, v in values.items()
        )
    return c


# The case: a CI campaign with bs 4k judged against a bs 128k baseline of the same family.
BIG = {"bw_bytes": [1000.0, 1001.0, 999.0], "iops": [100.0, 101.0, 99.0]}
SMALL = {"bw_bytes": [583.0, 584.0, 582.0], "iops": [1864.0, 1865.0, 1863.0]}


def test_a_verdict_across_different_fixed_parameters_is_inconclusive_and_says_why(team: Any) -> None:
    base = finished(team, "nas-128k", {"bs": "128k"}, BIG)
    ci = finished(team, "nas-ci-4k", {"bs": "4k"}, SMALL)

    verdict = baselines.verdict_compute(campaign=ci, baseline_campaign=base)

    assert verdict.outcome == "inconclusive"
    assert {i["outcome"] for i in verdict.items} == {"inconclusive"}
    bw = next(i for i in verdict.items if i["metric"] == "bw_bytes")
    assert bw["judged_outcome"] == "regression"  # what the numbers alone would have said: kept, not shown as verdict
    assert bw["differences"] == ["fixed bs: 128k (baseline) vs 4k"]
    assert bw["reason"].startswith("not comparable, the configurations differ: fixed bs: 128k (baseline) vs 4k")


def test_a_verdict_across_different_hardware_or_software_is_inconclusive(team: Any) -> None:
    base = finished(team, "nas-a", {"bs": "128k"}, BIG)
    other_gpus = finished(team, "nas-b", {"bs": "128k"}, BIG, node={"cpu_model": "EPYC 7742", "cpu_cores": 128,
                          "ram_mb": 1048576, "gpu_count": 8, "gpu_model": "H100"})  # fmt: skip
    newer_fio = finished(team, "nas-c", {"bs": "128k"}, BIG, tool="fio-3.36")

    hardware = comparability.differences(base, other_gpus)
    assert len(hardware) == 1 and hardware[0].startswith("hardware: ") and "8 x A100" in hardware[0]
    assert "8 x H100" in hardware[0]
    software = comparability.differences(base, newer_fio)
    assert software == ["software: fio-3.33 / Linux 6.1.0 x86_64 (baseline) vs fio-3.36 / Linux 6.1.0 x86_64"]
    assert baselines.verdict_compute(campaign=newer_fio, baseline_campaign=base).outcome == "inconclusive"


def test_the_same_configuration_is_judged_as_before(team: Any) -> None:
    base = finished(team, "nas-1", {"bs": "128k"}, BIG)
    again = finished(team, "nas-2", {"bs": "128k"}, {"bw_bytes": [800.0, 801.0, 799.0], "iops": [80.0, 81.0, 79.0]})
    assert comparability.differences(base, again) == []
    verdict = baselines.verdict_compute(campaign=again, baseline_campaign=base)
    assert verdict.outcome == "regression" and not any("differences" in i for i in verdict.items)


def test_the_compare_page_and_api_list_what_differs_and_judge_nothing_across_it(owner: Any, team: Any) -> None:
    base = finished(team, "nas-128k", {"bs": "128k"}, BIG)
    ci = finished(team, "nas-ci-4k", {"bs": "4k"}, SMALL)
    client = Client()
    client.force_login(owner)

    api = client.get(f"/api/v1/compare/?campaigns={base.pk},{ci.pk}").json()
    assert api["columns"][0]["differences"] == []
    assert api["columns"][1]["differences"] == ["fixed bs: 128k (baseline) vs 4k"]
    assert {c["outcome"] for r in api["rows"] for c in r["changes"][1:]} == {"inconclusive"}
    page = client.get(f"/compare/?campaign={base.pk}&campaign={ci.pk}").content.decode()
    assert "Not the same configuration" in page and "fixed bs: 128k (baseline) vs 4k" in page
    assert ": not comparable" in page and "change-worse" not in page and "change-better" not in page


def test_what_the_campaign_says_it_tests_may_differ(team: Any) -> None:
    """verdict.differs_in maps the two sides explicitly: a throttled rate is the change under test, not a reason."""
    base = finished(team, "nas-fast", {"bs": "128k"}, BIG)
    slow = finished(team, "nas-slow", {"bs": "128k", "rate": "4m"}, {"bw_bytes": [500.0, 501.0, 499.0],
                    "iops": [50.0, 51.0, 49.0]})  # fmt: skip
    assert baselines.verdict_compute(campaign=slow, baseline_campaign=base).outcome == "inconclusive"
    Campaign.objects.filter(pk=slow.pk).update(verdict={"differs_in": ["rate"]})
    slow.refresh_from_db()
    verdict = baselines.verdict_compute(campaign=slow, baseline_campaign=base)
    assert verdict.outcome == "regression"
    assert verdict.items[0]["accepted_differences"] == ["fixed rate: (unset) (baseline) vs 4m"]


def test_the_campaign_summary_keeps_labelled_aggregates_out_of_the_headline(team: Any) -> None:
    """A training run stores its images/s and each epoch's (labelled {epoch}); mdtest each test's rates: pooled, the
    headline's mean would be the mean of different things."""
    from campaigns.selectors import campaign_summary

    c = Campaign.objects.create(name="tf", kind="tf_cnn_benchmarks", team=team, matrix=[["model", ["resnet50"]]],
                                status=CampaignStatus.SUCCEEDED)  # fmt: skip
    for i, (total, epochs) in enumerate(((1000.0, (900.0, 1100.0)), (1010.0, (910.0, 1110.0)))):
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=0, params={"model": "resnet50"},
                                 repetition=i + 1, status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.create(run=run, name="images_per_sec", value=total, unit="img/s", host="", labels={})
        for epoch, rate in enumerate(epochs):
            Result.objects.create(run=run, name="images_per_sec", value=rate, unit="img/s", host="",
                                  labels={"epoch": epoch})  # fmt: skip
    rows = {r["metric"]: r for r in campaign_summary(campaign=c)}
    assert rows["images_per_sec"]["mean"] == 1005.0 and rows["images_per_sec"]["n"] == 2
    assert rows["images_per_sec{epoch=0}"]["mean"] == 905.0 and rows["images_per_sec{epoch=1}"]["n"] == 2


def matrix_campaign(team: Any, name: str, points: dict[str, list[float]], **verdict: Any) -> Campaign:
    """A succeeded fio campaign whose matrix axis is bs (one point per key of ``points``)."""
    c = Campaign.objects.create(name=name, kind="fio", team=team, matrix=[["bs", list(points)]], family="ci-nas",
                                status=CampaignStatus.SUCCEEDED, verdict=verdict)  # fmt: skip
    for point, (bs, values) in enumerate(points.items()):
        for i, value in enumerate(values):
            run = Run.objects.create(campaign=c, sequence=next(_sequence), point=point, params={"bs": bs},
                                     repetition=i + 1, status=RunStatus.SUCCEEDED)  # fmt: skip
            Result.objects.create(run=run, name="bw_bytes", value=value, unit="B/s", host="", labels={})
    return c


def test_a_pair_maps_a_candidate_point_to_a_baseline_point_of_other_parameters(team: Any) -> None:
    """verdict.pairs: the issue's bs 4k candidate judged against the bs 128k baseline because the user said so."""
    base = finished(team, "nas-128k", {"bs": "128k"}, BIG)
    ci = finished(team, "nas-ci-4k", {"bs": "4k"}, SMALL)
    Campaign.objects.filter(pk=ci.pk).update(verdict={"pairs": [{"baseline": {"bs": "128k"},
                                                                 "candidate": {"bs": "4k"}}]})  # fmt: skip
    ci.refresh_from_db()

    verdict = baselines.verdict_compute(campaign=ci, baseline_campaign=base)

    bw = next(i for i in verdict.items if i["metric"] == "bw_bytes")
    assert bw["outcome"] == "regression" and "differences" not in bw
    assert bw["accepted_differences"] == ["fixed bs: 128k (baseline) vs 4k"]
    assert bw["paired_with"] == {"pair": 0, "baseline_params": {"rw": "read"}}


def test_a_pair_between_matrix_points_judges_them_and_leaves_the_others_matched_by_their_axes(team: Any) -> None:
    base = matrix_campaign(team, "m-base", {"128k": [1000.0, 1001.0, 999.0], "1m": [2000.0, 2001.0, 1999.0]})
    cand = matrix_campaign(team, "m-cand", {"4k": [500.0, 501.0, 499.0], "1m": [2000.0, 2001.0, 1999.0]},
                           pairs=[{"baseline": {"bs": "128k"}, "candidate": {"bs": "4k"}}])  # fmt: skip

    items = baselines.verdict_compute(campaign=cand, baseline_campaign=base).items

    assert [(i["params"], i["outcome"]) for i in items] == [({"bs": "4k"}, "regression"), ({"bs": "1m"}, "pass")]
    assert items[0]["paired_with"]["baseline_params"] == {"bs": "128k"} and "paired_with" not in items[1]


def test_a_pair_that_finds_no_baseline_point_is_inconclusive(team: Any) -> None:
    base = matrix_campaign(team, "n-base", {"128k": [1000.0, 1001.0, 999.0]})
    cand = matrix_campaign(team, "n-cand", {"4k": [500.0, 501.0, 499.0]},
                           pairs=[{"baseline": {"bs": "64k"}, "candidate": {"bs": "4k"}}])  # fmt: skip

    items = baselines.verdict_compute(campaign=cand, baseline_campaign=base).items

    assert [(i["params"], i["outcome"], i["test"]) for i in items] == [
        ({"bs": "128k"}, "inconclusive", "missing"),  # the baseline point no pair took: no candidate values
        ({"bs": "4k"}, "inconclusive", "missing"),  # the pair's: no baseline point has bs 64k
    ]


def test_a_pair_maps_points_but_other_differences_still_make_it_inconclusive(team: Any) -> None:
    base = finished(team, "h-base", {"bs": "128k"}, BIG)
    ci = finished(team, "h-ci", {"bs": "4k"}, SMALL, tool="fio-3.36")
    Campaign.objects.filter(pk=ci.pk).update(verdict={"pairs": [{"baseline": {"bs": "128k"},
                                                                 "candidate": {"bs": "4k"}}]})  # fmt: skip
    ci.refresh_from_db()

    bw = next(i for i in baselines.verdict_compute(campaign=ci, baseline_campaign=base).items)
    assert bw["outcome"] == "inconclusive" and bw["differences"][0].startswith("software: ")


@pytest.mark.parametrize(
    ("pairs", "field"),
    [
        ({"baseline": {"bs": "128k"}}, "verdict.pairs"),
        ([{"baseline": {"bs": "128k"}}], "verdict.pairs[0]"),
        ([{"baseline": {}, "candidate": {"bs": "4k"}}], "verdict.pairs[0].baseline"),
        ([{"baseline": {"bs": ["128k"]}, "candidate": {"bs": "4k"}}], "verdict.pairs[0].baseline.bs"),
        ([{"baseline": {"bs": "128k"}, "candidate": {"blocksize": "4k"}}], "verdict.pairs[0].candidate.blocksize"),
    ],
)
def test_it_refuses_a_malformed_pair_naming_the_field(pairs: Any, field: str) -> None:
    from campaigns.spec import SpecError, validate

    data = {"name": "c", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "rw": "read", "size": "1M"},
            "verdict": {"pairs": pairs}}  # fmt: skip
    with pytest.raises(SpecError) as raised:
        validate(data)
    assert raised.value.field == field
