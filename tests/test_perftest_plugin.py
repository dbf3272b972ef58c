"""The perftest plug-in: parameters, the commands of each pair and step, parsing of real outputs of several perftest
versions (see fixtures/perftest/SOURCES.md), aggregation, and the helper run for real with perftest's own programs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common import numbers
from plugins.benchmarks import perftest as perftest_module
from plugins.benchmarks.base import HostCommand, HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark
from plugins.benchmarks.iperf import pair_rounds

FIXTURES = Path(__file__).parent / "fixtures" / "perftest"


@pytest.fixture
def perftest():
    return get_benchmark("perftest")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def value(metrics: list[Metric], name: str, size: int, host: str = "h1") -> float:
    found = [m.value for m in metrics if m.name == name and m.host == host and m.labels.get("size") == size]
    assert len(found) == 1, (name, size, found)
    return found[0]


def hosts(count: int) -> tuple[HostInfo, ...]:
    return tuple(HostInfo(name=f"n{i}", address=f"10.0.0.{i + 1}") for i in range(count))


def context(index: int, run_hosts: tuple[HostInfo, ...]) -> HostContext:
    name = run_hosts[index].name
    return HostContext(node=name, index=index, run_dir=f"/srv/rb/{name}", data_dir="/scratch", hosts=run_hosts)


def plan(command: HostCommand | list[HostCommand] | None) -> dict[str, Any]:
    assert isinstance(command, HostCommand)
    assert command.argv == ["python3", "rackbench_perftest.py", "steps.json"] and not command.service
    return json.loads(command.files["steps.json"])


def client_output(text: str, peer: str = "n1", code: int = 0, stderr: str = "", **extra: Any) -> str:
    header = {"role": "client", "peer": peer, "step": 0, "exit_code": code, "stderr": stderr, **extra}
    return perftest_module.HEADER + json.dumps(header) + "\n" + text


# --- parameters -----------------------------------------------------------------------------------------------


def test_it_is_registered_with_its_version_command_and_units(perftest):
    assert perftest.kind == "perftest" and perftest.version_argv == ["ib_write_bw", "--version"]
    units = {m.name: m.unit for m in perftest.metrics}
    assert units["bw_avg_bps"] == "bit/s" and units["msg_rate"] == "msg/s" and units["latency_p99_s"] == "s"
    assert numbers.quantity(392.34e9, units["bw_avg_bps"]) == "392 Gbit/s"
    assert numbers.quantity(1.27e-6, units["latency_typical_s"]) == "1.27 µs"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"test": "ib_atomic_bw"}, "test"),
        ({"device": "-d mlx5_0"}, "device"),
        ({"device": "mlx5_0; reboot"}, "device"),
        ({"port": 80}, "port"),
        ({"iterations": 4}, "iterations"),
        ({"size": "1x"}, "size"),
        ({"size": 64, "all_sizes": True}, "all_sizes"),
        ({"duration": 5, "iterations": 1000}, "duration"),
        ({"duration": 5, "all_sizes": True}, "duration"),
        ({"test": "ib_send_lat", "duration": 5}, "duration"),
        ({"test": "ib_write_lat", "qps": 4}, "qps"),
        ({"test": "ib_read_lat", "bidirectional": True}, "bidirectional"),
        ({"use_cuda_dmabuf": True}, "use_cuda_dmabuf"),
        ({"mtu": 9000}, "mtu"),
        ({"gid_index": "three"}, "gid_index"),
        ({"report_gbits": "yes"}, "report_gbits"),
        ({"nodes": 2}, "nodes"),
    ],
)
def test_it_refuses_a_bad_parameter_naming_it(perftest, params, field):
    with pytest.raises(ParamError) as caught:
        perftest.validate(params)
    assert caught.value.field == field


def test_it_builds_the_options_users_of_the_fleet_tools_give(perftest):
    params = {
        "test": "ib_write_bw", "device": "mlx5_0", "ib_port": 1, "size": "64k", "iterations": 5000, "qps": 4,
        "gid_index": 3, "tclass": 106, "tos": 41, "mtu": 4096, "connection": "RC", "rdma_cm": True,
        "bidirectional": True, "use_cuda": 0, "use_cuda_dmabuf": True, "port": 10000,
    }  # fmt: skip
    server, client = (plan(perftest.build(params, context(i, hosts(2))))["steps"] for i in (1, 0))
    shared = ["ib_write_bw", "-d", "mlx5_0", "-i", "1", "-n", "5000", "-q", "4", "-x", "3", "-T", "41", "-m", "4096",
              "-c", "RC", "-s", "65536", "--tclass=106", "--use_cuda=0", "--report_gbits", "-F", "-R", "-b",
              "--use_cuda_dmabuf", "-p", "10000"]  # fmt: skip
    hca = {"hca": "mlx5_0", "ib_port": 1}  # echoed in each step's header: the HCA port the results are labelled with
    assert server == [{"step": 0, "role": "server", "peer": "n0", "argv": shared, **hca}]
    assert client == [{"step": 0, "role": "client", "peer": "n1", "argv": [*shared, "10.0.0.2"], **hca}]


def test_it_passes_all_sizes_and_duration_as_perftest_spells_them(perftest):
    steps = plan(perftest.build({"all_sizes": True, "report_gbits": False}, context(0, hosts(2))))["steps"]
    assert steps[0]["argv"] == ["ib_write_bw", "-a", "-F", "-p", "18515", "10.0.0.2"]
    steps = plan(perftest.build({"test": "ib_read_bw", "duration": 10}, context(0, hosts(2))))["steps"]
    assert steps[0]["argv"] == ["ib_read_bw", "-D", "10", "--report_gbits", "-F", "-p", "18515", "10.0.0.2"]


# --- pairing --------------------------------------------------------------------------------------------------


def test_pairs_makes_even_hosts_clients_of_the_next_one_all_at_once(perftest):
    run_hosts = hosts(4)
    steps = [plan(perftest.build({}, context(i, run_hosts)))["steps"] for i in range(4)]
    assert [(s[0]["role"], s[0]["peer"]) for s in steps] == [
        ("client", "n1"), ("server", "n0"), ("client", "n3"), ("server", "n2"),
    ]  # fmt: skip
    assert all(len(s) == 1 and s[0]["argv"][s[0]["argv"].index("-p") + 1] == "18515" for s in steps)
    assert steps[0][0]["argv"][-1] == "10.0.0.2" and steps[2][0]["argv"][-1] == "10.0.0.4"
    with pytest.raises(ParamError) as caught:
        perftest.build({}, context(0, hosts(3)))
    assert caught.value.field == "topology"


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_all_pairs_measures_both_directions_of_every_pair_in_the_iperf3_rounds(perftest, count):
    run_hosts = hosts(count)
    plans = [plan(perftest.build({"topology": "all_pairs"}, context(i, run_hosts))) for i in range(count)]
    rounds = pair_rounds(count)
    measured = set()
    for index, found in enumerate(plans):
        numbers_ = [s["step"] for s in found["steps"]]
        assert numbers_ == sorted(numbers_)  # in step order
        for s in found["steps"]:
            assert s["round"] == s["step"] // 2 and s["argv"][s["argv"].index("-p") + 1] == str(18515 + s["step"])
            partner = int(s["peer"][1:])
            assert tuple(sorted((index, partner))) in rounds[s["round"]]
            if s["role"] == "client":
                measured.add((index, partner))
                server = next(t for t in plans[partner]["steps"] if t["step"] == s["step"])
                assert server["role"] == "server" and server["peer"] == f"n{index}"
    assert measured == {(a, b) for a in range(count) for b in range(count) if a != b}


def test_it_refuses_steps_past_port_65535(perftest):
    with pytest.raises(ParamError) as caught:
        perftest.build({"topology": "all_pairs", "port": 65_530}, context(0, hosts(5)))
    assert caught.value.field == "port"


# --- parsing real outputs -------------------------------------------------------------------------------------


def test_it_reads_mib_per_second_of_a_doca_perftest_as_2_to_the_20_bytes(perftest):
    """DOCA-OFED 3.3's perftest prints MiB/sec; the same link measured with --report_gbits agrees."""
    send = perftest.parse(fixture_text("doca-send-bw-mib.txt"), host="h1")
    write = perftest.parse(fixture_text("doca-write-bw-gbits.txt"), host="h1")
    assert value(send, "bw_avg_bps", 65536) == pytest.approx(46557.03 * 2**20 * 8)
    assert value(send, "bw_peak_bps", 65536) == pytest.approx(46567.34 * 2**20 * 8)
    assert value(send, "msg_rate", 65536) == pytest.approx(744912)
    assert value(write, "bw_avg_bps", 65536) == pytest.approx(392.34e9)
    assert value(send, "bw_avg_bps", 65536) == pytest.approx(value(write, "bw_avg_bps", 65536), rel=0.01)


