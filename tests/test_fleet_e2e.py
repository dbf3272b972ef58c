"""The proof on a lab with real links: an iperf3 all-pairs campaign, and a two-pass localisation, across six
namespaced nodes name the one node whose link is degraded to 30 % of the others, and no other; on a healthy lab they
name none.

Every node's link is first shaped to the same line rate (tc tbf), as a fleet of identical NICs would be: unshaped,
veth pairs on this shared 2-core machine carry whatever CPU time is left, which says nothing about links."""

from __future__ import annotations

from typing import Any

import pytest

from analysis import fleet, selectors
from tests.netns_helpers import NODES, assert_two_pass_verdict, launch_and_succeed, shape_every_link

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def all_pairs(name: str) -> Any:
    return launch_and_succeed(
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


def test_all_pairs_names_the_node_whose_link_runs_at_30_percent_and_no_other(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    shape_every_link(netns_lab["dir"], degraded="lab4")

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
    return launch_and_succeed(
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


def test_two_pass_localisation_names_the_degraded_node_and_no_other(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"], degraded="lab4")

    assert_two_pass_verdict(two_pass("two-pass-degraded"), degraded="lab4")


def test_two_pass_localisation_on_a_healthy_lab_names_no_node(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"])

    assert_two_pass_verdict(two_pass("two-pass-healthy"), degraded=None)
