"""Pairwise plans and two-pass localisation for nccl-tests and perftest (plugins/localise.py's Localiser, shared
with iperf3 and torch_dist): the commands each topology builds per host and round, pass 2's partners from a pass 1
whose outputs are real nccl-tests and perftest outputs (fixtures/nccl, fixtures/perftest) passed through the
plug-ins' own helpers and parsers, and the direction a latency is judged in.

No GPU or RDMA device is needed: the helpers run here with ``cat`` of a real output standing in for each pair's
launch (the launch's command line is checked on its own), so what is tested is the plan, the helper's rounds and the
parsing, never a measurement."""

from __future__ import annotations

import csv
import io
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from analysis import selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from plugins import localise
from plugins.benchmarks import nccl as nccl_module
from plugins.benchmarks import perftest as perftest_module
from plugins.benchmarks.base import HostCommand, HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark

FIXTURES = Path(__file__).parent / "fixtures"
# Two real 2-node, 16-GPU all_reduce_perf outputs: an H100 pair (busbw up to 338.82 GB/s) and a p4d pair over EFA
# (43.81 GB/s), as a healthy pair and a pair with a bad node.
NCCL_GOOD = FIXTURES / "nccl" / "a3mega-h100-2node-16gpu-allreduce.txt"
NCCL_SLOW = FIXTURES / "nccl" / "aws-efa-eks-p4d-2node-tag-output-gdrdma.txt"
# Real perftest client outputs: ib_write_bw at 392.34 Gb/s and ib_send_bw (UD) at 51.76 Gbit/s at its largest size;
# ib_send_lat with a typical latency of 1.27 us and 1.67 us at 2 bytes.
BW_GOOD = FIXTURES / "perftest" / "doca-write-bw-gbits.txt"
BW_SLOW = FIXTURES / "perftest" / "ud-send-bw-all-mb.txt"
LAT_GOOD = FIXTURES / "perftest" / "doca-send-lat.txt"
LAT_SLOW = FIXTURES / "perftest" / "ud-send-lat-all.txt"
CAT = shutil.which("cat") or "/bin/cat"


def hosts(count: int, slots: int = 1) -> tuple[HostInfo, ...]:
    return tuple(HostInfo(name=f"n{i}", address=f"10.0.0.{i + 1}", slots=slots) for i in range(count))


def context(index: int, run_hosts: tuple[HostInfo, ...]) -> HostContext:
    name = run_hosts[index].name
    return HostContext(node=name, index=index, run_dir=f"/r/{name}", data_dir="/d", hosts=run_hosts,
                       env={"NCCL_SOCKET_IFNAME": "eth0"})  # fmt: skip


