"""NIC x metric measured for real: an iperf3 all-pairs campaign with telemetry on, across the six namespaced lab
nodes, one node's link degraded to 30 %: the fleet view per device names that node's eth0, from the mean rates the
run's telemetry recorded, and no other NIC; loopback is no device of the fleet."""

from __future__ import annotations

from typing import Any

import pytest

from analysis import fleet, selectors
from campaigns.models import CampaignStatus
from tests.conftest import launch_and_wait
from tests.netns_helpers import NODES, shape_every_link

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def test_the_nic_of_the_degraded_node_is_named_from_the_runs_telemetry(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"], degraded="lab4")

    campaign = launch_and_wait(
        {
            "name": "all-pairs-nics",
            "kind": "iperf3",
            "nodes": NODES,
            "cache": {"flush_clients": False},
            "fixed": {"topology": "all_pairs", "duration": 3, "port": 5701},
            "matrix": {"parallel": [1]},
            "telemetry": {"interval": "200ms", "groups": ["net"]},
        },
        timeout=300,
    )
    assert campaign.status == CampaignStatus.SUCCEEDED, [r.error for r in campaign.runs.all()]
    data = selectors.campaign_fleet_data(campaign=campaign)
    (nics,) = fleet.device_views(data.devices, groups=data.groups)

    assert {d.title for d in nics.devices} == {f"{n}/eth0" for n in NODES}  # lo left out
    assert {c.name for c in nics.columns} == {"net.rx_bytes.mean", "net.tx_bytes.mean"}
    assert [o.device.title for o in nics.outliers] == ["lab4/eth0"], [
        (d.title, [round(c.score.ratio or 0, 2) for c in nics.row(d) if c]) for d in nics.devices
    ]
