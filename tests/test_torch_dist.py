"""rackbench's torch.distributed benchmark (kind torch_dist): its parameters, its mpirun command, its outputs read
by the nccl-tests parser, its pairwise topologies and two-pass localisation, and real runs across 2 and 4 nodes of
the namespaced lab (gloo on CPUs, over mpirun) and a two-pass localisation across its six nodes with one link
degraded."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from plugins import localise
from plugins.benchmarks import torch_dist
from plugins.benchmarks.base import HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark
from tests.conftest import NETNS_LAB_PORT
from tests.netns_helpers import NODES, assert_two_pass_verdict, lab_env, launch_and_succeed, shape_every_link

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


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_a_time_past_a_second_stays_its_own_column_and_is_read_back(bench: Any, op: str) -> None:
    """The program's own table writer, with times from 2 us to 1,131 s: every row is read back with its time (the
    9-wide field once ran into the N/A before it: "N/A1131798.9")."""
    from argparse import Namespace
    from io import StringIO

    from plugins.tools import torch_dist as program

    args = Namespace(op=op, backend="gloo", min_bytes=8, max_bytes=8 << 20, factor=2, warmup=1, iters=2)
    out = StringIO()
    program.table_header(out, args, Namespace(__version__="2.5.1+cpu"), 2, [(0, "n0", 1, "cpu"), (1, "n1", 2, "cpu")])
    times = [2e-6, 0.5, 1.1317989, 1131.7989]
    busbw = []
    for count, seconds in zip([2, 1024, 4096, 1 << 20], times, strict=True):
        row, bw = program.table_row(args, count, seconds, 0, 1.0)
        out.write(row)
        busbw.append(bw)
    program.table_footer(out, busbw)

    assert "N/A1" not in out.getvalue()
    rows = [m for m in bench.parse(out.getvalue()) if m.name == "time_us"]
    assert [m.value for m in rows] == pytest.approx([t * 1e6 for t in times], rel=1e-3, abs=0.1)
    placement = "in-place" if op == "all_reduce" else "out-of-place"
    assert {m.labels["placement"] for m in rows} == {placement}


def test_it_reads_the_ddp_loops_images_per_second(bench: Any) -> None:
    metrics = {m.name: m.value for m in bench.parse((FIXTURES / "ddp-gloo-2ranks.txt").read_text())}
    assert metrics == {"images_per_sec": 67.9, "images_per_sec_per_device": 33.9}


def test_a_run_without_results_is_an_error_naming_what_is_missing(bench: Any) -> None:
    with pytest.raises(Exception, match="no torch_dist result"):
        bench.parse("Traceback (most recent call last):\n  ...\nRuntimeError: Connection refused\n")
    assert "did not finish" in bench.missing([], ["n0"])[0]


# --- pairwise topologies and two-pass localisation ---------------------------------------------------------------


def plan_of(command: Any) -> dict[str, Any]:
    return json.loads(command.files["torch_pairs.json"])


def test_all_pairs_runs_every_pair_in_rounds_under_one_mpirun_with_one_rank_per_node(bench: Any) -> None:
    hosts = tuple(HostInfo(name=f"n{i}", address=f"10.0.0.{i + 1}", slots=8) for i in range(4))
    command = bench.build({"topology": "all_pairs"}, HostContext("n0", 0, "/r", "/d", hosts=hosts))
    argv = command.argv

    assert argv[:3] == ["mpirun", "--preload-files", "torch_dist.py,torch_pairs.json"]
    assert argv[argv.index("-n") + 1] == "4" and argv[argv.index("--host") + 1].endswith("10.0.0.4:1")
    assert argv[-2:] == ["--pairs", "torch_pairs.json"]
    plan = plan_of(command)
    assert plan["names"] == ["n0", "n1", "n2", "n3"]
    every = [(a, b) for a in range(4) for b in range(a + 1, 4)]
    assert sorted(tuple(p) for pairs in plan["rounds"] for p in pairs) == every
    for pairs in plan["rounds"]:  # disjoint pairs in each round
        assert len({n for p in pairs for n in p}) == 2 * len(pairs)


@pytest.mark.parametrize(
    ("topology", "count", "rounds"),
    [
        ("pairs", 4, [[[0, 1], [2, 3]]]),
        ("ring", 4, [[[0, 1], [2, 3]], [[1, 2], [0, 3]]]),
        ("ring", 3, [[[0, 1]], [[1, 2]], [[0, 2]]]),
    ],
)
def test_pairs_and_ring_plan_disjoint_rounds(bench: Any, topology: str, count: int, rounds: list[Any]) -> None:
    assert plan_of(bench.build({"topology": topology}, context(0, count)))["rounds"] == rounds


def test_two_pass_runs_random_pairs_then_pass_twos_partners(bench: Any) -> None:
    first = plan_of(bench.build({"topology": "two_pass", "seed": 3}, context(0, 6)))["rounds"]
    assert [[tuple(p) for p in pairs] for pairs in first] == localise.random_pair_rounds(6, 3)
    params = {"topology": "two_pass", "localise_pass": 2, "partners": "n0:n2,n1:n2", "reference_gbps": 1.5}
    assert plan_of(bench.build(params, context(0, 6)))["rounds"] == [[[0, 2]], [[1, 2]]]  # n2 in one test at once


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"topology": "mesh"}, "topology"),
        ({"topology": "pairs", "op": "ddp"}, "topology"),
        ({"topology": "pairs", "mpi_slots": 8}, "mpi_slots"),
        ({"seed": 3}, "seed"),
        ({"topology": "two_pass", "partners": "n0:n1"}, "partners"),
        ({"topology": "two_pass", "localise_pass": 2}, "partners"),
        ({"topology": "two_pass", "threshold": 2}, "threshold"),
    ],
)
def test_bad_pairwise_parameters_are_refused_naming_the_field(bench: Any, params: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError) as raised:
        bench.validate(params)
    assert raised.value.field == field


def test_pairs_needs_an_even_host_count(bench: Any) -> None:
    with pytest.raises(ParamError, match="even number"):
        bench.build({"topology": "pairs"}, context(0, 3))


def test_each_pairs_table_is_read_and_stored_on_both_of_its_nodes(bench: Any) -> None:
    metrics = bench.parse((FIXTURES / "all_reduce-gloo-pairs-4ranks.txt").read_text(), host="n0")
    flows = torch_dist.pair_flows(metrics)

    assert sorted(flows) == [("n0", "n1"), ("n0", "n2"), ("n1", "n0"), ("n2", "n0"), ("n2", "n3"), ("n3", "n2")]
    assert flows[("n0", "n1")] == flows[("n1", "n0")] > 0
    sizes = {m.labels["size_bytes"] for m in metrics if m.name == "busbw_gbps" and m.host == "n3"}
    assert sizes == {65536, 262144, 1048576}
    assert {m.labels["round"] for m in metrics if m.host == "n0"} == {0, 1}
    total = {m.name: m.value for m in bench.aggregate(metrics)}
    assert total["ranks"] == 2 and total["wrong"] == 0
    assert total["busbw_max_gbps"] == statistics.median([flows[("n0", "n1")], flows[("n0", "n2")], flows[("n2", "n3")]])
    assert bench.missing([*metrics, *bench.aggregate(metrics)], ["n0"]) == []


def test_a_pairwise_run_that_ended_early_is_an_error() -> None:
    text = (FIXTURES / "all_reduce-gloo-pairs-4ranks.txt").read_text()
    with pytest.raises(ParseError, match="before every pair"):
        get_benchmark("torch_dist").parse(text[: text.index("#rackbench-pairs")], host="n0")


def pair_metrics(pairs: list[tuple[str, str]], slow: set[str]) -> list[Metric]:
    return [
        Metric("busbw_max_gbps", 0.3 if slow & {a, b} else 1.0, "GB/s", host=node, labels={"peer": peer, "round": 0})
        for a, b in pairs
        for node, peer in ((a, b), (b, a))
    ]


def test_two_pass_follows_a_low_pair_with_known_good_partners_and_judges_only_its_node(bench: Any) -> None:
    params = {"topology": "two_pass", "iters": 2}
    first = pair_metrics([("n0", "n1"), ("n2", "n3"), ("n4", "n5")], slow={"n3"})

    second = bench.follow_up(params, first)

    assert second["localise_pass"] == 2 and second["partners"] == "n2:n0,n3:n1" and second["reference_gbps"] == 1.0
    plan = bench.second_pass_of(second)
    assert plan == localise.SecondPass(["n2", "n3"], ["n0", "n1"], [("n2", "n0"), ("n3", "n1")], 1.0)
    verdict = localise.judge(plan, bench.pair_flows(pair_metrics(plan.partners, slow={"n3"})), threshold=0.7)
    assert (verdict.bad, verdict.cleared) == (["n3"], ["n2"])
    assert bench.follow_up(second, first) is None  # pass 2 asks for nothing more
    assert bench.follow_up(params, pair_metrics([("n0", "n1"), ("n2", "n3")], slow=set())) is None


# --- for real, across lab nodes -----------------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
@pytest.mark.timeout(420)  # past the campaign's wait, so that a run that does not end is reported
def test_collectives_and_ddp_run_across_2_and_4_lab_nodes_and_store_busbw(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    campaign = launch_and_succeed(
        {
            "name": "torch-dist-lab",
            "kind": "torch_dist",
            "nodes": ["lab1", "lab2", "lab3", "lab4"],
            "cache": {"flush_clients": False},
            "env": lab_env(),
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


TWO_PASS_WAIT = 400  # s: two passes of three pairs each, seconds per pair


def two_pass(name: str) -> Any:
    return launch_and_succeed(
        {
            "name": name,
            "kind": "torch_dist",
            "nodes": NODES,
            "cache": {"flush_clients": False},
            "env": lab_env(),
            # Messages well past the links' token bucket (200 KB at the line rate), few of them: seconds per pair.
            "fixed": {
                "topology": "two_pass",
                "seed": 18,
                "nodes": len(NODES),
                "min_bytes": "1M",
                "max_bytes": "4M",
                "factor": 4,
                "warmup": 1,
                "iters": 3,
                "port": NETNS_LAB_PORT + 27100,
            },
            "matrix": {"op": ["all_reduce"]},
        },
        timeout=TWO_PASS_WAIT,
    )


@pytest.mark.lab
@pytest.mark.worker
@pytest.mark.timeout(600)  # past two_pass's wait (TWO_PASS_WAIT)
def test_two_pass_on_six_lab_nodes_names_the_node_whose_link_runs_at_30_percent_and_no_other(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    shape_every_link(netns_lab["dir"], degraded="lab4")

    campaign = two_pass("torch-dist-two-pass-degraded")
    assert_two_pass_verdict(campaign, degraded="lab4")
    first = campaign.runs.order_by("sequence").first()
    pairs = first.results.filter(name="busbw_max_gbps", labels__has_key="peer")
    assert pairs.count() == 6  # three pairs, each on both of its nodes
    assert all(r.labels["peer"] != r.host for r in pairs)


@pytest.mark.lab
@pytest.mark.worker
@pytest.mark.timeout(600)  # past two_pass's wait (TWO_PASS_WAIT)
def test_two_pass_on_a_healthy_six_node_lab_names_no_node(netns_lab: dict[str, Any], worker: Any) -> None:
    shape_every_link(netns_lab["dir"])

    assert_two_pass_verdict(two_pass("torch-dist-two-pass-healthy"), degraded=None)
