"""The statistic chosen per campaign (mean or median of a point's repetitions), used the same way by campaign show,
the campaign page, compare (page and API), verdicts, the CI client and every export; a view may override it."""

from __future__ import annotations

import csv
import io
import json
from itertools import count
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from campaigns import baselines, selectors, services
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from campaigns.spec import SpecError, validate
from clients import rackbench_ci as ci

pytestmark = pytest.mark.django_db
_sequence = count(1)

# Skewed repetitions: one fast outlier lifts the candidate's mean by 20% while its median fell by 19%.
BASELINE = [100.0, 101.0, 99.0]  # mean 100, median 100
CANDIDATE = [80.0, 81.0, 200.0]  # mean 120.33, median 81


def finished(team: Any, name: str, values: list[float], statistic: str = "median") -> Campaign:
    """A succeeded fio campaign of one point whose runs measured ``values`` (bw_bytes, aggregate across hosts)."""
    c = Campaign.objects.create(name=name, kind="fio", team=team, fixed={"bs": "1M"}, matrix=[["rw", ["read"]]],
                                family="nas", status=CampaignStatus.SUCCEEDED, statistic=statistic,
                                repetitions=len(values))  # fmt: skip
    for i, value in enumerate(values):
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=0, params={"rw": "read", "bs": "1M"},
                                 repetition=i + 1, status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.create(run=run, name="bw_bytes", value=value, unit="B/s", host="", labels={})
    return c


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def csv_rows(body: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(body.decode())))


def test_a_campaign_sums_up_by_the_mean_unless_its_definition_says_median() -> None:
    base = {"name": "c", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "1M", "rw": "read", "size": "1M"}}
    assert validate(base)["statistic"] == "mean"
    assert validate({**base, "statistic": "median"})["statistic"] == "median"


@pytest.mark.parametrize("value", ["average", "MEDIAN", 50, True])
def test_it_refuses_a_statistic_other_than_mean_or_median_naming_the_field(value: Any) -> None:
    base = {"name": "c", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "1M", "rw": "read", "size": "1M"}}
    with pytest.raises(SpecError) as raised:
        validate({**base, "statistic": value})
    assert raised.value.field == "statistic"


def test_the_seed_004_presets_sum_up_by_the_median_as_the_paper_does() -> None:
    from campaigns.presets import preset_get

    for slug in ("seed004-roce-vs-tcp", "seed004-data-sources"):
        preset = preset_get(slug)
        assert preset is not None
        assert {part["statistic"] for part in preset.campaigns} == {"median"}


