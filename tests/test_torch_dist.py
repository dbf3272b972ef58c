"""rackbench's torch.distributed benchmark (kind torch_dist): its parameters, its mpirun command, its outputs read
by the nccl-tests parser, and real runs across 2 and 4 nodes of the namespaced lab (gloo on CPUs, over mpirun)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from campaigns.models import CampaignStatus
from plugins.benchmarks.base import HostContext, HostInfo, ParamError, get_benchmark
from tests.conftest import NETNS_LAB_PORT, launch_and_wait

FIXTURES = Path(__file__).parent / "fixtures" / "torch_dist"


@pytest.fixture
def bench() -> Any:
    return get_benchmark("torch_dist")


def context(index: int, count: int = 2) -> HostContext:
    hosts = tuple(HostInfo(name=f"n{i}", address=f"10.0.0.{i + 1}", ssh_port=2222) for i in range(count))
    return HostContext(node=hosts[index].name, index=index, run_dir="/r", data_dir="/d", hosts=hosts)


def test_it_runs_the_program_under_mpirun_from_the_first_host_with_rank_0_listening_there(bench: Any) -> None:
    command = bench.build({"op": "all_reduce", "max_bytes": "1M", "iters": 5}, context(0))
    argv = command.argv

    assert argv[:3] == ["mpirun", "--preload-files", "torch_dist.py"]
    assert argv[argv.index("--host") + 1] == "10.0.0.1:1,10.0.0.2:1"
    program = argv[argv.index("-u") + 1 :]
    assert program[0] == "torch_dist.py" and program[program.index("--master") + 1] == "10.0.0.1"
    assert program[program.index("--max-bytes") + 1] == str(1024**2) and program[program.index("--iters") + 1] == "5"
    assert "def all_reduce(" in command.files["torch_dist.py"]
    assert bench.build({}, context(1)) is None  # the other host only runs ranks


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"op": "broadcast"}, "op"),
        ({"backend": "mpi"}, "backend"),
        ({"max_bytes": "4M; rm -rf /"}, "max_bytes"),
        ({"min_bytes": "8M", "max_bytes": "1M"}, "min_bytes"),
        ({"iters": 0}, "iters"),
        ({"port": 80}, "port"),
        ({"python": "python3 -c evil"}, "python"),
        ({"python": "/usr/../bin/python3"}, "python"),
        ({"colour": "blue"}, "colour"),
        ({"mpi_btl": "tcp;x"}, "mpi_btl"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(bench: Any, params: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError) as raised:
        bench.validate(params)
    assert raised.value.field == field


def test_the_nccl_tests_parser_reads_its_collective_table(bench: Any) -> None:
    metrics = bench.parse((FIXTURES / "all_gather-gloo-2ranks.txt").read_text())
    run = {m.name: m.value for m in metrics if not m.labels}
    rows = [m for m in metrics if m.name == "busbw_gbps"]

    assert run["ranks"] == 2 and run["wrong"] == 0 and run["busbw_avg_gbps"] > 0
    assert [m.labels["size_bytes"] for m in rows] == [8, 128, 2048, 32768, 524288]
    assert {m.labels["placement"] for m in rows} == {"out-of-place"}  # all_gather: the in-place columns are N/A
    assert bench.missing(metrics, ["n0"]) == [] and bench.check({}, metrics, {}) == []


def test_it_reads_the_ddp_loops_images_per_second(bench: Any) -> None:
    metrics = {m.name: m.value for m in bench.parse((FIXTURES / "ddp-gloo-2ranks.txt").read_text())}
    assert metrics == {"images_per_sec": 67.9, "images_per_sec_per_device": 33.9}


def test_a_run_without_results_is_an_error_naming_what_is_missing(bench: Any) -> None:
    with pytest.raises(Exception, match="no torch_dist result"):
        bench.parse("Traceback (most recent call last):\n  ...\nRuntimeError: Connection refused\n")
    assert "did not finish" in bench.missing([], ["n0"])[0]


# --- for real, across lab nodes -----------------------------------------------------------------------------------


def torch_path() -> str:
    """Where this interpreter's torch lives, if the lab's login can read it (the nodes' python3 is the same 3.11)."""
    torch = pytest.importorskip("torch")
    site = str(Path(torch.__file__).resolve().parent.parent)
    login = ["su", "-s", "/bin/sh", "rackbench-lab", "-c", f"PYTHONPATH={site} python3 -c 'import torch'"]
    probe = subprocess.run(login, capture_output=True, text=True, cwd="/")
    if os.geteuid() != 0 or probe.returncode != 0:
        pytest.skip(f"the lab's login cannot import torch from {site}: {probe.stderr[-300:]}")
    return site


@pytest.mark.lab
@pytest.mark.worker
def test_collectives_and_ddp_run_across_2_and_4_lab_nodes_and_store_busbw(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    campaign = launch_and_wait(
        {
            "name": "torch-dist-lab",
            "kind": "torch_dist",
            "nodes": ["lab1", "lab2", "lab3", "lab4"],
            "cache": {"flush_clients": False},
            # Every lab node's hostname is this machine's, which resolves to loopback: gloo is told the interface,
            # and Open MPI's daemons call mpirun back directly over the nodes' link (its routing tree sometimes
            # lost a daemon of four on these identically named hosts).
            "env": {
                "PYTHONPATH": torch_path(),
                "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "eth0",
                "OMPI_MCA_routed": "direct",
                "OMPI_MCA_plm_rsh_no_tree_spawn": "1",
                "OMPI_MCA_oob_tcp_if_include": "eth0",
            },
            "fixed": {
                "max_bytes": "256K",
                "factor": 8,
                "warmup": 1,
                "iters": 3,
                "steps": 3,
                "batch_size": 8,
                "port": NETNS_LAB_PORT + 27000,
            },  # fmt: skip
            "matrix": {"nodes": [2, 4], "op": ["all_reduce", "ddp"]},
        },
        timeout=300,
    )

    assert campaign.status == CampaignStatus.SUCCEEDED, [
        (r.params, r.error, [h.stderr[-2000:] for h in r.hosts.all()]) for r in campaign.runs.all()
    ]
    for run in campaign.runs.all():
        ranks = run.params["nodes"]
        command = run.hosts.get(host="lab1").command
        assert command.startswith("cd ") and f"mpirun --preload-files torch_dist.py -n {ranks}" in command
        if run.params["op"] == "all_reduce":
            total = {r.name: r.value for r in run.results.filter(host="", labels={})}
            assert total["ranks"] == ranks and total["wrong"] == 0 and total["busbw_avg_gbps"] > 0
            busbw = run.results.filter(name="busbw_gbps", labels__placement="in-place")
            first = max(8, 4 * ranks)  # at least one float per rank
            sizes = [first * 8**i for i in range(7) if first * 8**i <= 256 * 1024]
            assert sorted(r.labels["size_bytes"] for r in busbw) == sizes
            assert busbw.order_by("-value").first().value > 0
        else:
            assert run.results.get(name="images_per_sec", host="").value > 0