def run_helper(tmp_path: Path, command: HostCommand, plan_name: str, plan: dict[str, Any]) -> str:
    """The helper of ``command`` run here on ``plan`` (the built plan, with stand-in argv); its stdout."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name, content in command.files.items():
        (tmp_path / name).write_text(content)
    (tmp_path / plan_name).write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, *command.argv[1:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return done.stdout


# --- localise: the direction of a latency -------------------------------------------------------------------------


def test_a_latency_pair_is_low_when_its_latency_is_high_and_its_worse_direction_is_the_higher_one() -> None:
    flows = {("n0", "n1"): 1.0e-6, ("n1", "n0"): 1.1e-6, ("n2", "n3"): 1.0e-6, ("n3", "n2"): 3.0e-6,
             ("n4", "n5"): 1.2e-6, ("n5", "n4"): 1.0e-6}  # fmt: skip
    assert localise.pair_values(flows, higher_is_better=False)[("n2", "n3")] == 3.0e-6

    second = localise.plan_second_pass(flows, threshold=0.7, higher_is_better=False)

    assert second is not None and second.suspects == ["n2", "n3"] and not second.higher_is_better
    assert second.reference == pytest.approx(1.15e-6)  # the median good pair's worse direction
    retest = {("n2", "n0"): 1.1e-6, ("n0", "n2"): 1.0e-6, ("n3", "n1"): 2.9e-6, ("n1", "n3"): 3.1e-6}
    verdict = localise.judge(second, retest, threshold=0.7)
    assert (verdict.bad, verdict.cleared) == (["n3"], ["n2"])
    # Judged the other way round, the fast pairs would be the suspects: the direction is not a detail.
    wrong = localise.plan_second_pass(flows, threshold=0.7)
    assert wrong is None or "n3" not in wrong.suspects


# --- nccl-tests: the commands of each topology ----------------------------------------------------------------


@pytest.fixture
def nccl() -> Any:
    return get_benchmark("nccl")


def nccl_plan(command: HostCommand) -> dict[str, Any]:
    assert command.argv == ["python3", "rackbench_pairs.py", "pairs.json"] and not command.service
    assert "def run_round(" in command.files["rackbench_pairs.py"]
    return json.loads(command.files["pairs.json"])


def launch_hosts(launch: dict[str, Any]) -> tuple[str, str]:
    argv = launch["argv"]
    return argv[argv.index("--host") + 1], argv[argv.index("-n") + 1]


@pytest.mark.parametrize(
    ("params", "count", "rounds"),
    [
        ({"topology": "pairs"}, 4, [[["n0", "n1"], ["n2", "n3"]]]),
        ({"topology": "ring"}, 3, [[["n0", "n1"]], [["n1", "n2"]], [["n0", "n2"]]]),
        ({"topology": "all_pairs"}, 4, [[["n0", "n3"], ["n1", "n2"]], [["n0", "n2"], ["n1", "n3"]],
                                        [["n0", "n1"], ["n2", "n3"]]]),
        ({"topology": "two_pass", "localise_pass": 2, "partners": "n1:n4,n3:n4", "reference_gbps": 300},
         6, [[["n1", "n4"]], [["n3", "n4"]]]),
    ],
)  # fmt: skip
def test_nccl_pairwise_runs_one_2_node_mpirun_per_pair_with_every_gpu_of_both(
    nccl: Any, params: dict[str, Any], count: int, rounds: list[Any]
) -> None:
    run_hosts = hosts(count, slots=8)
    command = nccl.build({**params, "max_bytes": "1G", "iters": 20}, context(0, run_hosts))
    plan = nccl_plan(command)

    assert [[launch["nodes"] for launch in launches] for launches in plan["rounds"]] == rounds
    assert plan["timeout"] == 1800
    address = {h.name: h.address for h in run_hosts}
    for launches in plan["rounds"]:
        for launch in launches:
            a, b = launch["nodes"]
            assert launch_hosts(launch) == (f"{address[a]}:8,{address[b]}:8", "16")
            argv = launch["argv"]
            assert argv[0] == "mpirun" and "NCCL_SOCKET_IFNAME=eth0" in argv
            rank = argv[argv.index("/opt/nccl-tests/build/all_reduce_perf") :]
            assert rank[rank.index("-e") + 1] == str(1024**3) and rank[rank.index("-n") + 1] == "20"
    assert all(nccl.build(params, context(i, run_hosts)) is None for i in range(1, count))  # mpirun hops there


def test_nccl_two_pass_pass_one_is_the_seeded_random_pairing(nccl: Any) -> None:
    plan = nccl_plan(nccl.build({"topology": "two_pass", "seed": 5, "gpus_per_rank": 8}, context(0, hosts(7, 8))))
    expected = [[[f"n{a}", f"n{b}"] for a, b in pairs] for pairs in localise.random_pair_rounds(7, 5)]
    assert [[launch["nodes"] for launch in launches] for launches in plan["rounds"]] == expected
    assert len(plan["rounds"]) == 2  # seven nodes: the one left over is paired again in a second round
    launch = plan["rounds"][0][0]
    assert launch_hosts(launch)[1] == "2" and launch["argv"][launch["argv"].index("-g") + 1] == "8"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"topology": "mesh"}, "topology"),
        ({"pair_timeout": 60}, "pair_timeout"),
        ({"topology": "pairs", "pair_timeout": 5}, "pair_timeout"),
        ({"topology": "all_pairs", "seed": 3}, "seed"),
        ({"topology": "two_pass", "threshold": 1.5}, "threshold"),
        ({"topology": "two_pass", "partners": "n0:n1"}, "partners"),
        ({"topology": "two_pass", "reference_gbps": 10}, "reference_gbps"),
        ({"topology": "two_pass", "localise_pass": 2}, "partners"),
        ({"topology": "two_pass", "localise_pass": 2, "partners": "n0", "reference_gbps": 1}, "partners"),
    ],
)
def test_nccl_bad_pairwise_parameters_are_refused_naming_the_field(
    nccl: Any, params: dict[str, Any], field: str
) -> None:
    with pytest.raises(ParamError) as raised:
        nccl.validate(params)
    assert raised.value.field == field


def test_nccl_pass_two_naming_a_host_outside_the_run_and_pairs_of_an_odd_count_are_refused(nccl: Any) -> None:
    params = {"topology": "two_pass", "localise_pass": 2, "partners": "n1:n9", "reference_gbps": 1}
    with pytest.raises(ParamError, match="n9"):
        nccl.build(params, context(0, hosts(4)))
    with pytest.raises(ParamError, match="even number"):
        nccl.build({"topology": "pairs"}, context(0, hosts(3)))


# --- nccl-tests: the helper's rounds, and two_pass through the real parser -----------------------------------


def test_the_pairs_helper_runs_a_rounds_launches_at_once_and_the_rounds_one_after_another(nccl: Any, tmp_path: Path):
    command = nccl.build({"topology": "all_pairs"}, context(0, hosts(4)))
    plan = nccl_plan(command)
    clock = "import time; a = time.time(); time.sleep(1); print(a, time.time())"
    for launches in plan["rounds"]:
        for launch in launches:
            launch["argv"] = [sys.executable, "-c", clock]
    out = run_helper(tmp_path, command, "pairs.json", plan)

    sections = nccl_module.header_sections(out, nccl_module.PAIR_PREFIX)
    assert out.rstrip().endswith('#rackbench-pairs {"pairs": 6}')
    spans: dict[int, list[tuple[float, float]]] = {}
    for header, body in sections:
        assert header["exit_code"] == 0 and header["stderr"] == ""
        start, end = (float(x) for x in body.split("#rackbench-pairs")[0].split())
        spans.setdefault(header["round"], []).append((start, end))
    assert sorted(spans) == [0, 1, 2] and all(len(found) == 2 for found in spans.values())
    for number, found in spans.items():
        assert max(s for s, _ in found) < min(e for _, e in found)  # both pairs of the round at once
        if number:
            assert min(s for s, _ in found) >= max(e for _, e in spans[number - 1])  # after the previous round


def nccl_pass(nccl: Any, tmp_path: Path, params: dict[str, Any], run_hosts: tuple[HostInfo, ...], bad: str):
    """One pass: the built plan, each launch replaced by ``cat`` of a real 2-node output (the slow one where the bad
    node takes part), the helper run, its output parsed as the runner parses it."""
    command = nccl.build(params, context(0, run_hosts))
    plan = nccl_plan(command)
    for launches in plan["rounds"]:
        for launch in launches:
            launch["argv"] = [CAT, str(NCCL_SLOW if bad in launch["nodes"] else NCCL_GOOD)]
    metrics = nccl.parse(run_helper(tmp_path, command, "pairs.json", plan), host="n0")
    return metrics + nccl.aggregate(metrics)


def test_nccl_two_pass_re_tests_pass_ones_low_pair_with_good_partners_and_names_only_the_bad_node(
    nccl: Any, tmp_path: Path
) -> None:
    run_hosts, params = hosts(6, slots=8), {"topology": "two_pass", "seed": 11}
    first = nccl_pass(nccl, tmp_path / "one", params, run_hosts, bad="n3")

    assert nccl.missing(first, ["n0"]) == [] and nccl.check(params, first, {}) == []
    flows = nccl.pair_flows(first)
    assert len(flows) == 6 and sorted(set(flows.values())) == [43.81, 338.82]  # both directions of 3 pairs
    total = {m.name: m.value for m in first if m.host == "" and not m.labels}
    assert total["busbw_max_gbps"] == 338.82 and total["ranks"] == 16 and total["wrong"] == 0
    partner = next(b for a, b in flows if a == "n3")
    second = nccl.follow_up(params, first)

    assert second is not None and second["localise_pass"] == 2 and second["reference_gbps"] == 338.82
    plan = nccl.second_pass_of(second)
    assert plan is not None and sorted(plan.suspects) == sorted(["n3", partner])
    assert not {b for _, b in plan.partners} & {"n3", partner}  # re-tested with nodes of the good pairs
    retest = nccl_pass(nccl, tmp_path / "two", second, run_hosts, bad="n3")
    verdict = localise.judge(plan, nccl.pair_flows(retest), threshold=second.get("threshold", 0.7))
    assert (verdict.bad, verdict.cleared, verdict.untested) == (["n3"], [partner], [])
    assert nccl.follow_up(second, retest) is None  # pass 2 asks for nothing more
    assert nccl.follow_up(params, nccl_pass(nccl, tmp_path / "healthy", params, run_hosts, bad="none")) is None


def test_a_pair_whose_launch_failed_is_a_parse_error_naming_the_pair_and_its_status(nccl: Any, tmp_path: Path):
    command = nccl.build({"topology": "pairs"}, context(0, hosts(4)))
    plan = nccl_plan(command)
    plan["rounds"][0][0]["argv"] = [CAT, str(NCCL_GOOD)]
    failed = FIXTURES / "nccl" / "issue-nccl-tests-322-failure-mid-table.txt"
    plan["rounds"][0][1]["argv"] = [sys.executable, "-c", f"print(open({str(failed)!r}).read()); raise SystemExit(3)"]
    out = run_helper(tmp_path, command, "pairs.json", plan)

    with pytest.raises(ParseError) as raised:
        nccl.parse(out, host="n0")
    assert "pair n2-n3" in str(raised.value) and "exit status 3" in str(raised.value)
    assert "Test NCCL failure" in str(raised.value)
    with pytest.raises(ParseError, match="before every pair"):
        nccl.parse(out[: out.index("#rackbench-pairs")], host="n0")


# --- perftest: the commands of two_pass ---------------------------------------------------------------------------


@pytest.fixture
def perftest() -> Any:
    return get_benchmark("perftest")


def perftest_steps(perftest: Any, params: dict[str, Any], count: int) -> list[list[dict[str, Any]]]:
    found = []
    for index in range(count):
        command = perftest.build(params, context(index, hosts(count)))
        found.append(json.loads(command.files["steps.json"])["steps"] if command else [])
    return found


def test_perftest_two_pass_measures_both_directions_of_pass_ones_random_pairs_step_by_step(perftest: Any) -> None:
    params = {"topology": "two_pass", "seed": 4, "test": "ib_write_bw", "port": 20000, "device": "mlx5_0"}
    plans = perftest_steps(perftest, params, 6)
    (pairs,) = localise.random_pair_rounds(6, 4)

    for a, b in pairs:
        for me, other in ((a, b), (b, a)):
            steps = plans[me]
            assert [(s["step"], s["round"], s["role"], s["peer"]) for s in steps] == [
                (0, 0, "client" if me == a else "server", f"n{other}"),
                (1, 0, "server" if me == a else "client", f"n{other}"),
            ]
            for s in steps:
                argv = s["argv"]
                assert argv[:3] == ["ib_write_bw", "-d", "mlx5_0"] and argv[argv.index("-p") + 1] == str(
                    20000 + s["step"]
                )
                assert (argv[-1] == f"10.0.0.{other + 1}") == (s["role"] == "client")


def test_perftest_pass_two_runs_each_suspect_with_its_partner_and_nothing_on_other_hosts(perftest: Any) -> None:
    params = {"topology": "two_pass", "localise_pass": 2, "partners": "n1:n4,n3:n4", "reference": 3.9e11}
    plans = perftest_steps(perftest, params, 6)

    assert plans[0] == plans[2] == plans[5] == []
    assert [(s["step"], s["role"], s["peer"]) for s in plans[4]] == [
        (0, "server", "n1"), (1, "client", "n1"), (2, "server", "n3"), (3, "client", "n3"),
    ]  # fmt: skip
    assert [(s["step"], s["role"]) for s in plans[3]] == [(2, "client"), (3, "server")]  # n4 is in one test at once


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"seed": 3}, "seed"),
        ({"topology": "ring", "threshold": 0.5}, "threshold"),
        ({"topology": "two_pass", "reference": 1e9}, "reference"),
        ({"topology": "two_pass", "localise_pass": 2, "reference": 1e9}, "partners"),
        ({"topology": "two_pass", "localise_pass": 3}, "localise_pass"),
        ({"topology": "two_pass", "reference_bps": 1e9}, "reference_bps"),  # perftest's is unit-neutral
    ],
)
def test_perftest_bad_localisation_parameters_are_refused_naming_the_field(
    perftest: Any, params: dict[str, Any], field: str
) -> None:
    with pytest.raises(ParamError) as raised:
        perftest.validate(params)
    assert raised.value.field == field


# --- perftest: two_pass through the real helper and parser, bandwidth and latency ---------------------------------


def perftest_pass(
    perftest: Any, tmp_path: Path, params: dict[str, Any], count: int, bad: str, good: Path, slow: Path
) -> list[Metric]:
    """Every host's helper run on its built steps, each client step ``cat`` of a real perftest client output (the
    slow one where the bad node takes part) and each server step ``true``; their outputs parsed per host."""
    metrics: list[Metric] = []
    run_hosts = hosts(count)
    for index in range(count):
        command = perftest.build(params, context(index, run_hosts))
        if command is None:
            continue
        plan = json.loads(command.files["steps.json"])
        for step in plan["steps"]:
            me, peer = f"n{index}", step["peer"]
            source = slow if bad in (me, peer) else good
            step["argv"] = [CAT, str(source)] if step["role"] == "client" else [sys.executable, "-c", "pass"]
        out = run_helper(tmp_path / f"n{index}", command, "steps.json", plan)
        metrics += perftest.parse(out, host=f"n{index}")
    return metrics + perftest.aggregate(metrics)


@pytest.mark.parametrize(
    ("test", "threshold", "good", "slow", "reference"),
    [
        ("ib_write_bw", 0.7, BW_GOOD, BW_SLOW, 392.34e9),
        ("ib_send_lat", 0.8, LAT_GOOD, LAT_SLOW, 1.27e-6),
    ],
)
def test_perftest_two_pass_names_the_bad_node_for_bandwidth_and_for_latency(
    perftest: Any, tmp_path: Path, test: str, threshold: float, good: Path, slow: Path, reference: float
) -> None:
    params = {"topology": "two_pass", "seed": 2, "test": test, "threshold": threshold}
    first = perftest_pass(perftest, tmp_path / "one", params, 6, "n5", good, slow)

    flows = perftest.pair_flows(first)
    assert len(flows) == 6 and all(f"n{i}" in {a for a, _ in flows} for i in range(6))
    second = perftest.follow_up(params, first)
    assert second is not None and second["reference"] == pytest.approx(reference)
    plan = perftest.second_pass_of(second)
    assert plan is not None and "n5" in plan.suspects and len(plan.suspects) == 2
    assert plan.higher_is_better == (test == "ib_write_bw")
    retest = perftest_pass(perftest, tmp_path / "two", second, 6, "n5", good, slow)

    verdict = localise.judge(plan, perftest.pair_flows(retest), threshold=threshold)
    assert verdict.bad == ["n5"] and verdict.cleared == [n for n in plan.suspects if n != "n5"]
    assert perftest.follow_up(params, perftest_pass(perftest, tmp_path / "ok", params, 6, "none", good, slow)) is None


def test_perftest_judges_a_pair_by_its_largest_message_bandwidth_and_its_smallest_message_latency() -> None:
    bw = perftest_module.Perftest().parse(BW_SLOW.read_text(), host="n0")
    lat = perftest_module.Perftest().parse(LAT_SLOW.read_text(), host="n0")
    tagged = [Metric(m.name, m.value, m.unit, m.host, {**m.labels, "peer": "n1"}) for m in bw + lat]
    sizes = sorted({m.labels["size"] for m in bw if m.name == "bw_avg_bps"})
    largest = next(m.value for m in bw if m.name == "bw_avg_bps" and m.labels["size"] == sizes[-1])
    smallest = min(m.labels["size"] for m in lat)
    typical = next(m.value for m in lat if m.name == "latency_typical_s" and m.labels["size"] == smallest)

    assert perftest_module.pair_flows([m for m in tagged if m.name.startswith("bw")]) == {("n0", "n1"): largest}
    assert perftest_module.pair_flows([m for m in tagged if m.name.startswith("lat")]) == {("n0", "n1"): typical}


# --- the link matrix page, its exports and the API, on results stored by the real parsers -----------------------

_sequence = itertools.count(1)


def stored(team: Any, kind: str, points: list[tuple[dict[str, Any], list[Metric]]]) -> Campaign:
    """A succeeded campaign whose point ``i`` ran once with ``points[i]``'s parameters and stored those metrics (the
    plug-in's parse and aggregate of its output), as the runner stores them."""
    campaign = Campaign.objects.create(name=f"pairs-{kind}-{next(_sequence)}", kind=kind, team=team,
                                       status=CampaignStatus.SUCCEEDED, matrix=[])  # fmt: skip
    for point, (params, metrics) in enumerate(points):
        run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=point, params=params,
                                 repetition=1, status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.bulk_create(
            Result(run=run, name=m.name, value=m.value, unit=m.unit, host=m.host, labels=m.labels) for m in metrics
        )
    return campaign


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_nccl_all_pairs_busbw_is_on_the_link_matrix_page_with_unit_and_statistic_and_exported(
    nccl: Any, tmp_path: Path, owner: Any, team: Any
) -> None:
    params = {"topology": "all_pairs"}
    campaign = stored(team, "nccl", [(params, nccl_pass(nccl, tmp_path, params, hosts(6, slots=8), bad="n3"))])
    url = f"/analysis/campaigns/{campaign.pk}/links/"

    page = logged_in(owner).get(url).content.decode()
    assert "busbw_max_gbps (GB/s, higher is better), the median over repetitions of the bus bandwidth" in page
    assert "node \\ peer" in page and "339 GB/s" in page and "43.8 GB/s" in page
    assert "Bad node n3" in page and "Bad node n0" not in page and "heat-bad" in page
    rows = list(csv.reader(io.StringIO(logged_in(owner).get(url, {"format": "csv"}).content.decode())))
    assert rows[0] == ["node", *[f"n{i}" for i in range(6)]]
    assert rows[1][1] == "" and float(rows[1][2]) == 338.82 and float(rows[4][1]) == 43.81  # n3 -> n0
    api = APIClient()
    api.force_login(owner)
    links = api.get(f"/api/v1/campaigns/{campaign.pk}/links/").json()
    assert (links["metric"], links["unit"], links["higher_is_better"]) == ("busbw_max_gbps", "GB/s", True)
    assert links["statistic"].startswith("median over repetitions of the bus bandwidth of the pair's 2-node")
    assert (links["rows"], links["columns"], links["outliers"], links["points"]) == ("node", "peer", ["n3"], [0])
    assert links["matrix"][0][3] == links["matrix"][3][0] == 43.81  # a pair's value on both of its nodes


