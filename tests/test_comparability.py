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
