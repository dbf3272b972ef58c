"""Per-campaign storage mounts: the plan, the exact commands, and what happens on a lab node."""

from __future__ import annotations

import shlex
from types import SimpleNamespace
from typing import Any

import pytest

from campaigns import services
from campaigns.models import CampaignStatus
from campaigns.spec import SpecError
from inventory.services import node_upsert, storage_upsert
from plugins.benchmarks.base import ParamError
from plugins.mounts import mount_command, plan_mounts, unmount_command, validate_mounts
from tests.conftest import launch_and_wait

NAS = SimpleNamespace(
    name="isilon",
    kind="isilon-powerscale",
    data_addresses=["10.1.0.1", "10.1.0.2", "10.1.0.3"],
    export_path="/ifs/data",
    mount_options="rsize=524288,wsize=524288,nolock",
    admin_address="10.1.0.10",
)


def test_it_spreads_mount_points_round_robin_over_the_data_addresses() -> None:
    first = plan_mounts({"count": 4, "path": "/mnt/isilon"}, storage=NAS, node_index=0)
    second = plan_mounts({"count": 4, "path": "/mnt/isilon"}, storage=NAS, node_index=1)

    assert [p.point for p in first] == [f"/mnt/isilon/{i}" for i in range(4)]
    assert [p.source for p in first] == [
        "10.1.0.1:/ifs/data",
        "10.1.0.2:/ifs/data",
        "10.1.0.3:/ifs/data",
        "10.1.0.1:/ifs/data",
    ]
    assert second[0].source == "10.1.0.2:/ifs/data"  # node 1 starts where node 0 left off
    assert {p.options for p in first} == {NAS.mount_options} and {p.fstype for p in first} == {"nfs"}


def test_it_builds_idempotent_mount_and_unmount_lines() -> None:
    plans = plan_mounts({"count": 2, "path": "/mnt/isilon", "options": "nconnect=8"}, storage=NAS, node_index=0)

    mount = mount_command(plans, "bench")
    unmount = unmount_command(plans, "root")

    assert (
        "mountpoint -q /mnt/isilon/0 || sudo -n mount -t nfs -o nconnect=8 -- 10.1.0.1:/ifs/data /mnt/isilon/0" in mount
    )
    assert "sudo -n mkdir -p -- /mnt/isilon/1" in mount
    assert "if mountpoint -q /mnt/isilon/1; then umount /mnt/isilon/1 || rc=1; fi" in unmount
    for line in (mount, unmount):
        shlex.split(line)  # well-formed shell


def test_a_local_storage_is_bind_mounted() -> None:
    local = SimpleNamespace(kind="local", export_path="/scratch", mount_options="", data_addresses=[])

    (plan,) = plan_mounts({"count": 1, "path": "/mnt/x"}, storage=local, node_index=3)

    assert (plan.fstype, plan.source, plan.point) == ("bind", "/scratch", "/mnt/x/0")
    assert "mount --bind -- /scratch /mnt/x/0" in mount_command([plan], "root")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"count": 0}, "mounts.count"),
        ({"count": 2, "path": "/mnt"}, "mounts.path"),
        ({"count": 2, "path": "/mnt/../etc"}, "mounts.path"),
        ({"count": 2, "path": "/mnt/x; rm -rf /"}, "mounts.path"),
        ({"count": 2, "options": "nolock; reboot"}, "mounts.options"),
        ({"bogus": 1}, "mounts"),
    ],
)
def test_it_refuses_bad_mount_definitions(value: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError) as caught:
        validate_mounts(value, NAS)
    assert caught.value.field == field


@pytest.mark.django_db
def test_a_campaign_with_mounts_needs_a_storage_system() -> None:
    node_upsert(name="n1", address="10.0.0.1")
    data = {"name": "m", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k"}, "matrix": {"rw": ["read"]}}

    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data={**data, "mounts": {"count": 2, "path": "/mnt/nas"}})
    assert caught.value.field == "mounts"

    storage_upsert(name="nas", kind="nfs", data_addresses=["10.1.0.1"], export_path="/export")
    campaign = services.campaign_apply(data={**data, "storage": "nas", "mounts": {"count": 2, "path": "/mnt/nas"}})
    assert campaign.mounts == {"count": 2, "path": "/mnt/nas"}


@pytest.mark.lab
@pytest.mark.worker
def test_a_run_fails_clearly_when_its_node_may_not_mount(lab: dict[str, Any], worker: Any) -> None:
    # The lab user may flush caches through sudo, not mount: the run must fail with sudo's own words.
    data = {
        "name": "mount-denied",
        "kind": "fio",
        "nodes": ["lab1"],
        "storage": "lab-local",
        "mounts": {"count": 2, "path": "/mnt/rackbench-test"},
        "fixed": {"bs": "64k", "size": "4M"},
        "matrix": {"rw": ["read"]},
    }
    campaign = launch_and_wait(data, timeout=60)
    run = campaign.runs.get()
    assert campaign.status == CampaignStatus.FAILED
    assert "mounting the storage failed" in run.error and "sudo" in run.error
