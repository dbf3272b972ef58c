"""The storage read benchmark: round_robin_mpi.py's selection and substitution, storage_read.py run for real (alone
and under mpirun), and the storage_read plug-in's command line and parsing of what the real runs printed."""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks.base import HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark
from plugins.tools import round_robin_mpi as rr

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "plugins" / "tools"
SPREADER = TOOLS / "round_robin_mpi.py"
READER = TOOLS / "storage_read.py"
MPI_ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
HOSTS = (HostInfo("dgx2-1", "10.0.0.1", 16), HostInfo("dgx2-2", "10.0.0.2", 16))
MOUNTS = tuple(f"/mnt/isilon{i}" for i in range(1, 17))
PRIMARY = HostContext(node="dgx2-1", index=0, run_dir="/srv/rb/run-1", data_dir="/scratch/rb", hosts=HOSTS)
# What mpirun --tag-output -n 3 printed when storage_read.py still wrote its newline separately (Python with
# PYTHONUNBUFFERED=1): rank 1's line came right after rank 0's JSON, before rank 0's newline. Captured verbatim.
INTERLEAVED = (
    '[1,0]<stdout>:{"type": "summary", "tool": "rackbench-storage-read", "rank": 0, "size": 3, "host'
    '": "vm", "dir": "/tmp/syncx", "files": 2, "bytes": 1190133760, "records": 72640, "batches": 113'
    '5, "epochs": 36320, "seconds": 1.001738, "mb_per_sec": 1188.069, "records_per_sec": 72513.967, '
    '"sync_wait_seconds": 0.448898}[1,1]<stdout>:{"type": "summary", "tool": "rackbench-storage-read'
    '", "rank": 1, "size": 3, "host": "vm", "dir": "/tmp/syncx", "files": 2, "bytes": 1190133760, "r'
    'ecords": 72640, "batches": 1135, "epochs": 36320, "seconds": 1.018066, "mb_per_sec": 1169.014, '
    '"records_per_sec": 71350.973, "sync_wait_seconds": 0.487348}[1,1]<stdout>:\n'
    '[1,2]<stdout>:{"type": "summary", "tool": "rackbench-storage-read", "rank": 2, "size": 3, "host'
    '": "vm", "dir": "/tmp/syncx", "files": 2, "bytes": 1190133760, "records": 72640, "batches": 113'
    '5, "epochs": 36320, "seconds": 1.002378, "mb_per_sec": 1187.31, "records_per_sec": 72467.647, "'
    'sync_wait_seconds": 0.520975}[1,0]<stdout>:\n'
    "[1,2]<stdout>:\n"
)

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


@pytest.fixture
def bench():
    return get_benchmark("storage_read")


def run(argv: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env or MPI_ENV, capture_output=True, text=True, timeout=120)


def summary_lines(stdout: str) -> dict[int, dict[str, Any]]:
    """The summary line of each rank, read without the plug-in (lines may carry mpirun --tag-output's prefix)."""
    docs = [json.loads(line[line.index("{") :]) for line in stdout.splitlines() if '"summary"' in line]
    return {doc["rank"]: doc for doc in docs}