@pytest.mark.django_db
def test_perftest_latency_pairs_are_judged_lower_is_better_on_the_matrix(
    perftest: Any, tmp_path: Path, owner: Any, team: Any
) -> None:
    lat = {"topology": "all_pairs", "test": "ib_send_lat"}
    bw = {"topology": "all_pairs", "test": "ib_write_bw"}
    campaign = stored(team, "perftest", [
        (bw, perftest_pass(perftest, tmp_path / "bw", bw, 6, "n1", BW_GOOD, BW_SLOW)),
        (lat, perftest_pass(perftest, tmp_path / "lat", lat, 6, "n5", LAT_GOOD, LAT_SLOW)),
    ])  # fmt: skip
    url = f"/analysis/campaigns/{campaign.pk}/links/"

    page = logged_in(owner).get(url, {"point": "1"}).content.decode()
    assert "latency_typical_s (s, lower is better)" in page and "client \\ server" in page
    assert "1.67 µs" in page and "1.27 µs" in page and "heat-low" in page
    assert "Bad node n5" in page and "Bad node n0" not in page
    api = APIClient()
    api.force_login(owner)
    links = api.get(f"/api/v1/campaigns/{campaign.pk}/links/", {"point": 1}).json()
    assert (links["unit"], links["higher_is_better"], links["outliers"]) == ("s", False, ["n5"])
    # Without a point the first point's metric is shown, never two units in one matrix.
    first = api.get(f"/api/v1/campaigns/{campaign.pk}/links/").json()
    assert (first["metric"], first["unit"], first["outliers"], first["points"]) == (
        "bw_avg_bps",
        "bit/s",
        ["n1"],
        [0, 1],
    )


