"""The iperf plug-ins (iperf3, iperf2): parameters, commands per topology, parsing of real outputs (see
fixtures/iperf/SOURCES.md), aggregation, and real iperf servers and clients on loopback run from the built commands."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks import iperf as iperf_module
from plugins.benchmarks.base import HostCommand, HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark

FIXTURES = Path(__file__).parent / "fixtures" / "iperf"


@pytest.fixture
def iperf3():
    return get_benchmark("iperf3")


@pytest.fixture
def iperf2():
    return get_benchmark("iperf2")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_bytes().decode()  # bytes first: keeps CRLF line endings as they are


def value(metrics: list[Metric], name: str, host: str = "h1", **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == host and m.labels == labels]
    assert len(found) == 1, (name, host, labels, found)
    return found[0]


def hosts(count: int, base: str = "10.0.0.") -> tuple[HostInfo, ...]:
    return tuple(HostInfo(name=f"n{i}", address=f"{base}{i + 1}") for i in range(count))


def context(index: int, run_hosts: tuple[HostInfo, ...], root: str = "/srv/rackbench") -> HostContext:
    name = run_hosts[index].name
    return HostContext(node=name, index=index, run_dir=f"{root}/{name}/run", data_dir="/scratch", hosts=run_hosts)


def commands(built: HostCommand | list[HostCommand] | None) -> tuple[HostCommand | None, HostCommand | None]:
    """(main, service) of what build() returned for one host."""
    found = built if isinstance(built, list) else [built] if built else []
    mains = [c for c in found if not c.service]
    services = [c for c in found if c.service]
    assert len(mains) <= 1 and len(services) <= 1
    return (mains[0] if mains else None), (services[0] if services else None)


def plan(command: HostCommand, name: str) -> dict[str, Any]:
    return json.loads(command.files[name])


# --- registration and metric specs ---------------------------------------------------------------------------


def test_it_registers_both_kinds_with_their_version_commands(iperf3, iperf2):
    assert (iperf3.kind, iperf3.version_argv) == ("iperf3", ["iperf3", "--version"])
    assert (iperf2.kind, iperf2.version_argv) == ("iperf2", ["iperf", "--version"])


def test_it_declares_units_and_directions_of_its_metrics(iperf3):
    assert (iperf3.spec("throughput_bps").unit, iperf3.spec("throughput_bps").higher_is_better) == ("bit/s", True)
    assert (iperf3.spec("retransmits").unit, iperf3.spec("retransmits").higher_is_better) == ("count", False)
    assert (iperf3.spec("cpu_local_percent").unit, iperf3.spec("cpu_local_percent").higher_is_better) == ("%", False)
    assert iperf3.spec("cpu_remote_percent").unit == "%"
    assert iperf3.required_metrics == ("throughput_bps",)


def test_it_gives_every_parsed_metric_its_declared_unit(iperf3, iperf2):
    for name in ("iperf3-3.12-bidir-P2.json", "rackbench-iperf3-all-to-all-n0.txt"):
        for metric in iperf3.parse(fixture_text(name), host="h1"):
            assert metric.unit == iperf3.spec(metric.name).unit
    for metric in iperf2.parse(fixture_text("iperf-2.1.8-full-duplex-P2.txt"), host="h1"):
        assert metric.unit == iperf2.spec(metric.name).unit


# --- parameters ----------------------------------------------------------------------------------------------


def test_it_fills_in_defaults_for_an_empty_campaign(iperf3, iperf2):
    p = iperf3.params({})
    assert (p.topology, p.reverse, p.bidir, p.parallel, p.duration, p.omit) == ("pairs", False, False, 1, 10, 0)
    assert (p.port, p.connect_timeout, p.bitrate, p.window, p.length) == (5201, 10, None, None, None)
    assert iperf2.params({}).port == 5001


def test_it_normalises_flags_and_integers(iperf3):
    p = iperf3.params({"reverse": "true", "parallel": "32", "duration": 60, "omit": "5", "bitrate": 0})
    assert (p.reverse, p.parallel, p.duration, p.omit, p.bitrate) == (True, 32, 60, 5, "0")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"topology": "star"}, "topology"),
        ({"parallel": 0}, "parallel"),
        ({"parallel": 129}, "parallel"),
        ({"parallel": "4; rm -rf /"}, "parallel"),
        ({"parallel": True}, "parallel"),
        ({"parallel": 1.5}, "parallel"),
        ({"duration": 0}, "duration"),
        ({"duration": "10s"}, "duration"),
        ({"omit": -1}, "omit"),
        ({"omit": 10, "duration": 10}, "omit"),
        ({"port": 80}, "port"),
        ({"port": 70000}, "port"),
        ({"reverse": "yes"}, "reverse"),
        ({"reverse": True, "bidir": True}, "bidir"),
        ({"bitrate": "1G; touch /tmp/pwned"}, "bitrate"),
        ({"bitrate": "10G/100"}, "bitrate"),
        ({"bitrate": "-1"}, "bitrate"),
        ({"window": "0"}, "window"),
        ({"window": "256 K"}, "window"),
        ({"length": "$(id)"}, "length"),
        ({"length": "-l"}, "length"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"interface_address": "10.0.0.1"}, "interface_address"),
        ({"interface_address": {"n0": "10.0.0.1 -R"}}, "interface_address"),
        ({"interface_address": {"n0": "storage-1.example.com"}}, "interface_address"),
        ({"udp": "yes"}, "udp"),
        ({"extra_args": ["-Z"]}, "extra_args"),
    ],
)
def test_it_refuses_a_bad_parameter_naming_it(iperf3, params, field):
    with pytest.raises(ParamError) as caught:
        iperf3.validate(params)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    with pytest.raises(ParamError):
        iperf3.build(params, context(0, hosts(2)))


@pytest.mark.parametrize("field", ["omit", "connect_timeout"])
def test_it_refuses_iperf3_only_options_for_iperf2(iperf2, field):
    with pytest.raises(ParamError, match="iperf3") as caught:
        iperf2.validate({field: 2, "duration": 10})
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("topology", "count", "field"),
    [("pairs", 3, "topology"), ("pairs", 1, "topology"), ("to_first", 1, "topology"), ("all_to_all", 0, "topology")],
)
def test_it_refuses_host_counts_a_topology_cannot_use(iperf3, topology, count, field):
    run_hosts = hosts(count)
    host = context(0, run_hosts) if run_hosts else HostContext(node="n0", index=0, run_dir="/r", data_dir="/d")
    with pytest.raises(ParamError) as caught:
        iperf3.build({"topology": topology}, host)
    assert caught.value.field == field


def test_it_refuses_ports_past_65535_and_addresses_of_unknown_hosts(iperf3):
    with pytest.raises(ParamError) as caught:
        iperf3.build({"topology": "to_first", "port": 65_534}, context(0, hosts(4)))
    assert caught.value.field == "port"
    with pytest.raises(ParamError, match="n9") as caught:
        iperf3.build({"interface_address": {"n9": "10.1.1.1"}}, context(0, hosts(2)))
    assert caught.value.field == "interface_address"


def test_it_refuses_a_node_address_that_is_no_host_name(iperf3):
    run_hosts = (HostInfo("n0", "10.0.0.1"), HostInfo("n1", "-R 10.0.0.2"))
    with pytest.raises(ParamError, match="n1") as caught:
        iperf3.build({}, context(0, run_hosts))
    assert caught.value.field == "interface_address"


# --- commands per topology ------------------------------------------------------------------------------------


def test_it_pairs_hosts_in_order_with_servers_on_the_odd_ones(iperf3):
    run_hosts = hosts(4)
    built = [
        commands(iperf3.build({"port": 6000, "duration": 30, "parallel": 8}, context(i, run_hosts))) for i in range(4)
    ]
    assert [main is not None for main, _ in built] == [True, False, True, False]
    assert [service is not None for _, service in built] == [False, True, False, True]
    main0 = plan(built[0][0], "clients.json")["clients"]
    assert main0 == [
        {
            "peer": "n1",
            "address": "10.0.0.2",
            "port": 6000,
            "argv": ["iperf3", "-c", "10.0.0.2", "-p", "6000", "-B", "10.0.0.1", "-J", "-t", "30", "-P", "8"]
            + ["--connect-timeout", "10000"],
        }
    ]
    servers1 = plan(built[1][1], "servers.json")
    assert servers1 == {
        "address": "10.0.0.2",
        "servers": [{"peer": "n0", "port": 6000, "argv": ["iperf3", "-s", "-p", "6000", "-B", "10.0.0.2"]}],
    }
    main2 = plan(built[2][0], "clients.json")["clients"]
    assert [(c["peer"], c["address"], c["port"]) for c in main2] == [("n3", "10.0.0.4", 6002)]
    assert [s["port"] for s in plan(built[3][1], "servers.json")["servers"]] == [6002]


def test_it_runs_one_server_per_sender_on_the_first_host_for_to_first(iperf3):
    run_hosts = hosts(3)
    first_main, first_service = commands(iperf3.build({"topology": "to_first"}, context(0, run_hosts)))
    assert first_main is None
    assert [(s["peer"], s["port"]) for s in plan(first_service, "servers.json")["servers"]] == [
        ("n1", 5202),
        ("n2", 5203),
    ]
    for i in (1, 2):
        main, service = commands(iperf3.build({"topology": "to_first"}, context(i, run_hosts)))
        assert service is None
        assert [(c["peer"], c["address"], c["port"]) for c in plan(main, "clients.json")["clients"]] == [
            ("n0", "10.0.0.1", 5201 + i)
        ]


def test_it_gives_every_host_servers_and_clients_for_all_to_all(iperf3):
    run_hosts = hosts(3)
    for me in range(3):
        main, service = commands(iperf3.build({"topology": "all_to_all", "port": 7000}, context(me, run_hosts)))
        others = [i for i in range(3) if i != me]
        servers = plan(service, "servers.json")["servers"]
        assert [(s["peer"], s["port"]) for s in servers] == [(f"n{s}", 7000 + s) for s in others]
        clients = plan(main, "clients.json")["clients"]
        assert [(c["peer"], c["port"]) for c in clients] == [(f"n{r}", 7000 + me) for r in others]


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7])
def test_all_pairs_rounds_are_disjoint_and_cover_every_pair_once(count):
    rounds = iperf_module.pair_rounds(count)
    pairs = [pair for round_ in rounds for pair in round_]
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)
    assert sorted(pairs) == [(a, b) for a in range(count) for b in range(a + 1, count)]
    for round_ in rounds:
        members = [host for pair in round_ for host in pair]
        assert len(members) == len(set(members))  # no host in two pairs of a round


def test_all_pairs_gives_every_host_one_server_and_its_clients_in_round_order(iperf3):
    run_hosts = hosts(4)
    rounds = iperf_module.pair_rounds(4)
    for me in range(4):
        main, service = commands(iperf3.build({"topology": "all_pairs", "port": 7000}, context(me, run_hosts)))
        assert [s["port"] for s in plan(service, "servers.json")["servers"]] == [7000]
        clients = plan(main, "clients.json")
        assert clients["in_turn"] is True and clients["busy_wait"] > 0
        expected = [(r, f"n{b if a == me else a}") for r, pairs in enumerate(rounds) for a, b in pairs if me in (a, b)]
        assert [(c["round"], c["peer"]) for c in clients["clients"]] == expected
        assert all(c["port"] == 7000 for c in clients["clients"])


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("iperf3", {"reverse": True}, "both directions"),
        ("iperf3", {"bidir": True}, "both directions"),
        ("iperf2", {}, "needs iperf3"),
    ],
)
def test_all_pairs_refuses_what_it_cannot_do_naming_the_topology(kind, params, message):
    with pytest.raises(ParamError, match=message) as raised:
        get_benchmark(kind).build({"topology": "all_pairs", **params}, context(0, hosts(4)))
    assert raised.value.field == "topology"


def test_it_runs_the_helper_with_argv_only_and_polls_readiness_without_connecting(iperf3):
    main, service = commands(iperf3.build({}, context(0, hosts(2))))
    assert main.argv == ["python3", "rackbench_iperf.py", "clients", "clients.json"]
    assert main.files["rackbench_iperf.py"] == iperf_module.HELPER_SCRIPT
    _, service = commands(iperf3.build({}, context(1, hosts(2))))
    assert service.service is True
    assert service.argv == ["python3", "rackbench_iperf.py", "serve", "servers.json"]
    assert service.ready_argv == ["python3", "rackbench_iperf.py", "ready", "servers.json"]
    assert set(service.files) == {"rackbench_iperf.py", "servers.json"}
    compile(iperf_module.HELPER_SCRIPT, "rackbench_iperf.py", "exec")


def test_it_passes_direction_tuning_and_omit_to_iperf3(iperf3):
    params = {"reverse": True, "omit": 2, "bitrate": "25G", "window": "4M", "length": "128K", "connect_timeout": 3}
    argv = plan(commands(iperf3.build(params, context(0, hosts(2))))[0], "clients.json")["clients"][0]["argv"]
    assert argv[argv.index("--connect-timeout") + 1] == "3000"
    assert argv[argv.index("-O") + 1] == "2"
    assert argv[-7:] == ["-R", "-b", "25G", "-w", "4M", "-l", "128K"]
    bidir = plan(commands(iperf3.build({"bidir": True}, context(0, hosts(2))))[0], "clients.json")["clients"][0]
    assert "--bidir" in bidir["argv"] and "-R" not in bidir["argv"]


def test_it_builds_iperf2_commands_with_unrounded_bit_rates(iperf2):
    run_hosts = hosts(2)
    main, _ = commands(iperf2.build({"bidir": True, "parallel": 16, "length": "64K"}, context(0, run_hosts)))
    _, service = commands(iperf2.build({}, context(1, run_hosts)))
    assert plan(main, "clients.json")["clients"][0]["argv"] == (
        ["iperf", "-c", "10.0.0.2", "-p", "5001", "-B", "10.0.0.1", "-t", "10", "-P", "16", "-f", "b"]
        + ["--full-duplex", "-l", "64K"]
    )
    assert plan(service, "servers.json")["servers"][0]["argv"] == ["iperf", "-s", "-p", "5001", "-B", "10.0.0.2"]
    reverse = plan(commands(iperf2.build({"reverse": True}, context(0, run_hosts)))[0], "clients.json")
    assert reverse["clients"][0]["argv"][-1] == "-R"


def test_it_uses_the_interface_address_of_a_host_when_given(iperf3):
    run_hosts = hosts(2)
    params = {"interface_address": {"n1": "10.200.10.13"}}
    main, _ = commands(iperf3.build(params, context(0, run_hosts)))
    client = plan(main, "clients.json")["clients"][0]
    assert client["address"] == "10.200.10.13"
    assert client["argv"][2:7] == ["10.200.10.13", "-p", "5201", "-B", "10.0.0.1"]
    _, service = commands(iperf3.build(params, context(1, run_hosts)))
    assert plan(service, "servers.json")["address"] == "10.200.10.13"


def test_it_keeps_shell_metacharacters_in_host_names_out_of_any_shell(iperf3):
    run_hosts = (HostInfo("n0;id", "10.0.0.1"), HostInfo("n1$(id)", "10.0.0.2"))
    main, _ = commands(iperf3.build({}, context(0, run_hosts)))
    assert main.argv == ["python3", "rackbench_iperf.py", "clients", "clients.json"]
    assert plan(main, "clients.json")["clients"][0]["peer"] == "n1$(id)"


# --- parsing iperf3 -------------------------------------------------------------------------------------------


def test_it_reads_receiver_throughput_sender_retransmits_and_cpu(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-P1.json"), host="h1")
    flow = {"peer": "127.0.0.1", "direction": "send"}
    assert value(metrics, "throughput_bps", **flow) == 32352326076.176155  # end.sum_received.bits_per_second
    assert value(metrics, "retransmits", **flow) == 0
    assert value(metrics, "cpu_local_percent", peer="127.0.0.1") == 97.49268871505166
    assert value(metrics, "cpu_remote_percent", peer="127.0.0.1") == 69.88787410706698
    assert len(metrics) == 4


def test_it_reads_the_sum_of_parallel_streams(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-P4.json"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 32230080872.5342


def test_it_reads_a_reverse_test_as_received_with_the_servers_retransmits(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-reverse-P2.json"), host="h1")
    flow = {"peer": "127.0.0.1", "direction": "receive"}
    assert value(metrics, "throughput_bps", **flow) == 28150901657.425415
    assert value(metrics, "retransmits", **flow) == 3
    assert not [m for m in metrics if m.labels.get("direction") == "send"]


def test_it_reads_both_directions_of_a_bidir_test(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-bidir-P2.json"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 15586933486.007875
    assert value(metrics, "retransmits", peer="127.0.0.1", direction="send") == 4
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="receive") == 9022860150.450804
    assert value(metrics, "retransmits", peer="127.0.0.1", direction="receive") == 0


def test_it_reads_the_end_sums_that_leave_out_omitted_seconds(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-omit-bitrate-window-length.json"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 3999487191.229871
    older = iperf3.parse(fixture_text("iperf3-3.9-cloudpilot-omit3.json"), host="h1")
    flow = {"peer": "168.1.194.92", "direction": "send"}
    assert value(older, "throughput_bps", **flow) == 35268888.9409304
    assert value(older, "retransmits", **flow) == 1597
    assert value(older, "cpu_local_percent", peer="168.1.194.92") == 4.17469646782558


def test_it_reads_json_with_crlf_line_endings_from_a_terminal(iperf3):
    text = fixture_text("iperf3-3.12-pty-crlf.txt")
    assert "\r\n" in text
    metrics = iperf3.parse(text, host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 24812039622.965965
    assert value(metrics, "retransmits", peer="127.0.0.1", direction="send") == 28


def test_it_finds_the_json_after_terminal_noise(iperf3):
    noisy = "warning: something from the shell\n" + fixture_text("iperf3-3.12-P1.json") + "\nlogout\n"
    metrics = iperf3.parse(noisy, host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 32352326076.176155


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("iperf3-3.12-refused.json", "unable to connect to server: Connection refused"),
        ("iperf3-3.12-server-busy.json", "the server is busy running a test. try again later"),
        ("iperf3-3.12-server-killed.json", "unable to write to stream socket: Connection reset by peer"),
        ("iperf3-3.12-client-interrupted.json", "interrupt - the client has terminated"),
        ("iperf3-3.6-cloudpilot-interrupted.txt", "interrupt - the client has terminated"),
        ("iperf3-3.6-cloudpilot-control-socket-closed.json", "error - control socket has closed unexpectedly"),
    ],
)
def test_it_fails_with_iperf3s_own_error_message(iperf3, name, message):
    with pytest.raises(ParseError) as caught:
        iperf3.parse(fixture_text(name), host="h1")
    assert str(caught.value) == f"iperf3 reported an error: {message}"


def test_it_refuses_a_result_whose_receiver_counted_nothing(iperf3):
    with pytest.raises(ParseError, match="56320 bytes sent but none received"):
        iperf3.parse(fixture_text("iperf3-3.6-cloudpilot-bytes-nothing-received.json"), host="h1")


def test_it_refuses_cut_off_json_and_output_without_json(iperf3):
    with pytest.raises(ParseError, match="incomplete"):
        iperf3.parse(fixture_text("iperf3-3.9-cloudpilot-reverse-truncated.json"), host="h1")
    with pytest.raises(ParseError, match="no iperf3 JSON output found"):
        iperf3.parse(fixture_text("iperf-2.1.8-P1-bits.txt"), host="h1")
    with pytest.raises(ParseError, match="printed nothing"):
        iperf3.parse("\r\n", host="h1")


# --- parsing iperf 2 ------------------------------------------------------------------------------------------


def test_it_reads_a_single_stream_in_bits_per_second(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-P1-bits.txt"), host="h1")
    assert [(m.name, m.labels, m.value) for m in metrics] == [
        ("throughput_bps", {"peer": "127.0.0.1", "direction": "send"}, 33829159571.0)
    ]


def test_it_reads_the_sum_line_in_adaptive_units(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-P3-adaptive.txt"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == pytest.approx(39.6e9)


def test_it_reads_the_final_sum_after_interval_reports(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-P2-interval.txt"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 31006843237


def test_it_reads_starred_streams_of_a_reverse_test_as_received(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-reverse-P2.txt"), host="h1")
    assert [(m.labels, m.value) for m in metrics] == [({"peer": "127.0.0.1", "direction": "receive"}, 37158077739)]


def test_it_sums_each_direction_of_a_full_duplex_test_from_its_streams(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-full-duplex-P2.txt"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 8974072594 + 12174438340
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="receive") == 10372410714 + 8636755450


def test_it_reads_enhanced_reports_of_iperf_2_0_and_2_1(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.1.8-enhanced-P2.txt"), host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 32675511147
    runs = fixture_text("iperf-2.0.x-pkb-results.txt").split("\n#\n")
    assert len(runs) == 4
    one, two = (iperf2.parse(run, host="h1") for run in runs[2:])
    assert value(one, "throughput_bps", peer="10.128.0.2", direction="send") == pytest.approx(1966e6)
    assert value(two, "throughput_bps", peer="10.128.0.2", direction="send") == pytest.approx(1970e6)


def test_it_reads_the_classic_report_of_iperf_2_0(iperf2):
    metrics = iperf2.parse(fixture_text("iperf-2.0.9-issue1069-t4.txt"), host="h1")
    assert value(metrics, "throughput_bps", peer="192.168.43.26", direction="send") == pytest.approx(19.1e9)


def test_it_reads_iperf2_output_with_crlf_line_endings(iperf2):
    text = fixture_text("iperf-2.1.8-pty-crlf.txt")
    assert "\r\n" in text
    metrics = iperf2.parse(text, host="h1")
    assert value(metrics, "throughput_bps", peer="127.0.0.1", direction="send") == 25549827324


def test_it_fails_when_iperf2_reports_a_failed_write_or_no_result(iperf2):
    with pytest.raises(ParseError, match="write failed: Broken pipe"):
        iperf2.parse(fixture_text("iperf-2.0.9-issue1069-write-failed.txt"), host="h1")
    with pytest.raises(ParseError, match="no iperf result line"):
        iperf2.parse(fixture_text("iperf-2.1.8-refused.txt"), host="h1")


# --- the helper's output: one section per peer ----------------------------------------------------------------


def test_it_labels_each_flow_of_the_helpers_output_with_its_peer(iperf3):
    metrics = iperf3.parse(fixture_text("rackbench-iperf3-all-to-all-n0.txt"), host="n0")
    assert value(metrics, "throughput_bps", host="n0", peer="n1", direction="send") == 9790625583.56676
    assert value(metrics, "throughput_bps", host="n0", peer="n2", direction="send") == 12226122931.82
    assert value(metrics, "cpu_local_percent", host="n0", peer="n2") == 13.50787073410997
    assert {m.host for m in metrics} == {"n0"}


def test_it_labels_iperf2_flows_of_the_helpers_output(iperf2):
    metrics = iperf2.parse(fixture_text("rackbench-iperf2-to-first-reverse-n1.txt"), host="n1")
    assert [(m.labels, m.value) for m in metrics] == [({"peer": "n0", "direction": "receive"}, 31583538789)]


def test_it_names_the_peer_and_the_tools_stderr_when_a_flow_failed(iperf2):
    with pytest.raises(ParseError) as caught:
        iperf2.parse(fixture_text("rackbench-iperf2-refused.txt"), host="n0")
    assert str(caught.value) == "peer n1: iperf reported: tcp connect failed: Connection refused"


def test_it_fails_the_whole_host_when_one_of_its_flows_failed(iperf3):
    good = fixture_text("rackbench-iperf3-all-to-all-n0.txt")
    header = '#rackbench-iperf {"address": "10.0.0.9", "exit_code": 0, "peer": "n9", "port": 5201, "stderr": ""}\n'
    with pytest.raises(ParseError, match="^peer n9: iperf3 reported an error: unable to connect"):
        iperf3.parse(good + header + fixture_text("iperf3-3.12-refused.json"), host="n0")


# --- aggregation, missing metrics and checks ------------------------------------------------------------------


def test_it_sums_simultaneous_flows_across_hosts(iperf3):
    per_host = iperf3.parse(fixture_text("rackbench-iperf3-all-to-all-n0.txt"), host="n0")
    per_host += iperf3.parse(fixture_text("iperf3-3.12-P4.json"), host="n1")
    aggregate = iperf3.aggregate(per_host)
    assert [(m.name, m.host, m.labels, m.unit) for m in aggregate] == [
        ("throughput_bps", "", {}, "bit/s"),
        ("retransmits", "", {}, "count"),
    ]
    assert aggregate[0].value == pytest.approx(9790625583.56676 + 12226122931.82 + 32230080872.5342)


def test_it_sums_each_direction_as_well_for_bidir(iperf3):
    per_host = iperf3.parse(fixture_text("iperf3-3.12-bidir-P2.json"), host="n0")
    per_host += iperf3.parse(fixture_text("iperf3-3.12-bidir-P2.json"), host="n2")
    aggregate = {(m.name, tuple(m.labels.items())): m.value for m in iperf3.aggregate(per_host)}
    assert aggregate[("throughput_bps", (("direction", "send"),))] == 2 * 15586933486.007875
    assert aggregate[("throughput_bps", (("direction", "receive"),))] == 2 * 9022860150.450804
    assert aggregate[("throughput_bps", ())] == pytest.approx(2 * (15586933486.007875 + 9022860150.450804))
    assert aggregate[("retransmits", ())] == 8


def test_it_reports_every_client_host_without_throughput_as_missing(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-P1.json"), host="n0")
    metrics.append(Metric(name="cpu_local_percent", value=5.0, unit="%", host="n2", labels={"peer": "n3"}))
    assert iperf3.missing(metrics, ["n0", "n2"]) == ["n2: no iperf throughput (throughput_bps) in its client output"]
    assert iperf3.missing(metrics, ["n0"]) == []


def test_it_flags_a_run_that_measured_another_direction_than_asked(iperf2):
    forward = iperf2.parse(fixture_text("iperf-2.1.8-P1-bits.txt"), host="n0")
    problems = iperf2.check({"reverse": True}, forward, {})
    assert len(problems) == 1 and problems[0].startswith("n0: iperf2 measured the send direction")
    assert iperf2.check({}, forward, {}) == []
    duplex = iperf2.parse(fixture_text("iperf-2.1.8-full-duplex-P2.txt"), host="n0")
    assert iperf2.check({"bidir": True}, duplex, {}) == []


# --- real iperf on loopback, from the built commands ----------------------------------------------------------

needs_iperf3 = pytest.mark.skipif(shutil.which("iperf3") is None, reason="iperf3 is not installed")
needs_iperf2 = pytest.mark.skipif(shutil.which("iperf") is None, reason="iperf (2) is not installed")


def free_loopback(count: int, ports: int) -> tuple[list[str], int]:
    """count distinct 127.x addresses and a base port whose next `ports` ports are free on all of them."""
    for _ in range(50):
        net = random.randrange(10, 250)
        addresses = [f"127.0.{net}.{i + 1}" for i in range(count)]
        base = random.randrange(20_000, 60_000)
        try:
            for address in addresses:
                for port in range(base, base + ports):
                    with socket.socket() as s:
                        s.bind((address, port))
        except OSError:
            continue
        return addresses, base
    pytest.fail("no free loopback ports")


def run_on_loopback(benchmark, params: dict[str, Any], count: int, tmp_path: Path) -> dict[str, str]:
    """What the runner does: services first, each polled with ready_argv; then every main at once; then stop."""
    addresses, base = free_loopback(count, count)
    run_hosts = tuple(HostInfo(name=f"n{i}", address=a) for i, a in enumerate(addresses))
    params = {**params, "port": base}
    jobs = []
    for i in range(count):
        host = context(i, run_hosts, root=str(tmp_path))
        main, service = commands(benchmark.build(params, host))
        for command, directory in ((main, Path(host.run_dir)), (service, Path(host.run_dir) / "service")):
            if command:
                directory.mkdir(parents=True, exist_ok=True)
                for name, content in command.files.items():
                    (directory / name).write_text(content)
        jobs.append((host, main, service))
    services = []
    try:
        for host, _, service in jobs:
            if service:
                directory = Path(host.run_dir) / "service"
                log = open(directory / "stdout", "w")  # noqa: SIM115  (closed with the process below)
                proc = subprocess.Popen(
                    service.argv, cwd=directory, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
                services.append((proc, log, service, directory))
        for proc, _, service, directory in services:
            deadline = time.monotonic() + 15
            while subprocess.run(service.ready_argv, cwd=directory, capture_output=True).returncode != 0:
                assert proc.poll() is None, (directory / "stdout").read_text()
                assert time.monotonic() < deadline, "the iperf servers never listened"
                time.sleep(0.1)
        mains = [
            (
                host.node,
                subprocess.Popen(
                    main.argv, cwd=host.run_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                ),
            )
            for host, main, _ in jobs
            if main
        ]
        outputs = {}
        for node, proc in mains:
            stdout, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
            outputs[node] = stdout
        for proc, *_ in services:
            assert proc.poll() is None, "a service ended before it was stopped"
    finally:
        for proc, log, *_ in services:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # as the runner stops a service
            proc.wait(timeout=10)
            log.close()
    for _, _, service, directory in services:
        stopped = subprocess.run(service.ready_argv, cwd=directory, capture_output=True)
        assert stopped.returncode == 1, "an iperf server still listens after its service was stopped"
    return outputs


@needs_iperf3
def test_it_runs_a_real_iperf3_pair_from_the_built_commands(iperf3, tmp_path):
    outputs = run_on_loopback(iperf3, {"duration": 1, "parallel": 2}, 2, tmp_path)
    assert list(outputs) == ["n0"]
    metrics = iperf3.parse(outputs["n0"], host="n0")
    assert value(metrics, "throughput_bps", host="n0", peer="n1", direction="send") > 0
    assert value(metrics, "cpu_local_percent", host="n0", peer="n1") >= 0
    assert iperf3.missing(metrics, ["n0"]) == []
    assert iperf3.check({"duration": 1}, metrics, {}) == []


@needs_iperf3
def test_it_runs_real_iperf3_all_to_all_in_both_directions(iperf3, tmp_path):
    params = {"topology": "all_to_all", "bidir": True, "duration": 1}
    outputs = run_on_loopback(iperf3, params, 3, tmp_path)
    per_host = [m for node, text in outputs.items() for m in iperf3.parse(text, host=node)]
    flows = {(m.host, m.labels["peer"], m.labels["direction"]) for m in per_host if m.name == "throughput_bps"}
    expected = {(f"n{s}", f"n{r}", d) for s in range(3) for r in range(3) if s != r for d in ("send", "receive")}
    assert flows == expected
    assert all(m.value > 0 for m in per_host if m.name == "throughput_bps")
    assert iperf3.check(params, per_host, {}) == []
    directions = {m.labels.get("direction") for m in iperf3.aggregate(per_host) if m.name == "throughput_bps"}
    assert directions == {None, "send", "receive"}


@needs_iperf3
def test_it_runs_real_iperf3_all_pairs_round_by_round(iperf3, tmp_path):
    params = {"topology": "all_pairs", "duration": 1}
    outputs = run_on_loopback(iperf3, params, 4, tmp_path)
    per_host = [m for node, text in outputs.items() for m in iperf3.parse(text, host=node)]
    flows = {
        (m.host, m.labels["peer"]): m.labels["round"]
        for m in per_host
        if m.name == "throughput_bps" and m.labels["direction"] == "send"
    }
    rounds = iperf_module.pair_rounds(4)
    assert flows == {
        (f"n{s}", f"n{r}"): number for number, pairs in enumerate(rounds) for a, b in pairs for s, r in ((a, b), (b, a))
    }
    assert all(m.value > 0 for m in per_host if m.name == "throughput_bps")
    throughput = sorted(m.value for m in per_host if m.name == "throughput_bps")
    [headline] = [m for m in iperf3.aggregate(per_host) if m.name == "throughput_bps"]
    assert headline.labels == {} and headline.value == pytest.approx((throughput[5] + throughput[6]) / 2)


@needs_iperf3
def test_it_stops_its_servers_when_the_service_is_stopped(iperf3, tmp_path):
    addresses, base = free_loopback(2, 2)
    run_hosts = tuple(HostInfo(name=f"n{i}", address=a) for i, a in enumerate(addresses))
    _, service = commands(iperf3.build({"topology": "all_to_all", "port": base}, context(0, run_hosts)))
    for name, content in service.files.items():
        (tmp_path / name).write_text(content)
    proc = subprocess.Popen(service.argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while subprocess.run(service.ready_argv, cwd=tmp_path, capture_output=True).returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        proc.terminate()  # the helper alone, not its process group: it must stop its servers itself
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while subprocess.run(service.ready_argv, cwd=tmp_path, capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "an iperf3 server outlived its helper"
        time.sleep(0.1)


@needs_iperf2
def test_it_runs_a_real_iperf2_to_first_test_in_reverse(iperf2, tmp_path):
    params = {"topology": "to_first", "reverse": True, "duration": 1, "parallel": 2}
    outputs = run_on_loopback(iperf2, params, 3, tmp_path)
    assert sorted(outputs) == ["n1", "n2"]
    for node, text in outputs.items():
        metrics = iperf2.parse(text, host=node)
        assert value(metrics, "throughput_bps", host=node, peer="n0", direction="receive") > 0
    per_host = [m for node, text in outputs.items() for m in iperf2.parse(text, host=node)]
    assert iperf2.check(params, per_host, {}) == []


# --- UDP: the receiver's throughput, jitter and loss ---------------------------------------------------------------
# Real outputs (fixtures/iperf/SOURCES.md): iperf3 3.12 and iperf 2.1.8 generated here on loopback, iperf3 3.1.3 from
# a public repository's README, iperf 2.0.x from PerfKitBenchmarker's test data.

UDP = {"peer": "127.0.0.1", "direction": "send"}


def test_it_reads_iperf3_udp_as_the_receiver_counted_it(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-udp-P1.json"), host="h1")
    assert value(metrics, "throughput_bps", **UDP) == 100113178.79986963  # sum_received, not sum_sent's 100128594
    assert value(metrics, "jitter_ms", **UDP) == 0.527155870653616
    assert (value(metrics, "lost_packets", **UDP), value(metrics, "packets", **UDP)) == (0, 382)
    assert value(metrics, "lost_percent", **UDP) == 0


def test_it_reads_iperf3_udp_loss_of_parallel_streams_and_reverse(iperf3):
    metrics = iperf3.parse(fixture_text("iperf3-3.12-udp-P2.json"), host="h1")
    assert value(metrics, "throughput_bps", **UDP) == 398895411.0095779
    assert (value(metrics, "lost_packets", **UDP), value(metrics, "packets", **UDP)) == (4, 1526)
    assert value(metrics, "lost_percent", **UDP) == pytest.approx(0.2621231979030144)
    reverse = iperf3.parse(fixture_text("iperf3-3.12-udp-reverse-P1.json"), host="h1")
    assert value(reverse, "jitter_ms", peer="127.0.0.1", direction="receive") == 0.0031069569626516057


def test_it_reads_the_older_iperf3_udp_layout_from_the_receivers_counts(iperf3):
    """iperf3 3.1.3: end.sum only, the sender's 834711189 bit/s with the receiver's 69 of 9996 datagrams lost."""
    metrics = iperf3.parse(fixture_text("iperf3-3.1.3-udp-selfhealing-readme.json"), host="h1")
    udp = {"peer": "10.101.106.254", "direction": "send"}
    assert value(metrics, "throughput_bps", **udp) == pytest.approx((9996 - 69) * 8192 * 8 / 0.785134)
    assert value(metrics, "jitter_ms", **udp) == 0.092
    assert value(metrics, "lost_percent", **udp) == pytest.approx(100 * 69 / 9996)


def test_it_reads_iperf2_udp_from_the_server_reports(iperf2):
    one = iperf2.parse(fixture_text("iperf-2.1.8-udp-P1-bits.txt"), host="h1")
    assert value(one, "throughput_bps", **UDP) == 104870556  # the server's report, not the client's 104883454
    assert (value(one, "lost_packets", **UDP), value(one, "packets", **UDP)) == (0, 8919)
    two = iperf2.parse(fixture_text("iperf-2.1.8-udp-P2-bits.txt"), host="h1")
    assert value(two, "throughput_bps", **UDP) == 104907813 + 104891519  # both streams' reports, not the [SUM]
    assert (value(two, "lost_packets", **UDP), value(two, "packets", **UDP)) == (1, 8920 + 8919)
    adaptive = iperf2.parse(fixture_text("iperf-2.1.8-udp-P1-adaptive.txt"), host="h1")
    assert value(adaptive, "throughput_bps", **UDP) == 105e6


def test_it_reads_iperf_2_0_udp_server_reports(iperf2):
    runs = fixture_text("iperf-2.0.x-pkb-results.txt").split("\n#\n")
    one, two = (iperf2.parse(run, host="h1") for run in runs[:2])
    udp = {"peer": "10.128.0.2", "direction": "send"}
    assert value(one, "throughput_bps", **udp) == pytest.approx(1.05e6)
    assert (value(one, "jitter_ms", **udp), value(one, "packets", **udp)) == (0.017, 5350)
    assert value(two, "throughput_bps", **udp) == pytest.approx(2.10e6)
    assert (value(two, "jitter_ms", **udp), value(two, "lost_packets", **udp)) == (0.039, 1)


def test_it_refuses_udp_output_without_the_receivers_report(iperf2):
    text = fixture_text("iperf-2.1.8-udp-P1-bits.txt").split("[  1] Server Report:")[0]
    with pytest.raises(ParseError, match="no UDP Server Report"):
        iperf2.parse(text, host="h1")


def test_it_aggregates_udp_loss_as_a_ratio_of_the_sums_and_jitter_as_the_worst(iperf3):
    per_host = iperf3.parse(fixture_text("iperf3-3.12-udp-P1.json"), host="h1")
    per_host += iperf3.parse(fixture_text("iperf3-3.12-udp-P2.json"), host="h3")
    total = {m.name: m.value for m in iperf3.aggregate(per_host) if not m.labels}
    assert total["lost_packets"] == 4 and total["packets"] == 382 + 1526
    assert total["lost_percent"] == pytest.approx(100 * 4 / (382 + 1526))
    assert total["jitter_ms"] == 0.527155870653616


def test_it_passes_udp_to_clients_and_to_iperf2_servers(iperf2, iperf3):
    run_hosts = hosts(2)
    main, _ = commands(iperf3.build({"udp": True, "bitrate": "1G"}, context(0, run_hosts)))
    assert plan(main, "clients.json")["clients"][0]["argv"][-3:] == ["-u", "-b", "1G"]
    _, service = commands(iperf2.build({"udp": "true"}, context(1, run_hosts)))
    servers = plan(service, "servers.json")
    assert servers["servers"][0]["argv"][-1] == "-u" and servers["udp"] is True
    with pytest.raises(ParamError) as caught:
        iperf2.validate({"udp": True, "reverse": True})
    assert caught.value.field == "udp"


@needs_iperf3
def test_it_runs_a_real_iperf3_udp_pair_from_the_built_commands(iperf3, tmp_path):
    outputs = run_on_loopback(iperf3, {"udp": True, "bitrate": "50M", "duration": 1}, 2, tmp_path)
    metrics = iperf3.parse(outputs["n0"], host="n0")
    assert value(metrics, "throughput_bps", host="n0", peer="n1", direction="send") > 10e6
    assert value(metrics, "packets", host="n0", peer="n1", direction="send") > 0


@needs_iperf2
def test_it_runs_a_real_iperf2_udp_pair_from_the_built_commands(iperf2, tmp_path):
    outputs = run_on_loopback(iperf2, {"udp": True, "bitrate": "50M", "duration": 1}, 2, tmp_path)
    metrics = iperf2.parse(outputs["n0"], host="n0")
    assert value(metrics, "throughput_bps", host="n0", peer="n1", direction="send") > 10e6
    assert value(metrics, "jitter_ms", host="n0", peer="n1", direction="send") >= 0


def test_it_reads_interface_addresses_given_as_text_in_a_campaign_file(iperf3):
    params = {"interface_address": "n0=10.200.10.13, n1=10.200.22.13"}
    main, _ = commands(iperf3.build(params, context(0, hosts(2))))
    argv = plan(main, "clients.json")["clients"][0]["argv"]
    assert argv[argv.index("-c") + 1] == "10.200.22.13" and argv[argv.index("-B") + 1] == "10.200.10.13"
    with pytest.raises(ParamError) as caught:
        iperf3.validate({"interface_address": "n0:10.0.0.1"})
    assert caught.value.field == "interface_address"
