"""Localisation time against node count on the namespaced lab (issue 18: 16 and 64 nodes).

    PYTHONPATH=. scripts/test -p tests.conftest -m drill -s bench/test_localisation_time.py

Real worker, real sshd nodes each in its own network namespace (needs root), PostgreSQL and Redis, as the suite
uses them. For each node count (RACKBENCH_BENCH_NODES, default "16,64") a lab of its own comes up on port
RACKBENCH_BENCH_PORT (default 3718; its /24 of 198.18.0.0/15 follows from the port), every link is shaped to
LINE_RATE and one node's to 30 % of it, then an iperf3 ``two_pass`` campaign (1 s flows) and, for comparison, an
``all_pairs`` one run on it. Reported: launch -> end of each campaign (what a user waits for), runs, flows, and
who was named. The lab is brought down at the end.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from analysis import fleet, selectors
from runners import lab
from tests.conftest import launch_and_wait

COUNTS = [int(n) for n in os.environ.get("RACKBENCH_BENCH_NODES", "16,64").split(",")]
PORT = int(os.environ.get("RACKBENCH_BENCH_PORT", "3718"))
LINE_RATE, DEGRADED = "50mbit", "15mbit"


def campaign(name: str, nodes: list[str], topology: str) -> Any:
    data = {"name": name, "kind": "iperf3", "nodes": nodes, "cache": {"flush_clients": False}, "timeout": 1800,
            "fixed": {"topology": topology, "duration": 1, "port": 5701}, "matrix": {"parallel": [1]}}  # fmt: skip
    done = launch_and_wait(data, timeout=1800)
    assert done.status == "succeeded", [r.error for r in done.runs.all()]
    return done


def seconds(done: Any) -> float:
    return (done.finished_at - done.launched_at).total_seconds()


@pytest.mark.drill
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("count", COUNTS)
def test_localisation_time(count: int, worker: Any, transactional_db: None) -> None:
    path = Path(tempfile.mkdtemp(prefix="rackbench-bench-netlab-"))
    path.chmod(0o755)
    previous = settings.RACKBENCH
    try:
        started = lab.lab_up(count, port=PORT, lab_dir=path, network=lab.NETNS)
        if started[0].network != lab.NETNS:
            pytest.skip("network namespaces cannot be made here")
        settings.RACKBENCH = {**previous, "LAB_DIR": path}
        call_command("lab", "up", "--nodes", str(count), stdout=io.StringIO(), stderr=io.StringIO())
        nodes = [f"lab{i}" for i in range(1, count + 1)]
        bad = f"lab{count // 2}"
        for name in nodes:
            lab.lab_degrade(name, rate=LINE_RATE, lab_dir=path)
        lab.lab_degrade(bad, rate=DEGRADED, lab_dir=path)

        print(f"\n{count} nodes, links at {LINE_RATE}, {bad} at {DEGRADED}, 1 s flows")
        localised = campaign(f"two-pass-{count}", nodes, "two_pass")
        (verdict,) = selectors.campaign_localisation(campaign=localised)
        print(f"  two_pass : {seconds(localised):6.1f} s, {localised.runs.count()} runs, suspects "
              f"{verdict['suspects']}, bad {verdict['bad']}", flush=True)  # fmt: skip
        every = campaign(f"all-pairs-{count}", nodes, "all_pairs")
        matrix = fleet.link_matrix(selectors.campaign_link_flows(campaign=every))
        print(f"  all_pairs: {seconds(every):6.1f} s, {len(matrix.cells)} flows, outliers {matrix.outliers}")
    finally:
        settings.RACKBENCH = previous
        lab.lab_down(lab_dir=path)
        shutil.rmtree(path, ignore_errors=True)
