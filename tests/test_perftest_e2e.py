"""perftest between lab nodes through the whole runner. The lab has no RDMA device and this machine cannot make one
(no rdma_rxe module, no RDMA netlink), so perftest's own programs fail there the way they fail on a node whose HCA is
missing: the run must fail with perftest's message, on the client, and store no number."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from campaigns.models import CampaignStatus
from tests.conftest import launch_and_wait

pytestmark = [
    pytest.mark.lab,
    pytest.mark.worker,
    pytest.mark.skipif(not shutil.which("ib_write_bw"), reason="perftest is not installed (scripts/bootstrap does it)"),
]


def test_a_perftest_pair_without_an_rdma_device_fails_with_perftests_own_message(lab: dict[str, Any], worker: Any):
    campaign = launch_and_wait(
        {
            "name": "perftest-no-hca",
            "kind": "perftest",
            "nodes": ["lab1", "lab2"],
            "cache": {"flush_clients": False},
            "fixed": {"test": "ib_write_bw", "device": "mlx5_0", "size": 65536, "connect_timeout": 5, "timeout": 30},
        }
    )

    assert campaign.status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert "Unable to find the Infiniband/RoCE device" in run.error, run.error
    assert "lab2" in run.error  # the client's peer, named
    hosts = {h.host: h for h in run.hosts.all()}
    assert "rackbench_perftest.py" in hosts["lab1"].command and "rackbench_perftest.py" in hosts["lab2"].command
    assert not run.results.exists()
