"""Team boundaries the pages and the API keep: who creates shared campaigns, which choices a form offers, what an
error may tell about another team."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.models import Team
from accounts.services import team_add_member, token_create
from campaigns.models import Campaign
from campaigns.services import campaign_apply
from inventory.services import node_upsert

FIO = {"name": "web-fio", "nodes": ["n1"], "repetitions": "1", "warmup_runs": "0", "timeout": "600",
       "fixed": "bs=4k\nsize=16M\n", "matrix": "rw=read\n", "create": ""}  # fmt: skip
SPEC = {"name": "api-fio", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "size": "16M"},
        "matrix": {"rw": ["read"]}}  # fmt: skip


@pytest.fixture
def shared_node(db: Any) -> Any:
    return node_upsert(name="n1", address="10.0.0.1")


@pytest.mark.django_db
def test_a_member_of_several_teams_picks_one_of_their_teams_in_the_quick_fio_form(
    client: Any, owner: Any, outsider: Any, shared_node: Any
) -> None:
    team_add_member(team=Team.objects.get(name="red"), user=owner)
    client.force_login(owner)
    url = reverse("campaigns:campaign-new-fio")
    assert 'name="team"' in client.get(url).content.decode()
    response = client.post(url, FIO)
    assert response.status_code == 200 and "team" in response.context["form"].errors
    third = Team.objects.create(name="green")
    response = client.post(url, {**FIO, "team": third.pk})
    assert "team" in response.context["form"].errors and not Campaign.objects.exists()
    response = client.post(url, {**FIO, "team": Team.objects.get(name="red").pk})
    assert response.status_code == 302
    assert Campaign.objects.get(name="web-fio").team.name == "red"


@pytest.mark.django_db
def test_a_user_without_a_team_creates_no_shared_campaign_on_any_path(
    client: Any, django_user_model: Any, shared_node: Any
) -> None:
    loner = django_user_model.objects.create_user("loner")
    client.force_login(loner)
    response = client.post(reverse("campaigns:campaign-new-fio"), FIO)
    assert response.status_code == 200 and "staff" in str(response.context["form"].errors)
    definition = "name: b1\nkind: fio\nnodes: [n1]\nmatrix: {rw: [read]}\n"
    builder = client.post(reverse("campaigns:campaign-new"), {"definition": definition, "create": ""})
    assert builder.status_code == 200 and "team" in str(builder.context["form"].errors)
    api = APIClient()
    api.force_login(loner)
    answer = api.post("/api/v1/campaigns/", {"spec": SPEC}, format="json")
    assert answer.status_code == 400 and answer.json()["extra"]["field"] == "team"
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_only_staff_replace_or_delete_a_shared_campaign_through_the_api(
    owner: Any, team: Any, django_user_model: Any, shared_node: Any
) -> None:
    shared = campaign_apply(data=SPEC)  # from the command line: shared
    api = APIClient()
    api.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token_create(user=owner, team=team, name='ci', scope='launch').secret}"
    )
    url = f"/api/v1/campaigns/{shared.pk}/"
    assert api.get(url).status_code == 200
    replaced = api.put(url, {"spec": {**SPEC, "description": "mine now"}}, format="json")
    assert replaced.status_code == 403 and "staff" in replaced.json()["message"]
    assert api.delete(url).status_code == 403
    assert Campaign.objects.get(pk=shared.pk).description == ""
    root = APIClient()
    root.force_login(django_user_model.objects.create_superuser("root"))
    assert root.delete(url).status_code == 204


@pytest.mark.django_db
def test_the_quick_fio_form_offers_and_accepts_only_what_the_viewer_sees(
    client: Any, team: Any, outsider: Any, shared_node: Any
) -> None:
    from inventory.services import storage_upsert

    storage_upsert(name="blue-secret-nas", kind="nfs", team=team)
    node_upsert(name="blue-secret-node", address="10.0.0.2", team=team)
    storage_upsert(name="shared-nas", kind="nfs")
    client.force_login(outsider)
    url = reverse("campaigns:campaign-new-fio")
    page = client.get(url).content.decode()
    assert "shared-nas" in page and "n1" in page
    assert "blue-secret" not in page
    for field, theirs in (("storage", "blue-secret-nas"), ("nodes", "blue-secret-node")):
        answers = []
        for value in (theirs, "no-such-thing"):
            response = client.post(url, {**FIO, field: [value] if field == "nodes" else value})
            answers.append(str(response.context["form"].errors).replace(value, "NAME"))
        assert "valid choice" in answers[0] and answers[0] == answers[1], answers
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_another_teams_node_tag_is_as_unknown_as_a_missing_one(team: Any, outsider: Any, shared_node: Any) -> None:
    node_upsert(name="blue1", address="10.0.0.3", team=team, tags=["blue-only"])
    red = Team.objects.get(name="red")
    answers = []
    for tag in ("blue-only", "no-such-tag"):
        with pytest.raises(Exception) as caught:
            campaign_apply(data={**SPEC, "nodes": [], "node_tags": [tag]}, owner=outsider, team=red)
        answers.append(str(caught.value).replace(tag, "TAG"))
    assert answers[0] == answers[1]


@pytest.mark.django_db
def test_only_staff_set_or_retire_the_baseline_of_a_shared_campaign(
    owner: Any, team: Any, django_user_model: Any, shared_node: Any
) -> None:
    from django.utils import timezone

    from campaigns import baselines
    from campaigns.models import Baseline, Result, RunStatus
    from campaigns.services import campaign_finish, campaign_launch

    shared = campaign_launch(campaign=campaign_apply(data=SPEC))
    for run in shared.runs.all():
        Result.objects.create(run=run, name="bw_bytes", value=1.0, unit="B/s")
    shared.runs.update(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    campaign_finish(campaign=shared)
    api = APIClient()
    api.force_login(owner)
    refused = api.post("/api/v1/baselines/", {"campaign": shared.pk}, format="json")
    assert refused.status_code == 403 and not Baseline.objects.exists()
    baseline = baselines.baseline_set(campaign=shared)
    assert api.delete(f"/api/v1/baselines/{baseline.pk}/").status_code == 403
    assert Baseline.objects.get(pk=baseline.pk).active
    root = APIClient()
    root.force_login(django_user_model.objects.create_superuser("root"))
    assert root.delete(f"/api/v1/baselines/{baseline.pk}/").status_code == 204