def value(metrics: list[Metric], name: str, host: str = "", **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == host and m.labels == labels]
    assert len(found) == 1, (name, host, labels, found)
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python38() -> str | None:
    """A Python 3.8 interpreter, to check the node-side tools run on the oldest Python they promise."""
    for candidate in [
        shutil.which("python3.8"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3"))),
    ]:
        if candidate and run([candidate, "--version"]).returncode == 0:
            return candidate
    return None


# --- round_robin_mpi.py: selection and substitution --------------------------------------------------------------


def test_it_picks_directories_round_robin_by_rank():
    dirs = ["/mnt/a", "/mnt/b", "/mnt/c"]
    assert [rr.pick(dirs, rank) for rank in range(7)] == [
        "/mnt/a",
        "/mnt/b",
        "/mnt/c",
        "/mnt/a",
        "/mnt/b",
        "/mnt/c",
        "/mnt/a",
    ]
    assert rr.pick(list(MOUNTS), 17) == "/mnt/isilon2"


def test_it_reads_the_global_or_local_rank_the_launcher_set():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "PMI_RANK": "9"}
    assert rr.rank_from(env, "global") == 5
    assert rr.rank_from(env, "local") == 1
    assert rr.rank_from({"PMI_RANK": "9"}, "global") == 9
    assert rr.rank_from({"SLURM_PROCID": "3", "SLURM_LOCALID": "0"}, "local") == 0
    assert rr.rank_from({}, "global") == 0  # no MPI: a single process
    with pytest.raises(rr.UsageError):
        rr.rank_from({"OMPI_COMM_WORLD_RANK": "x"}, "global")


def test_it_substitutes_every_data_dir_token_and_nothing_else():
    command = ["python", "-u", "train.py", "--data_dir={data_dir}/train", "{data_dir}", "{data_dir}{data_dir}", "{x}"]
    assert rr.substitute(command, "/mnt/isilon3") == [
        "python",
        "-u",
        "train.py",
        "--data_dir=/mnt/isilon3/train",
        "/mnt/isilon3",
        "/mnt/isilon3/mnt/isilon3",
        "{x}",
    ]


def test_it_parses_dirs_before_the_double_dash_and_the_command_after_it():
    assert rr.parse_args(["--dirs", "a", "b", "--", "cmd", "--dirs", "--"]) == (
        "global",
        ["a", "b"],
        ["cmd", "--dirs", "--"],
    )
    assert rr.parse_args(["--by", "local", "--dirs", "a", "--", "cmd"]) == ("local", ["a"], ["cmd"])
    for bad in (
        ["--dirs", "a", "cmd"],
        ["--dirs", "--", "cmd"],
        ["--dirs", "a", "--"],
        ["--by", "node", "--dirs", "a", "--", "c"],
    ):
        with pytest.raises(rr.UsageError):
            rr.parse_args(bad)


def test_it_becomes_the_command_with_its_directory_in_the_environment():
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "4"}
    script = "import os, sys; print(sys.argv[1], os.environ['RACKBENCH_DATA_DIR'], os.getpid())"
    result = run(
        [
            sys.executable,
            str(SPREADER),
            "--dirs",
            "/d0",
            "/d1",
            "/d2",
            "--",
            sys.executable,
            "-c",
            script,
            "x={data_dir}",
        ],
        env=env,
    )
    assert result.returncode == 0, result.stderr
    arg, data_dir, _ = result.stdout.split()
    assert (arg, data_dir) == ("x=/d1", "/d1")


def test_it_exits_2_on_bad_usage_and_127_for_a_missing_command():
    bad = run([sys.executable, str(SPREADER), "--dirs", "/d0"])
    assert bad.returncode == 2 and "missing '--'" in bad.stderr
    missing = run([sys.executable, str(SPREADER), "--dirs", "/d0", "--", "no-such-program-rackbench"])
    assert missing.returncode == 127 and "cannot run" in missing.stderr


def test_the_node_tools_are_python_3_8_syntax():
    for path in (SPREADER, READER):
        ast.parse(path.read_text(), feature_version=(3, 8))


@pytest.mark.skipif(python38() is None, reason="no Python 3.8 interpreter here")
def test_the_node_tools_run_on_python_3_8(tmp_path):
    interpreter = python38()
    assert interpreter is not None
    argv = [interpreter, str(SPREADER), "--dirs", str(tmp_path), "--", interpreter, str(READER), "--dir", "{data_dir}"]
    result = run([*argv, "--create", "4", "--record-size", "4k", "--format", "tfrecord", "--batches", "3"])
    assert result.returncode == 0, result.stderr
    assert summary_lines(result.stdout)[0]["records"] == 3 * 64


