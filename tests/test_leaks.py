"""Small leaks closed: campaign names per team, /metrics behind its token, webhooks kept off internal addresses,
storage addresses and paths that reach mount checked."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Team
from campaigns import baselines
from campaigns.models import Campaign
from campaigns.services import campaign_apply
from campaigns.spec import SpecError
from campaigns.tasks import verdict_webhook_task
from common.addresses import url_refusal
from inventory.models import StorageSystem
from inventory.services import node_upsert, storage_upsert
from plugins.mounts import MountPlan, mount_command

SPEC = {"name": "blue-draft", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "size": "16M"},
        "matrix": {"rw": ["read"]}}  # fmt: skip


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_campaign_names_are_per_team_and_another_teams_name_tells_nothing(team: Any, owner: Any, outsider: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1")
    mine = api_for(owner).post("/api/v1/campaigns/", {"spec": SPEC}, format="json")
    assert mine.status_code == 201
    theirs = api_for(outsider).post("/api/v1/campaigns/", {"spec": SPEC}, format="json")
    assert theirs.status_code == 201, theirs.json()
    assert sorted(Campaign.objects.values_list("team__name", flat=True)) == ["blue", "red"]
    again = api_for(outsider).post("/api/v1/campaigns/", {"spec": SPEC}, format="json")
    assert again.status_code == 400 and "already exists" in again.json()["message"]  # in their own team
    red = Team.objects.get(name="red")
    campaign_apply(data={**SPEC, "description": "red's"}, team=red)  # apply updates red's draft, not blue's
    assert Campaign.objects.get(team=team).description == ""


@pytest.mark.django_db
def test_metrics_need_their_token_by_default(settings: Any) -> None:
    assert Client().get("/metrics").status_code == 403
    settings.RACKBENCH = {**settings.RACKBENCH, "METRICS_TOKEN": "scrape-me"}
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000/x", "http://localhost/x", "http://10.1.2.3/", "http://192.168.0.1/", "http://[::1]/",
     "http://169.254.169.254/latest/meta-data/", "http://0.0.0.0/", "http://[::ffff:127.0.0.1]/", "https://172.16.0.1/"],
)  # fmt: skip
def test_an_internal_webhook_address_is_refused(url: str) -> None:
    assert url_refusal(url, resolve=False)


def test_a_public_webhook_address_is_accepted() -> None:
    assert url_refusal("https://93.184.215.14/hook", resolve=False) == ""


@pytest.mark.django_db
def test_a_webhook_to_an_internal_address_is_refused_when_defined_and_when_called(team: Any, settings: Any) -> None:
    from tests.test_api import finished_campaign

    with pytest.raises(SpecError) as caught:
        campaign_apply(data={**SPEC, "verdict": {"webhook": "http://127.0.0.1:9/hook"}}, team=team)
    assert caught.value.field == "verdict.webhook"
    settings.RACKBENCH = {**settings.RACKBENCH, "WEBHOOK_ALLOW_PRIVATE": True}
    base = finished_campaign("base", team, {"read": [100.0, 100.5], "randread": [50.0, 50.5]}, family="f")
    baselines.baseline_set(campaign=base)
    same = finished_campaign("same", team, {"read": [100.2, 100.4], "randread": [50.1, 50.3]}, family="f",
                             verdict={"webhook": "http://127.0.0.1:9/hook"})  # fmt: skip
    settings.RACKBENCH = {**settings.RACKBENCH, "WEBHOOK_ALLOW_PRIVATE": False}  # defined before the rule, say
    outcome = verdict_webhook_task.apply((same.verdicts.get().pk,)).get()
    assert outcome.startswith("refused: 127.0.0.1 is an internal address")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value"),
    [("data_addresses", ["-oexec"]), ("data_addresses", ["10.0.0.1;id"]), ("data_addresses", "10.0.0.1"),
     ("export_path", "/ifs/../etc"), ("export_path", "-o exec"), ("export_path", "/x;id"), ("export_path", "rel/x"),
     ("mount_options", "exec;id"), ("admin_address", "--proxy=x")],
)  # fmt: skip
def test_storage_addresses_and_paths_that_reach_mount_are_checked(
    field: str, value: Any, member: Any, team: Any
) -> None:
    storage = storage_upsert(name="nas", kind="nfs", team=team)
    response = api_for(member).patch(f"/api/v1/storage-systems/{storage.pk}/", {field: value}, format="json")
    assert response.status_code == 400 and field in response.json()["extra"], response.json()
    assert StorageSystem.objects.get(pk=storage.pk).export_path == ""


def test_mount_reads_the_source_and_the_point_as_operands_never_options() -> None:
    nfs = mount_command([MountPlan("/mnt/a/0", "10.0.0.1:/ifs", "nfs", "nconnect=8")], "root")
    bind = mount_command([MountPlan("/mnt/b/0", "/scratch", "bind", "")], "root")
    assert "mount -t nfs -o nconnect=8 -- 10.0.0.1:/ifs /mnt/a/0" in nfs
    assert "mount --bind -- /scratch /mnt/b/0" in bind
