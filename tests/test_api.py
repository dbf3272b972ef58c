"""The REST API: resources per team, tokens, campaign actions, idempotent launches, baselines, verdicts, compare."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Team, TokenScope
from accounts.services import team_add_member, token_create, token_revoke
from campaigns import baselines
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus, Verdict
from campaigns.services import campaign_apply, campaign_finish, campaign_launch
from campaigns.tasks import verdict_webhook_task
from inventory.models import Credential, Node, NodeStatus
from inventory.services import node_upsert, storage_upsert

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not-a-real-key"
LISTS = [
    f"/api/v1/{name}/"
    for name in ("nodes", "storage-systems", "credentials", "interfaces", "campaigns", "runs", "results", "baselines",
                 "verdicts")
]  # fmt: skip


def fio_data(name: str, nodes: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "fio", "nodes": nodes, "fixed": {"bs": "4k", "size": "16M"},
            "matrix": {"rw": ["read", "randread"]}, **extra}  # fmt: skip


def client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


@pytest.fixture
def api(owner: Any) -> APIClient:
    return client_for(owner)


def finished_campaign(name: str, team: Any, values: dict[str, list[float]], **extra: Any) -> Campaign:
    """A campaign of ``team`` that ran: per rw point, one succeeded run per value of bw_bytes (no lab needed)."""
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_apply(data=fio_data(name, ["n1"], repetitions=len(values["read"]), **extra), team=team)
    campaign = campaign_launch(campaign=campaign)
    for run in campaign.runs.all():
        value = values[run.params["rw"]][run.repetition - 1]
        Result.objects.create(run=run, name="bw_bytes", value=value, unit="B/s")
        Result.objects.create(run=run, name="bw_bytes", value=value / 2, unit="B/s", host="n1")
    campaign.runs.update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    campaign_finish(campaign=campaign)
    campaign.refresh_from_db()
    return campaign


def make_rows(count: int, team: Any) -> list[Campaign]:
    """``count`` of everything in ``team``: credentials, nodes, storage, finished campaigns with verdicts."""
    campaigns = []
    for i in range(count):
        credential = Credential.objects.create(name=f"key{i}", username="bench", private_key_encrypted=SECRET,
                                               public_key="ssh-ed25519 AAAA", fingerprint="x", team=team)  # fmt: skip
        node = node_upsert(name=f"node{i}", address=f"10.0.1.{i + 1}", credential=credential, team=team,
                           tags=["lab", f"rack{i}"])  # fmt: skip
        node.interfaces.create(name="eth0", speed_mbps=100_000)
        storage_upsert(name=f"nas{i}", kind="nfs", admin_credential=credential, team=team)
        campaign = campaign_apply(data=fio_data(f"camp{i}", [f"node{i}"], family="fam"), team=team)
        campaign = campaign_launch(campaign=campaign)
        for run in campaign.runs.all():
            Result.objects.create(run=run, name="bw_bytes", value=100.0 + i, unit="B/s")
            Result.objects.create(run=run, name="bw_bytes", value=50.0, unit="B/s", host=f"node{i}")
        campaign.runs.update(status=RunStatus.SUCCEEDED)
        campaign_finish(campaign=campaign)
        campaign.refresh_from_db()
        if i == 0:
            baselines.baseline_set(campaign=campaign)  # the next ones are judged against it as they finish
        campaigns.append(campaign)
    return campaigns


# --- authentication and teams ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("url", LISTS)
def test_it_refuses_anonymous_clients_with_the_error_shape(url: str) -> None:
    response = APIClient().get(url)
    assert response.status_code == 401
    assert set(response.json()) == {"message", "extra"}


# Queries of one list request whatever its number of rows: session, user, the caller's teams, count, the page
# and one per prefetched relation.
QUERIES = {
    "/api/v1/nodes/": 6,
    "/api/v1/storage-systems/": 5,
    "/api/v1/credentials/": 5,
    "/api/v1/interfaces/": 5,
    "/api/v1/campaigns/": 7,
    "/api/v1/runs/": 6,
    "/api/v1/results/": 4,
    "/api/v1/baselines/": 6,
    "/api/v1/verdicts/": 5,
}


@pytest.mark.django_db
@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize("rows", [2, 6])
def test_it_lists_with_a_fixed_number_of_queries(
    api: APIClient, team: Any, django_assert_num_queries: Any, url: str, rows: int
) -> None:
    make_rows(rows, team)
    with django_assert_num_queries(QUERIES[url]):
        response = api.get(url)
    assert response.status_code == 200
    assert len(response.json()["results"]) >= 1


@pytest.mark.django_db
@pytest.mark.parametrize("url", LISTS)
def test_it_shows_the_outsider_nothing_of_another_team(team: Any, outsider: Any, url: str) -> None:
    make_rows(2, team)
    assert client_for(outsider).get(url).json()["results"] == []


@pytest.mark.django_db
def test_it_answers_404_not_403_for_another_teams_objects(team: Any, owner: Any, outsider: Any) -> None:
    first, second = make_rows(2, team)
    run = first.runs.first()
    assert run is not None
    verdict = second.verdicts.get()
    urls = [f"/api/v1/campaigns/{first.pk}/", f"/api/v1/runs/{run.pk}/", f"/api/v1/nodes/{first.nodes.get().pk}/",
            f"/api/v1/verdicts/{verdict.pk}/", f"/api/v1/campaigns/{first.pk}/preview/",
            f"/api/v1/campaigns/{second.pk}/verdict/"]  # fmt: skip
    for url in urls:
        assert client_for(owner).get(url).status_code == 200, url
        response = client_for(outsider).get(url)
        assert response.status_code == 404 and set(response.json()) == {"message", "extra"}, url
    for action in ("launch", "cancel", "rerun-failed", "verdict"):
        assert client_for(outsider).post(f"/api/v1/campaigns/{first.pk}/{action}/").status_code == 404
    assert client_for(outsider).delete(f"/api/v1/campaigns/{first.pk}/").status_code == 404
    assert Campaign.objects.filter(pk=first.pk).exists()


@pytest.mark.django_db
def test_it_lets_a_team_use_shared_inventory_but_not_another_teams(team: Any, outsider: Any) -> None:
    node_upsert(name="shared1", address="10.0.2.1")
    node_upsert(name="blue1", address="10.0.2.2", team=team)
    red = client_for(outsider)
    names = [n["name"] for n in red.get("/api/v1/nodes/").json()["results"]]
    assert names == ["shared1"]
    response = red.post("/api/v1/campaigns/", {"spec": fio_data("red-camp", ["blue1"])}, format="json")
    assert response.status_code == 400
    assert response.json() == {"message": "nodes[0]: no node named 'blue1' in the inventory",
                               "extra": {"field": "nodes[0]"}}  # fmt: skip
    response = red.post("/api/v1/campaigns/", {"spec": fio_data("red-camp", ["shared1"])}, format="json")
    assert response.status_code == 201 and response.json()["team"] == "red"


@pytest.mark.django_db
def test_it_authenticates_tokens_and_keeps_them_to_their_team_and_scope(team: Any, owner: Any, outsider: Any) -> None:
    make_rows(1, team)
    reader = token_create(user=owner, team=team, name="dashboards")
    assert reader.token.digest not in reader.secret and reader.secret.startswith("rbk_")
    client = bearer(reader.secret)
    assert client.get("/api/v1/campaigns/").json()["count"] == 1
    response = client.post("/api/v1/campaigns/", {"spec": fio_data("x", ["node0"])}, format="json")
    assert response.status_code == 403 and "read-only" in response.json()["message"]

    launcher = token_create(user=owner, team=team, name="ci", scope=TokenScope.LAUNCH)
    response = bearer(launcher.secret).post("/api/v1/campaigns/", {"spec": fio_data("ci-1", ["node0"])}, format="json")
    assert response.status_code == 201 and response.json()["team"] == "blue"

    token_revoke(token=launcher.token)
    for secret in (launcher.secret, reader.secret[:-2] + "xx", "rbk_nope", "garbage"):
        response = bearer(secret).get("/api/v1/campaigns/")
        assert response.status_code == 401 and response.json()["message"] == "invalid, expired or revoked token"


@pytest.mark.django_db
def test_it_refuses_an_expired_token_and_a_token_of_someone_who_left_the_team(team: Any, owner: Any) -> None:
    issued = token_create(user=owner, team=team, name="ci", expires_at=timezone.now() + timedelta(seconds=60))
    assert bearer(issued.secret).get("/api/v1/runs/").status_code == 200
    type(issued.token).objects.filter(pk=issued.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(issued.secret).get("/api/v1/runs/").status_code == 401
    fresh = token_create(user=owner, team=team, name="ci2")
    owner.memberships.all().delete()
    assert bearer(fresh.secret).get("/api/v1/runs/").status_code == 401


# --- inventory ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_creates_and_edits_nodes_in_the_callers_team_and_never_shows_a_key(api: APIClient, team: Any) -> None:
    make_rows(1, team)
    response = api.post("/api/v1/nodes/", {"name": "gpu7", "address": "10.0.3.7", "credential": "key0",
                                           "tags": ["dgx", "lab"], "gpu_count": 8}, format="json")  # fmt: skip
    assert response.status_code == 201, response.json()
    node = response.json()
    assert (node["team"], node["credential"], node["tags"]) == ("blue", "key0", ["dgx", "lab"])
    response = api.patch(f"/api/v1/nodes/{node['id']}/", {"status": "maintenance"}, format="json")
    assert response.json()["status"] == "maintenance"
    assert api.get("/api/v1/nodes/", {"status": "maintenance"}).json()["count"] == 1
    assert api.get("/api/v1/nodes/", {"tag": "dgx"}).json()["count"] == 1
    bad = api.post("/api/v1/nodes/", {"name": "gpu8", "address": "x", "status": "on-fire"}, format="json")
    assert bad.status_code == 400 and "status" in bad.json()["extra"]
    for url in ("/api/v1/credentials/", "/api/v1/storage-systems/", "/api/v1/nodes/"):
        body = api.get(url).content.decode()
        assert "PRIVATE KEY" not in body and "private_key" not in body


@pytest.mark.django_db
def test_it_leaves_shared_inventory_to_staff(api: APIClient) -> None:
    node = node_upsert(name="shared1", address="10.0.2.1")
    response = api.patch(f"/api/v1/nodes/{node.pk}/", {"status": "retired"}, format="json")
    assert response.status_code == 403 and "staff" in response.json()["message"]


@pytest.mark.django_db
def test_it_never_lets_a_member_create_shared_inventory(
    api: APIClient, owner: Any, outsider: Any, django_user_model: Any
) -> None:
    loner = client_for(django_user_model.objects.create_user("loner"))
    response = loner.post("/api/v1/nodes/", {"name": "mine", "address": "10.0.4.1"}, format="json")
    assert response.status_code == 403 and "staff" in response.json()["message"]
    response = loner.post("/api/v1/storage-systems/", {"name": "nas9", "kind": "nfs"}, format="json")
    assert response.status_code == 403
    team_add_member(team=Team.objects.get(name="red"), user=owner)  # now in blue and red: say which
    response = api.post("/api/v1/nodes/", {"name": "two", "address": "10.0.4.2"}, format="json")
    assert response.status_code == 400 and "team" in response.json()["extra"]
    response = api.post("/api/v1/nodes/", {"name": "two", "address": "10.0.4.2", "team": "red"}, format="json")
    assert response.status_code == 201 and response.json()["team"] == "red"
    assert not Node.objects.filter(team=None).exists()


def persona(name: str, request: Any, django_user_model: Any) -> Any:
    """A conftest persona (member, owner: the team's admin, outsider), or staff with or without the admin's
    permission to change nodes and storage systems, or a superuser; these three are in no team."""
    if name == "superuser":
        return django_user_model.objects.create_superuser("root")
    if name.startswith("staff"):
        user = django_user_model.objects.create_user(name, is_staff=True)
        codenames = ["change_node", "change_storagesystem"] if name == "staff" else ["view_node"]
        user.user_permissions.set(Permission.objects.filter(content_type__app_label="inventory",
                                                            codename__in=codenames))  # fmt: skip
        return user
    return request.getfixturevalue(name)


# Whether each persona changes (True), is refused (False) or does not even see (None) a node or storage system of
# team blue, then a shared one.
MAY_CHANGE = {
    "member": (True, False),
    "owner": (True, False),
    "outsider": (None, False),
    "staff": (None, True),  # may change any node in the admin, but blue's are none of its business here: 404
    "staff-without-permission": (None, False),
    "superuser": (True, True),
}


@pytest.mark.django_db
@pytest.mark.parametrize("who", list(MAY_CHANGE))
def test_the_api_and_the_node_page_agree_on_who_changes_inventory(
    who: str, request: Any, team: Any, django_user_model: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client = client_for(persona(who, request, django_user_model))  # a session: the API and the pages alike
    blue = (node_upsert(name="blue1", address="10.0.5.1", team=team), storage_upsert(name="nas-blue", team=team))
    shared = (node_upsert(name="shared1", address="10.0.5.2"), storage_upsert(name="nas-shared"))
    for (node, storage), expected in zip((blue, shared), MAY_CHANGE[who], strict=True):
        changes = [
            client.patch(f"/api/v1/nodes/{node.pk}/", {"status": "maintenance"}, format="json"),
            client.patch(f"/api/v1/storage-systems/{storage.pk}/", {"export_path": "/x"}, format="json"),
        ]
        page = client.get(reverse("inventory:node-detail", args=[node.pk]))
        with django_capture_on_commit_callbacks() as queued:
            collect = client.post(reverse("inventory:node-collect-facts", args=[node.pk]))
        node.refresh_from_db()
        storage.refresh_from_db()
        if expected is None:
            assert [r.status_code for r in [*changes, page, collect]] == [404] * 4, node.name
        else:
            assert [r.status_code for r in changes] == [200 if expected else 403] * 2, node.name
            assert ("Collect facts</button>" in page.content.decode()) is expected, node.name
            assert len(queued) == int(expected), node.name
        assert (node.status, storage.export_path) == (("maintenance", "/x") if expected else ("active", "")), node.name
        assert client.delete(f"/api/v1/nodes/{node.pk}/").status_code == {True: 204, False: 403, None: 404}[expected]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("who", "created"),
    [("member", "blue"), ("owner", "blue"), ("outsider", "red"), ("staff", None), ("staff-without-permission", 403),
     ("superuser", None)],
)  # fmt: skip
def test_a_member_creates_inventory_in_their_team_and_staff_create_shared_inventory(
    who: str, created: str | int | None, request: Any, team: Any, django_user_model: Any
) -> None:
    client = client_for(persona(who, request, django_user_model))
    response = client.post("/api/v1/nodes/", {"name": "new1", "address": "10.0.6.1"}, format="json")
    storage = client.post("/api/v1/storage-systems/", {"name": "nas-new", "kind": "nfs"}, format="json")
    if created == 403:
        assert (response.status_code, storage.status_code) == (403, 403)
        assert "staff" in response.json()["message"] and not Node.objects.exists()
    else:
        assert (response.status_code, storage.status_code) == (201, 201), response.json()
        assert response.json()["team"] == storage.json()["team"] == created


@pytest.mark.django_db
def test_it_answers_409_when_deleting_storage_a_campaign_uses(api: APIClient, team: Any) -> None:
    storage = storage_upsert(name="nas", kind="nfs", team=team)
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign_apply(data=fio_data("uses-nas", ["n1"], storage="nas"), team=team)
    response = api.delete(f"/api/v1/storage-systems/{storage.pk}/")
    assert response.status_code == 409 and response.json()["extra"]["used_by"] == ["uses-nas"]


# --- campaigns ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_creates_a_campaign_from_yaml_and_names_the_bad_field(api: APIClient, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    text = yaml.safe_dump(fio_data("from-yaml", ["n1"]))
    response = api.post("/api/v1/campaigns/", {"yaml": text}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["team"], body["family"], body["status"]) == ("from-yaml", "blue", "from-yaml", "draft")
    again = api.post("/api/v1/campaigns/", {"yaml": text}, format="json")
    assert again.status_code == 400 and again.json()["extra"] == {"field": "name"}
    bad = api.post("/api/v1/campaigns/", {"spec": {**fio_data("b", ["n1"]), "repetitions": 0}}, format="json")
    assert bad.status_code == 400 and bad.json()["extra"] == {"field": "repetitions"}
    broken = api.post("/api/v1/campaigns/", {"yaml": "name: [unclosed"}, format="json")
    assert broken.status_code == 400 and set(broken.json()) == {"message", "extra"}
    assert api.post("/api/v1/campaigns/", {}, format="json").status_code == 400
    assert Campaign.objects.count() == 1


@pytest.mark.django_db
def test_it_updates_a_draft_but_answers_409_once_launched(api: APIClient, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_apply(data=fio_data("editable", ["n1"]), team=team)
    url = f"/api/v1/campaigns/{campaign.pk}/"
    response = api.put(url, {"spec": fio_data("editable", ["n1"], repetitions=3)}, format="json")
    assert response.status_code == 200 and response.json()["repetitions"] == 3
    renamed = api.put(url, {"spec": fio_data("renamed", ["n1"])}, format="json")
    assert renamed.status_code == 400 and renamed.json()["extra"] == {"field": "name"}
    campaign_launch(campaign=campaign)
    assert api.put(url, {"spec": fio_data("editable", ["n1"])}, format="json").status_code == 409
    assert api.delete(url).status_code == 409
    assert api.post(f"{url}cancel/").json()["status"] == "cancelled"
    assert api.delete(url).status_code == 204


@pytest.mark.django_db
def test_it_launches_once_per_idempotency_key(api: APIClient, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_apply(data=fio_data("idem", ["n1"]), team=team)
    url = f"/api/v1/campaigns/{campaign.pk}/launch/"
    first = api.post(url, HTTP_IDEMPOTENCY_KEY="pipeline-42")
    retry = api.post(url, HTTP_IDEMPOTENCY_KEY="pipeline-42")
    assert first.status_code == retry.status_code == 200
    assert first.json() == retry.json() and retry["Idempotent-Replayed"] == "true"
    assert campaign.runs.count() == 2
    assert api.post(url).status_code == 409  # without a key, a second launch is an invalid transition
    other = api.post(f"/api/v1/campaigns/{campaign.pk}/cancel/", HTTP_IDEMPOTENCY_KEY="pipeline-42")
    assert other.status_code == 200  # cancel takes no key: it is idempotent by its state machine
    reused = api.post(f"/api/v1/campaigns/{campaign.pk}/rerun-failed/", HTTP_IDEMPOTENCY_KEY="pipeline-42")
    assert reused.status_code == 422 and reused.json()["extra"]["path"] == url


@pytest.mark.django_db
def test_it_answers_400_when_a_launch_is_refused_for_another_reason(api: APIClient, team: Any) -> None:
    node = node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_apply(data=fio_data("maint", ["n1"]), team=team)
    node.status = NodeStatus.MAINTENANCE
    node.save(update_fields=["status"])
    response = api.post(f"/api/v1/campaigns/{campaign.pk}/launch/")
    assert response.status_code == 400
    assert response.json() == {"message": "nodes not active (maintenance or retired): n1", "extra": {"field": "nodes"}}
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.DRAFT


@pytest.mark.django_db
def test_it_reruns_the_failed_runs_of_a_finished_campaign(api: APIClient, team: Any) -> None:
    campaign = finished_campaign("flaky", team, {"read": [10.0], "randread": [5.0]})
    Run.objects.filter(campaign=campaign, point=1).update(status=RunStatus.FAILED)
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.FAILED)
    response = api.post(f"/api/v1/campaigns/{campaign.pk}/rerun-failed/")
    assert response.status_code == 200 and response.json()["status"] == "running"
    retry = campaign.runs.get(sequence=3)
    assert (retry.point, retry.attempt, retry.status, retry.hosts.count()) == (1, 2, "pending", 1)
    assert api.post(f"/api/v1/campaigns/{campaign.pk}/rerun-failed/").status_code == 409


@pytest.mark.django_db
def test_it_lists_presets_and_instantiates_one_in_the_team(api: APIClient, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    storage_upsert(name="nas", kind="nfs", data_addresses=["10.0.9.1"], export_path="/ifs/data", team=team)
    presets = api.get("/api/v1/presets/").json()
    assert "storage-fio-bandwidth" in [p["slug"] for p in presets]
    body = {"name": "nightly", "nodes": ["n1"], "storage": "nas"}
    response = api.post("/api/v1/presets/storage-fio-bandwidth/instantiate/", body, format="json")
    assert response.status_code == 201
    created = response.json()["campaigns"]
    assert [(c["name"], c["team"], c["family"]) for c in created] == [("nightly", "blue", "storage-fio-bandwidth")]
    assert api.get("/api/v1/presets/no-such/").status_code == 404
    assert api.post("/api/v1/presets/no-such/instantiate/", {"name": "x"}, format="json").status_code == 400


# --- results ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_filters_results_by_campaign_metric_host_params_and_time(api: APIClient, team: Any) -> None:
    first, second = make_rows(2, team)
    rows = api.get("/api/v1/results/", {"campaign": first.pk, "host": ""}).json()["results"]
    assert {(r["campaign"], r["name"], r["value"], r["host"]) for r in rows} == {(first.pk, "bw_bytes", 100.0, "")}
    rows = api.get("/api/v1/results/", {"campaign": second.pk, "param.rw": "randread", "host": "node1"}).json()
    assert [(r["params"]["rw"], r["host"]) for r in rows["results"]] == [("randread", "node1")]
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    assert api.get("/api/v1/results/", {"finished_after": later}).json()["results"] == []
    bad = api.get("/api/v1/results/", {"campaign": "abc"})
    assert bad.status_code == 400 and bad.json() == {"message": "invalid input",
                                                     "extra": {"campaign": ["Enter a number."]}}  # fmt: skip


@pytest.mark.django_db
def test_it_pages_results_with_a_cursor(api: APIClient, team: Any) -> None:
    make_rows(3, team)
    seen, url, params = [], "/api/v1/results/", {"limit": "5"}
    while url:
        page = api.get(url, params).json()
        seen += [r["id"] for r in page["results"]]
        url, params = page["next"], {}
    assert len(seen) == Result.objects.count() == 12 and seen == sorted(seen, reverse=True)


@pytest.mark.django_db
def test_it_filters_results_by_their_run_s_status_and_says_it(api: APIClient, team: Any) -> None:
    first, second = make_rows(2, team)
    Run.objects.filter(campaign=second).update(status=RunStatus.FAILED)
    rows = api.get("/api/v1/results/", {"run_status": "succeeded"}).json()["results"]
    assert rows and {(r["campaign"], r["run_status"]) for r in rows} == {(first.pk, "succeeded")}
    rows = api.get("/api/v1/results/", {"run_status": "failed"}).json()["results"]
    assert rows and {r["campaign"] for r in rows} == {second.pk}
    bad = api.get("/api/v1/results/", {"run_status": "bogus"})
    assert bad.status_code == 400 and "run_status" in bad.json()["extra"]


# --- baselines, verdicts, compare ---------------------------------------------------------------


@pytest.mark.django_db
def test_it_judges_a_campaign_against_its_family_baseline(api: APIClient, team: Any) -> None:
    base = finished_campaign("base", team, {"read": [100.0, 101.0, 99.0], "randread": [50.0, 51.0, 49.0]},
                             family="nightly")  # fmt: skip
    worse = finished_campaign("worse", team, {"read": [80.0, 81.0, 79.0], "randread": [50.5, 49.5, 50.0]},
                              family="nightly")  # fmt: skip
    response = api.post(f"/api/v1/campaigns/{worse.pk}/verdict/", {}, format="json")
    assert response.status_code == 404
    assert response.json() == {"message": "no baseline for family nightly", "extra": {"reason": "no-baseline"}}

    response = api.post("/api/v1/baselines/", {"campaign": base.pk, "note": "driver 550"}, format="json")
    assert response.status_code == 201 and response.json()["family"] == "nightly"
    response = api.post(f"/api/v1/campaigns/{worse.pk}/verdict/", {}, format="json")
    assert response.status_code == 201
    verdict = response.json()
    assert (verdict["outcome"], verdict["method"], verdict["method_version"]) == ("regression", "welch-t", 1)
    assert verdict["baseline_campaign"] == {"id": base.pk, "name": "base"} and verdict["final"] is True
    by_point = {i["params"]["rw"]: i for i in verdict["items"]}
    assert by_point["read"]["outcome"] == "regression" and by_point["read"]["change_pct"] == pytest.approx(-20)
    assert by_point["read"]["higher_is_better"] is True and by_point["read"]["p_value"] < 0.05
    assert "80" in by_point["read"]["reason"] and by_point["randread"]["outcome"] == "pass"
    assert verdict["counts"] == {"pass": 1, "regression": 1, "improvement": 0, "inconclusive": 0}
    assert api.get(f"/api/v1/campaigns/{worse.pk}/verdict/").json()["id"] == verdict["id"]
    looser = api.post(f"/api/v1/campaigns/{worse.pk}/verdict/", {"threshold_pct": 25}, format="json").json()
    assert looser["outcome"] == "pass" and looser["policy"]["threshold_pct"] == 25
    bad = api.post(f"/api/v1/campaigns/{worse.pk}/verdict/", {"alpha": 3}, format="json")
    assert bad.status_code == 400 and "alpha" in bad.json()["extra"]


@pytest.mark.django_db
def test_it_answers_409_for_a_verdict_on_a_running_campaign(api: APIClient, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_launch(campaign=campaign_apply(data=fio_data("busy", ["n1"]), team=team))
    assert api.post(f"/api/v1/campaigns/{campaign.pk}/verdict/", {}, format="json").status_code == 409
    response = api.post("/api/v1/baselines/", {"campaign": campaign.pk}, format="json")
    assert response.status_code == 409


@pytest.mark.django_db
def test_it_reruns_suspected_regressions_before_the_verdict_is_final(team: Any) -> None:
    base = finished_campaign("base", team, {"read": [100.0, 100.5], "randread": [50.0, 50.5]}, family="f")
    baselines.baseline_set(campaign=base)
    worse = finished_campaign("worse", team, {"read": [70.0, 70.5], "randread": [50.0, 50.5]}, family="f",
                              verdict={"rerun_regressions": True})  # fmt: skip
    verdict = worse.verdicts.get()
    assert (verdict.outcome, verdict.final, worse.status) == ("regression", False, "running")
    extra = list(worse.runs.filter(status=RunStatus.PENDING).values_list("point", "repetition"))
    assert extra == [(0, 3), (0, 4)]
    for run in worse.runs.filter(status=RunStatus.PENDING):
        Result.objects.create(run=run, name="bw_bytes", value=71.0, unit="B/s")
    worse.runs.update(status=RunStatus.SUCCEEDED)
    campaign_finish(campaign=worse)
    worse.refresh_from_db()
    final = worse.verdicts.first()
    assert final is not None and (final.outcome, final.final, worse.status) == ("regression", True, "succeeded")
    assert next(i for i in final.items if i["point"] == 0)["candidate"]["n"] == 4


@pytest.mark.django_db
def test_it_compares_campaigns_point_by_point_and_says_when_a_change_is_noise(api: APIClient, team: Any) -> None:
    a = finished_campaign("a", team, {"read": [100.0, 101.0, 99.0], "randread": [50.0, 70.0, 30.0]})
    b = finished_campaign("b", team, {"read": [120.0, 121.0, 119.0], "randread": [60.0, 80.0, 40.0]})
    table = api.get("/api/v1/compare/", {"campaigns": f"{a.pk},{b.pk}"}).json()
    assert [c["label"] for c in table["columns"]] == ["a", "b"] and table["by_point"] is True
    rows = {r["params"]["rw"]: r for r in table["rows"]}
    assert rows["read"]["changes"][1]["outcome"] == "improvement"
    assert rows["read"]["changes"][1]["change_pct"] == pytest.approx(20)
    assert rows["randread"]["changes"][1]["outcome"] == "inconclusive"  # +20% inside a ±40% spread
    assert rows["read"]["values"][0]["n"] == 3
    first_a, first_b = a.runs.get(sequence=1), b.runs.get(sequence=1)
    runs = api.get("/api/v1/compare/", {"runs": f"{first_a.pk},{first_b.pk}"}).json()
    assert runs["by_point"] is False and len(runs["rows"]) == 1
    assert [c["label"] for c in runs["columns"]] == [f"a · run #1 (point {first_a.point})",
                                                     f"b · run #1 (point {first_b.point})"]  # fmt: skip
    points = api.get("/api/v1/compare/", {"points": f"{a.pk}:0,{b.pk}:0"}).json()
    assert points["rows"][0]["changes"][1]["outcome"] == "improvement"
    assert [c["label"] for c in points["columns"]] == [
        "a · point 0",  # the same parameters on both sides: the label says only what differs
        "b · point 0",
    ]
    assert api.get("/api/v1/compare/", {"campaigns": str(a.pk)}).status_code == 400
    assert api.get("/api/v1/compare/", {"campaigns": f"{a.pk},999999"}).status_code == 404
    assert api.get("/api/v1/compare/", {"campaigns": "x,y"}).status_code == 400


@pytest.mark.django_db
def test_it_compares_sets_in_the_order_written_and_reads_the_pages_parameters_too(api: APIClient, team: Any) -> None:
    a = finished_campaign("a", team, {"read": [100.0, 101.0, 99.0], "randread": [50.0, 51.0, 49.0]})
    b = finished_campaign("b", team, {"read": [80.0, 81.0, 79.0], "randread": [50.0, 51.0, 49.0]})
    run = b.runs.get(sequence=1)
    mixed = api.get(f"/api/v1/compare/?runs={run.pk}&campaigns={a.pk}&points={b.pk}:0").json()
    assert [(c["campaign"], c["runs"]) for c in mixed["columns"]][:2] == [(b.pk, [run.pk]), (a.pk, None)]
    assert mixed["columns"][2]["label"] == "b · point 0"  # the reference is the first written: the run
    as_page = api.get(f"/api/v1/compare/?campaign={a.pk}&campaign={b.pk}&threshold=30").json()
    as_api = api.get(f"/api/v1/compare/?campaigns={a.pk},{b.pk}&threshold_pct=30").json()
    assert as_page == as_api and as_api["policy"] == {"threshold_pct": 30.0, "alpha": 0.05, "statistic": "mean"}
    read = next(r for r in as_api["rows"] if r["params"]["rw"] == "read")
    assert read["changes"][1]["outcome"] == "pass"  # -20% inside a 30% threshold
    strict = api.get(f"/api/v1/compare/?campaigns={a.pk},{b.pk}&alpha=0.01").json()
    assert strict["policy"]["alpha"] == 0.01


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        ("campaigns={a},nope", 400, "campaigns"),
        ("points={a}", 400, "points"),
        ("campaigns={a},{b}&alpha=3", 400, "alpha"),
        ("campaigns={a},{b}&threshold_pct=lots", 400, "threshold_pct"),
        ("campaigns={a},{b}&threshold=-1", 400, "threshold"),
        ("runs={a_run}", 400, "campaigns"),  # one set: nothing to compare it with
        ("campaigns=" + ",".join(str(i) for i in range(1, 14)), 400, "campaigns"),  # more than analysis.forms.MAX_SETS
        ("campaigns={a}&points={a}:9", 404, None),
        ("campaigns={a},{hidden}", 404, None),
        ("campaigns={a}&runs={hidden_run}", 404, None),
        ("campaigns={a}&points={hidden}:0", 404, None),
    ],
)
def test_it_answers_a_bad_or_unseen_compare_set_in_the_one_error_shape(
    api: APIClient, team: Any, outsider: Any, query: str, status: int, field: str | None
) -> None:
    a = finished_campaign("a", team, {"read": [100.0, 101.0], "randread": [50.0, 51.0]})
    b = finished_campaign("b", team, {"read": [80.0, 81.0], "randread": [50.0, 51.0]})
    red = Team.objects.get(name="red")
    hidden = finished_campaign("red-only", red, {"read": [1.0, 1.0], "randread": [1.0, 1.0]})
    url = "/api/v1/compare/?" + query.format(a=a.pk, b=b.pk, a_run=a.runs.first().pk, hidden=hidden.pk,
                                             hidden_run=hidden.runs.first().pk)  # fmt: skip
    response = api.get(url)
    assert response.status_code == status, response.json()
    body = response.json()
    assert set(body) == {"message", "extra"}
    if field is not None:
        assert field in body["extra"], body
    else:
        assert body["message"].startswith(("no ", "campaign a has no point 9"))


class Receiver(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.django_db
def test_it_posts_a_signed_verdict_to_the_webhook(team: Any, settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "WEBHOOK_SECRET": "s3cret", "WEBHOOK_ALLOW_PRIVATE": True}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        base = finished_campaign("base", team, {"read": [100.0, 100.5], "randread": [50.0, 50.5]}, family="f")
        baselines.baseline_set(campaign=base)
        same = finished_campaign("same", team, {"read": [100.2, 100.4], "randread": [50.1, 50.3]}, family="f",
                                 verdict={"webhook": url})  # fmt: skip
        verdict = same.verdicts.get()
        assert verdict_webhook_task.apply((verdict.pk,)).get().startswith("204")
    finally:
        server.shutdown()
    headers, body = Receiver.received[-1]
    assert headers["X-Rackbench-Signature"] == baselines.webhook_signature(body, "s3cret")
    payload = json.loads(body)
    assert payload["campaign"]["name"] == "same" and payload["verdict"]["outcome"] == "pass"
    assert Verdict.objects.get(pk=verdict.pk).webhook_status.startswith("204")


@pytest.mark.django_db
def test_it_records_a_webhook_that_cannot_be_reached(team: Any, settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "WEBHOOK_ALLOW_PRIVATE": True}  # the receiver is on this machine
    base = finished_campaign("base", team, {"read": [100.0, 100.5], "randread": [50.0, 50.5]}, family="f")
    baselines.baseline_set(campaign=base)
    same = finished_campaign("same", team, {"read": [100.2, 100.4], "randread": [50.1, 50.3]}, family="f",
                             verdict={"webhook": "http://127.0.0.1:9/nothing-listens"})  # fmt: skip
    verdict = same.verdicts.get()
    outcome = verdict_webhook_task.apply((verdict.pk,), retries=5).get()  # the last of its retries
    assert outcome.startswith("failed (attempt 6)") and "Connection refused" in outcome
    assert "Connection refused" in Verdict.objects.get(pk=verdict.pk).webhook_status


# --- schema and docs ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_serves_an_openapi_schema_and_docs_from_vendored_assets(api: APIClient) -> None:
    schema = yaml.safe_load(api.get("/api/v1/schema/").content)
    assert schema["openapi"].startswith("3.") and "/api/v1/campaigns/{id}/verdict/" in schema["paths"]
    assert "tokenAuth" in schema["components"]["securitySchemes"]
    page = api.get("/api/v1/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page and "cdn" not in page.lower()
    redoc = api.get("/api/v1/redoc/").content.decode()  # ReDoc in the system's fonts: nothing from the internet
    assert "/static/drf_spectacular_sidecar/redoc/" in redoc and "https://" not in redoc
    assert "system-ui" in redoc


@pytest.mark.django_db
def test_it_weighs_the_familys_earlier_campaigns_in_a_verdict(api: APIClient, team: Any) -> None:
    steady = {"read": [100.0, 101.0, 99.0], "randread": [50.0, 51.0, 49.0]}
    base = finished_campaign("base", team, steady, family="nightly")
    baselines.baseline_set(campaign=base)
    for name in ("mon", "tue"):
        finished_campaign(name, team, steady, family="nightly")
    worse = finished_campaign("wed", team, {"read": [80.0, 81.0, 79.0], "randread": [50.0, 51.0, 49.0]},
                              family="nightly")  # fmt: skip
    items = {i["params"]["rw"]: i for i in worse.verdicts.get().items}
    assert (items["read"]["outcome"], items["read"]["test"]) == ("regression", "history")
    assert items["randread"]["outcome"] == "pass"