def test_it_skips_warnings_printed_inside_the_table(perftest):
    metrics = perftest.parse(fixture_text("doca-read-bw-gbits.txt"), host="h1")
    assert {(m.name, m.labels["size"]) for m in metrics} == {
        ("bw_peak_bps", 65536), ("bw_avg_bps", 65536), ("msg_rate", 65536),
    }  # fmt: skip
    assert value(metrics, "bw_avg_bps", 65536) == pytest.approx(328.61e9)


def test_it_reads_every_latency_column_in_seconds(perftest):
    metrics = perftest.parse(fixture_text("doca-send-lat.txt"), host="h1")
    expected = {"latency_min_s": 1.24, "latency_max_s": 5.19, "latency_typical_s": 1.27, "latency_avg_s": 1.27,
                "latency_stdev_s": 0.00, "latency_p99_s": 1.37, "latency_p999_s": 5.19}  # fmt: skip
    assert {m.name: m.value for m in metrics} == pytest.approx({k: v * 1e-6 for k, v in expected.items()})


def test_it_reads_all_sizes_of_a_latency_sweep(perftest):
    metrics = perftest.parse(fixture_text("ud-send-lat-all.txt"), host="h1")
    sizes = sorted({m.labels["size"] for m in metrics})
    assert sizes == [2**k for k in range(1, 13)]
    assert value(metrics, "latency_p999_s", 32) == pytest.approx(12.79e-6)
    assert value(metrics, "latency_typical_s", 4096) == pytest.approx(3.73e-6)