# --- storage_read.py alone -------------------------------------------------------------------------------------------


def test_it_creates_a_synthetic_dataset_and_reads_it_batch_by_batch(tmp_path):
    result = run(
        [
            sys.executable,
            str(READER),
            "--dir",
            str(tmp_path),
            "--create",
            "6",
            "--record-size",
            "64k",
            "--batch-size",
            "4",
            "--batches",
            "5",
        ]
    )
    assert result.returncode == 0, result.stderr
    doc = summary_lines(result.stdout)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rbsr-{i:06d}.rec" for i in range(6)]
    assert (doc["rank"], doc["size"], doc["files"], doc["batches"], doc["records"]) == (0, 1, 6, 5, 20)
    assert doc["bytes"] == 20 * 65536
    assert doc["epochs"] == 4  # 20 records over 6 files: the fourth pass had begun
    assert doc["mb_per_sec"] > 0 and doc["records_per_sec"] > 0


def test_it_reads_tfrecord_entries_as_records(tmp_path):
    argv = [sys.executable, str(READER), "--dir", str(tmp_path), "--format", "tfrecord", "--batch-size", "3"]
    created = run([*argv, "--create", "2", "--record-size", "1000", "--records-per-file", "5", "--batches", "1"])
    assert created.returncode == 0, created.stderr
    assert {p.stat().st_size for p in tmp_path.iterdir()} == {5 * (12 + 1000 + 4)}
    result = run([*argv, "--pattern", "*.tfrecord", "--batches", "4"])
    doc = summary_lines(result.stdout)[0]
    assert (doc["records"], doc["bytes"], doc["epochs"]) == (12, 12 * 1016, 2)


def test_it_reuses_a_dataset_that_is_already_there(tmp_path):
    argv = [
        sys.executable,
        str(READER),
        "--dir",
        str(tmp_path),
        "--create",
        "2",
        "--record-size",
        "4k",
        "--batches",
        "1",
    ]
    assert run(argv).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert run(argv).returncode == 0
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_it_prints_progress_lines_while_it_reads(tmp_path):
    argv = [sys.executable, str(READER), "--dir", str(tmp_path), "--create", "2", "--record-size", "4k"]
    result = run([*argv, "--duration", "1", "--interval", "0.2"])
    kinds = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert kinds[-1] == "summary" and kinds.count("progress") >= 2


def test_it_fails_with_a_reason_when_there_is_nothing_to_read(tmp_path):
    result = run([sys.executable, str(READER), "--dir", str(tmp_path), "--batches", "1"])
    assert result.returncode == 1 and "no record files match" in result.stderr
    assert run([sys.executable, str(READER), "--dir", str(tmp_path), "--create", "2"]).returncode == 2


# --- for real under mpirun ----------------------------------------------------------------------------------------


@needs_mpirun
def test_it_spreads_two_mpi_ranks_over_two_directories_and_reads_for_real(tmp_path, bench):
    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    argv = [
        *("mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2"),
        *("python3", str(SPREADER), "--dirs", str(d1), str(d2), "--"),
        *("python3", str(READER), "--dir", "{data_dir}", "--create", "8", "--record-size", "256k", "--batches", "20"),
    ]
    result = run(argv)
    assert result.returncode == 0, result.stdout + result.stderr
    docs = summary_lines(result.stdout)
    assert docs[0]["dir"] == str(d1) and docs[1]["dir"] == str(d2)
    assert sorted(p.name for p in d1.iterdir()) == [f"rbsr-{i:06d}.rec" for i in (0, 2, 4, 6)]
    assert sorted(p.name for p in d2.iterdir()) == [f"rbsr-{i:06d}.rec" for i in (1, 3, 5, 7)]
    metrics = bench.parse(result.stdout, host="local")
    assert value(metrics, "ranks") == 2
    assert value(metrics, "read_mb_per_sec", "local", rank=0) > 0
    assert value(metrics, "read_mb_per_sec", "local", rank=1) > 0
    assert value(metrics, "read_mb_per_sec") == pytest.approx(docs[0]["mb_per_sec"] + docs[1]["mb_per_sec"])
    assert value(metrics, "read_bytes") == 2 * 20 * 64 * 262144
    assert bench.missing(metrics, ["local"]) == []


