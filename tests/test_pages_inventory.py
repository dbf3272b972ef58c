"""Inventory pages: the node list's filters (tag, GPU model, status, text), a node with its facts and the
"Collect facts" button (any member of the node's team, or staff who may change nodes in the admin; shared nodes:
those staff only), storage systems."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.services import team_create
from inventory.models import Node, NodeStatus
from inventory.services import node_upsert, storage_upsert
from runners.dispatch import collect_facts

LIST = reverse("inventory:node-list")


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def nodes(team: Any) -> dict[str, Node]:
    made = [
        node_upsert(name="dgx-a", address="10.0.0.1", team=team, tags=["dgx"], gpu_model="A100", gpu_count=8,
                    cpu_model="AMD EPYC 7742"),
        node_upsert(name="dgx-h", address="10.0.0.2", team=team, tags=["dgx"], gpu_model="H100", gpu_count=8,
                    status=NodeStatus.MAINTENANCE),
        node_upsert(name="lab-shared", address="127.0.1.1", tags=["lab"]),
        node_upsert(name="red-secret", address="10.9.9.9", team=team_create(name="green")),
    ]  # fmt: skip
    return {n.name: n for n in made}


def names(client: Client, **params: str) -> set[str]:
    return {n.name for n in client.get(LIST, params).context["nodes"]}


@pytest.mark.django_db
def test_it_sends_anonymous_users_to_the_login_page(client: Client, nodes: dict[str, Node]) -> None:
    pk = nodes["dgx-a"].pk
    for response in (client.get(LIST), client.get(reverse("inventory:node-detail", args=[pk])),
                     client.get(reverse("inventory:storage-list")),
                     client.post(reverse("inventory:node-collect-facts", args=[pk]))):  # fmt: skip
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_filters_nodes_by_tag_gpu_model_status_and_text(member: Any, nodes: dict[str, Node]) -> None:
    client = signed_in(member)
    assert names(client) == {"dgx-a", "dgx-h", "lab-shared"}  # not the red team's node
    assert names(client, tag="dgx") == {"dgx-a", "dgx-h"}
    assert names(client, gpu_model="H100") == {"dgx-h"}
    assert names(client, status="active") == {"dgx-a", "lab-shared"}
    assert names(client, q="epyc") == {"dgx-a"}
    assert names(client, q="127.0.1") == {"lab-shared"}
    assert names(client, tag="dgx", status="maintenance") == {"dgx-h"}
    page = client.get(LIST, {"q": "nothing-like-it"}).content.decode()
    assert "No node matches these filters" in page


@pytest.mark.django_db
def test_it_offers_no_filter_values_of_another_teams_nodes(outsider: Any, nodes: dict[str, Node]) -> None:
    node_upsert(name="red-gpu", address="10.9.9.8", team=outsider.teams.get(), gpu_model="MI300X")
    page = signed_in(outsider).get(LIST).content.decode()
    assert "MI300X" in page and "A100" not in page and "dgx-a" not in page
    assert ">dgx<" not in page  # the tag is only on the blue team's nodes
    response = signed_in(outsider).get(LIST, {"tag": "dgx"})
    assert "Select a valid choice" in response.content.decode()  # as unknown as a tag nobody has
    assert {n.name for n in response.context["nodes"]} == {"lab-shared", "red-gpu"}


@pytest.mark.django_db
def test_it_explains_a_bad_filter_value_instead_of_failing(member: Any, nodes: dict[str, Node]) -> None:
    response = signed_in(member).get(LIST, {"status": "exploded"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()


@pytest.mark.django_db
def test_the_node_list_reads_as_many_queries_for_2_or_20_nodes(
    member: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(member)
    for i in range(2):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}", team=team, tags=["a", "b"], gpu_model="H100")
    with CaptureQueriesContext(connection) as few:
        client.get(LIST)
    for i in range(2, 20):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}", team=team, tags=["a", f"t{i}"], gpu_model=f"G{i}")
    with django_assert_max_num_queries(len(few)):
        assert "n19" in client.get(LIST).content.decode()


@pytest.mark.django_db
def test_it_shows_a_node_with_its_facts_and_404s_another_team(
    member: Any, outsider: Any, nodes: dict[str, Node]
) -> None:
    node = nodes["dgx-a"]
    node.facts = {"kernel": "6.8.0-lab", "home": "/home/lab"}
    node.save(update_fields=["facts"])
    page = signed_in(member).get(reverse("inventory:node-detail", args=[node.pk])).content.decode()
    assert "6.8.0-lab" in page and "blue" in page
    assert "Collect facts</button>" in page  # any member of the team, not only its admins
    assert "Edit in the admin" not in page  # not staff
    assert signed_in(outsider).get(reverse("inventory:node-detail", args=[node.pk])).status_code == 404
    other = reverse("inventory:node-detail", args=[nodes["red-secret"].pk])
    assert signed_in(member).get(other).status_code == 404


@pytest.mark.django_db
def test_a_team_member_collects_the_facts_of_a_team_node(
    member: Any, nodes: dict[str, Node], django_capture_on_commit_callbacks: Any
) -> None:
    node = nodes["dgx-a"]
    client = signed_in(member)
    assert "Collect facts</button>" in client.get(reverse("inventory:node-detail", args=[node.pk])).content.decode()
    with django_capture_on_commit_callbacks() as queued:
        response = client.post(reverse("inventory:node-collect-facts", args=[node.pk]))
    assert response.status_code == 302
    # the task is queued once the request's transaction commits, for this node
    assert [(c.func, c.args) for c in queued] == [(collect_facts, (node.pk,))]
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Collecting the facts of dgx-a: reload this page in a few seconds."
    ]


def staff(django_user_model: Any, name: str, *permissions: str) -> Any:
    user = django_user_model.objects.create_user(name, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="inventory", codename__in=permissions))
    return user


@pytest.mark.django_db
def test_only_staff_who_may_change_nodes_collect_the_facts_of_a_shared_node(
    owner: Any, member: Any, outsider: Any, nodes: dict[str, Node], django_user_model: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:  # fmt: skip
    shared = nodes["lab-shared"]
    page, target = (reverse(f"inventory:{name}", args=[shared.pk]) for name in ("node-detail", "node-collect-facts"))
    viewer = staff(django_user_model, "viewer", "view_node")  # in the admin, but may not change nodes there
    for user in (owner, member, outsider, viewer):
        client = signed_in(user)
        assert "Collect facts</button>" not in client.get(page).content.decode()
        with django_capture_on_commit_callbacks() as queued:
            response = client.post(target)
        assert [str(m) for m in get_messages(response.wsgi_request)] == [
            "Only staff may collect the facts of lab-shared."
        ], user
        assert queued == []
    assert "Edit in the admin" not in signed_in(viewer).get(page).content.decode()
    team_node = reverse("inventory:node-collect-facts", args=[nodes["dgx-a"].pk])
    assert signed_in(outsider).post(team_node).status_code == 404
    ops = signed_in(staff(django_user_model, "ops", "change_node"))
    html = ops.get(page).content.decode()
    assert "Collect facts</button>" in html and "Edit in the admin" in html
    with django_capture_on_commit_callbacks() as queued:
        response = ops.post(target)
    assert "Collecting the facts of lab-shared" in str(list(get_messages(response.wsgi_request))[0])
    assert [(c.func, c.args) for c in queued] == [(collect_facts, (shared.pk,))]
    assert ops.get(target).status_code == 405


@pytest.mark.django_db
def test_it_lists_storage_systems_of_the_users_teams_only(member: Any, outsider: Any, team: Any) -> None:
    storage_upsert(name="blue-nas-with-a-very-long-name-that-must-not-break-the-table", kind="nfs", team=team)
    storage_upsert(name="lab-local", kind="local", export_path="/srv")
    page = signed_in(member).get(reverse("inventory:storage-list")).content.decode()
    assert "blue-nas-with-a-very-long-name" in page and 'class="name-cell"' in page and "lab-local" in page
    page = signed_in(outsider).get(reverse("inventory:storage-list")).content.decode()
    assert "blue-nas" not in page and "lab-local" in page
