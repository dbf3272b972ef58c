"""The read-only REST API and its campaign actions."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from rest_framework.test import APIClient

from campaigns.models import Campaign, CampaignStatus, Result
from campaigns.services import campaign_apply, campaign_launch
from inventory.models import Credential, NodeStatus
from inventory.services import node_upsert, storage_upsert

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not-a-real-key"


def fio_data(name: str, nodes: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "fio",
        "nodes": nodes,
        "fixed": {"bs": "4k", "size": "16M"},
        "matrix": {"rw": ["read", "randread"]},
    }


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice")


@pytest.fixture
def api(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def make_rows(count: int, user: Any) -> list[Campaign]:
    """``count`` of everything: credentials, nodes with tags, storage systems, launched campaigns with results."""
    campaigns = []
    for i in range(count):
        credential = Credential.objects.create(
            name=f"key{i}",
            username="bench",
            private_key_encrypted=SECRET,
            public_key="ssh-ed25519 AAAA",
            fingerprint="x",
        )
        node_upsert(name=f"node{i}", address=f"10.0.0.{i + 1}", credential=credential, tags=["lab", f"rack{i}"])
        storage_upsert(name=f"nas{i}", kind="nfs", admin_credential=credential)
        campaign = campaign_apply(data=fio_data(f"camp{i}", [f"node{i}"]), owner=user)
        campaign = campaign_launch(campaign=campaign, user=user)
        for run in campaign.runs.all():
            Result.objects.create(run=run, name="read_iops", value=100.0 + i, unit="IOPS")
            Result.objects.create(run=run, name="read_bw_bytes", value=1e9, unit="B/s", host=f"node{i}")
        campaigns.append(campaign)
    return campaigns


# Queries of one list request, whatever the number of rows: session, user, count (pagination), the page, and one
# per prefetched relation (node tags; campaign nodes and tags; run hosts).
QUERIES = {
    "/api/v1/nodes/": 5,
    "/api/v1/storage-systems/": 4,
    "/api/v1/campaigns/": 6,
    "/api/v1/runs/": 5,
    "/api/v1/results/": 4,
}
ENDPOINTS = list(QUERIES)


@pytest.mark.django_db
@pytest.mark.parametrize("url", ENDPOINTS)
def test_it_refuses_anonymous_clients_with_the_error_shape(url: str) -> None:
    response = APIClient().get(url)
    assert response.status_code == 403
    assert set(response.json()) == {"message", "extra"}


@pytest.mark.django_db
@pytest.mark.parametrize("url", ENDPOINTS)
@pytest.mark.parametrize("rows", [1, 6])
def test_it_lists_with_a_fixed_number_of_queries(
    api: APIClient, user: Any, django_assert_num_queries: Any, url: str, rows: int
) -> None:
    make_rows(rows, user)
    with django_assert_num_queries(QUERIES[url]):
        response = api.get(url)
    assert response.status_code == 200
    assert response.json()["count"] >= rows and len(response.json()["results"]) >= rows


@pytest.mark.django_db
def test_it_never_shows_a_credentials_secret(api: APIClient, user: Any) -> None:
    make_rows(1, user)
    for url in ENDPOINTS[:2]:
        body = api.get(url).content.decode()
        assert "key0" in body
        assert "PRIVATE KEY" not in body and "private_key" not in body


@pytest.mark.django_db
def test_it_shows_nodes_and_campaigns_with_related_names(api: APIClient, user: Any) -> None:
    make_rows(1, user)
    node = api.get("/api/v1/nodes/").json()["results"][0]
    assert node["name"] == "node0" and node["tags"] == ["lab", "rack0"] and node["credential"] == "key0"
    assert api.get("/api/v1/nodes/", {"tag": "rack0", "status": "active"}).json()["count"] == 1
    assert api.get("/api/v1/nodes/", {"status": "retired"}).json()["count"] == 0
    campaign = api.get("/api/v1/campaigns/").json()["results"][0]
    assert campaign["nodes"] == ["node0"] and campaign["owner"] == "alice"
    assert campaign["matrix"] == {"rw": ["read", "randread"]}
    assert (campaign["run_total"], campaign["run_done"], campaign["run_failed"]) == (2, 0, 0)


@pytest.mark.django_db
def test_it_filters_runs_and_results_by_campaign_and_metric(api: APIClient, user: Any) -> None:
    first, second = make_rows(2, user)
    runs = api.get("/api/v1/runs/", {"campaign": second.pk}).json()["results"]
    assert {r["campaign"] for r in runs} == {second.pk} and len(runs) == 2
    assert runs[0]["hosts"][0]["host"] == "node1"
    results = api.get("/api/v1/results/", {"campaign": first.pk, "name": "read_iops"}).json()["results"]
    assert len(results) == 2
    assert {(r["campaign"], r["name"], r["value"], r["host"]) for r in results} == {(first.pk, "read_iops", 100.0, "")}


@pytest.mark.django_db
def test_it_answers_400_for_a_filter_that_is_not_a_number(api: APIClient) -> None:
    response = api.get("/api/v1/runs/", {"campaign": "abc"})
    assert response.status_code == 400
    assert response.json() == {"message": "invalid input", "extra": {"campaign": ["must be a whole number, got 'abc'"]}}


@pytest.mark.django_db
def test_it_launches_a_campaign_once_and_answers_409_the_second_time(api: APIClient, user: Any) -> None:
    node_upsert(name="lab1", address="127.0.0.1")
    campaign = campaign_apply(data=fio_data("api-launch", ["lab1"]), owner=user)
    url = f"/api/v1/campaigns/{campaign.pk}/launch/"
    response = api.post(url)
    assert response.status_code == 200
    assert response.json()["status"] == "running" and response.json()["run_total"] == 2
    response = api.post(url)
    assert response.status_code == 409
    assert response.json() == {"message": "campaign api-launch is already running", "extra": {}}
    assert campaign.runs.count() == 2


@pytest.mark.django_db
def test_it_answers_400_when_a_launch_is_refused_for_another_reason(api: APIClient, user: Any) -> None:
    node = node_upsert(name="lab1", address="127.0.0.1")
    campaign = campaign_apply(data=fio_data("api-maint", ["lab1"]), owner=user)
    node.status = NodeStatus.MAINTENANCE
    node.save(update_fields=["status"])
    response = api.post(f"/api/v1/campaigns/{campaign.pk}/launch/")
    assert response.status_code == 400
    assert response.json() == {
        "message": "nodes not active (maintenance or retired): lab1",
        "extra": {"field": "nodes"},
    }
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.DRAFT


@pytest.mark.django_db
def test_it_cancels_a_running_campaign_and_answers_409_for_a_draft(api: APIClient, user: Any) -> None:
    node_upsert(name="lab1", address="127.0.0.1")
    campaign = campaign_apply(data=fio_data("api-cancel", ["lab1"]), owner=user)
    url = f"/api/v1/campaigns/{campaign.pk}/cancel/"
    assert api.post(url).status_code == 409
    campaign_launch(campaign=campaign, user=user)
    response = api.post(url)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"


@pytest.mark.django_db
def test_it_answers_404_with_the_error_shape_for_an_unknown_campaign(api: APIClient) -> None:
    response = api.post("/api/v1/campaigns/999/launch/")
    assert response.status_code == 404
    assert set(response.json()) == {"message", "extra"}


@pytest.mark.django_db
def test_it_refuses_anonymous_launches(user: Any) -> None:
    node_upsert(name="lab1", address="127.0.0.1")
    campaign = campaign_apply(data=fio_data("api-anon", ["lab1"]), owner=user)
    assert APIClient().post(f"/api/v1/campaigns/{campaign.pk}/launch/").status_code == 403
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.DRAFT


def test_it_accepts_http_basic_credentials_for_scripts(django_user_model: Any) -> None:
    django_user_model.objects.create_user("ci", password="pw-ci-123456")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"ci:pw-ci-123456").decode())

    assert client.get("/api/v1/campaigns/").status_code == 200
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(b"ci:wrong").decode())
    response = client.get("/api/v1/campaigns/")
    assert response.status_code in (401, 403) and "message" in response.json()
