"""The campaign builder: YAML from a preset, a previous campaign or blank; a live preview that saves nothing;
a node picker of the nodes the team may use; create, create and launch, save as YAML."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from accounts.services import team_add_member, team_create
from campaigns.models import Campaign, CampaignStatus
from campaigns.services import campaign_apply
from inventory.models import NodeStatus
from inventory.services import node_upsert, storage_upsert

NEW = reverse("campaigns:campaign-new")
PREVIEW = reverse("campaigns:campaign-new-preview")
HX = {"HX-Request": "true"}


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def definition(**overrides: Any) -> str:
    data = {"name": "web-fio", "kind": "fio", "nodes": ["n1"], "repetitions": 2, "fixed": {"bs": "4k", "size": "16M"},
            "matrix": {"rw": ["read", "randread"], "numjobs": [1, 4]}}  # fmt: skip
    return yaml.safe_dump({**data, **overrides}, sort_keys=False)


@pytest.fixture
def nodes(team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team, tags=["dgx"], gpu_model="H100", gpu_count=8)
    node_upsert(name="n2", address="10.0.0.2", team=team, status=NodeStatus.MAINTENANCE)
    node_upsert(name="shared1", address="10.0.1.1", tags=["lab"])
    node_upsert(name="red1", address="10.9.0.1", team=team_create(name="green"))
    storage_upsert(name="nas", kind="nfs", export_path="/export", team=team)


@pytest.mark.django_db
def test_it_sends_anonymous_users_to_the_login_page(client: Client) -> None:
    for response in (client.get(NEW), client.post(PREVIEW, {"definition": definition()})):
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_it_opens_on_a_blank_definition_with_its_preview(member: Any, nodes: None) -> None:
    page = signed_in(member).get(NEW).content.decode()
    assert "name: my-campaign" in page and 'id="preview"' in page
    assert 'hx-post="/campaigns/new/preview/" hx-trigger="keyup changed delay:500ms"' in page
    assert "nodes: select at least one node" in html.unescape(page)  # the blank one names no node yet
    for label in ("Create and launch", "Save as YAML", ">Create<"):
        assert label in page


@pytest.mark.django_db
def test_it_picks_only_active_nodes_the_team_may_use(member: Any, nodes: None) -> None:
    page = signed_in(member).get(NEW).content.decode()
    assert 'value="n1"' in page and 'value="shared1"' in page
    assert 'value="n2"' not in page  # in maintenance
    assert 'value="red1"' not in page  # another team's
    assert 'data-tags="dgx ' in page and 'data-gpu="H100"' in page
    assert "Created in team <strong>blue</strong>" in page


@pytest.mark.django_db
def test_it_previews_the_run_count_and_exact_commands_without_saving(member: Any, nodes: None) -> None:
    response = signed_in(member).post(PREVIEW, {"definition": definition()}, headers=HX)
    page = response.content.decode()
    assert response.status_code == 200 and "<html" not in page
    assert 'data-testid="preview-runs">8<' in page  # 4 points x 2 repetitions
    assert "--output-format=json job.fio" in page and "rw=randread" in page and "numjobs=4" in page
    assert not Campaign.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        (definition(matrix={"rw": ["read", "sideways"]}), "matrix.rw", "must be one of"),
        (definition(nodes=["ghost"]), "nodes[0]", "no node named 'ghost'"),
        (definition(nodes=["red1"]), "nodes[0]", "no node named 'red1'"),  # another team's node
        (definition(repetitions=0), "repetitions", "must be at least 1"),
        (definition(storage="nas", cache={"flush_storage": "yes"}), "cache.flush_storage", "true or false"),
        (definition(colour="blue"), "colour", "unknown field"),
        ("name: [unclosed", "definition", "not valid YAML at line 1"),
    ],
)
def test_it_names_the_field_of_a_bad_definition_and_saves_nothing(
    member: Any, nodes: None, text: str, field: str, message: str
) -> None:
    page = html.unescape(signed_in(member).post(PREVIEW, {"definition": text}, headers=HX).content.decode())
    assert f"{field}: " in page and message in page, page
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_it_refuses_a_name_already_taken(member: Any, team: Any, nodes: None) -> None:
    campaign_apply(data=yaml.safe_load(definition()), team=team)
    page = html.unescape(signed_in(member).post(PREVIEW, {"definition": definition()}).content.decode())
    assert "name: a campaign named 'web-fio' already exists" in page


@pytest.mark.django_db
def test_it_merges_the_picked_nodes_into_the_definition(member: Any, nodes: None) -> None:
    page = signed_in(member).post(PREVIEW, {"definition": definition(nodes=[]), "picked": ["shared1"]}).content
    assert "shared1" in page.decode() and 'data-testid="preview-runs">8<' in page.decode()


@pytest.mark.django_db
def test_it_creates_the_campaign_in_the_users_team(member: Any, team: Any, nodes: None) -> None:
    response = signed_in(member).post(NEW, {"definition": definition(), "picked": ["shared1"], "create": "1"})
    campaign = Campaign.objects.get(name="web-fio")
    assert response.status_code == 302 and response["Location"] == f"/campaigns/{campaign.pk}/"
    assert campaign.team == team and campaign.owner == member and campaign.status == CampaignStatus.DRAFT
    assert [n.name for n in campaign.nodes.order_by("name")] == ["n1", "shared1"]


@pytest.mark.django_db
def test_it_shows_the_error_on_the_definition_when_create_fails(member: Any, nodes: None) -> None:
    response = signed_in(member).post(NEW, {"definition": definition(nodes=["ghost"]), "create": "1"})
    assert response.status_code == 200
    assert "nodes[0]: no node named 'ghost'" in " ".join(response.context["form"].errors["definition"])
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_it_creates_and_launches(member: Any, nodes: None) -> None:
    signed_in(member).post(NEW, {"definition": definition(), "launch": "1"})
    campaign = Campaign.objects.get(name="web-fio")
    assert campaign.status == CampaignStatus.RUNNING and campaign.runs.count() == 8


@pytest.mark.django_db
def test_it_asks_a_user_of_several_teams_which_team(member: Any, team: Any, nodes: None) -> None:
    other = team_create(name="gold")
    team_add_member(team=other, user=member)
    client = signed_in(member)
    assert 'name="team"' in client.get(NEW).content.decode()
    response = client.post(NEW, {"definition": definition(nodes=["shared1"]), "create": "1"})
    assert "team" in response.context["form"].errors and not Campaign.objects.exists()
    client.post(NEW, {"definition": definition(nodes=["shared1"]), "team": other.pk, "create": "1"})
    assert Campaign.objects.get().team == other


@pytest.mark.django_db
def test_it_saves_the_definition_as_a_yaml_download(member: Any, nodes: None) -> None:
    response = signed_in(member).post(NEW, {"definition": definition(nodes=[]), "picked": ["n1"], "download": "1"})
    assert response["Content-Disposition"] == 'attachment; filename="web-fio.yaml"'
    assert yaml.safe_load(response.content)["nodes"] == ["n1"]
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_it_starts_from_a_preset_and_creates_it(member: Any, nodes: None) -> None:
    client = signed_in(member)
    page = html.unescape(client.get(NEW, {"preset": "storage-fio-bandwidth"}).content.decode())
    text = page.split('data-testid="definition"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
    data = yaml.safe_load(text)
    assert data["name"] == "storage-fio-bandwidth" and data["fixed"]["bs"] == "1M" and data["storage"] == ""
    assert "storage-fio-bandwidth-ontap" not in page
    data.update(nodes=["n1"], storage="nas")
    client.post(NEW, {"definition": yaml.safe_dump(data), "create": "1"})
    campaign = Campaign.objects.get(name="storage-fio-bandwidth")
    assert campaign.family == "storage-fio-bandwidth" and campaign.storage.name == "nas"
    assert campaign.mounts["path"] == "/mnt/rackbench"


@pytest.mark.django_db
def test_it_loads_one_part_of_a_preset_suite(member: Any) -> None:
    page = html.unescape(signed_in(member).get(NEW, {"preset": "seed003-ontap-validation:fio-iops"}).content.decode())
    assert "name: seed003-ontap-validation-fio-iops" in page and "randwrite" in page
    selected = re.findall(
        r'<option value="([^"]*)" selected>', page.split('id="start-preset"', 1)[1].split("</select>")[0]
    )
    assert selected == ["seed003-ontap-validation:fio-iops"]  # the preset loaded stays the one shown in the list
    assert signed_in(member).get(NEW, {"preset": "no-such-preset"}).status_code == 404


@pytest.mark.django_db
def test_it_clones_a_previous_campaign_under_a_new_name(member: Any, outsider: Any, team: Any, nodes: None) -> None:
    source = campaign_apply(data={**yaml.safe_load(definition()), "family": "nightly"}, team=team)
    client = signed_in(member)
    page = html.unescape(client.get(NEW, {"clone": source.pk}).content.decode())
    assert "name: web-fio-2" in page and "family: nightly" in page and 'data-testid="preview-runs">8<' in page
    text = page.split('data-testid="definition"', 1)[1].split(">", 1)[1].split("</textarea>", 1)[0]
    client.post(NEW, {"definition": text, "create": "1"})
    clone = Campaign.objects.get(name="web-fio-2")
    assert clone.family == "nightly" and clone.team == team and clone.matrix == source.matrix
    assert signed_in(outsider).get(NEW, {"clone": source.pk}).status_code == 404
