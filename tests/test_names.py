"""Names that become paths: one rule (common.names) for campaigns, nodes and storage systems, and remote paths that
no name can leave."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from campaigns.plan import host_context, host_infos
from campaigns.services import campaign_apply, campaign_launch
from common.errors import FieldError, ParamError
from common.names import name_problem, path_under
from inventory.importers import NodeImportError, nodes_import
from inventory.models import Node
from inventory.services import InventoryError, node_upsert

BAD = ["../../../../../tmp/owned", "a/b", "..", ".hidden", "-rf", "x" * 101, "", "a b", "a\0b"]


@pytest.mark.parametrize("name", BAD)
def test_path_under_refuses_anything_but_one_component(name: str) -> None:
    with pytest.raises(FieldError):
        path_under("/home/lab/.rackbench", name, "run-1")


def test_path_under_keeps_a_good_name_inside_the_root() -> None:
    assert path_under("/home/lab/.rackbench/", "lab1", "run-1-abc") == "/home/lab/.rackbench/lab1/run-1-abc"


@pytest.mark.django_db
@pytest.mark.parametrize("name", BAD[:-1])  # a NUL: the database refuses it first (400, tested in test_security)
def test_a_node_or_storage_name_that_is_not_a_path_component_is_refused_naming_the_field(name: str, owner: Any) -> None:
    api = APIClient()
    api.force_login(owner)
    for url, extra in (("/api/v1/nodes/", {"address": "10.0.0.1"}), ("/api/v1/storage-systems/", {})):
        response = api.post(url, {"name": name, **extra}, format="json")
        assert response.status_code == 400 and "name" in response.json()["extra"], (url, name)
    with pytest.raises(InventoryError) as caught:
        node_upsert(name=name, address="10.0.0.1")
    assert caught.value.field == "name"
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_the_node_import_refuses_a_name_that_is_not_a_path_component() -> None:
    with pytest.raises(NodeImportError) as caught:
        nodes_import(text="name,address\n../../etc/x,10.0.0.1\n", fmt="csv")
    assert caught.value.errors[0][1].startswith("name '../../etc/x'") and not Node.objects.exists()


@pytest.mark.django_db
def test_a_run_never_builds_a_directory_outside_its_root_even_for_a_name_stored_before_the_rule() -> None:
    node = node_upsert(name="n1", address="10.0.0.1")
    spec = {"name": "c", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "size": "1M", "rw": "read"}}
    campaign = campaign_launch(campaign=campaign_apply(data=spec))
    run = campaign.runs.first()
    root = "/home/lab/" + settings.RACKBENCH["REMOTE_ROOT"]
    good = host_context(run, node_name="n1", index=0, root=root, hosts=host_infos([node]))
    assert good.run_dir.startswith(f"{root}/n1/run-") and good.data_dir == f"{root}/data/n1"
    Node.objects.filter(pk=node.pk).update(name="../../../../../tmp/owned")  # the database, not the API
    with pytest.raises(ParamError, match="unsafe remote path"):  # fails the run for good
        host_context(run, node_name="../../../../../tmp/owned", index=0, root=root, hosts=host_infos([node]))


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "required"),
        (None, "required"),
        ("has spaces", "'has spaces' contains a space: only letters, digits, '.', '_' or '-' are allowed"),
        ("a/b", "contains '/'"),
        (".hidden", "'.hidden' starts with '.': a name starts with a letter or digit"),
        ("x" * 101, "is 101 characters long: at most 100"),
        (7, "must be text, not int"),
    ],
)
def test_a_name_error_says_what_is_wrong_with_the_name_given(name: Any, says: str) -> None:
    problem = name_problem(name)
    assert problem is not None and says in problem
    assert name == "" or name is None or "required" not in problem
    assert name_problem("lab-1.a_b") is None