def test_it_reads_all_sizes_of_a_bidirectional_gbits_sweep(perftest):
    metrics = perftest.parse(fixture_text("rocm-write-bw-bidir-all-gbits.txt"), host="h1")
    sizes = sorted({m.labels["size"] for m in metrics if m.name == "bw_avg_bps"})
    assert sizes == [2**k for k in range(1, 24)]
    assert value(metrics, "bw_peak_bps", 2) == pytest.approx(0.142947e9)  # six decimals for the first row
    assert value(metrics, "bw_avg_bps", 8388608) == pytest.approx(204.59e9)
    assert value(metrics, "msg_rate", 16) == pytest.approx(9.025968e6)


def test_it_reads_megabytes_per_second_of_older_versions(perftest):
    metrics = perftest.parse(fixture_text("ud-send-bw-all-mb.txt"), host="h1")
    assert value(metrics, "bw_avg_bps", 4096) == pytest.approx(6170.13 * 2**20 * 8)
    assert value(metrics, "bw_peak_bps", 4096) == pytest.approx(7301.40 * 2**20 * 8)
    old = perftest.parse(fixture_text("issue65-send-bw-mb.txt"), host="h1")
    assert value(old, "bw_avg_bps", 1024) == pytest.approx(5544.28 * 2**20 * 8)


@pytest.mark.parametrize("name", ["issue65-send-bw-mb.txt", "issue273-write-bw-post-list-gbits.txt",
                                  "ud-send-bw-all-mb-server.txt"])  # fmt: skip
def test_it_leaves_out_a_peak_printed_as_zero_next_to_a_real_average(perftest, name):
    metrics = perftest.parse(fixture_text(name), host="h1")
    assert not [m for m in metrics if m.name == "bw_peak_bps"]
    assert all(m.value > 0 for m in metrics if m.name == "bw_avg_bps")


def test_it_turns_perftests_own_failure_into_a_parse_error_naming_peer_and_status(perftest):
    stderr = fixture_text("perftest-6.06-no-device.stderr.txt")
    with pytest.raises(ParseError) as caught:
        perftest.parse(client_output("", peer="n1", code=1, stderr=stderr), host="n0")
    assert "peer n1" in str(caught.value) and "Unable to find the Infiniband/RoCE device" in str(caught.value)
    assert "exit status 1" in str(caught.value)


def test_it_refuses_a_table_without_rows(perftest):
    head = fixture_text("doca-write-bw-gbits.txt").split("Conflicting")[0]
    with pytest.raises(ParseError, match="empty"):
        perftest.parse(head + "-" * 87 + "\n", host="h1")


