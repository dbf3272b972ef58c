"""The proof on a lab with real links: an iperf3 all-pairs campaign, and a two-pass localisation, across six
namespaced nodes name the one node whose link is degraded to 30 % of the others, and no other; on a healthy lab they
name none.

Every node's link is first shaped to the same line rate (tc tbf), as a fleet of identical NICs would be: unshaped,
veth pairs on this shared 2-core machine carry whatever CPU time is left, which says nothing about links."""

from __future__ import annotations

from typing import Any

import pytest

from analysis import fleet, selectors
from campaigns.models import CampaignStatus
from runners import lab
from tests.conftest import NETNS_LAB_NODES, launch_and_wait

pytestmark = [pytest.mark.lab, pytest.mark.worker]

LINE_RATE = "400mbit"
DEGRADED = "120mbit"  # 30 % of the line rate
NODES = [f"lab{i}" for i in range(1, NETNS_LAB_NODES + 1)]


def shape_every_link(lab_dir: Any) -> None:
    for name in NODES:
        lab.lab_degrade(name, rate=LINE_RATE, lab_dir=lab_dir)


def all_pairs(name: str) -> Any:
    campaign = launch_and_wait(
        {
            "name": name,
            "kind": "iperf3",
            "nodes": NODES,
            "cache": {"flush_clients": False},
            "fixed": {"topology": "all_pairs", "duration": 1, "port": 5501},
            "matrix": {"parallel": [1]},
        },
        timeout=180,
    )
    assert campaign.status == CampaignStatus.SUCCEEDED, [r.error for r in campaign.runs.all()]
    return campaign


def test_all_pairs_names_the_node_whose_link_runs_at_30_percent_and_no_other(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    shape_every_link(netns_lab["dir"])
    lab.lab_degrade("lab4", rate=DEGRADED, lab_dir=netns_lab["dir"])

    campaign = all_pairs("all-pairs-degraded")
    matrix = fleet.link_matrix(selectors.campaign_link_flows(campaign=campaign))

    assert len(matrix.cells) == 30  # every ordered pair of six nodes, measured
    assert matrix.outliers == ["lab4"]
    assert matrix.bad_links == []  # its cells are explained by the node
    for sender, receiver in matrix.cells:
        share = matrix.relative(sender, receiver)
        assert share is not None
        if "lab4" in (sender, receiver):
            assert share < 0.45, (sender, receiver, share)  # the node's whole row and column
        else:
            assert share > 0.8, (sender, receiver, share)


def test_all_pairs_on_a_healthy_lab_names_no_node(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"])

    campaign = all_pairs("all-pairs-healthy")
    matrix = fleet.link_matrix(selectors.campaign_link_flows(campaign=campaign))
    view = fleet.fleet_view(selectors.campaign_fleet_samples(campaign=campaign))

    assert len(matrix.cells) == 30
    assert matrix.outliers == [] and matrix.bad_links == []
    assert view.outliers == []


def two_pass(name: str) -> Any:
    campaign = launch_and_wait(
        {
            "name": name,
            "kind": "iperf3",
            "nodes": NODES,
            "cache": {"flush_clients": False},
            # nodes: a run-level parameter beside the plug-in's, kept on the run of pass 2
            "fixed": {"topology": "two_pass", "duration": 1, "port": 5601, "seed": 18, "nodes": len(NODES)},
            "matrix": {"parallel": [1]},
        },
        timeout=180,
    )
    assert campaign.status == CampaignStatus.SUCCEEDED, [r.error for r in campaign.runs.all()]
    return campaign


def test_two_pass_localisation_names_the_degraded_node_and_no_other(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"])
    lab.lab_degrade("lab4", rate=DEGRADED, lab_dir=netns_lab["dir"])

    campaign = two_pass("two-pass-degraded")
    (verdict,) = selectors.campaign_localisation(campaign=campaign)

    assert campaign.runs.count() == 2  # pass 1, and the re-tests it called for
    assert verdict["pairs"] == 3
    assert "lab4" in verdict["suspects"] and len(verdict["suspects"]) == 2  # lab4 and its random partner
    assert verdict["bad"] == ["lab4"]
    assert verdict["cleared"] == [n for n in verdict["suspects"] if n != "lab4"]


def test_two_pass_localisation_on_a_healthy_lab_names_no_node(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"])

    campaign = two_pass("two-pass-healthy")
    (verdict,) = selectors.campaign_localisation(campaign=campaign)

    assert campaign.runs.count() == 1  # no pair was low: no second pass
    assert (verdict["pairs"], verdict["suspects"], verdict["bad"]) == (3, [], [])
