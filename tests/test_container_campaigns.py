"""Campaigns that run in containers: every command inside, MPI over the containers' sshd, a key pair per launch."""

from __future__ import annotations

from typing import Any

import pytest

from campaigns import selectors, services
from campaigns.spec import SpecError
from inventory.crypto import decrypt
from inventory.services import node_upsert, storage_upsert

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes() -> None:
    for i in (1, 2):
        node_upsert(name=f"dgx{i}", address=f"10.0.0.{i}", gpu_count=8, ssh_user="bench")
    storage_upsert(name="nas", kind="nfs", data_addresses=["10.1.0.1"], export_path="/export")


def campaign(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "in-docker",
        "kind": "fio",
        "nodes": ["dgx1", "dgx2"],
        "container": {"runtime": "docker", "image": "rackbench/bench-node:latest", "ssh_port": 2222},
        "fixed": {"bs": "1M", "size": "1G"},
        "matrix": {"rw": ["read"]},
    }
    data.update(overrides)
    return data


def test_every_command_runs_inside_the_campaigns_container(nodes: None) -> None:
    created = services.campaign_apply(data=campaign())

    host = selectors.campaign_preview(campaign=created)["shown"][0]["hosts"][0]

    assert host["command"].startswith("cd /home/bench/.rackbench/dgx1/run-ID && docker exec")
    assert f"rackbench-c{created.pk} fio --eta=never" in host["command"]
    assert "-w /home/bench/.rackbench/dgx1/run-ID" in host["command"]


def test_mpi_hops_over_the_containers_sshd(nodes: None) -> None:
    data = campaign(
        name="nccl-in-docker",
        kind="nccl",
        env={"NCCL_DEBUG": "INFO"},
        fixed={"binary": "all_reduce_perf"},
        matrix={"nodes": [2]},
    )
    created = services.campaign_apply(data=data)

    primary, other = selectors.campaign_preview(campaign=created)["shown"][0]["hosts"]

    assert "docker exec" in primary["command"] and "mpirun" in primary["command"]
    assert "-mca plm_rsh_args '-p 2222'" in primary["command"]
    assert "--host 10.0.0.1:8,10.0.0.2:8" in primary["command"]
    assert other["command"] == ""  # its ranks are started by mpirun, inside its container


def test_a_launch_gets_its_own_key_pair_stored_encrypted(nodes: None) -> None:
    launched = services.campaign_launch(campaign=services.campaign_apply(data=campaign()))

    assert launched.ssh_public_key.startswith("ssh-ed25519 ")
    assert "PRIVATE KEY" not in launched.ssh_private_key_encrypted
    assert decrypt(launched.ssh_private_key_encrypted).startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    other = services.campaign_launch(campaign=services.campaign_apply(data=campaign(name="other")))
    assert other.ssh_public_key.split()[1] != launched.ssh_public_key.split()[1]


@pytest.mark.parametrize(
    ("container", "field"),
    [
        ({"runtime": "lxc", "image": "x"}, "container.runtime"),
        ({"runtime": "docker", "image": "bad image; rm -rf /"}, "container.image"),
        ({"runtime": "docker", "image": "x", "ssh_port": 0}, "container.ssh_port"),
        ({"runtime": "docker", "image": "x", "volumes": ["relative:/x"]}, "container.volumes"),
    ],
)
def test_it_refuses_a_bad_container_naming_the_field(nodes: None, container: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=campaign(container=container))
    assert caught.value.field.startswith(field)


def test_bare_metal_needs_no_container(nodes: None) -> None:
    created = services.campaign_apply(data=campaign(container={"runtime": "bare"}))

    assert created.container == {}
    assert selectors.campaign_preview(campaign=created)["shown"][0]["hosts"][0]["command"].count("docker") == 0


def test_a_container_campaign_exports_and_clones_with_its_container(nodes: None) -> None:
    created = services.campaign_apply(data=campaign())

    clone = services.campaign_clone(campaign=created, name="in-docker-again")

    assert clone.container == created.container and clone.container["image"] == "rackbench/bench-node:latest"
