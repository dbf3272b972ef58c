"""The mdtest and IOR plug-ins: parameters, mpirun command lines, parsing of real outputs of several versions
(see fixtures/mdtest/SOURCES.md and fixtures/ior/SOURCES.md) and, where the tools are installed, real runs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks import mdtest as mdtest_module
from plugins.benchmarks.base import HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark

FIXTURES = Path(__file__).parent / "fixtures"
HOSTS = (HostInfo("dgx2-1", "10.0.0.1", 16), HostInfo("dgx2-2", "10.0.0.2", 16))
PRIMARY = HostContext(node="dgx2-1", index=0, run_dir="/srv/rb/run-1", data_dir="/scratch/rb", hosts=HOSTS)
SECONDARY = HostContext(node="dgx2-2", index=1, run_dir="/srv/rb/run-1", data_dir="/scratch/rb", hosts=HOSTS)
MPI_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture
def mdtest():
    return get_benchmark("mdtest")


@pytest.fixture
def ior():
    return get_benchmark("ior")


def fixture_text(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_bytes().decode()  # bytes first: keeps CRLF line endings as they are


def value(metrics: list[Metric], name: str) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == "" and m.labels == {}]
    assert len(found) == 1, (name, found)
    return found[0]


def names(metrics: list[Metric]) -> set[str]:
    return {m.name for m in metrics}


def rank_part(argv: list[str], binary: str) -> list[str]:
    """What mpirun starts on every rank: argv from the binary on."""
    return argv[argv.index(binary) :]


# --- mdtest: registration --------------------------------------------------------------------------------------


def test_it_registers_mdtest_as_an_mpi_benchmark_with_directed_units(mdtest):
    assert mdtest.kind == "mdtest" and mdtest.uses_mpi
    assert mdtest.spec("file_creation_ops_per_sec").unit == "ops/s"
    assert mdtest.spec("file_creation_ops_per_sec").higher_is_better
    assert mdtest.spec("tree_removal_ops_per_sec_max").higher_is_better
    assert not mdtest.spec("file_stat_ops_per_sec_stdev").higher_is_better


def test_it_gives_every_parsed_mdtest_metric_its_declared_unit_and_the_run_as_host(mdtest):
    for path in sorted((FIXTURES / "mdtest").glob("*.txt")):
        if "interrupted" in path.name:
            continue
        for metric in mdtest.parse(fixture_text("mdtest", path.name), host="dgx2-1"):
            assert metric.unit == mdtest.spec(metric.name).unit, (path.name, metric)
            assert metric.host == "", (path.name, metric)
            assert metric.labels == {} or "four-tests" in path.name, (path.name, metric)  # one test: unlabelled


# --- mdtest: parsing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "op", "stats"),
    [
        # mdtest 1.8.1: "SUMMARY (in ops/sec):", rows with ':'
        ("mdtest-1.8.1-manpage-example1.txt", "directory_stat", (154657.227, 28731.061, 91694.144, 62963.083)),
        ("mdtest-1.8.1-manpage-example2.txt", "file_removal", (51911.845, 51911.845, 51911.845, 0.0)),
        # mdtest 1.9.3: "SUMMARY: (of 3 iterations)"
        ("mdtest-1.9.3.txt", "file_creation", (20518.572, 15776.451, 18266.693, 1943.286)),
        ("mdtest-1.9.3.txt", "tree_removal", (80.986, 77.769, 79.791, 1.438)),
        # 96 ranks on 8 nodes of a GPFS cluster, mdtest -v (verbose lines around the table)
        ("mdtest-1.9.3-akrr-96tasks-verbose.txt", "file_stat", (1585248.756, 1381314.525, 1483281.640, 101967.116)),
        # IOR 3.2.1's mdtest (it still calls itself 1.9.3): "SUMMARY rate:"
        ("mdtest-3.2.1.txt", "file_read", (937875.150, 842548.710, 905838.937, 44754.088)),
        ("mdtest-ior3.2.0-akrr-16tasks-verbose.txt", "tree_creation", (704.333, 132.891, 473.477, 188.476)),
        # IOR 3.3.0's mdtest: wider name column
        ("mdtest-3.3.0.txt", "directory_removal", (7403.720, 1049.485, 4025.362, 2609.579)),
        ("mdtest-3.3.0-pty-crlf.txt", "file_stat", (2282375.496, 971265.121, 1775858.900, 554314.351)),
        # IOR 4.0.0's mdtest: no ':' after the operation, a "Directory rename" row
        ("mdtest-4.0.0.txt", "directory_rename", (184689.740, 36237.453, 133582.433, 84338.379)),
        ("mdtest-4.0.0.txt", "file_creation", (10226.019, 6435.400, 8598.618, 1951.288)),
    ],
)
def test_it_reads_max_min_mean_and_stdev_from_each_mdtest_version(mdtest, name, op, stats):
    metrics = mdtest.parse(fixture_text("mdtest", name), host="dgx2-1")
    found = tuple(value(metrics, f"{op}_ops_per_sec{s}") for s in ("_max", "_min", "", "_stdev"))
    assert found == pytest.approx(stats)


def test_it_reads_all_ten_operations_of_mdtest_4(mdtest):
    metrics = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0.txt"))
    ops = {m.name.removesuffix("_ops_per_sec") for m in metrics if m.name.endswith("_ops_per_sec")}
    assert ops == {
        "directory_creation",
        "directory_stat",
        "directory_rename",
        "directory_removal",
        "file_creation",
        "file_stat",
        "file_read",
        "file_removal",
        "tree_creation",
        "tree_removal",
    }


def test_it_reads_the_rate_table_and_ignores_the_time_table_of_mdtest_P(mdtest):
    metrics = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-rate-and-time.txt"))
    assert value(metrics, "directory_creation_ops_per_sec") == pytest.approx(16139.121)
    assert value(metrics, "tree_removal_ops_per_sec_max") == pytest.approx(78.064)


def test_it_drops_the_zero_rows_of_phases_mdtest_did_not_run(mdtest):
    created = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-create-only-tag-output.txt"))
    assert {m.name for m in created if m.name.endswith("_ops_per_sec")} == {
        "directory_creation_ops_per_sec",
        "file_creation_ops_per_sec",
        "tree_creation_ops_per_sec",
    }
    assert value(created, "file_creation_ops_per_sec") == pytest.approx(116411.435)
    removed = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-remove-only.txt"))
    assert {m.name for m in removed if m.name.endswith("_ops_per_sec")} == {
        "directory_removal_ops_per_sec",
        "file_removal_ops_per_sec",
        "tree_removal_ops_per_sec",
    }


def test_it_reads_a_files_only_run_with_a_tree_and_data(mdtest):
    metrics = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-files-tree-leaf.txt"))
    assert not any(m.name.startswith("directory_") for m in metrics)
    assert value(metrics, "file_read_ops_per_sec") == pytest.approx(352068.708)
    assert value(metrics, "tree_creation_ops_per_sec_min") == pytest.approx(1432.519)


# Four tests in one output: AKRR's mdtest app kernel runs mdtest four times into one log (fixtures/mdtest/SOURCES.md),
# with mdtest 1.9.3 ("SUMMARY:") and IOR 3.2.0's mdtest ("SUMMARY rate:").
FOUR_TESTS = ["single directory", "unique directory", "single tree", "tree per process"]


@pytest.mark.parametrize(
    ("name", "file_creation_means"),
    [
        ("mdtest-1.9.3-akrr-four-tests.txt", [113.827, 35892.066, 1807.941, 26951.173]),
        ("mdtest-ior3.2.0-akrr-four-tests.txt", None),
    ],
)
def test_it_keeps_every_test_of_an_output_labelled_with_what_it_measured(mdtest, name, file_creation_means):
    metrics = mdtest.parse(fixture_text("mdtest", name), host="n1")
    creation = {m.labels["test"]: m.value for m in metrics if m.name == "file_creation_ops_per_sec"}
    assert list(creation) == FOUR_TESTS  # nothing lost, in the order they ran
    assert all(m.labels and set(m.labels) == {"test"} for m in metrics)  # no unlabelled mix of the four
    if file_creation_means:
        assert list(creation.values()) == file_creation_means
    trees = {m.labels["test"]: m.value for m in metrics if m.name == "tree_creation_ops_per_sec"}
    assert set(trees) == set(FOUR_TESTS)
    assert mdtest.missing(metrics, ["n1"]) == []


def test_it_names_a_test_from_its_command_line():
    assert mdtest_module.test_name("/x/mdtest -v -I 32 -z 0 -b 0 -i 2") == "single directory"
    assert mdtest_module.test_name('/x/mdtest "-v" "-I" "32" "-z" "0" "-i" "10" "-u"') == "unique directory"
    assert mdtest_module.test_name("mdtest -I 4 -z 4 -b 2 -i 2") == "single tree"
    assert mdtest_module.test_name("mdtest '-n' '20' '-u' '-z' '2' '-b' '3'") == "tree per process"


def test_one_test_alone_keeps_its_rates_unlabelled(mdtest):
    metrics = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0.txt"), host="n1")
    assert metrics and all(m.labels == {} for m in metrics)


def test_it_refuses_an_interrupted_mdtest_output(mdtest):
    with pytest.raises(ParseError, match="no mdtest SUMMARY rate table"):
        mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-interrupted.txt"))
    with pytest.raises(ParseError):
        mdtest.parse("")


def test_it_quotes_the_error_line_when_mdtest_failed(mdtest):
    text = "-- started at 11/21/2026 22:20:26 --\nError invalid argument: --version\nInvalid options\n"
    with pytest.raises(ParseError, match="Error invalid argument: --version"):
        mdtest.parse(text)


def test_it_fails_an_mdtest_run_without_rates_or_without_an_operation_it_asked_for(mdtest):
    assert mdtest.missing([], ["dgx2-1"]) == ["expected mdtest's SUMMARY rates for the run; found none"]
    created = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-create-only-tag-output.txt"))
    assert mdtest.missing(created, ["dgx2-1"]) == []
    assert mdtest.check({"phases": ["create"]}, created, {}) == []
    problems = mdtest.check({}, created, {})
    assert any("file_stat_ops_per_sec" in p for p in problems)
    assert any("directory_removal_ops_per_sec" in p for p in problems)
    files_only = mdtest.parse(fixture_text("mdtest", "mdtest-4.0.0-files-tree-leaf.txt"))
    assert mdtest.check({"files_only": True}, files_only, {}) == []


# --- mdtest: command line --------------------------------------------------------------------------------------


def test_it_builds_the_seed_mdtest_command_on_the_primary_only(mdtest):
    params = {"files_per_rank": 10000, "iterations": 3, "directory": "/mnt/lustre/mdtest"}
    argv = mdtest.build(params, PRIMARY).argv
    assert argv[:3] == ["mpirun", "-n", "32"]
    assert "10.0.0.1:16,10.0.0.2:16" in argv
    assert rank_part(argv, "mdtest") == ["mdtest", "-n", "10000", "-i", "3", "-u", "-d", "/mnt/lustre/mdtest"]
    assert mdtest.build(params, SECONDARY) is None


def test_it_runs_mdtest_in_the_data_dir_by_default(mdtest):
    argv = mdtest.build({}, PRIMARY).argv
    assert rank_part(argv, "mdtest") == ["mdtest", "-n", "1000", "-i", "3", "-u", "-d", "/scratch/rb"]


def test_it_maps_every_mdtest_parameter_to_its_option(mdtest):
    params = {
        "items_per_dir": 4096,
        "iterations": 2,
        "unique_dir": False,
        "write_bytes": 4096,
        "read_bytes": 4096,
        "depth": 3,
        "branching": 7,
        "leaf_only": True,
        "files_only": True,
        "phases": ["remove", "create"],
        "binary": "/opt/ior/bin/mdtest",
        "mpi_slots": 2,
        "mpi_tag_output": True,
    }
    argv = mdtest.build(params, PRIMARY).argv
    assert argv[:3] == ["mpirun", "-n", "4"]
    assert "--tag-output" in argv
    assert rank_part(argv, "/opt/ior/bin/mdtest") == [
        "/opt/ior/bin/mdtest",
        *("-I", "4096", "-i", "2", "-w", "4096", "-e", "4096", "-z", "3", "-b", "7"),
        *("-L", "-F", "-C", "-r", "-d", "/scratch/rb"),
    ]


def test_it_passes_the_campaign_environment_to_mdtest_ranks(mdtest):
    host = HostContext(node="n1", index=0, run_dir="/r", data_dir="/d", hosts=HOSTS[:1], env={"NCCL_DEBUG": "INFO"})
    assert "NCCL_DEBUG=INFO" in mdtest.build({}, host).argv


def test_it_keeps_a_hostile_mdtest_directory_in_one_argument(mdtest):
    directory = "/mnt/a b;rm -rf ~ $(id)"
    argv = mdtest.build({"directory": directory}, PRIMARY).argv
    assert argv[-1] == directory
    assert shlex.split(shlex.join(argv))[-1] == directory


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"nonsense": 1}, "nonsense"),
        ({"files_per_rank": 0}, "files_per_rank"),
        ({"files_per_rank": "100 files"}, "files_per_rank"),
        ({"files_per_rank": 10, "items_per_dir": 10}, "items_per_dir"),
        ({"iterations": True}, "iterations"),
        ({"unique_dir": "yes"}, "unique_dir"),
        ({"directory": "relative/dir"}, "directory"),
        ({"directory": "/mnt/a@/mnt/b"}, "directory"),
        ({"directory": "/mnt/a\nb"}, "directory"),
        ({"files_only": True, "dirs_only": True}, "dirs_only"),
        ({"phases": ["create", "rename"]}, "phases"),
        ({"phases": []}, "phases"),
        ({"binary": "-h"}, "binary"),
        ({"binary": "mdtest;id"}, "binary"),
        ({"mpi_btl": "^openib $(id)"}, "mpi_btl"),
        ({"mpi_tag_output": "False"}, "mpi_tag_output"),
    ],
)
def test_it_refuses_bad_mdtest_parameters_naming_the_field(mdtest, params, field):
    with pytest.raises(ParamError) as caught:
        mdtest.validate(params)
    assert caught.value.field == field


# --- IOR: parsing ----------------------------------------------------------------------------------------------


def test_it_registers_ior_as_an_mpi_benchmark_with_directed_units(ior):
    assert ior.kind == "ior" and ior.uses_mpi
    assert ior.spec("write_bw_mib_s").unit == "MiB/s" and ior.spec("write_bw_mib_s").higher_is_better
    assert ior.spec("read_ops").unit == "ops/s"
    assert not ior.spec("read_bw_mib_s_stdev").higher_is_better
    assert not ior.spec("write_time_s").higher_is_better


def test_it_gives_every_parsed_ior_metric_its_declared_unit_and_the_run_as_host(ior):
    for path in sorted((FIXTURES / "ior").glob("*.txt")):
        try:
            metrics = ior.parse(fixture_text("ior", path.name), host="dgx2-1")
        except ParseError:
            continue
        for metric in metrics:
            assert metric.unit == ior.spec(metric.name).unit, (path.name, metric)
            assert metric.host == "", (path.name, metric)
            assert metric.labels == {} or "four-tests" in path.name, (path.name, metric)  # one test: unlabelled


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # IOR 2.10.3: "Operation  Max (MiB)  Min (MiB)  Mean (MiB)   Std Dev  Max (OPs) ..."
        (
            "ior-2.10.3.txt",
            {"write_bw_mib_s": 1050.20, "write_bw_mib_s_max": 1342.89, "write_ops": 8401.61, "read_time_s": 0.00128},
        ),
        ("ior-2.10.3-pty-crlf.txt", {"write_bw_mib_s_stdev": 134.97, "read_bw_mib_s": 14184.35}),
        # IOR 3.0.1: "Summary of all tests:" without OPs columns
        ("ior-3.0.1.txt", {"read_bw_mib_s_min": 3066.26, "read_bw_mib_s_stdev": 3969.04, "write_time_s": 0.01835}),
        ("ior-3.0.1-akrr-gpfs-96tasks-write.txt", {"write_bw_mib_s": 613.20, "write_time_s": 31.31128}),
        ("ior-3.2.0-akrr-gpfs-write.txt", {"write_bw_mib_s_max": 91.52, "write_ops": 4.58, "write_time_s": 34.96647}),
        ("ior-3.2.1.txt", {"write_bw_mib_s": 934.38, "read_ops_max": 189651.54, "read_bw_mib_s_max": 11853.22}),
        ("ior-3.3.0dev-akrr-stampede2.txt", {"read_bw_mib_s": 332.55, "read_ops": 16.63, "write_time_s": 0.93727}),
        ("ior-3.3.0.txt", {"write_bw_mib_s_min": 803.25, "read_ops": 173793.73}),
        ("ior-3.3.0-tag-output.txt", {"write_bw_mib_s": 1348.31, "read_bw_mib_s_max": 14884.01}),
        # IOR 4.0.0: Stonewall columns, no "Max Write:" lines
        ("ior-4.0.0.txt", {"write_bw_mib_s": 909.62, "read_bw_mib_s_stdev": 3998.31, "write_ops_max": 17622.26}),
    ],
)
def test_it_reads_the_summary_of_each_ior_version(ior, name, expected):
    metrics = ior.parse(fixture_text("ior", name))
    assert {key: value(metrics, key) for key in expected} == pytest.approx(expected)


def test_it_has_no_ops_metrics_where_ior_printed_none(ior):
    assert not any(n.endswith(("_ops", "_ops_max")) for n in names(ior.parse(fixture_text("ior", "ior-3.0.1.txt"))))


def test_it_reads_only_the_operation_a_write_only_or_read_only_ior_run_did(ior):
    written = ior.parse(fixture_text("ior", "ior-4.0.0-mpiio-write-only.txt"))
    assert value(written, "write_bw_mib_s") == pytest.approx(2401.36)
    assert not any(n.startswith("read") for n in names(written))
    assert ior.check({"write": True}, written, {}) == []
    assert ior.check({}, written, {}) == ["expected metric read_bw_mib_s is missing: IOR printed no read summary"]
    read = ior.parse(fixture_text("ior", "ior-4.0.0-mpiio-read-only.txt"))
    assert value(read, "read_bw_mib_s_max") == pytest.approx(11884.51)
    assert ior.check({"read": True}, read, {}) == []


def test_it_falls_back_to_the_max_lines_when_the_summary_table_is_cut_off(ior):
    text = fixture_text("ior", "ior-3.3.0.txt")
    cut = text[: text.index("Summary of all tests:")]  # the output as stored had IOR died right there
    metrics = ior.parse(cut)
    assert {m.name: m.value for m in metrics} == {"write_bw_mib_s_max": 1328.59, "read_bw_mib_s_max": 12196.44}
    assert ior.missing(metrics, ["dgx2-1"]) == ["expected IOR's mean write or read bandwidth for the run; found none"]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("ior-3.2.1-interrupted.txt", "IOR did not finish"),
        ("ior-3.2.1-strided-config-error.txt", "requires xfer-size == block-size"),
        ("ior-4.0.0-mpiio-read-aborted.txt", "cannot open file"),
    ],
)
def test_it_refuses_failed_or_interrupted_ior_outputs_saying_why(ior, name, said):
    with pytest.raises(ParseError, match=said):
        ior.parse(fixture_text("ior", name))


def test_it_accepts_a_complete_ior_run(ior):
    metrics = ior.parse(fixture_text("ior", "ior-4.0.0.txt"))
    assert ior.missing(metrics, ["dgx2-1"]) == []
    assert ior.check({}, metrics, {}) == []


# --- IOR: command line -----------------------------------------------------------------------------------------


def test_it_builds_the_ior_command_on_the_primary_only(ior):
    params = {
        "api": "MPIIO",
        "transfer_size": "1m",
        "block_size": "4g",
        "segments": 2,
        "file_per_proc": True,
        "reorder": True,
        "fsync": True,
        "iterations": 5,
        "test_file": "/mnt/lustre/ior/testfile",
    }
    argv = ior.build(params, PRIMARY).argv
    assert argv[:3] == ["mpirun", "-n", "32"]
    assert rank_part(argv, "ior") == [
        *("ior", "-a", "MPIIO", "-t", "1m", "-b", "4g", "-s", "2", "-i", "5", "-F", "-C", "-e"),
        *("-w", "-r", "-o", "/mnt/lustre/ior/testfile"),
    ]
    assert ior.build(params, SECONDARY) is None


def test_it_writes_the_ior_test_file_into_the_data_dir_by_default(ior):
    argv = ior.build({"write": True, "keep_file": True, "transfer_size": 65536, "binary": "IOR"}, PRIMARY).argv
    assert rank_part(argv, "IOR") == [
        *("IOR", "-a", "POSIX", "-t", "65536", "-b", "16m", "-i", "3", "-k", "-w", "-o", "/scratch/rb/ior-testfile"),
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"api": "HDF5"}, "api"),
        ({"transfer_size": "1 m"}, "transfer_size"),
        ({"transfer_size": "-1m"}, "transfer_size"),
        ({"block_size": 0}, "block_size"),
        ({"transfer_size": "3k", "block_size": "16k"}, "block_size"),
        ({"segments": 0}, "segments"),
        ({"iterations": 1001}, "iterations"),
        ({"file_per_proc": 2}, "file_per_proc"),
        ({"write": False, "read": False}, "write"),
        ({"test_file": "ior.dat"}, "test_file"),
        ({"test_file": "/mnt/dir/"}, "test_file"),
        ({"binary": "ior --help"}, "binary"),
        ({"block": "1m"}, "block"),
        ({"mpi_slots": 0}, "mpi_slots"),
    ],
)
def test_it_refuses_bad_ior_parameters_naming_the_field(ior, params, field):
    with pytest.raises(ParamError) as caught:
        ior.validate(params)
    assert caught.value.field == field


# --- real runs, where mdtest and IOR are installed -------------------------------------------------------------


def run_locally(argv: list[str], cwd: Path) -> str:
    env = {**os.environ, **MPI_ROOT_ENV}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def local_host(tmp_path: Path) -> HostContext:
    data = tmp_path / "data"
    data.mkdir()
    return HostContext(
        node="local", index=0, run_dir=str(tmp_path), data_dir=str(data), hosts=(HostInfo("local", "localhost", 2),)
    )


def local_params(params: dict[str, Any]) -> dict[str, Any]:
    return {**params, "mpi_bind_to": "none"}


@pytest.mark.skipif(shutil.which("mdtest") is None or shutil.which("mpirun") is None, reason="mdtest not installed")
def test_it_runs_mdtest_for_real_and_parses_what_it_printed(mdtest, tmp_path):
    params = local_params({"files_per_rank": 50, "iterations": 2, "files_only": True})
    argv = mdtest.build(params, local_host(tmp_path)).argv
    argv.insert(1, "--oversubscribe")
    metrics = mdtest.parse(run_locally(argv, tmp_path))
    assert mdtest.check(params, metrics, {}) == []
    assert value(metrics, "file_creation_ops_per_sec") > 0


@pytest.mark.skipif(shutil.which("ior") is None or shutil.which("mpirun") is None, reason="IOR not installed")
def test_it_runs_ior_for_real_and_parses_what_it_printed(ior, tmp_path):
    params = local_params({"transfer_size": "64k", "block_size": "1m", "iterations": 2, "file_per_proc": True})
    argv = ior.build(params, local_host(tmp_path)).argv
    argv.insert(1, "--oversubscribe")
    metrics = ior.parse(run_locally(argv, tmp_path))
    assert ior.check(params, metrics, {}) == []
    assert value(metrics, "write_bw_mib_s") > 0 and value(metrics, "read_bw_mib_s") > 0
