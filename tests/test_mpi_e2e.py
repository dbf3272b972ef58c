"""An MPI benchmark across lab nodes through the whole runner: mpirun from the primary over the nodes' sshd,
the round-robin rank wrapper, every rank's result parsed; and the reachability check naming a dead host."""

from __future__ import annotations

from typing import Any

import pytest

from campaigns.models import CampaignStatus
from inventory.services import node_upsert
from tests.conftest import LAB_PORT, launch_and_wait

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def storage_read(name: str, nodes: list[str], **fixed: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "storage_read",
        "nodes": nodes,
        "storage": "lab-local",
        "cache": {"flush_clients": True, "flush_storage": True},
        "fixed": {
            "mpi_slots": 2,
            "create_files": 8,
            "record_size": "64k",
            "records_per_file": 4,
            "batch_size": 4,
            "duration": 2,
            "subdir": name,
            **fixed,
        },
        "matrix": {"nodes": [1, 2]},
    }


def test_the_storage_read_benchmark_runs_under_mpirun_across_lab_nodes(lab: dict[str, Any], worker: Any) -> None:
    campaign = launch_and_wait(storage_read("mpi-read", ["lab1", "lab2"]))

    assert campaign.status == CampaignStatus.SUCCEEDED, [r.error for r in campaign.runs.all()]
    one, two = campaign.runs.order_by("sequence")
    for run, ranks in ((one, 2), (two, 4)):
        primary = run.hosts.get(host="lab1")
        assert primary.command.count("mpirun") == 1 and f"-p {LAB_PORT}" in primary.command
        assert f"-n {ranks}" in primary.command
        assert run.results.get(name="ranks", host="").value == ranks
        per_rank = run.results.filter(name="read_mb_per_sec", labels__has_key="rank")
        assert per_rank.count() == ranks and all(r.value > 0 for r in per_rank)
        total = run.results.get(name="read_mb_per_sec", host="", labels={}).value
        assert total == pytest.approx(sum(r.value for r in per_rank))
    assert not two.hosts.get(host="lab2").command  # lab2 only hosts ranks; mpirun started them over its sshd


def test_the_reachability_check_names_the_host_mpirun_cannot_reach(lab: dict[str, Any], worker: Any) -> None:
    lab1 = lab["nodes"]["lab1"]
    # lab9 is lab1's sshd under another name: the worker reaches it, but mpirun is told to hop over port 2,
    # where nothing listens, so the check must fail and name lab9.
    node_upsert(
        name="lab9", address=lab1.address, ssh_port=LAB_PORT, ssh_user=lab1.ssh_user, credential=lab1.credential
    )
    data = storage_read("mpi-dead", ["lab1", "lab9"])
    data["matrix"] = {"nodes": [2]}
    data["fixed"]["mpi_ssh_port"] = 2
    campaign = launch_and_wait(data)

    run = campaign.runs.get()
    assert campaign.status == CampaignStatus.FAILED
    assert "MPI reachability check" in run.error and f"cannot reach lab9 ({lab1.address}:2)" in run.error
