"""The nccl-tests plug-in: parameters, the mpirun command, parsing of real nccl-tests outputs (see
fixtures/nccl/SOURCES.md), missing metrics, and the data and transport checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks.base import HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark
from plugins.benchmarks.nccl import Transport, transports

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
HOSTS = (HostInfo(name="dgx1", address="a", slots=8), HostInfo(name="dgx2", address="b", slots=8))
ENV = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "bond0"}


def host(index: int = 0, env: dict[str, str] | None = None, hosts: tuple[HostInfo, ...] = HOSTS) -> HostContext:
    return HostContext(
        node=hosts[index].name,
        index=index,
        run_dir=f"/srv/rackbench/runs/3/{hosts[index].name}",
        data_dir="/scratch",
        hosts=hosts,
        env=ENV if env is None else env,
    )


@pytest.fixture
def nccl():
    return get_benchmark("nccl")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_bytes().decode()  # bytes first: keeps line endings as they are


def value(metrics: list[Metric], name: str, **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == "" and m.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def sizes(metrics: list[Metric]) -> list[int]:
    return sorted({m.labels["size_bytes"] for m in metrics if "size_bytes" in m.labels})


def run_level(metrics: list[Metric]) -> dict[str, float]:
    return {m.name: m.value for m in metrics if not m.labels}


def connections(metrics: list[Metric]) -> dict[str, float]:
    return {m.labels["transport"]: m.value for m in metrics if m.name == "transport_connections"}


# --- registration and metric specs ---------------------------------------------------------------------------


def test_it_is_registered_as_nccl(nccl):
    assert nccl.kind == "nccl"
    assert nccl.required_metrics == ("busbw_avg_gbps", "busbw_max_gbps")
    assert all(nccl.spec(name) for name in nccl.required_metrics)


def test_it_declares_units_and_directions_of_its_metrics(nccl):
    assert (nccl.spec("busbw_gbps").unit, nccl.spec("busbw_gbps").higher_is_better) == ("GB/s", True)
    assert (nccl.spec("algbw_gbps").unit, nccl.spec("algbw_gbps").higher_is_better) == ("GB/s", True)
    assert (nccl.spec("time_us").unit, nccl.spec("time_us").higher_is_better) == ("us", False)
    assert nccl.spec("busbw_avg_gbps").unit == nccl.spec("busbw_max_gbps").unit == "GB/s"
    assert nccl.spec("wrong").higher_is_better is False
    assert nccl.spec("out_of_bounds").higher_is_better is False


def test_it_gives_every_parsed_metric_its_declared_unit_and_the_run_as_host(nccl):
    for path in sorted(FIXTURES.glob("*.*")):
        if path.suffix not in (".txt", ".log"):
            continue
        try:
            metrics = nccl.parse(fixture_text(path.name), host="dgx1")
        except ParseError:
            continue
        for metric in metrics:
            assert metric.unit == nccl.spec(metric.name).unit, (path.name, metric)
            assert metric.host == "", (path.name, metric)


# --- parsing: every layout -----------------------------------------------------------------------------------


def test_it_reads_the_2019_layout_with_an_error_column(nccl):
    metrics = nccl.parse(fixture_text("pkb-2019-nccl2.4.6-allreduce-2node-16gpu.txt"))
    assert sizes(metrics) == [8 * 2**i for i in range(31)]
    assert value(metrics, "time_us", size_bytes=8, placement="out-of-place") == 58.10
    assert value(metrics, "time_us", size_bytes=8589934592, placement="in-place") == 1623801
    assert value(metrics, "algbw_gbps", size_bytes=4294967296, placement="out-of-place") == 8.43
    assert value(metrics, "busbw_gbps", size_bytes=4294967296, placement="in-place") == 15.80
    # "error" is the largest deviation (4e-07), not a count: no #wrong metric, the out-of-bounds count says it all
    assert not [m for m in metrics if m.name == "wrong"]
    assert run_level(metrics) == {
        "busbw_max_gbps": 15.80,
        "busbw_avg_gbps": 5.16186,
        "out_of_bounds": 0,
        "ranks": 16,
        "nodes": 2,
    }


def test_it_reads_a_header_and_footer_without_hash_marks(nccl):
    metrics = nccl.parse(fixture_text("issue-nccl-tests-37-allgather-no-hash-marks.txt"))
    assert sizes(metrics) == [4294967296]
    assert value(metrics, "time_us", size_bytes=4294967296, placement="out-of-place") == 29122
    assert value(metrics, "busbw_gbps", size_bytes=4294967296, placement="in-place") == 128.84
    assert run_level(metrics) == {"busbw_max_gbps": 129.05, "busbw_avg_gbps": 128.942, "out_of_bounds": 2}


def test_it_reads_the_2021_layout_without_validation_and_skips_rows_of_zero_bytes(nccl):
    metrics = nccl.parse(fixture_text("superbench-allreduce-a100-8gpu-error-column.log"))
    assert sizes(metrics) == [4 * 2**i for i in range(32)]  # the two rows of 0 bytes are left out
    assert value(metrics, "time_us", size_bytes=4, placement="out-of-place") == 34.73
    assert value(metrics, "busbw_gbps", size_bytes=8589934592, placement="out-of-place") == 235.26
    assert value(metrics, "time_us", size_bytes=8589934592, placement="in-place") == 63959
    assert run_level(metrics) == {
        "busbw_max_gbps": 235.26,
        "busbw_avg_gbps": 68.4048,
        "out_of_bounds": 0,
        "ranks": 8,
        "nodes": 1,
    }


def test_it_reads_alltoall_rows_whose_redop_is_blank(nccl):
    metrics = nccl.parse(fixture_text("superbench-alltoall-a100-8gpu-blank-redop.log"))
    assert sizes(metrics) == [32 * 2**i for i in range(29)]
    assert value(metrics, "algbw_gbps", size_bytes=32, placement="out-of-place") == 0.00
    assert value(metrics, "time_us", size_bytes=32, placement="out-of-place") == 89.00
    assert value(metrics, "busbw_gbps", size_bytes=8589934592, placement="out-of-place") == 224.31
    assert value(metrics, "busbw_gbps", size_bytes=8589934592, placement="in-place") == 226.16
    assert run_level(metrics)["busbw_max_gbps"] == 226.16
    assert run_level(metrics)["busbw_avg_gbps"] == 58.6481


def test_it_reads_the_2_13_layout_with_root_and_wrong_columns(nccl):
    metrics = nccl.parse(fixture_text("a3mega-h100-2node-16gpu-allreduce.txt"))
    assert sizes(metrics) == [8 * 2**i for i in range(31)]
    assert value(metrics, "time_us", size_bytes=8589934592, placement="out-of-place") == 47535
    assert value(metrics, "algbw_gbps", size_bytes=8589934592, placement="out-of-place") == 180.71
    assert value(metrics, "busbw_gbps", size_bytes=8589934592, placement="in-place") == 337.35
    assert value(metrics, "wrong", size_bytes=8589934592, placement="in-place") == 0
    assert run_level(metrics) == {
        "busbw_max_gbps": 338.82,
        "wrong": 0,
        "busbw_avg_gbps": 70.742,
        "out_of_bounds": 0,
        "ranks": 16,
        "nodes": 2,
    }


def test_it_reads_not_available_wrong_counts_as_absent(nccl):
    metrics = nccl.parse(fixture_text("pkb-2022-allreduce-2node-k80-no-validation.txt"))
    assert sizes(metrics) == [1048576 * 2**i for i in range(11)]
    assert value(metrics, "time_us", size_bytes=1073741824, placement="out-of-place") == 1752724
    assert not [m for m in metrics if m.name == "wrong"]
    assert run_level(metrics)["busbw_max_gbps"] == 0.63
    assert run_level(metrics)["busbw_avg_gbps"] == 0.565546

    single = nccl.parse(fixture_text("issue-nccl-tests-287-alltoall-rtx5090-1gpu.txt"))
    assert value(single, "algbw_gbps", size_bytes=33554432, placement="in-place") == 43046.10
    assert value(single, "wrong", size_bytes=33554432, placement="out-of-place") == 0
    assert [m.labels["placement"] for m in single if m.name == "wrong" and m.labels] == ["out-of-place"]
    assert run_level(single)["busbw_avg_gbps"] == 0


def test_it_reads_the_2_17_layout_and_its_wrong_elements(nccl):
    metrics = nccl.parse(fixture_text("issue-nccl-tests-369-gh200-2node-wrong-elements.txt"))
    assert sizes(metrics) == [8 * 2**i for i in range(25)]
    assert value(metrics, "wrong", size_bytes=1048576, placement="out-of-place") == 96
    assert value(metrics, "wrong", size_bytes=1048576, placement="in-place") == 32
    assert value(metrics, "time_us", size_bytes=134217728, placement="in-place") == 5886.67
    assert run_level(metrics) == {
        "busbw_max_gbps": 22.87,
        "wrong": 128,
        "busbw_avg_gbps": 4.79995,
        "out_of_bounds": 4,
        "ranks": 2,
        "nodes": 2,
    }


def test_it_reads_the_rows_of_a_2_20_run_that_was_cut_off(nccl):
    metrics = nccl.parse(fixture_text("pr-dgx-spark-playbooks-103-nccl-tests-2.20-cut-off.txt"))
    assert sizes(metrics) == [8192, 16384, 32768, 65536]  # the last line holds only "131072"
    assert value(metrics, "busbw_gbps", size_bytes=65536, placement="in-place") == 1.01
    assert "busbw_avg_gbps" not in run_level(metrics)
    assert nccl.missing(metrics, ["spark-d708"]) == [
        "nccl-tests did not finish (its last line, '# Avg bus bandwidth', is missing): "
        "expected metric busbw_avg_gbps is missing"
    ]


# --- parsing: noise ------------------------------------------------------------------------------------------


def test_it_strips_mpirun_tag_output_prefixes_and_reads_interleaved_nccl_lines(nccl):
    metrics = nccl.parse(fixture_text("aws-efa-eks-p4d-2node-tag-output-gdrdma.txt"))
    assert sizes(metrics) == [8 * 2**i for i in range(30)]
    assert value(metrics, "time_us", size_bytes=8, placement="out-of-place") == 179.1
    assert value(metrics, "busbw_gbps", size_bytes=4294967296, placement="out-of-place") == 43.81
    assert run_level(metrics) == {
        "busbw_max_gbps": 43.81,
        "busbw_avg_gbps": 11.2432,
        "out_of_bounds": 0,
        "ranks": 16,
        "nodes": 2,
    }
    assert connections(metrics) == {"NET/AWS Libfabric/GDRDMA": 64, "P2P/IPC": 256}


def test_it_reads_tagged_output_after_ssh_warnings_and_zero_byte_rows(nccl):
    metrics = nccl.parse(fixture_text("eks-blueprints-g4dn-efa-2node-tag-output.txt"))
    assert sizes(metrics) == [4 * 2**i for i in range(29)]
    assert value(metrics, "time_us", size_bytes=1073741824, placement="out-of-place") == 344981
    assert value(metrics, "busbw_gbps", size_bytes=268435456, placement="out-of-place") == 3.15
    assert run_level(metrics)["busbw_avg_gbps"] == 1.15327
    assert connections(metrics) == {"NET/AWS Libfabric": 8}


def test_it_reads_indented_tagged_output(nccl):
    metrics = nccl.parse(fixture_text("eks-blueprints-p5-efa-tag-output-indented.txt"))
    assert sizes(metrics) == [8 * 2**i for i in range(32)]
    assert value(metrics, "busbw_gbps", size_bytes=17179869184, placement="in-place") == 482.82
    assert run_level(metrics) == {"busbw_max_gbps": 482.82, "wrong": 0, "busbw_avg_gbps": 123.343, "out_of_bounds": 0}


def test_it_puts_back_rows_cut_into_pieces_by_nccl_log_lines(nccl):
    metrics = nccl.parse(fixture_text("nccl2.27-a100-2gpu-debug-coll-split-rows.log"))
    assert sizes(metrics) == [8388608 * 2**i for i in range(11)]
    # "     8388608 ... sum      -1mew0:64904:64904 [1] NCCL INFO ...", then "    83.33  100.66  100.66      0mew0:...",
    # then "    80.98  103.59  103.59      0" many lines later
    assert value(metrics, "time_us", size_bytes=8388608, placement="out-of-place") == 83.33
    assert value(metrics, "busbw_gbps", size_bytes=8388608, placement="out-of-place") == 100.66
    assert value(metrics, "time_us", size_bytes=8388608, placement="in-place") == 80.98
    assert value(metrics, "busbw_gbps", size_bytes=8589934592, placement="in-place") == 216.61
    assert run_level(metrics) == {
        "busbw_max_gbps": 216.61,
        "wrong": 0,
        "busbw_avg_gbps": 178.078,
        "out_of_bounds": 0,
        "ranks": 2,
        "nodes": 1,
    }
    assert connections(metrics) == {"P2P/direct pointer": 48}


def test_it_reads_the_same_values_through_crlf_and_terminal_escapes(nccl):
    text = fixture_text("eks-blueprints-g4dn-efa-2node-tag-output.txt")
    noisy = "\x1b[0m" + text.replace("\n", "\r\n").replace("float", "\x1b[1mfloat\x1b[0m").replace("# Avg", "\x07# Avg")
    assert nccl.parse(noisy) == nccl.parse(text)


def test_it_keeps_the_complete_rows_of_an_interrupted_run_and_reports_the_missing_end(nccl):
    text = fixture_text("a3mega-h100-2node-16gpu-allreduce.txt")
    cut = text[: text.index("  2147483648     536870912") + 40]  # killed in the middle of a row
    metrics = nccl.parse(cut)
    assert sizes(metrics) == [8 * 2**i for i in range(28)]
    assert run_level(metrics)["busbw_max_gbps"] == 298.82
    assert nccl.missing(metrics, ["dgx1", "dgx2"]) == [
        "nccl-tests did not finish (its last line, '# Avg bus bandwidth', is missing): "
        "expected metric busbw_avg_gbps is missing"
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("issue-nccl-tests-369-gh200-device-busy.txt", "Test CUDA failure common.cu:1304 'CUDA-capable device(s)"),
        ("issue-nccl-tests-322-failure-mid-table.txt", "Test NCCL failure common.cu:1204 'unhandled cuda error"),
        ("issue-nccl-tests-107-non-mpi-build-under-mpirun.txt", "built without MPI support (make MPI=1)"),
        ("issue-nccl-tests-166-socket-and-shm.txt", "no '#  size  count  type ...' table header"),
    ],
)
def test_it_refuses_output_without_results_and_says_why(nccl, name, message):
    with pytest.raises(ParseError, match=r"\S") as error:
        nccl.parse(fixture_text(name))
    assert message in str(error.value)


def test_it_refuses_empty_output(nccl):
    with pytest.raises(ParseError):
        nccl.parse("")


# --- missing metrics -----------------------------------------------------------------------------------------


def test_it_requires_the_run_metrics_once_for_the_whole_run_not_per_host(nccl):
    metrics = nccl.parse(fixture_text("a3mega-h100-2node-16gpu-allreduce.txt"))
    assert nccl.missing(metrics, ["dgx1", "dgx2"]) == []
    assert nccl.missing([], ["dgx1"]) == [
        "nccl-tests did not finish (its last line, '# Avg bus bandwidth', is missing): "
        "expected metric busbw_avg_gbps is missing",
        "nccl-tests printed no result rows: expected metric busbw_max_gbps is missing",
    ]


# --- checks: data ---------------------------------------------------------------------------------------------


def test_it_fails_a_run_with_wrong_elements_or_out_of_bounds_values(nccl):
    text = fixture_text("issue-nccl-tests-369-gh200-2node-wrong-elements.txt")
    assert nccl.check({}, nccl.parse(text), {"gpu-1-1": text}) == [
        "nccl-tests found 128 wrong elements (data corruption) at message sizes 1048576 bytes",
        "nccl-tests reported 4 out-of-bounds results (FAILED)",
    ]
    old = fixture_text("issue-nccl-tests-37-allgather-no-hash-marks.txt")
    assert nccl.check({}, nccl.parse(old), {"n": old}) == ["nccl-tests reported 2 out-of-bounds results (FAILED)"]


def test_it_passes_a_clean_run(nccl):
    text = fixture_text("a3mega-h100-2node-16gpu-allreduce.txt")
    assert nccl.check({}, nccl.parse(text), {"dgx1": text}) == []


def test_it_fails_a_run_where_nccl_tests_replaced_an_unknown_datatype(nccl):
    text = fixture_text("a3mega-h100-2node-16gpu-allreduce.txt")
    # nccl-tests' message for a name it does not know (src/common.h, ncclstringtotype), e.g. from an older build
    logs = {"dgx1": "invalid type bfloat16, defaulting to float .. \n" + text}
    assert nccl.check({}, nccl.parse(text), logs) == [
        "nccl-tests ignored a parameter: invalid type bfloat16, defaulting to float"
    ]


# --- checks: transport ----------------------------------------------------------------------------------------


def test_it_counts_the_transports_of_every_nccl_log_format():
    seed_000 = (
        "dgx2-3:25000:27099 [8] NCCL INFO Ring 00 : 24 -> 40 [receive] via NET/IB/0/GDRDMA\n"
        "dgx2-3:25000:27099 [8] NCCL INFO Ring 00 : 40 -> 24 [send] via NET/IB/0/GDRDMA\n"
    )
    assert transports(seed_000.splitlines()) == {Transport("NET", "IB", True): 2}
    expected = {
        "issue-nccl-226-ring-format-socket.txt": {"NET/Socket": 15},  # the 16th line is cut before "via"
        "issue-nccl-tests-133-ib-gdrdma-p2p-read.txt": {"NET/IB/GDRDMA": 2, "P2P/direct pointer": 10},
        "issue-nccl-tests-128-ib-without-gdrdma.txt": {"NET/IB": 4, "P2P/IPC": 8},
        "issue-nccl-tests-166-socket-and-shm.txt": {"NET/Socket": 13, "NET/Sock": 1, "SHM": 1},
        "issue-nccl-1357-ibext-gdrdma-p2p-cumem.txt": {"NET/IBext/GDRDMA": 5, "P2P/CUMEM": 10},
    }
    for name, counts in expected.items():
        found = transports(fixture_text(name).splitlines())
        assert {str(t): n for t, n in found.items()} == counts, name


def test_it_reads_nccls_pxn_shared_and_pci_forms_of_a_network_transport():
    # NCCL's format strings (src/transport/net.cc): "via NET/%s/%d(%d)%s%s%s" with "/GDRDMA", "(PCI)", "/Shared"
    lines = [
        "h:1:2 [3] NCCL INFO Channel 00/0 : 3[3] -> 8[0] [send] via NET/IB/0(1)/GDRDMA/Shared",
        "h:1:2 [3] NCCL INFO Channel 01/0 : 3[3] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)",
        "h:1:2 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via direct shared memory",
    ]
    assert {str(t): n for t, n in transports(lines).items()} == {"NET/IB/GDRDMA": 2, "SHM": 1}


def logs_of(name: str) -> dict[str, str]:
    return {"dgx1": fixture_text(name)}


@pytest.mark.parametrize(
    ("expect", "name"),
    [
        ("NET/IB/GDRDMA", "issue-nccl-tests-133-ib-gdrdma-p2p-read.txt"),
        ("NET/IB/x/GDRDMA", "issue-nccl-tests-133-ib-gdrdma-p2p-read.txt"),
        ("NET/IB/0/GDRDMA", "issue-nccl-1357-ibext-gdrdma-p2p-cumem.txt"),
        ("NET/IB", "issue-nccl-tests-128-ib-without-gdrdma.txt"),
        ("NET", "issue-nccl-226-ring-format-socket.txt"),
        ("NET/Socket", "issue-nccl-226-ring-format-socket.txt"),
        ("NET/AWS Libfabric/GDRDMA", "aws-efa-eks-p4d-2node-tag-output-gdrdma.txt"),
        ("P2P", "aws-efa-eks-p4d-2node-tag-output-gdrdma.txt"),
        ("P2P/CUMEM", "issue-nccl-1357-ibext-gdrdma-p2p-cumem.txt"),
        ("SHM", "issue-nccl-tests-166-socket-and-shm.txt"),
    ],
)
def test_it_passes_the_transport_check_when_nccl_used_the_expected_transport(nccl, expect, name):
    assert nccl.check({"expect_transport": expect}, [], logs_of(name)) == []


@pytest.mark.parametrize(
    ("expect", "name", "problem"),
    [
        (
            "NET/IB/GDRDMA",
            "issue-nccl-tests-166-socket-and-shm.txt",
            "expected NET/IB/.../GDRDMA between nodes, got NET/Socket on 13 of 14 connections, NET/Sock on 1 of 14 "
            "connections (NCCL_IB_DISABLE=1, or no usable HCA in NCCL_IB_HCA?)",
        ),
        (
            "NET/IB/GDRDMA",
            "issue-nccl-tests-128-ib-without-gdrdma.txt",
            "expected NET/IB/.../GDRDMA between nodes, got NET/IB on 4 of 4 connections (GPUDirect RDMA not used: "
            "nvidia-peermem not loaded, or NCCL_NET_GDR_LEVEL too low?)",
        ),
        (
            "NET/AWS Libfabric/GDRDMA",
            "eks-blueprints-g4dn-efa-2node-tag-output.txt",
            "expected NET/AWS Libfabric/.../GDRDMA between nodes, got NET/AWS Libfabric on 8 of 8 connections "
            "(GPUDirect RDMA not used: nvidia-peermem not loaded, or NCCL_NET_GDR_LEVEL too low?)",
        ),
        (
            "NET/Socket",
            "issue-nccl-tests-133-ib-gdrdma-p2p-read.txt",
            "expected NET/Socket between nodes, got NET/IB/GDRDMA on 2 of 2 connections",
        ),
        (
            "P2P",
            "issue-nccl-tests-166-socket-and-shm.txt",
            "expected P2P within nodes, got SHM on 1 of 1 connections "
            "(NCCL_P2P_DISABLE=1, or peer-to-peer not available between these GPUs?)",
        ),
        (
            "NET/IB/GDRDMA",
            "nccl2.27-a100-2gpu-debug-coll-split-rows.log",
            "expected NET/IB/.../GDRDMA between nodes, but NCCL reported no connection between nodes "
            "(a single-node run?)",
        ),
        (
            "NET/IB/GDRDMA",
            "a3mega-h100-2node-16gpu-allreduce.txt",
            "expected NET/IB/.../GDRDMA between nodes, but the output holds none of NCCL's transport lines "
            "(NCCL_DEBUG=INFO not set, or NCCL failed before connecting)",
        ),
    ],
)
def test_it_fails_the_transport_check_when_nccl_used_another_transport(nccl, expect, name, problem):
    assert nccl.check({"expect_transport": expect}, [], logs_of(name)) == [problem]


def test_it_finds_the_transport_lines_on_stderr_too(nccl):
    lines = fixture_text("issue-nccl-tests-166-socket-and-shm.txt").splitlines()
    stdout = fixture_text("a3mega-h100-2node-16gpu-allreduce.txt")
    logs = {"dgx1": stdout + "\n" + "\n".join(lines)}  # the runner passes stdout, a newline, then stderr
    problems = nccl.check({"expect_transport": "NET/IB/GDRDMA"}, nccl.parse(stdout), logs)
    assert problems and problems[0].startswith("expected NET/IB/.../GDRDMA between nodes, got NET/Socket")


# --- parameters ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"binary": "all_reduce"}, "binary"),
        ({"binary": "../../bin/sh"}, "binary"),
        ({"binary_dir": "relative/build"}, "binary_dir"),
        ({"binary_dir": "/opt/nccl tests/build"}, "binary_dir"),
        ({"binary_dir": "/opt/x;touch /tmp/pwned"}, "binary_dir"),
        ({"binary_dir": "/opt/$(id)"}, "binary_dir"),
        ({"binary_dir": "/opt/../etc"}, "binary_dir"),
        ({"binary_suffix": "_mpi; id"}, "binary_suffix"),
        ({"min_bytes": "8X"}, "min_bytes"),
        ({"min_bytes": -8}, "min_bytes"),
        ({"min_bytes": True}, "min_bytes"),
        ({"max_bytes": "2T"}, "max_bytes"),
        ({"min_bytes": "1G", "max_bytes": "1M"}, "max_bytes"),
        ({"step_factor": 1}, "step_factor"),
        ({"step_factor": 2, "step_bytes": 1024}, "step_bytes"),
        ({"gpus_per_rank": 0}, "gpus_per_rank"),
        ({"gpus_per_rank": "2; id"}, "gpus_per_rank"),
        ({"iters": 0}, "iters"),
        ({"warmup_iters": -1}, "warmup_iters"),
        ({"check": 1001}, "check"),
        ({"op": "all"}, "op"),
        ({"op": "sum -o max"}, "op"),
        ({"datatype": "fp16"}, "datatype"),
        ({"datatype": "all"}, "datatype"),
        ({"root": -1}, "root"),
        ({"expect_transport": "IB"}, "expect_transport"),
        ({"expect_transport": "NET/GDRDMA"}, "expect_transport"),
        ({"expect_transport": "SHM/direct"}, "expect_transport"),
        ({"expect_transport": ""}, "expect_transport"),
        ({"mpi_btl": "tcp self"}, "mpi_btl"),
        ({"mpi_slots": 0}, "mpi_slots"),
        ({"nthreads": 2}, "nthreads"),
        ({"extra_args": "-G 1"}, "extra_args"),
    ],
)
def test_it_names_the_parameter_it_refuses(nccl, params, field):
    with pytest.raises(ParamError) as error:
        nccl.validate(params)
    assert error.value.field == field


def test_it_accepts_a_campaign_of_the_seed_papers(nccl):
    nccl.validate(
        {
            "binary": "all_reduce_perf",
            "min_bytes": "8",
            "max_bytes": "8G",
            "step_factor": 2,
            "gpus_per_rank": 1,
            "iters": 20,
            "warmup_iters": 5,
            "check": True,
            "op": "sum",
            "datatype": "float",
            "expect_transport": "NET/IB/x/GDRDMA",
            "mpi_ssh_port": 2222,
            "mpi_btl": "^openib",
        }
    )


# --- the command -----------------------------------------------------------------------------------------------


def test_it_runs_mpirun_on_the_primary_host_with_one_rank_per_gpu(nccl):
    command = nccl.build({}, host())
    assert command.argv == [
        "mpirun",
        "-n",
        "16",
        "--allow-run-as-root",
        "--host",
        "a:8,b:8",
        "--report-bindings",
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "-x",
        "LD_LIBRARY_PATH",
        "-x",
        "PATH",
        "-x",
        "NCCL_IB_DISABLE=1",
        "-x",
        "NCCL_SOCKET_IFNAME=bond0",
        "/opt/nccl-tests/build/all_reduce_perf",
        "-b",
        "8",
        "-e",
        "134217728",
        "-f",
        "2",
        "-g",
        "1",
    ]
    assert command.files == {}


def test_it_runs_nothing_on_the_other_hosts(nccl):
    assert nccl.build({}, host(index=1)) is None


def test_it_passes_every_option_as_its_own_argument(nccl):
    params = {
        "binary": "reduce_scatter_perf",
        "binary_dir": "/usr/local/nccl-tests/build/",
        "binary_suffix": "_mpi",
        "min_bytes": "1K",
        "max_bytes": "1G",
        "step_bytes": 1048576,
        "iters": 50,
        "warmup_iters": 10,
        "check": 0,
        "op": "avg",
        "datatype": "bfloat16",
        "root": 0,
    }
    argv = nccl.build(params, host()).argv
    start = argv.index("/usr/local/nccl-tests/build/reduce_scatter_perf_mpi")
    assert argv[start + 1 :] == [
        *("-b", "1024", "-e", "1073741824", "-i", "1048576", "-g", "1", "-n", "50", "-w", "10", "-c", "0"),
        *("-o", "avg", "-d", "bfloat16", "-r", "0"),
    ]


def test_it_gives_each_rank_gpus_per_rank_gpus(nccl):
    argv = nccl.build({"gpus_per_rank": 4}, host()).argv
    assert argv[argv.index("--host") + 1] == "a:2,b:2"
    assert argv[argv.index("-n") + 1] == "4"
    assert argv[argv.index("-g") + 1] == "4"
    odd = (HostInfo(name="odd", address="c", slots=6),)
    with pytest.raises(ParamError) as error:
        nccl.build({"gpus_per_rank": 4}, host(hosts=odd))
    assert error.value.field == "gpus_per_rank"


def test_it_lets_mpi_slots_set_the_ranks_per_host(nccl):
    argv = nccl.build({"mpi_slots": 1, "gpus_per_rank": 8, "mpi_ssh_port": 2222}, host()).argv
    assert argv[argv.index("--host") + 1] == "a:1,b:1"
    assert argv[argv.index("-n") + 1] == "2"
    at = argv.index("plm_rsh_args")
    assert argv[at - 1 : at + 2] == ["-mca", "plm_rsh_args", "-p 2222"]


def test_it_turns_nccl_info_on_when_the_transport_is_checked(nccl):
    argv = nccl.build({"expect_transport": "NET/IB/GDRDMA"}, host()).argv
    assert "NCCL_DEBUG=INFO" in argv
    assert "NCCL_IB_DISABLE=1" in argv
    assert "NCCL_DEBUG=INFO" not in nccl.build({}, host()).argv


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_DEBUG": "WARN"},
        {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"},
        {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL"},
        {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^INIT"},
    ],
)
def test_it_refuses_a_transport_check_the_campaigns_nccl_settings_would_blind(nccl, env):
    with pytest.raises(ParamError) as error:
        nccl.build({"expect_transport": "NET/IB"}, host(env=env))
    assert error.value.field == "expect_transport"


def test_it_keeps_a_campaigns_own_nccl_debug_settings_that_show_the_transport(nccl):
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_IB_HCA": "mlx5"}
    argv = nccl.build({"expect_transport": "NET/IB"}, host(env=env)).argv
    start, end = argv.index("NCCL_DEBUG=INFO") - 1, argv.index("NCCL_IB_HCA=mlx5") + 1
    assert argv[start:end] == ["-x", "NCCL_DEBUG=INFO", "-x", "NCCL_DEBUG_SUBSYS=INIT,NET", "-x", "NCCL_IB_HCA=mlx5"]


def test_it_refuses_an_environment_variable_mpirun_could_not_pass_safely(nccl):
    with pytest.raises(ParamError):
        nccl.build({}, host(env={"NCCL_SOCKET_IFNAME": "bond0\n-x EVIL=1"}))