@needs_mpirun
def test_it_keeps_synchronised_ranks_in_step_until_rank_0_stops_them(tmp_path):
    argv = [
        *("mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-n", "3"),
        *("python3", str(SPREADER), "--dirs", str(tmp_path), "--"),
        *("python3", str(READER), "--dir", "{data_dir}", "--create", "6", "--record-size", "16k"),
        *("--duration", "1", "--sync", f"127.0.0.1:{free_port()}", "--interval", "0"),
    ]
    result = run(argv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("[1,")  # --tag-output prefixes every line
    docs = summary_lines(result.stdout)
    assert sorted(docs) == [0, 1, 2]
    assert len({doc["batches"] for doc in docs.values()}) == 1  # every rank read the same number of batches
    assert docs[0]["seconds"] >= 1
    # the ranks start and stop at rank 0's word, so they all measure (nearly) rank 0's time
    assert all(abs(doc["seconds"] - docs[0]["seconds"]) < 0.1 for doc in docs.values())


@needs_mpirun
def test_it_runs_the_plug_in_command_as_built(tmp_path, bench):
    mounts = (str(tmp_path / "m1"), str(tmp_path / "m2"))
    host = HostContext(
        node="local",
        index=0,
        run_dir=str(tmp_path),
        data_dir=str(tmp_path / "data"),
        hosts=(HostInfo("local", "127.0.0.1", 2),),
        mounts=mounts,
    )
    params = {
        "create_files": 4,
        "record_size": "64k",
        "batches": 10,
        "batch_size": 8,
        "sync": True,
        "mpi_bind_to": "none",
        "sync_port": free_port(),
        "mpi_tag_output": True,
    }
    command = bench.build(params, host)
    for name, content in command.files.items():
        (tmp_path / name).write_text(content)
    argv = [command.argv[0], "--oversubscribe", *command.argv[1:]]
    result = run(argv, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    metrics = bench.parse(result.stdout, host="local")
    assert value(metrics, "ranks") == 2
    assert value(metrics, "records_per_sec") > 0
    assert {doc["dir"] for doc in summary_lines(result.stdout).values()} == set(mounts)


# --- the plug-in ------------------------------------------------------------------------------------------------


def test_it_ships_both_tools_and_runs_them_from_the_primary_only(bench):
    host = HostContext(node="dgx2-1", index=0, run_dir="/r", data_dir="/scratch", hosts=HOSTS[:1], mounts=MOUNTS)
    command = bench.build({"subdir": "data/imagenet-scratch/tfrecords-150x", "format": "tfrecord"}, host)
    assert command.files == {"round_robin_mpi.py": SPREADER.read_text(), "storage_read.py": READER.read_text()}
    argv = command.argv
    assert argv[:3] == ["mpirun", "-n", "16"] and "--preload-files" not in argv
    rank = argv[argv.index("round_robin_mpi.py") - 1 :]
    assert rank == [
        *("python3", "round_robin_mpi.py", "--by", "global", "--dirs", *MOUNTS, "--"),
        *("python3", "storage_read.py", "--dir", "{data_dir}/data/imagenet-scratch/tfrecords-150x"),
        *("--pattern", "*", "--format", "tfrecord", "--batch-size", "64", "--duration", "60", "--drop-cache"),
        *("--interval", "10"),
    ]
    secondary = HostContext(node="dgx2-2", index=1, run_dir="/r", data_dir="/scratch", hosts=HOSTS, mounts=MOUNTS)
    assert bench.build({}, secondary) is None


def test_it_reads_from_the_data_dir_without_mount_points_and_preloads_the_tools_on_other_hosts(bench):
    params = {"create_files": 1000, "record_size": "128k", "batches": 100, "sync": True, "drop_cache": False}
    argv = bench.build(params, PRIMARY).argv
    assert argv[:3] == ["mpirun", "--preload-files", "round_robin_mpi.py,storage_read.py"]
    assert argv[argv.index("--dirs") + 1 : argv.index("--dirs") + 3] == ["/scratch/rb", "--"]
    tail = argv[argv.index("storage_read.py") + 1 :]
    assert tail == [
        *("--dir", "{data_dir}", "--pattern", "*", "--format", "file", "--batch-size", "64", "--batches", "100"),
        *("--create", "1000", "--record-size", "131072", "--interval", "10", "--sync", "10.0.0.1:29400"),
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"nonsense": 1}, "nonsense"),
        ({"format": "parquet"}, "format"),
        ({"pattern": "../*"}, "pattern"),
        ({"pattern": "/etc/*"}, "pattern"),
        ({"pattern": "*;id"}, "pattern"),
        ({"subdir": "a/../../b"}, "subdir"),
        ({"subdir": "-x"}, "subdir"),
        ({"batch_size": 0}, "batch_size"),
        ({"duration": 10, "batches": 5}, "batches"),
        ({"duration": "60s"}, "duration"),
        ({"create_files": 10}, "record_size"),
        ({"record_size": "1m"}, "record_size"),
        ({"create_files": 10, "record_size": "8x"}, "record_size"),
        ({"create_files": 10, "record_size": "5g"}, "record_size"),
        ({"records_per_file": 2}, "records_per_file"),
        ({"drop_cache": "no"}, "drop_cache"),
        ({"sync": "yes"}, "sync"),
        ({"sync_port": 80}, "sync_port"),
        ({"round_robin_by": "node"}, "round_robin_by"),
        ({"python": "python3 -c"}, "python"),
        ({"mpi_pml": "ob1;id"}, "mpi_pml"),
    ],
)
def test_it_refuses_bad_parameters_naming_the_field(bench, params, field):
    with pytest.raises(ParamError) as caught:
        bench.validate(params)
    assert caught.value.field == field


