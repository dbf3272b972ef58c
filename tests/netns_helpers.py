"""The steps lab tests on the netns lab share: shape every node's link to one line rate, degrade one, launch a campaign
and wait for it, and say in full why a run failed (every host's error and the end of its output, untruncated by
line)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from campaigns.models import CampaignStatus
from runners import lab
from tests.conftest import NETNS_LAB_NODES, launch_and_wait

LINE_RATE = "400mbit"
DEGRADED = "120mbit"  # 30 % of the line rate
NODES = [f"lab{i}" for i in range(1, NETNS_LAB_NODES + 1)]
TAIL_LINES = 40


def shape_every_link(lab_dir: Path, *, degraded: str | None = None) -> None:
    """Every node's link at the same line rate (tc tbf), as a fleet of identical NICs would be; ``degraded``: that
    node's link at DEGRADED instead."""
    for name in NODES:
        lab.lab_degrade(name, rate=DEGRADED if name == degraded else LINE_RATE, lab_dir=lab_dir)


def last_lines(text: str, count: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


def failure_report(campaign: Any) -> str:
    """Every run that did not succeed: its parameters, status and whole error, then the last TAIL_LINES lines of
    each host's stderr and stdout, with its command and exit code."""
    parts = [f"campaign {campaign.name}: {campaign.status}"]
    for run in campaign.runs.order_by("sequence"):
        if run.status == "succeeded":
            continue
        parts.append(f"\n=== run #{run.sequence} {run.params} {run.status}\n--- error:\n{run.error}")
        for host in run.hosts.all():
            parts.append(f"--- {host.host} exit {host.exit_code} command: {host.command or '(a rank only)'}")
            parts.append(f"--- {host.host} stderr (last {TAIL_LINES} lines):\n{last_lines(host.stderr)}")
            parts.append(f"--- {host.host} stdout (last {TAIL_LINES} lines):\n{last_lines(host.stdout)}")
    return "\n".join(parts)


def launch_and_succeed(data: dict[str, Any], *, timeout: float) -> Any:
    """Launch the campaign, wait until it has ended and fail with every failed run's full report unless it
    succeeded."""
    campaign = launch_and_wait(data, timeout=timeout)
    assert campaign.status == CampaignStatus.SUCCEEDED, failure_report(campaign)
    return campaign


def assert_two_pass_verdict(campaign: Any, *, degraded: str | None) -> dict[str, Any]:
    """A two_pass campaign on the six nodes (three random pairs) named ``degraded`` and no other: pass 1 suspected
    it and its random partner, pass 2 re-tested both with known-good partners and cleared the partner. Healthy
    (``degraded`` None): one pass, no suspect. Returns the verdict."""
    from analysis import selectors

    (verdict,) = selectors.campaign_localisation(campaign=campaign)
    assert verdict["pairs"] == len(NODES) // 2
    if degraded is None:
        assert campaign.runs.count() == 1  # no pair was low: no second pass
        assert (verdict["suspects"], verdict["bad"]) == ([], []), verdict
        return verdict
    assert campaign.runs.count() == 2  # pass 1, and the re-tests it called for
    assert degraded in verdict["suspects"] and len(verdict["suspects"]) == 2, verdict  # and its random partner
    assert verdict["bad"] == [degraded], verdict
    assert verdict["cleared"] == [n for n in verdict["suspects"] if n != degraded], verdict
    return verdict