@pytest.mark.django_db
def test_torch_dist_pairs_from_its_own_output_are_on_the_matrix(owner: Any, team: Any) -> None:
    bench = get_benchmark("torch_dist")
    metrics = bench.parse((FIXTURES / "torch_dist" / "all_reduce-gloo-pairs-4ranks.txt").read_text(), host="n0")
    campaign = stored(team, "torch_dist", [({"topology": "all_pairs"}, [*metrics, *bench.aggregate(metrics)])])
    flows = bench.pair_flows(metrics)

    links = selectors.campaign_links(campaign=campaign)
    assert sorted(links.flows) == sorted((a, b, v) for (a, b), v in flows.items())
    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/links/").content.decode()
    assert "bus bandwidth of the pair&#x27;s 2-node all_reduce" in page and "GB/s" in page
    # A run across every host (topology all) has no pairs: no matrix.
    whole = stored(team, "torch_dist", [({}, bench.parse((FIXTURES / "torch_dist" / "all_gather-gloo-2ranks.txt")
                                                            .read_text()))])  # fmt: skip
    assert selectors.campaign_links(campaign=whole) == selectors.Links([], None, [])


# --- for real: a torch_dist all_pairs campaign on the namespaced lab ---------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
@pytest.mark.timeout(600)  # past the campaign's wait, so that a run that does not end is reported
def test_a_torch_dist_all_pairs_campaign_on_the_lab_fills_the_matrix_and_its_degraded_node_is_a_row(
    netns_lab: dict[str, Any], worker: Any
) -> None:
    from analysis import reports
    from tests.conftest import NETNS_LAB_PORT
    from tests.netns_helpers import lab_env, launch_and_succeed, shape_every_link

    shape_every_link(netns_lab["dir"], degraded="lab3")
    nodes = ["lab1", "lab2", "lab3", "lab4"]
    campaign = launch_and_succeed(
        {
            "name": "torch-dist-all-pairs-matrix",
            "kind": "torch_dist",
            "nodes": nodes,
            "cache": {"flush_clients": False},
            "env": lab_env(),
            # Messages well past the links' token bucket, few of them: seconds per pair.
            "fixed": {
                "topology": "all_pairs",
                "nodes": len(nodes),
                "min_bytes": "1M",
                "max_bytes": "4M",
                "factor": 4,
                "warmup": 1,
                "iters": 3,
                "port": NETNS_LAB_PORT + 27200,
            },  # fmt: skip
            "matrix": {"op": ["all_reduce"]},
        },
        timeout=400,
    )

    links = selectors.campaign_links(campaign=campaign)
    matrix = selectors.link_matrix(links, threshold=3.5)
    assert links.metric is not None and (links.metric.name, links.metric.unit) == ("busbw_max_gbps", "GB/s")
    assert len(matrix.cells) == 12  # every ordered pair of four nodes: each pair's busbw on both of its nodes
    assert matrix.outliers == ["lab3"]
    for a, b in matrix.cells:
        share = matrix.relative(a, b)
        assert share is not None and (share < 0.6 if "lab3" in (a, b) else share > 0.8), (a, b, share)
    (finding,) = reports.link_findings(matrix)
    assert finding.startswith("Bad node lab3: the median of its pairs is ") and " MB/s" in finding  # GB/s, readably