def test_it_declares_units_and_directions(bench):
    assert bench.kind == "storage_read" and bench.uses_mpi
    assert bench.spec("read_mb_per_sec").unit == "MB/s" and bench.spec("read_mb_per_sec").higher_is_better
    assert bench.spec("records_per_sec").unit == "records/s"
    assert not bench.spec("sync_wait_s").higher_is_better


def test_it_fails_a_run_where_a_rank_printed_no_summary(bench):
    line = {
        "type": "summary",
        "tool": "rackbench-storage-read",
        "rank": 1,
        "size": 2,
        "bytes": 1,
        "records": 1,
        "mb_per_sec": 1.0,
        "records_per_sec": 1.0,
        "sync_wait_seconds": 0.0,
    }
    with pytest.raises(ParseError, match=r"only 1 of 2 ranks .*missing: \[0\]"):
        bench.parse(json.dumps(line), host="h1")
    with pytest.raises(ParseError, match="no storage_read summary"):
        bench.parse("storage_read.py: rank 0: no record files match '*' in /mnt/a\n", host="h1")
    assert bench.missing([], ["h1"]) == ["expected metric read_mb_per_sec for the run (the sum over ranks) is missing"]


def test_it_reads_summaries_that_mpirun_forwarded_run_together(bench):
    metrics = bench.parse(INTERLEAVED, host="h1")
    assert value(metrics, "ranks") == 3
    assert value(metrics, "read_mb_per_sec", "h1", rank=1) == pytest.approx(1169.014)
    assert value(metrics, "read_mb_per_sec") == pytest.approx(1188.069 + 1169.014 + 1187.31)
    assert value(metrics, "read_mb_per_sec_slowest_rank") == pytest.approx(1169.014)
