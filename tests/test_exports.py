"""Exports for pipelines: CSV and JSON of results, statistics, comparisons and verdicts through the API with a
token, exact values; a format an endpoint does not offer is named in a 406, never a 404 "Not found."."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.urls import reverse

from accounts.services import token_create
from campaigns import baselines
from campaigns.models import Campaign
from tests.test_api import bearer, client_for, finished_campaign

pytestmark = pytest.mark.django_db


def rows(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.content.decode())))


@pytest.fixture
def judged(team: Any) -> tuple[Campaign, Campaign]:
    base = finished_campaign("base", team, {"read": [2_142_590_765.33, 2.1e9], "randread": [5e8, 5.1e8]},
                             family="nightly")  # fmt: skip
    worse = finished_campaign("worse", team, {"read": [1.6e9, 1.61e9], "randread": [5e8, 5.05e8]}, family="nightly")
    baselines.baseline_set(campaign=base, runs=None, note="", user=None)
    baselines.verdict_compute(campaign=worse)
    return base, worse


def test_results_export_as_csv_with_a_token_and_exact_values(owner: Any, team: Any, judged: Any) -> None:
    base, _ = judged
    api = bearer(token_create(user=owner, team=team, name="pipeline").secret)
    got = rows(api.get(f"/api/v1/results/?campaign={base.pk}&host=&format=csv"))
    assert {"id", "name", "value", "unit"} <= set(got[0])
    assert "2142590765.33" in {r["value"] for r in got}  # exact, never "2.14 GB/s"
    assert api.get(f"/api/v1/results/?campaign={base.pk}&format=json").json()["results"]


def test_campaign_statistics_export_as_json_and_csv(owner: Any, team: Any, judged: Any) -> None:
    base, _ = judged
    api = bearer(token_create(user=owner, team=team, name="pipeline").secret)
    data = api.get(f"/api/v1/campaigns/{base.pk}/statistics/").json()
    read = next(r for r in data if r["params"]["rw"] == "read")
    assert read["n"] == 2 and read["mean"] == pytest.approx((2_142_590_765.33 + 2.1e9) / 2)
    table = rows(api.get(f"/api/v1/campaigns/{base.pk}/statistics/?format=csv"))
    assert {"point", "params.rw", "params.bs", "metric", "unit", "n", "mean", "median", "stdev", "min", "max"} <= set(
        table[0]
    )
    assert {r["params.rw"] for r in table} == {"read", "randread"}
    assert client_for(owner).get(f"/api/v1/campaigns/{base.pk}/statistics/?format=csv").status_code == 200


def test_verdicts_export_one_row_per_item(owner: Any, team: Any, judged: Any) -> None:
    _, worse = judged
    api = bearer(token_create(user=owner, team=team, name="pipeline").secret)
    items = rows(api.get(f"/api/v1/campaigns/{worse.pk}/verdict/?format=csv"))
    assert {r["params.rw"]: r["outcome"] for r in items} == {"read": "regression", "randread": "pass"}
    assert {"verdict", "campaign", "verdict_outcome", "metric", "unit", "change_pct", "p_value", "reason"} <= set(
        items[0]
    )
    listed = rows(api.get(f"/api/v1/verdicts/?campaign={worse.pk}&format=csv"))
    assert len(listed) == 2 and listed[0]["verdict_outcome"] == "regression"


def test_comparisons_export_one_row_per_cell(owner: Any, team: Any, judged: Any) -> None:
    base, worse = judged
    api = bearer(token_create(user=owner, team=team, name="pipeline").secret)
    cells = rows(api.get(f"/api/v1/compare/?campaigns={base.pk},{worse.pk}&format=csv"))
    read = [c for c in cells if c["params.rw"] == "read" and c["metric"] == "bw_bytes"]
    assert [c["campaign"] for c in read] == [str(base.pk), str(worse.pk)]
    assert read[1]["outcome"] == "regression" and float(read[1]["mean"]) == pytest.approx(1.605e9)
    assert read[0]["outcome"] == ""  # the reference has no change of its own


@pytest.mark.parametrize("path", ["/api/v1/results/", "/api/v1/runs/", "/api/v1/compare/?campaigns=1"])
def test_a_format_not_offered_is_named_in_a_406(owner: Any, path: str) -> None:
    sep = "&" if "?" in path else "?"
    response = client_for(owner).get(f"{path}{sep}format=xml")
    assert response.status_code == 406
    body = response.json()
    assert "format 'xml' is not offered" in body["message"] and "json" in body["message"]
    assert body["message"] != "Not found."


def test_the_runs_list_says_csv_is_not_offered_there(owner: Any) -> None:
    response = client_for(owner).get("/api/v1/runs/?format=csv")
    assert response.status_code == 406 and "'csv'" in response.json()["message"]


def test_the_outsider_exports_nothing_of_another_team(outsider: Any, judged: Any) -> None:
    base, _ = judged
    assert client_for(outsider).get(f"/api/v1/campaigns/{base.pk}/statistics/?format=csv").status_code == 404
    assert rows(client_for(outsider).get(f"/api/v1/results/?campaign={base.pk}&format=csv")) == []


def test_the_campaign_page_links_its_statistics_csv(owner: Any, judged: Any) -> None:
    base, _ = judged
    page = client_for(owner).get(reverse("campaigns:campaign-detail", args=[base.pk])).content.decode()
    assert f'href="/api/v1/campaigns/{base.pk}/statistics/?format=csv"' in page