def test_each_result_names_the_hca_port_its_client_ran_on(perftest):
    """The device perftest's banner names (mlx5_0 in DOCA's, ib0 in issue 273's), the port the plan gave the step;
    a version that printed no banner takes the plan's device; a placeholder of the docs names none."""
    ran = perftest.parse(client_output(fixture_text("doca-write-bw-gbits.txt"), hca="mlx5_1", ib_port=2), host="n0")
    assert {(m.labels["hca"], m.labels["port"]) for m in ran} == {("mlx5_0", 2)}  # the banner over the plan
    assert {m.labels["hca"] for m in perftest.parse(fixture_text("issue273-write-bw-post-list-gbits.txt"))} == {"ib0"}
    old = perftest.parse(client_output(fixture_text("issue65-send-bw-mb.txt"), hca="mlx4_0", ib_port=1), host="n0")
    assert {(m.labels["hca"], m.labels["port"]) for m in old} == {("mlx4_0", 1)}
    assert not [m for m in perftest.parse(fixture_text("rocm-write-bw-bidir-all-gbits.txt")) if "hca" in m.labels]
    assert perftest.aggregate(ran)[0].labels == {"size": 65536}  # the run's total is no HCA's


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, {"ib_port": 1}),  # perftest's default port, on the HCA it opens first (its banner names it)
        ({"device": "mlx5_2", "ib_port": 2}, {"hca": "mlx5_2", "ib_port": 2}),
        ({"rdma_cm": True}, {}),  # rdma_cm picks the port the server's address is reached through
    ],
)
def test_the_plan_names_the_hca_port_of_each_step(perftest, params, expected):
    for step in plan(perftest.build(params, context(0, hosts(2))))["steps"]:
        assert {k: step[k] for k in ("hca", "ib_port") if k in step} == expected


def test_it_reads_only_client_sections_of_the_helper_output_and_labels_peer_and_round(perftest):
    server = perftest_module.HEADER + json.dumps({"role": "server", "peer": "n0", "step": 1, "exit_code": 0}) + "\n"
    text = client_output(fixture_text("doca-write-bw-gbits.txt"), peer="n2", round=0)
    text += server + fixture_text("ud-send-bw-all-mb-server.txt")
    metrics = perftest.parse(text, host="n1")
    assert {m.labels["peer"] for m in metrics} == {"n2"} and {m.labels["round"] for m in metrics} == {0}
    assert all(m.unit == perftest.spec(m.name).unit for m in metrics)


# --- aggregation ----------------------------------------------------------------------------------------------


def _bw(host: str, value_: float, size: int = 65536, **labels: Any) -> Metric:
    return Metric("bw_avg_bps", value_, "bit/s", host, {"peer": "x", "size": size, **labels})


def test_it_sums_pairs_that_ran_at_once_and_takes_the_median_flow_of_all_pairs(perftest):
    total = perftest.aggregate([_bw("a", 1e9), _bw("c", 3e9), _bw("a", 5e9, size=2)])
    assert [(m.value, m.labels) for m in total] == [(5e9, {"size": 2}), (4e9, {"size": 65536})]
    rounds = perftest.aggregate([_bw("a", 1e9, round=0), _bw("b", 2e9, round=0), _bw("c", 9e9, round=1)])
    assert [m.value for m in rounds] == [2e9]


def test_it_reports_a_run_where_no_client_gave_a_result(perftest):
    assert perftest.missing([], ["n0", "n1"])
    assert not perftest.missing([_bw("n0", 1e9)], ["n0", "n1"])


# --- the helper, with perftest's own programs -----------------------------------------------------------------


