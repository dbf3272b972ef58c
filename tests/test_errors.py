"""Requests that answered 500: each now gets a 4xx in the one error shape, or the page it asked for."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from campaigns.models import Campaign, Result
from tests.test_api import finished_campaign


@pytest.fixture
def api(owner: Any) -> APIClient:
    client = APIClient()
    client.force_login(owner)
    return client


@pytest.mark.django_db
def test_format_suffix_routes_are_not_found_never_a_server_error(api: APIClient, team: Any) -> None:
    campaign = finished_campaign("c1", team, {"read": [1.0], "randread": [2.0]})
    run = campaign.runs.first()
    urls = [
        "/api/v1/nodes.json", f"/api/v1/campaigns/{campaign.pk}.json", f"/api/v1/campaigns/{campaign.pk}/preview.json",
        f"/api/v1/campaigns/{campaign.pk}/verdict.json", "/api/v1/presets.json", "/api/v1/presets/fio-4k.json",
        f"/api/v1/runs/{run.pk}/telemetry.json",
    ]  # fmt: skip
    answers = {url: api.get(url).status_code for url in urls}
    assert answers == dict.fromkeys(urls, 404)
    for url in (*urls, "/api/v1/campaigns/0.5/", "/api/v1/no-such-thing/"):
        response = api.get(url)
        assert response["Content-Type"] == "application/json" and set(response.json()) == {"message", "extra"}, url
    assert "text/html" in api.get("/campaigns/0.5/")["Content-Type"]
    assert api.get(f"/api/v1/campaigns/{campaign.pk}/", HTTP_ACCEPT="application/json").status_code == 200


@pytest.mark.django_db
def test_a_preview_the_plug_in_cannot_build_is_a_400_naming_the_field(api: APIClient, team: Any) -> None:
    campaign = finished_campaign("c1", team, {"read": [1.0], "randread": [2.0]})
    Campaign.objects.filter(pk=campaign.pk).update(fixed={"bs": "4k", "size": "16M", "group_reporting": "1"})
    response = api.get(f"/api/v1/campaigns/{campaign.pk}/preview/")
    assert response.status_code == 400 and set(response.json()) == {"message", "extra"}
    assert "group_reporting" in response.json()["message"] + str(response.json()["extra"])


@pytest.mark.django_db
def test_a_parameter_filter_is_a_parameter_name_never_a_lookup(api: APIClient, team: Any) -> None:
    finished_campaign("c1", team, {"read": [1.0], "randread": [2.0]})
    assert Result.objects.count() == 4
    for query in ("param.rw__isnull=maybe", "param.rw__isnull=true", "param.rw__in=1", "param.rw__gt=a"):
        response = api.get(f"/api/v1/results/?{query}")
        assert response.status_code == 200 and response.json()["results"] == [], query
    assert len(api.get("/api/v1/results/?param.rw=read").json()["results"]) == 2


@pytest.mark.django_db
@pytest.mark.parametrize("t0", ["1e400", "-1e400", "nan", "inf", "1e308", "x"])
def test_the_run_page_takes_any_window_from_the_url(client: Any, owner: Any, team: Any, t0: str) -> None:
    import numpy as np

    from telemetry.services import series_append

    campaign = finished_campaign("c1", team, {"read": [1.0], "randread": [2.0]})
    run = campaign.runs.first()
    series_append(run=run, host="n1", name="cpu.busiest_util", labels={}, unit="%", kind="gauge",
                  timestamps_ns=10**18 + np.arange(60, dtype=np.int64) * 10**9, values=np.full(60, 50.0))  # fmt: skip
    client.force_login(owner)
    assert client.get(f"/runs/{run.pk}/?t0={t0}&t1={t0}").status_code == 200