def test_a_definition_applied_through_the_api_keeps_its_statistic_and_exports_it(owner: Any, team: Any) -> None:
    from inventory.services import node_upsert

    node_upsert(name="n1", address="10.0.0.1", team=team)
    spec = {"name": "median-fio", "kind": "fio", "nodes": ["n1"], "statistic": "median",
            "fixed": {"bs": "1M", "size": "16M"}, "matrix": {"rw": ["read"]}}  # fmt: skip
    answer = api_for(owner).post("/api/v1/campaigns/", {"yaml": yaml.safe_dump(spec)}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["statistic"] == "median"
    campaign = Campaign.objects.get(name="median-fio")
    assert selectors.campaign_spec(campaign=campaign)["statistic"] == "median"

    refused = api_for(owner).post("/api/v1/campaigns/", {"spec": {**spec, "name": "x", "statistic": "p50"}},
                                  format="json")  # fmt: skip
    assert refused.status_code == 400
    assert refused.json()["extra"]["field"] == "statistic"


def test_show_compare_verdict_and_exports_agree_on_a_median_campaigns_number(owner: Any, team: Any) -> None:
    base = finished(team, "nas-before", BASELINE)
    cand = finished(team, "nas-after", CANDIDATE)
    api = api_for(owner)

    # campaign show: the median, named as the statistic
    out = io.StringIO()
    call_command("campaign", "show", "nas-after", stdout=out)
    text = out.getvalue()
    assert "each point: the median of its repetitions" in text
    header = next(line for line in text.splitlines() if line.startswith("point"))
    assert header.split()[4] == "median"
    shown = json.loads(_show_json("nas-after"))
    assert shown["statistic"] == "median"
    assert shown["summary"][0]["value"] == 81.0

    # the statistics export (JSON and CSV)
    stats = api.get(f"/api/v1/campaigns/{cand.pk}/statistics/").json()
    assert (stats[0]["statistic"], stats[0]["value"]) == ("median", 81.0)
    stats_csv = csv_rows(api.get(f"/api/v1/campaigns/{cand.pk}/statistics/?format=csv").content)
    assert (stats_csv[0]["statistic"], float(stats_csv[0]["value"])) == ("median", 81.0)

    # compare: the API, its CSV, the page and its export
    compared = api.get(f"/api/v1/compare/?campaigns={base.pk},{cand.pk}").json()
    assert compared["statistic"] == "median"
    cell = compared["rows"][0]["values"][1]
    change = compared["rows"][0]["changes"][1]
    assert cell["value"] == 81.0
    assert change["change_pct"] == pytest.approx(-19.0)
    compare_csv = csv_rows(api.get(f"/api/v1/compare/?campaigns={base.pk},{cand.pk}&format=csv").content)
    assert [(r["statistic"], float(r["value"])) for r in compare_csv] == [("median", 100.0), ("median", 81.0)]
    page = Client()
    page.force_login(owner)
    html = page.get(f"/compare/?campaign={base.pk}&campaign={cand.pk}").content.decode()
    assert "the <strong>median</strong> of its repetitions" in html
    exported = csv_rows(page.get(f"/compare/?campaign={base.pk}&campaign={cand.pk}&format=csv").content)
    assert float(exported[0]["nas-after median"]) == 81.0
    assert float(exported[0]["nas-after change %"]) == pytest.approx(-19.0)

    # the verdict, its API and CSV, and the CI client's table
    verdict = baselines.verdict_compute(campaign=cand, baseline_campaign=base)
    item = verdict.items[0]
    assert verdict.policy["statistic"] == item["statistic"] == "median"
    assert item["candidate"]["median"] == 81.0
    assert item["change_pct"] == pytest.approx(change["change_pct"])
    assert item["reason"].startswith("the median of bw_bytes is 19.0% worse")
    verdict_csv = csv_rows(api.get(f"/api/v1/campaigns/{cand.pk}/verdict/?format=csv").content)
    assert float(verdict_csv[0]["candidate_value"]) == 81.0
    document = api.get(f"/api/v1/campaigns/{cand.pk}/verdict/").json()
    tracked = ci.Tracked({"id": cand.pk, "name": cand.name, "status": "succeeded"}, verdict=document, done=True)
    lines = ci.summary_lines([tracked], ci.Policy(), "http://rb")
    assert lines[1].split()[3:7] == ["100", "B/s", "81.0", "B/s"] and "-19.0%" in lines[1]
    assert "by the median of each side's repetitions" in lines[-2]

    # and the campaign page names it and shows the verdict's medians
    detail = page.get(f"/campaigns/{cand.pk}/").content.decode()
    assert 'data-testid="verdict-statistic">median<' in detail
    assert "summed up by the <strong>median</strong>" in detail


def test_the_same_data_summed_up_by_the_mean_gives_the_mean_everywhere(owner: Any, team: Any) -> None:
    base = finished(team, "mean-before", BASELINE, statistic="mean")
    cand = finished(team, "mean-after", CANDIDATE, statistic="mean")
    api = api_for(owner)
    mean = sum(CANDIDATE) / 3

    assert api.get(f"/api/v1/campaigns/{cand.pk}/statistics/").json()[0]["value"] == pytest.approx(mean)
    compared = api.get(f"/api/v1/compare/?campaigns={base.pk},{cand.pk}").json()
    assert compared["rows"][0]["values"][1]["value"] == pytest.approx(mean)
    assert compared["rows"][0]["changes"][1]["change_pct"] == pytest.approx(20.333, abs=1e-3)
    verdict = baselines.verdict_compute(campaign=cand, baseline_campaign=base)
    assert verdict.items[0]["change_pct"] == pytest.approx(20.333, abs=1e-3)


def test_a_view_may_override_the_campaigns_statistic_and_says_so(owner: Any, team: Any) -> None:
    base = finished(team, "o-before", BASELINE)
    cand = finished(team, "o-after", CANDIDATE)
    api = api_for(owner)

    compared = api.get(f"/api/v1/compare/?campaigns={base.pk},{cand.pk}&statistic=mean").json()
    assert compared["statistic"] == "mean"
    assert compared["rows"][0]["values"][1]["value"] == pytest.approx(sum(CANDIDATE) / 3)
    bad = api.get(f"/api/v1/compare/?campaigns={base.pk},{cand.pk}&statistic=mode")
    assert bad.status_code == 400 and "statistic" in bad.json()["extra"]

    page = Client()
    page.force_login(owner)
    html = page.get(f"/compare/?campaign={base.pk}&campaign={cand.pk}&statistic=mean").content.decode()
    assert "the <strong>mean</strong> of its repetitions (asked for here)" in html
    scaling = page.get(f"/analysis/scaling/?campaign={cand.pk}&metric=bw_bytes&x=rw").content.decode()
    assert "the <strong>median</strong> of its repetitions (the statistic of o-after)" in scaling
    scaling = page.get(f"/analysis/scaling/?campaign={cand.pk}&metric=bw_bytes&stat=mean").content.decode()
    assert "the <strong>mean</strong> of its repetitions (chosen here; o-after sums up by the median)" in scaling

    sweep = page.get(f"/analysis/sweep/?campaign={cand.pk}&metric=bw_bytes&x=rw&format=csv").content.decode()
    assert sweep.splitlines()[0].split(",")[3] == "bw_bytes median"  # the export names the statistic
    sweep = page.get(f"/analysis/sweep/?campaign={cand.pk}&metric=bw_bytes&x=rw&stat=mean").content.decode()
    assert "the <strong>mean</strong> of its repetitions (chosen here; o-after sums up by the median)" in sweep

    verdict = baselines.verdict_compute(campaign=cand, baseline_campaign=base, overrides={"statistic": "mean"})
    assert verdict.policy["statistic"] == "mean"


def test_the_statistic_of_a_finished_campaign_can_be_changed_without_touching_its_runs(team: Any) -> None:
    campaign = finished(team, "later", CANDIDATE, statistic="mean")
    services.campaign_set_statistic(campaign=campaign, statistic="median")
    campaign.refresh_from_db()
    assert campaign.statistic == "median"
    assert selectors.campaign_summary(campaign=campaign)[0]["value"] == 81.0
    with pytest.raises(services.CampaignError) as raised:
        services.campaign_set_statistic(campaign=campaign, statistic="mode")
    assert raised.value.field == "statistic"


def _show_json(name: str) -> str:
    out = io.StringIO()
    call_command("campaign", "show", name, json=True, stdout=out)
    return out.getvalue()