def _helper(tmp_path: Path, command: HostCommand) -> subprocess.CompletedProcess[str]:
    for name, content in command.files.items():
        (tmp_path / name).write_text(content)
    return subprocess.run(
        [sys.executable, *command.argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(not shutil.which("ib_write_bw"), reason="perftest is not installed (scripts/bootstrap does it)")
def test_the_helper_runs_real_perftest_and_its_failure_reaches_the_parser(perftest, tmp_path):
    """Without an RDMA device perftest fails at once; the helper must not retry that as "not listening yet", and
    the parser must say what perftest said."""
    command = perftest.build({"connect_timeout": 30, "device": "rackbench_none"}, context(0, hosts(2)))
    assert isinstance(command, HostCommand)
    done = _helper(tmp_path, command)
    assert done.returncode != 0
    with pytest.raises(ParseError) as caught:
        perftest.parse(done.stdout, host="n0")
    assert "peer n1" in str(caught.value)
    assert "IB device rackbench_none not found" in str(caught.value) or "RoCE device" in str(caught.value)


def test_the_helper_retries_a_client_until_its_server_listens(tmp_path):
    """A stand-in client that fails like perftest's until a file appears (the server), then prints a table."""
    table = fixture_text("doca-write-bw-gbits.txt")
    (tmp_path / "table.txt").write_text(table)
    script = (
        "import os, sys, time\n"
        "n = int(open('tries').read()) + 1 if os.path.exists('tries') else 1\n"
        "open('tries', 'w').write(str(n))\n"
        "if n < 3:\n"
        "    sys.stderr.write(' Unable to open file descriptor for socket connection\\n'); sys.exit(1)\n"
        "sys.stdout.write(open('table.txt').read())\n"
    )
    (tmp_path / "client.py").write_text(script)
    steps = {"wait": 30, "timeout": 30, "steps": [
        {"step": 0, "role": "client", "peer": "n1", "argv": [sys.executable, "client.py"]},
    ]}  # fmt: skip
    command = HostCommand(
        argv=["python3", perftest_module.HELPER, perftest_module.PLAN],
        files={perftest_module.HELPER: perftest_module.HELPER_SCRIPT, perftest_module.PLAN: json.dumps(steps)},
    )
    done = _helper(tmp_path, command)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tries").read_text() == "3"
    metrics = get_benchmark("perftest").parse(done.stdout, host="n0")
    assert value(metrics, "bw_avg_bps", 65536, host="n0") == pytest.approx(392.34e9)


# A stand-in for a perftest program where no RDMA device exists: it keeps perftest's exchange (a server takes one
# client on its -p port and exits; a client that finds nothing listening fails with perftest's own message) and
# prints a result table in perftest's format, with the pair in the bandwidth so each result can be told apart.
STAND_IN = r"""#!PYTHON
import os, socket, sys
args = sys.argv[1:]
port = int(args[args.index("-p") + 1])
me = os.environ["STAND_IN_ADDRESS"]
client = not args[-1].startswith("-") and args[-2] != "-p"
table = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
table += " 65536      5000   {0}   {0}   0.1\n" + "-" * 87 + "\n"
if client:
    s = socket.socket()
    s.bind((me, 0))
    try:
        s.connect((args[-1], port))
    except OSError:
        sys.stderr.write(" Unable to open file descriptor for socket connection\n")
        sys.stderr.write(" Unable to init the socket connection\n")
        sys.exit(1)
    s.sendall(me.encode())
    s.recv(64)
    print(table.format(me.split(".")[-1] + "." + args[-1].split(".")[-1]))
else:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((me, port))
    s.listen(1)
    c, _ = s.accept()
    peer = c.recv(64).decode()
    c.sendall(b"ok")
    print(table.format(me.split(".")[-1] + "." + peer.split(".")[-1]))
"""


@pytest.mark.parametrize(("topology", "count"), [("pairs", 4), ("all_pairs", 3), ("all_pairs", 4)])
def test_the_helpers_of_all_hosts_keep_in_step_and_measure_every_planned_pair(perftest, tmp_path, topology, count):
    """Every host's helper at once, on loopback addresses 127.0.0.2.., with the stand-in on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "ib_write_bw"
    program.write_text(STAND_IN.replace("PYTHON", sys.executable))
    program.chmod(0o755)
    run_hosts = tuple(HostInfo(name=f"n{i}", address=f"127.0.0.{i + 2}") for i in range(count))
    port = 20000 + (os.getpid() % 20000)  # tests of other worktrees run on this machine too
    procs = []
    for i in range(count):
        command = perftest.build({"topology": topology, "port": port, "connect_timeout": 30, "timeout": 30},
                                 context(i, run_hosts))  # fmt: skip
        assert isinstance(command, HostCommand)
        home = tmp_path / f"n{i}"
        home.mkdir()
        for name, content in command.files.items():
            (home / name).write_text(content)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STAND_IN_ADDRESS": run_hosts[i].address}
        procs.append(subprocess.Popen([sys.executable, *command.argv[1:]], cwd=home, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    measured = {}
    for i, (out, _) in enumerate(outputs):
        for m in perftest.parse(out, host=f"n{i}"):
            if m.name == "bw_avg_bps":
                measured[(m.host, m.labels["peer"])] = m.value
    if topology == "pairs":
        expected = {("n0", "n1"), ("n2", "n3")}
    else:
        expected = {(f"n{a}", f"n{b}") for a in range(count) for b in range(count) if a != b}
    assert set(measured) == expected
    for (client, server), bps in measured.items():  # the client's own table, of its own pair
        assert bps == pytest.approx(float(f"{int(client[1:]) + 2}.{int(server[1:]) + 2}") * 1e9)


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_ring_measures_both_directions_of_each_host_and_the_next_in_disjoint_rounds(perftest, count):
    plans = [plan(perftest.build({"topology": "ring"}, context(i, hosts(count)))) for i in range(count)]
    measured = set()
    for index, found in enumerate(plans):
        for s in found["steps"]:
            assert s["round"] == s["step"] // 2
            if s["role"] == "client":
                measured.add((index, int(s["peer"][1:])))
        assert len({s["step"] for s in found["steps"]}) == len(found["steps"])  # one test at a time per host
    ring = {(i, (i + 1) % count) for i in range(count)} if count > 2 else {(0, 1)}
    assert measured == ring | {(b, a) for a, b in ring}
