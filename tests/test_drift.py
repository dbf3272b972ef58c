"""The drift gate: a campaign whose nodes' facts differ is refused (or warned about) before launch, naming the node,
the field and both values; on the lab with facts collected over SSH, and on the namespaced lab with a node whose
NIC MTU really differs."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from campaigns.drift import DriftError, campaign_drift_check
from campaigns.models import CampaignStatus
from campaigns.services import campaign_apply, campaign_definition_check, campaign_launch
from campaigns.spec import SpecError
from inventory import drift
from inventory.models import Node
from runners import lab
from tests.conftest import NETNS_LAB_NODES

FACTS: dict[str, Any] = {
    "kernel": "6.8.0-45-generic",
    "driver_version": "550.54.15",
    "gpu_count": 8,
    "nics": [{"name": "eth0", "mtu": 9000, "speed_mbps": 100000, "state": "UP"}],
    "ib_devices": [{"name": "mlx5_0", "fw_ver": "28.39.1002", "ports": [{"port": 1, "state": "PORT_ACTIVE"}]}],
    "mounts": [{"source": "10.0.0.5:/ifs", "target": "/mnt/data", "fstype": "nfs", "options": "rw"}],
}


def facts_with(**changes: Any) -> dict[str, Any]:
    return {**FACTS, **changes}


def values(**nodes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: drift.fact_values(facts) for name, facts in nodes.items()}


# --- the comparison -----------------------------------------------------------------------------------------


def test_it_names_the_node_the_field_and_both_values_against_the_majority() -> None:
    nics = [{"name": "eth0", "mtu": 1500, "speed_mbps": 100000, "state": "UP"}]
    found = drift.compare(values(a=FACTS, b=FACTS, c=facts_with(kernel="5.15.0-91-generic", nics=nics), d=FACTS))

    assert [(d.node, d.field, d.value, d.expected) for d in found] == [
        ("c", "kernel", "5.15.0-91-generic", "6.8.0-45-generic"),
        ("c", "nic.eth0.mtu", 1500, 9000),
    ]
    assert found[0].message == "c: kernel is 5.15.0-91-generic, expected 6.8.0-45-generic (3 of 4 nodes)"


def test_two_nodes_that_differ_are_both_named_with_both_values() -> None:
    found = drift.compare(values(a=FACTS, b=facts_with(driver_version="535.104.05")))

    assert {d.node for d in found} == {"a", "b"}
    assert "a 550.54.15, b 535.104.05" in found[0].message


def test_a_golden_node_and_pinned_values_are_the_reference() -> None:
    golden = drift.fact_values(facts_with(kernel="6.8.0-50-generic"))
    found = drift.compare(values(a=FACTS, b=FACTS), golden=golden, golden_name="gold", expect={"gpu_count": 4})

    assert [(d.node, d.field, d.expected, d.reference) for d in found] == [
        ("a", "gpu_count", 4, "pinned"),
        ("a", "kernel", "6.8.0-50-generic", "golden node gold"),
        ("b", "gpu_count", 4, "pinned"),
        ("b", "kernel", "6.8.0-50-generic", "golden node gold"),
    ]


def test_a_missing_hca_is_drift_and_fields_can_be_chosen_or_ignored() -> None:
    nodes = values(a=FACTS, b=FACTS, c=facts_with(ib_devices=[], kernel="5.15.0"))

    assert {d.field for d in drift.compare(nodes)} == {"kernel", "ib.mlx5_0.fw_ver", "ib.mlx5_0.port.1.state"}
    assert [d.value for d in drift.compare(nodes) if d.field == "ib.mlx5_0.fw_ver"] == [None]
    assert {d.field for d in drift.compare(nodes, fields=["kernel"])} == {"kernel"}
    assert {d.field for d in drift.compare(nodes, ignore=["ib.*"])} == {"kernel"}


def test_a_fleet_that_agrees_has_no_drift() -> None:
    assert drift.compare(values(a=FACTS, b=FACTS, c=FACTS)) == []


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("sometimes", "drift.mode"),
        ({"mode": "refuse", "colour": "red"}, "drift.colour"),
        ({"expect": ["kernel"]}, "drift.expect"),
        ({"expect": {"gpu_count": True}}, "drift.expect.gpu_count"),
        ({"fields": "kernel"}, "drift.fields"),
        ({"max_age": "soon"}, "drift.max_age"),
        ({"golden": 3}, "drift.golden"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_field(setting: Any, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        drift.validate_config(setting)
    assert caught.value.field == field


def test_the_gate_is_off_unless_asked_for() -> None:
    assert drift.validate_config(None) == {}
    assert drift.validate_config("off") == {}
    assert drift.validate_config("warn") == {"mode": "warn"}
    assert drift.validate_config({"max_age": "10m"}) == {"mode": "refuse", "max_age_s": 600.0}


# --- the definition --------------------------------------------------------------------------------------------


def fio(name: str, nodes: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "fio", "nodes": nodes, "fixed": {"bs": "4k", "size": "16M"},
            "matrix": {"rw": ["read"]}, **extra}  # fmt: skip


@pytest.mark.django_db
def test_a_golden_node_that_does_not_exist_is_refused_when_the_campaign_is_defined() -> None:
    Node.objects.create(name="n1", address="198.18.250.1")
    with pytest.raises(Exception) as caught:
        campaign_definition_check(data=fio("golden", ["n1"], drift={"golden": "nope"}))
    assert getattr(caught.value, "field", "") == "drift.golden"


@pytest.mark.django_db
def test_the_setting_is_kept_and_written_back_to_the_campaign_file() -> None:
    from campaigns.selectors import campaign_spec

    Node.objects.create(name="n1", address="198.18.250.1")
    campaign = campaign_apply(data=fio("kept", ["n1"], drift={"mode": "warn", "fields": ["kernel"], "max_age": 60}))
    assert campaign_spec(campaign=campaign)["drift"] == {"mode": "warn", "fields": ["kernel"], "max_age": 60.0}


# --- on the lab ----------------------------------------------------------------------------------------------


@pytest.mark.lab
def test_it_refuses_a_launch_on_a_node_whose_kernel_differs_naming_both(
    lab: dict[str, Any], owner: Any, team: Any
) -> None:
    """Facts are collected over SSH from the real nodes (all alike: they share this machine's kernel), then one
    node's kernel is made to differ in its stored facts, which are fresh enough to be trusted as they are."""
    names = sorted(lab["nodes"])
    campaign = campaign_apply(data=fio("drift-kernel", names, drift={"max_age": 600}), team=team)
    report = campaign_drift_check(campaign=campaign, nodes=list(lab["nodes"].values()), refresh=True)
    assert report is not None and report.clean, report.messages  # collected, and alike
    stored = Node.objects.get(name=names[2]).facts
    real = stored["kernel"]
    faked = {**stored, "kernel": "5.15.0-91-generic"}
    Node.objects.filter(name=names[2]).update(facts=faked, facts_collected_at=timezone.now())

    with pytest.raises(DriftError) as caught:
        campaign_launch(campaign=campaign)

    error = caught.value
    assert error.field == "drift"
    assert f"{names[2]}: kernel is 5.15.0-91-generic, expected {real} (3 of 4 nodes)" in error.message
    assert [(d["node"], d["field"], d["value"], d["expected"]) for d in error.extra["drift"]] == [
        (names[2], "kernel", "5.15.0-91-generic", real)
    ]
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.DRAFT

    client = APIClient()
    client.force_login(owner)
    response = client.post(f"/api/v1/campaigns/{campaign.pk}/launch/")
    assert response.status_code == 400, response.content
    assert response.json()["extra"]["field"] == "drift"
    assert response.json()["extra"]["drift"][0]["node"] == names[2]

    page = client.get(f"/campaigns/{campaign.pk}/preview/").content.decode()
    assert "5.15.0-91-generic" in page and real in page and "Drift gate" in page

    page = client.post(f"/campaigns/{campaign.pk}/launch/", follow=True).content.decode()
    assert f"{names[2]}: kernel is 5.15.0-91-generic, expected {real}" in page


@pytest.mark.lab
def test_a_warning_gate_launches_and_stale_facts_are_collected_again(lab: dict[str, Any], settings: Any) -> None:
    names = sorted(lab["nodes"])
    Node.objects.filter(name__in=names).update(facts={"kernel": "0.0-stale"}, facts_collected_at=None)
    campaign = campaign_apply(data=fio("drift-warn", names, drift="warn"), team=None)

    report = campaign_drift_check(campaign=campaign, nodes=list(Node.objects.filter(name__in=names)), refresh=True)

    assert report is not None and report.clean and report.unreachable == {}
    assert all(n.facts["kernel"] != "0.0-stale" for n in Node.objects.filter(name__in=names))


@pytest.mark.lab
def test_it_refuses_a_launch_on_a_node_whose_nic_mtu_really_differs(netns_lab: dict[str, Any]) -> None:
    """On the namespaced lab every node has its own eth0: one node's MTU is really lowered; the launch collects the
    facts again (they are stale) and names that node, the field and both MTUs."""
    names = [f"lab{i}" for i in range(1, NETNS_LAB_NODES + 1)]
    node = next(n for n in lab.lab_status(lab_dir=netns_lab["dir"]) if n.name == "lab3")
    campaign = campaign_apply(data=fio("drift-mtu", names, drift={"fields": ["kernel", "nic.*"]}), team=None)
    Node.objects.filter(name__in=names).update(facts_collected_at=None)
    mtu = ["ip", "netns", "exec", node.namespace, "ip", "link", "set", "dev", "eth0", "mtu"]
    subprocess.run([*mtu, "1400"], check=True)
    try:
        with pytest.raises(DriftError) as caught:
            campaign_launch(campaign=campaign)
    finally:
        subprocess.run([*mtu, "1500"], check=True)

    assert [(d["node"], d["field"], d["value"], d["expected"]) for d in caught.value.extra["drift"]] == [
        ("lab3", "nic.eth0.mtu", 1400, 1500)
    ]
    assert "lab3: nic.eth0.mtu is 1400, expected 1500 (5 of 6 nodes)" in caught.value.message
