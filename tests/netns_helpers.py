"""The steps lab tests on the netns lab share: the environment torch_dist's ranks need there, shape every node's link
to one line rate and degrade one, launch a campaign and wait for it, say in full why a run failed (every host's error
and the end of its output), and judge a two-pass localisation's verdict."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from analysis import selectors
from campaigns import services
from campaigns.models import CampaignStatus
from runners import lab
from tests.conftest import NETNS_LAB_NODES, finished

LINE_RATE = "400mbit"
DEGRADED = "120mbit"  # 30 % of the line rate
NODES = [f"lab{i}" for i in range(1, NETNS_LAB_NODES + 1)]
TAIL_LINES = 40


def torch_path() -> str:
    """Where this interpreter's torch lives, if the lab's login can read it (the nodes' python3 is the same 3.11)."""
    torch = pytest.importorskip("torch")
    site = str(Path(torch.__file__).resolve().parent.parent)
    login = ["su", "-s", "/bin/sh", "rackbench-lab", "-c", f"PYTHONPATH={site} python3 -c 'import torch'"]
    probe = subprocess.run(login, capture_output=True, text=True, cwd="/")
    if os.geteuid() != 0 or probe.returncode != 0:
        pytest.skip(f"the lab's login cannot import torch from {site}: {probe.stderr[-300:]}")
    return site


def lab_env() -> dict[str, str]:
    """The environment of torch_dist's ranks on the netns lab. Every lab node's hostname is this machine's, which
    resolves to loopback: gloo is told the interface, and Open MPI's daemons call mpirun back directly over the
    nodes' link (its routing tree sometimes lost a daemon of four on these identically named hosts)."""
    return {
        "PYTHONPATH": torch_path(),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "eth0",
        "OMPI_MCA_routed": "direct",
        "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
        "OMPI_MCA_oob_tcp_if_include": "eth0",
    }


def shape_every_link(lab_dir: Path, *, degraded: str | None = None) -> None:
    """Every node's link at the same line rate (tc tbf), as a fleet of identical NICs would be; ``degraded``: that
    node's link at DEGRADED instead."""
    for name in NODES:
        lab.lab_degrade(name, rate=DEGRADED if name == degraded else LINE_RATE, lab_dir=lab_dir)


def last_lines(text: str, count: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-count:])


def output_of(host: Any, name: str) -> str:
    """A run host's stdout or stderr: as collected, else (a run still under way) as its job has written it so far.
    The lab's nodes are this machine, so their job directories can be read here."""
    stored = str(getattr(host, name))
    path = Path(host.remote_dir) / name
    if stored or not host.remote_dir or not path.is_file():
        return stored
    return path.read_text(errors="replace")


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
            for name in ("stderr", "stdout"):
                parts.append(f"--- {host.host} {name} (last {TAIL_LINES} lines):\n{last_lines(output_of(host, name))}")
    return "\n".join(parts)


def launch_and_succeed(data: dict[str, Any], *, timeout: float) -> Any:
    """Launch the campaign, wait until it has ended and fail with every failed or unfinished run's full report
    unless it succeeded. The test's own time limit (pytest-timeout) must exceed ``timeout``, or it ends the test
    before anything is reported."""
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))
    try:
        finished(campaign, timeout)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n{failure_report(campaign)}")
    assert campaign.status == CampaignStatus.SUCCEEDED, failure_report(campaign)
    return campaign


def assert_two_pass_verdict(campaign: Any, *, degraded: str | None) -> dict[str, Any]:
    """A two_pass campaign on the six nodes (three random pairs) named ``degraded`` and no other: pass 1 suspected
    it and its random partner, pass 2 re-tested both with known-good partners and cleared the partner. Healthy
    (``degraded`` None): one pass, no suspect. Returns the verdict."""
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
