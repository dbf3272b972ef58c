"""The telemetry sampler (plugins/tools/sampler.py): its parsers on real /proc, sysfs and nvidia-smi output, the
sampler run for real on this machine, its files stored as series (telemetry.ingest.sampler_ingest), and the campaign's
``telemetry:`` settings.

Timings of the sampler's own CPU use live in bench/sampler_overhead.py; the lab run in tests/test_telemetry_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from campaigns import selectors, services
from campaigns.models import Campaign, Run
from campaigns.spec import SpecError
from plugins import telemetry as telemetry_config
from plugins.benchmarks.base import ParamError
from plugins.tools import sampler as tool
from runners import samplers
from telemetry import codec
from telemetry.ingest import sampler_ingest
from telemetry.models import DETAIL_SERIES, Chunk, Series, SeriesKind
from telemetry.services import run_telemetry_summarize

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
OURS = FIXTURES / "telemetry"
NVIDIA = FIXTURES / "nvidia_smi"
SAMPLER = ROOT / "plugins" / "tools" / "sampler.py"
MS = 1_000_000
# The fields of tests/fixtures/facts/nvidia_smi_noheader_nounits_rtx_2080.csv (its SOURCES.md).
RTX_2080_QUERY = (
    "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,gpu_uuid,power.draw,"
    "temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,utilization.gpu,"
    "utilization.memory,fan.speed,pcie.link.width.current,pstate"
)
RTX_2080_FIELDS = RTX_2080_QUERY.split(",")


def fixture(name: str) -> bytes:
    return (OURS / name).read_bytes()


def header_fields(line: str) -> list[str]:
    """A --format=csv header's field names, without their units (``clocks.current.sm [MHz]`` -> clocks.current.sm)."""
    return [cell.strip().split(" [")[0] for cell in line.split(",")]


# --- /proc and sysfs ----------------------------------------------------------------------------------------


def test_it_reads_the_cpu_lines_of_proc_stat() -> None:
    lines = tool.parse_proc_stat(fixture("proc_stat_local_vm_1.txt"))

    assert [name for name, _busy, _total in lines] == ["cpu", "cpu0", "cpu1"]
    # cpu0 21790 0 3616 111190 311 0 383 85 0 0: guest time (the last two) is already in user and nice
    assert lines[1] == ("cpu0", 21790 + 3616 + 383 + 85, 21790 + 3616 + 111190 + 311 + 383 + 85)


def test_it_computes_utilisation_between_two_readings_of_proc_stat() -> None:
    before = {n: (b, t) for n, b, t in tool.parse_proc_stat(fixture("proc_stat_local_vm_1.txt"))}
    after = {n: (b, t) for n, b, t in tool.parse_proc_stat(fixture("proc_stat_local_vm_2.txt"))}

    util = {name: tool.utilisation(before[name], after[name]) for name in after}

    assert util["cpu0"] == pytest.approx(100 * (14 + 3 + 3) / (14 + 3 + 78 + 3))  # user, system, softirq of 98
    assert util["cpu1"] == pytest.approx(100 * (57 + 6 + 3) / (57 + 6 + 30 + 1 + 3))
    assert min(util["cpu0"], util["cpu1"]) <= util["cpu"] <= max(util["cpu0"], util["cpu1"])
    assert math.isnan(tool.utilisation((5, 10), (5, 10)))  # no time passed: an offline core


def test_it_reads_proc_meminfo_in_kilobytes() -> None:
    info = tool.parse_meminfo(fixture("proc_meminfo_local_vm.txt"))

    assert info["MemTotal"] > info["MemAvailable"] > 0
    assert {"Cached", "Dirty", "HugePages_Total"} <= set(info)


def test_it_reads_sectors_of_whole_disks_from_proc_diskstats(tmp_path: Path) -> None:
    stats = tool.parse_diskstats(fixture("proc_diskstats_local_vm.txt"))
    # the sys_block of that machine: its whole disks
    for name in ("loop0", "loop7", "vda", "zram0"):
        (tmp_path / name).mkdir()

    line = next(x for x in fixture("proc_diskstats_local_vm.txt").decode().splitlines() if " vda " in x).split()
    assert stats["vda"] == (int(line[5]), int(line[9]))
    assert tool.whole_disks(stats, str(tmp_path)) == ["vda"]


def test_it_finds_no_nfs_mount_where_there_is_none() -> None:
    assert tool.parse_mountstats(fixture("proc_self_mountstats_local_vm.txt")) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "mountstats_nfs4_prometheus_procfs.txt",
            ("192.168.1.1:/srv/test", "/mnt/nfs/test", "nfs4", [1207640230, 0, 0, 0, 1210214218, 0, 295483, 0]),
        ),
        ("mountstats_nfs3_localhost_blog.txt", ("localhost:/tmp/s_test", "/mnt", "nfs", [15, 15, 0, 0, 15, 15, 1, 1])),
    ],
)
def test_it_reads_the_bytes_line_of_each_nfs_mount(name: str, expected: tuple[Any, ...]) -> None:
    assert tool.parse_mountstats(fixture(name)) == [expected]


def test_it_unescapes_mount_points_as_the_kernel_writes_them() -> None:
    # /proc/mounts of a tmpfs on "/tmp/rb mount test" (tests/fixtures/facts): the kernel's \040 for a space
    line = (FIXTURES / "facts" / "proc_mounts_escaped_local_vm.txt").read_text().split()[1]
    assert tool._unescape(line) == "/tmp/rb mount test"


def test_it_reads_network_counters_through_kept_open_files() -> None:
    net = tool.Net(1, MS, nics=["lo"])
    try:
        net.sample(1)
        with socket.create_server(("127.0.0.1", 0)) as server:
            client = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
            client.sendall(b"x" * 100_000)
            received = 0
            while received < 100_000:
                received += len(peer.recv(1 << 16))
            client.close()
            peer.close()
        net.sample(2)
    finally:
        net.close()
    stream = net.streams[0]
    assert [c["name"] for c in stream.definition["columns"]] == ["net.rx_bytes", "net.tx_bytes"]
    assert list(stream.ts) == [1, 2]
    rx = stream.cols[0]
    assert rx[1] - rx[0] >= 100_000


def test_it_reads_rdma_port_counters_as_four_byte_words(tmp_path: Path) -> None:
    for device, port, rcv, xmit in (("mlx5_0", 1, 1000, 2000), ("mlx5_1", 1, 7, 9)):
        counters = tmp_path / device / "ports" / str(port) / "counters"
        counters.mkdir(parents=True)
        (counters / "port_rcv_data").write_text(f"{rcv}\n")
        (counters / "port_xmit_data").write_text(f"{xmit}\n")

    rdma = tool.Rdma(1, MS, root=str(tmp_path))
    rdma.sample(5)
    rdma.close()

    stream = rdma.streams[0]
    columns = stream.definition["columns"]
    assert [(c["name"], c["labels"], c["scale"]) for c in columns[:2]] == [
        ("rdma.rx_bytes", {"device": "mlx5_0", "port": 1}, 4),
        ("rdma.tx_bytes", {"device": "mlx5_0", "port": 1}, 4),
    ]
    assert [col[0] for col in stream.cols] == [1000, 2000, 7, 9]
    assert rdma.sources() == [{"device": "mlx5_0", "port": 1}, {"device": "mlx5_1", "port": 1}]


def test_a_counter_that_cannot_be_read_any_more_is_recorded_as_missing(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("5\n")
    (tmp_path / "gone").write_text("6\n")
    group = tool.CounterFiles(1, MS, [(str(tmp_path / n), tool.column(n, {}, "B", "counter")) for n in ("gone", "ok")])
    (tmp_path / "gone").write_text("not a number\n")

    group.sample(1)

    assert [list(c) for c in group.streams[0].cols] == [[tool.MISSING], [tool.MISSING]]
    assert list(group.streams[0].ts) == [1]


# --- nvidia-smi ---------------------------------------------------------------------------------------------


def test_it_reads_a_noheader_nounits_line_of_nvidia_smi() -> None:
    line = (FIXTURES / "facts" / "nvidia_smi_noheader_nounits_rtx_2080.csv").read_text().strip()

    values = tool.parse_gpu_line(line, RTX_2080_FIELDS)

    assert values is not None
    assert values["power.draw"] == 176.98
    assert values["clocks.sm"] == 1965
    assert values["utilization.gpu"] == 86 and values["utilization.memory"] == 55
    assert math.isnan(values["temperature.memory"])  # a bare N/A


def test_it_reads_nvidia_smi_values_with_units_and_placeholders() -> None:
    text = (NVIDIA / "query-gpu-loop-v100s-miris.csv").read_text().splitlines()
    fields = header_fields(text[0])
    samples = [tool.parse_gpu_line(line, fields) for line in text[1:]]
    assert len(samples) == 107 and all(s is not None for s in samples)
    assert samples[0] is not None and samples[0]["index"] == 0 and samples[0]["memory.used"] == 1

    mig = (NVIDIA / "query-gpu-h100-mig-load-590.48.01.csv").read_text().splitlines()
    values = tool.parse_gpu_line(mig[1], header_fields(mig[0]))
    assert values is not None
    assert math.isnan(values["utilization.gpu"])  # [N/A] in MIG mode
    assert values["clocks.current.sm"] > 0


def test_it_ignores_what_nvidia_smi_prints_instead_of_samples() -> None:
    failure = (FIXTURES / "facts" / "nvidia_smi_driver_failure.txt").read_text()
    assert all(tool.parse_gpu_line(line) is None for line in failure.splitlines())


def test_it_reads_pcie_throughput_from_nvidia_smi_dmon() -> None:
    parser = tool.DmonParser()
    rows = [parser.feed(line) for line in (NVIDIA / "dmon-o-TD-mutc-xuesongtap.txt").read_text().splitlines()]
    samples = [r for r in rows if r is not None]

    assert [(gpu, row["rxpci"], row["txpci"]) for gpu, row in samples[:2]] == [(0, 5, 10), (0, 217, 677)]

    parser = tool.DmonParser()
    h100 = [parser.feed(line) for line in (NVIDIA / "dmon-h100-80gb-hbm3-load-590.48.01.txt").read_text().splitlines()]
    assert all("rxpci" not in row for _gpu, row in filter(None, h100))  # not asked for there


def nounits_line(capture: Path, fields: tuple[str, ...]) -> str:
    """Our fields of a real --format=csv capture, as --format=csv,noheader,nounits prints them."""
    header, row = capture.read_text().splitlines()[:2]
    values = dict(zip(header_fields(header), (c.strip() for c in row.split(",")), strict=True))
    aliases = {"clocks.sm": "clocks.current.sm"}
    cells = [values[aliases.get(f, f)] for f in fields]
    return ", ".join(c if c.startswith("[") else c.split()[0] for c in cells)


def fake_nvidia_smi(tmp_path: Path) -> Path:
    """An nvidia-smi that loops over the H100 capture's values (load, then MIG), prints the dmon capture, and
    answers ``nvlink -gt d`` with the H800's idle counters the first time and its counters in training after."""
    lines = [
        nounits_line(NVIDIA / "query-gpu-h100-80gb-hbm3-load-590.48.01.csv", tool.GPU_FIELDS),
        nounits_line(NVIDIA / "query-gpu-h100-mig-load-590.48.01.csv", tool.GPU_FIELDS),
    ]
    dmon = (NVIDIA / "dmon-o-TD-mutc-xuesongtap.txt").read_text()
    nvlink = [(NVIDIA / f"nvlink-gt-d-h800-{when}-llm-action.txt").read_text() for when in ("idle", "training")]
    script = tmp_path / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        f"LINES = {lines!r}\n"
        f"DMON = {dmon!r}\n"
        f"NVLINK = {nvlink!r}\n"
        f"CALLED = {str(tmp_path / 'nvlink-called')!r}\n"
        "if sys.argv[1] == 'dmon':\n"
        "    print(DMON, flush=True)\n"
        "    time.sleep(60)\n"
        "if sys.argv[1:] == ['nvlink', '-gt', 'd']:\n"
        "    print(NVLINK[os.path.exists(CALLED)], end='')\n"
        "    open(CALLED, 'a').close()\n"
        "    sys.exit(0)\n"
        "ms = int(sys.argv[sys.argv.index('-lms') + 1])\n"
        "for i in range(600):\n"
        "    print(LINES[i % 2], flush=True)\n"
        "    time.sleep(ms / 1000)\n"
    )
    script.chmod(0o755)
    return script


# --- the sampler, run for real --------------------------------------------------------------------------------


def run_sampler(directory: Path, seconds: float, *args: str, env: dict[str, str] | None = None) -> Path:
    """Run the sampler for ``seconds`` after it is ready, stop it with SIGTERM; returns its directory."""
    proc = subprocess.Popen(
        [sys.executable, str(SAMPLER), "--dir", str(directory), *args],
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not (directory / tool.READY).exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the sampler did not become ready"
        time.sleep(0.01)
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGTERM)
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    return directory


def decoded_streams(path: Path) -> list[tuple[dict[str, Any], np.ndarray, np.ndarray]]:
    """(definition, timestamps, values as columns x rows) of every stream of a sampler file."""
    definitions: dict[int, dict[str, Any]] = {}
    parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for kind, payload in tool.read_frames(path.read_bytes()):
        if kind == tool.DEFINE:
            definition = json.loads(bytes(payload))
            definitions[definition["stream"]] = definition
        elif kind == tool.SAMPLE:
            sid, rows, body = tool.sample_body(payload)
            width = len(definitions[sid]["columns"])
            dtype = "<i8" if definitions[sid]["type"] == "q" else "<f8"
            ts = np.frombuffer(body, "<i8", count=rows)
            parts.setdefault(sid, []).append((ts, np.frombuffer(body, dtype, offset=rows * 8).reshape(width, rows)))
    return [
        (definitions[sid], np.concatenate([p[0] for p in chunks]), np.concatenate([p[1] for p in chunks], axis=1))
        for sid, chunks in parts.items()
    ]


def decoded(path: Path) -> dict[str, tuple[dict[str, Any], np.ndarray, np.ndarray]]:
    """group -> (definition, timestamps, values) of a sampler file with one stream per group."""
    return {definition["group"]: (definition, ts, values) for definition, ts, values in decoded_streams(path)}


@contextlib.contextmanager
def loopback_traffic() -> Iterator[None]:
    """UDP datagrams to ourselves on lo, a few hundred a second, until the block ends."""
    stop = threading.Event()
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))

    def send() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            while not stop.wait(0.002):
                out.sendto(b"x" * 1000, sink.getsockname())

    sender = threading.Thread(target=send)
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join()
        sink.close()


@pytest.mark.parametrize("fast_loop", ["compiled", "python"])
def test_it_samples_this_machine_fast_and_slow_until_sigterm(tmp_path: Path, fast_loop: str) -> None:
    with loopback_traffic():
        run_sampler(
            tmp_path, 1.5, "--groups", "cpu,mem,net,disk", "--interval", str(200 * MS), "--fast", "net",
            "--fast-loop", fast_loop,
        )  # fmt: skip

    assert (tmp_path / "fastloop").exists() == (fast_loop == "compiled")
    slow, fast = decoded(tmp_path / "slow.rbs"), decoded(tmp_path / "fast.rbs")
    assert set(slow) == {"cpu", "mem", "disk"} and set(fast) == {"net"}
    definition, ts, values = fast["net"]
    assert definition["interval_ns"] == MS
    assert {c["labels"]["nic"] for c in definition["columns"]} >= {"lo"}
    assert len(ts) > 500 and values.shape == (len(definition["columns"]), len(ts))
    assert 0.8 * MS <= np.median(np.diff(ts)) <= 1.2 * MS  # kept its cadence on this 2-core machine
    assert (np.diff(values, axis=1) >= 0).all()  # counters
    lo_rx = [c["name"] == "net.rx_bytes" and c["labels"]["nic"] == "lo" for c in definition["columns"]].index(True)
    assert values[lo_rx, -1] - values[lo_rx, 0] > 100_000  # read every tick, not once
    assert abs(int(ts[0]) - time.time_ns()) < 60 * 10**9  # absolute timestamps
    cpu_def, cpu_ts, cpu = slow["cpu"]
    assert [c["name"] for c in cpu_def["columns"][:3]] == ["cpu.util", "cpu.busiest_util", "cpu.core_util"]
    assert len(cpu_ts) >= 6 and ((cpu >= 0) & (cpu <= 100)).all()
    assert (cpu[1] >= cpu[2:].max(axis=0) - 1e-9).all()  # the busiest core is the busiest of the cores
    assert abs(int(cpu_ts[0]) - time.time_ns()) < 60 * 10**9  # absolute timestamps
    mem_def, _mem_ts, mem = slow["mem"]
    assert [c["scale"] for c in mem_def["columns"]] == [1024] * 4
    assert (mem[:3] > 0).all() and (mem[3] >= 0).all()  # used, available, cached; dirty may be nothing


@pytest.mark.parametrize("fast_loop", ["compiled", "python"])
def test_a_sampler_stopped_alone_stops_its_fast_process_too(tmp_path: Path, fast_loop: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(SAMPLER), "--dir", str(tmp_path), "--groups", "cpu,net", "--fast", "net",
         "--fast-loop", fast_loop],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / tool.READY).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)  # the parent only, not the process group
        assert proc.wait(timeout=10) == 0
        assert not group_has_members(proc.pid)
    finally:
        if group_has_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_without_a_c_compiler_the_fast_groups_are_sampled_by_python(tmp_path: Path) -> None:
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}

    run_sampler(tmp_path / "auto", 0.5, "--groups", "net", "--fast", "net", env=env)
    refused = subprocess.run(
        [sys.executable, str(SAMPLER), "--dir", str(tmp_path / "compiled"), "--groups", "net", "--fast", "net",
         "--fast-loop", "compiled"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    probe = subprocess.run(
        [sys.executable, str(SAMPLER), "--dir", str(tmp_path / "probe"), "--groups", "net", "--fast", "net", "--probe"],
        capture_output=True, text=True, env=env, timeout=30, check=True,
    )  # fmt: skip

    assert not (tmp_path / "auto" / "fastloop").exists()
    assert len(decoded(tmp_path / "auto" / "fast.rbs")["net"][1]) > 100
    assert refused.returncode == 2 and "--fast-loop compiled" in refused.stderr and "no-such-cc" in refused.stderr
    assert json.loads(probe.stdout)["fast_loop"] == "python"


def test_the_probe_builds_the_compiled_loop_once(tmp_path: Path) -> None:
    argv = [sys.executable, str(SAMPLER), "--dir", str(tmp_path), "--groups", "net", "--fast", "net", "--probe"]

    first = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout)
    built = (tmp_path / "fastloop").stat().st_mtime_ns
    again = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout)

    assert first["fast_loop"] == again["fast_loop"] == "compiled"
    assert (tmp_path / "fastloop").stat().st_mtime_ns == built


def group_has_members(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_it_samples_gpus_through_nvidia_smi(tmp_path: Path) -> None:
    fake = fake_nvidia_smi(tmp_path)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}

    run_sampler(
        tmp_path / "out", 1.2, "--groups", "gpu", "--interval", str(200 * MS), "--nvlink-every", str(300 * MS), env=env
    )

    streams = {d["columns"][0]["name"]: (d, ts, v) for d, ts, v in decoded_streams(tmp_path / "out" / "slow.rbs")}
    assert set(streams) == {"gpu.util", "gpu.pcie_rx", "gpu.nvlink_tx_bytes"}
    query, ts, values = streams["gpu.util"]
    assert [c["name"] for c in query["columns"]] == [name for name, _unit, _scale in tool.GPU_COLUMNS.values()]
    assert query["columns"][0]["labels"] == {"gpu": 0}
    assert len(ts) >= 4 and (np.diff(ts) > 0).all()
    # the H100 under load (100 %, 11 %, 19818 MiB, 631.95 W, 1980 MHz, 59 C), then in MIG mode ([N/A] utilisation)
    assert values[:, 0].tolist() == [100, 11, 19818, 631.95, 1980, 59]
    assert math.isnan(values[0, 1]) and values[2, 1] > 0
    pcie, _ts, rates = streams["gpu.pcie_rx"]
    assert [c["unit"] for c in pcie["columns"]] == ["MB/s", "MB/s"]
    assert rates[:, :3].tolist() == [[5, 217, 0], [10, 677, 3]]
    nvlink, ts, kib = streams["gpu.nvlink_tx_bytes"]
    assert nvlink["type"] == "q" and nvlink["interval_ns"] == 300 * MS
    assert [(c["name"], c["kind"], c["unit"], c["scale"]) for c in nvlink["columns"]] == [
        ("gpu.nvlink_tx_bytes", "counter", "B", 1024),
        ("gpu.nvlink_rx_bytes", "counter", "B", 1024),
    ]
    assert len(ts) >= 3 and (np.diff(ts) >= 250 * MS).all()  # one read every --nvlink-every, not every tick
    assert kib[:, 0].tolist() == [46904218, 46904215] and kib[:, 1].tolist() == [11128243781, 11102817348]


def test_it_reads_nvlink_data_counters_summed_over_each_gpus_links() -> None:
    idle = tool.parse_nvlink((NVIDIA / "nvlink-gt-d-h800-idle-llm-action.txt").read_text())
    tx = 5863784 + 5864084 + 5864630 + 5863784 + 5861984 + 5861984 + 5861984 + 5861984
    rx = 5863677 + 5862999 + 5863940 + 5861984 + 5862774 + 5862696 + 5862999 + 5863146
    assert idle == {0: {"Tx": tx, "Rx": rx}}
    two = (NVIDIA / "nvlink-gt-r-h800-2gpu-llm-action.txt").read_text()
    raw = tool.parse_nvlink(two, counter="Raw")
    assert sorted(raw) == [0, 1]
    assert raw[1]["Tx"] == 25415406 + 8614105 + 8618737 + 8617599 + 8619360 + 8616291 + 8621649 + 8626449
    assert tool.parse_nvlink(two) == {}  # -gt r prints no data counters
    assert tool.parse_nvlink(two.splitlines()[0]) == {}  # a GPU that lists no link


def test_it_stops_asking_for_nvlink_counters_where_there_are_none(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    calls = tmp_path / "calls"
    script.write_text(  # a GPU without NVLink: every command prints nothing
        f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = nvlink ] && exit 0\nsleep 60\n'
    )
    script.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    run_sampler(tmp_path / "out", 1.0, "--groups", "gpu", "--interval", str(100 * MS), "--nvlink-every", str(100 * MS),
                env=env)  # fmt: skip

    assert calls.read_text().splitlines().count("nvlink -gt d") == 1


# --- stored as series ---------------------------------------------------------------------------------------


@pytest.fixture
def run(db: None) -> Run:
    campaign = Campaign.objects.create(name="telemetry", telemetry={"enabled": True})
    return Run.objects.create(campaign=campaign, sequence=1, point=0, repetition=1)


def written(tmp_path: Path, streams: list[tool.Stream], end: dict[str, int] | None = None) -> bytes:
    output = tool.Output(str(tmp_path / "file.rbs"), 1 << 30)
    for stream in streams:
        output.define(stream)
    for stream in streams:
        output.write(stream.frame())
    if end:
        output.end(end)
    os.close(output.fd)
    return (tmp_path / "file.rbs").read_bytes()


def samples(series: Series) -> codec.Decoded:
    chunks = [codec.decode(c.data) for c in Chunk.objects.filter(series=series).order_by("seq")]
    return codec.Decoded(
        np.concatenate([c.timestamps_ns for c in chunks]), np.concatenate([c.values for c in chunks]), None, None
    )


def test_it_stores_counters_scaled_gauges_as_they_are_and_leaves_out_what_is_missing(run: Run, tmp_path: Path) -> None:
    rdma = tool.Stream(
        1, "rdma", MS, "q", [tool.column("rdma.rx_bytes", {"device": "mlx5_0", "port": 1}, "B", "counter", 4)]
    )
    cpu = tool.Stream(2, "cpu", 100 * MS, "d", [tool.column("cpu.util", {}, "%", "gauge", precision=0.01)])
    t0 = 1_767_225_600 * 10**9
    for i, value in enumerate([10, 20, tool.MISSING, 40]):
        rdma.ts.append(t0 + i * MS)
        rdma.appenders[0](value)
    for i, value in enumerate([12.345, math.nan, 50.0]):
        cpu.ts.append(t0 + i * 100 * MS)
        cpu.appenders[0](value)

    stored = sampler_ingest(run=run, host="n1", blobs=[written(tmp_path, [rdma, cpu])])

    assert stored == {"series": 2, "samples": 5}
    rx = Series.objects.get(run=run, name="rdma.rx_bytes")
    assert (rx.kind, rx.unit, rx.labels, rx.interval_ns, rx.host) == (
        SeriesKind.COUNTER,
        "B",
        {"device": "mlx5_0", "port": 1},
        MS,
        "n1",
    )
    got = samples(rx)
    assert got.timestamps_ns.tolist() == [t0, t0 + MS, t0 + 3 * MS] and got.values.tolist() == [40, 80, 160]
    util = samples(Series.objects.get(run=run, name="cpu.util"))
    assert util.values.tolist() == pytest.approx([12.345, 50.0], abs=0.0051)  # to within precision/2


def test_it_keeps_samples_up_to_one_interval_after_the_benchmark_ended(run: Run, tmp_path: Path) -> None:
    net = tool.Stream(1, "net", MS, "q", [tool.column("net.rx_bytes", {"nic": "lo"}, "B", "counter")])
    t0 = 1_767_225_600 * 10**9
    for i in range(10):
        net.ts.append(t0 + i * MS)
        net.appenders[0](i * 1000)

    sampler_ingest(run=run, host="n1", blobs=[written(tmp_path, [net], {"main_ended_ns": t0 + 5 * MS + 1})])

    assert samples(Series.objects.get(run=run)).timestamps_ns[-1] == t0 + 6 * MS


def test_storing_again_replaces_a_hosts_series_and_timestamps_only_ever_increase(run: Run, tmp_path: Path) -> None:
    gpu = tool.Stream(
        1, "gpu", 100 * MS, "d", [tool.column("gpu.memory_used_bytes", {"gpu": 0}, "B", "gauge", 1 << 20)]
    )
    t0 = 1_767_225_600 * 10**9
    for t, value in ((t0, 1.0), (t0, 2.0), (t0 + 100 * MS, 3.0), (t0 + 50 * MS, 4.0), (t0 + 200 * MS, 5.0)):
        gpu.ts.append(t)  # two lines read at once, then a clock stepped back
        gpu.appenders[0](value)
    blob = written(tmp_path, [gpu])

    sampler_ingest(run=run, host="n1", blobs=[blob])
    sampler_ingest(run=run, host="n1", blobs=[blob])

    series = Series.objects.get(run=run)
    assert samples(series).values.tolist() == [1 << 20, 3 << 20, 5 << 20]


def test_a_sampler_file_cut_short_keeps_its_whole_frames(run: Run, tmp_path: Path) -> None:
    net = tool.Stream(1, "net", MS, "q", [tool.column("net.rx_bytes", {"nic": "lo"}, "B", "counter")])
    for i in range(3):
        net.ts.append(1_767_225_600 * 10**9 + i * MS)
        net.appenders[0](i)
    blob = written(tmp_path, [net])

    sampler_ingest(run=run, host="n1", blobs=[blob + blob[len(tool.MAGIC) : len(tool.MAGIC) + 7]])

    assert Series.objects.get(run=run).sample_count == 3


def test_a_real_sampler_file_is_stored_and_summarised(run: Run, tmp_path: Path) -> None:
    run_sampler(tmp_path, 1.0, "--groups", "cpu,net", "--interval", str(100 * MS), "--fast", "net")

    blobs = [(tmp_path / name).read_bytes() for name in ("slow.rbs", "fast.rbs")]

    stored = sampler_ingest(run=run, host="n1", blobs=blobs)
    run_telemetry_summarize(run=run, skip=DETAIL_SERIES)

    names = set(Series.objects.filter(run=run).values_list("name", flat=True))
    assert {"cpu.util", "cpu.busiest_util", "cpu.core_util", "net.rx_bytes", "net.tx_bytes"} <= names
    assert stored["samples"] > 1000
    results = {(r.name, r.labels.get("nic")): r for r in run.results.all()}
    assert results[("net.rx_bytes.max", "lo")].unit == "B/s"
    assert ("cpu.busiest_util.p99", None) in results
    assert not any(name.startswith("cpu.core_util") for name, _nic in results)


# --- the campaign's telemetry: settings ------------------------------------------------------------------------


def test_the_settings_are_normalised() -> None:
    assert telemetry_config.validate_telemetry(None) == {}
    assert telemetry_config.validate_telemetry({"enabled": False, "interval": "1ms"}) == {}
    assert telemetry_config.validate_telemetry(True) == {
        "enabled": True,
        "interval": "1s",
        "groups": list(tool.GROUPS),
        "fast": [],
    }
    assert telemetry_config.validate_telemetry(
        {"interval": 0.5, "fast_interval": "1000us", "fast": ["net", "rdma"], "groups": ["cpu", "net", "rdma"]}
    ) == {
        "enabled": True,
        "interval": "500ms",
        "groups": ["cpu", "net", "rdma"],
        "fast": ["net", "rdma"],
        "fast_interval": "1ms",
    }


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"interval": "500us", "groups": ["net"]}, "telemetry.interval", "500us is shorter than 1ms"),
        ({"interval": "1ms"}, "telemetry.interval", "shorter than 100ms, the shortest interval for cpu, mem, nfs"),
        ({"fast": ["cpu"]}, "telemetry.fast", "cpu cannot be sampled at fast_interval"),
        ({"fast": ["disk"]}, "telemetry.fast", "only counters read from one sysfs file each (net, rdma)"),
        ({"fast": ["net"], "groups": ["cpu"]}, "telemetry.fast", "net is not in telemetry.groups"),
        ({"fast": ["net"], "fast_interval": "100us"}, "telemetry.fast_interval", "100us is shorter than 1ms"),
        ({"fast": ["net"], "fast_interval": "2s"}, "telemetry.fast_interval", "must be shorter than interval (1s)"),
        ({"fast_interval": "1ms"}, "telemetry.fast_interval", "telemetry.fast names no group"),
        ({"groups": ["cpu", "ipmi"]}, "telemetry.groups", "unknown group 'ipmi'"),
        ({"interval": "fast"}, "telemetry.interval", "must be a duration"),
        ({"enabled": "yes"}, "telemetry.enabled", "must be true or false"),
        ({"rate": 5}, "telemetry.rate", "unknown field"),
        ("1s", "telemetry", "must be a mapping"),
        ({"prometheus": [{"name": "up", "query": "up", "step": "soon"}]}, "telemetry.prometheus[0].step", "1ms"),
        ({"prometheus": [{"name": "up", "query": "up", "step": 0}]}, "telemetry.prometheus[0].step", "longer than"),
        (
            {"prometheus": [{"name": "up", "query": "up"}, {"name": "up", "query": "up"}]},
            "telemetry.prometheus[1].name",
            "'up' is used twice",
        ),
        ({"prometheus": {"name": "up"}}, "telemetry.prometheus", "must be a list"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(value: Any, field: str, words: str) -> None:
    with pytest.raises(ParamError) as caught:
        telemetry_config.validate_telemetry(value)
    assert caught.value.field == field
    assert words in caught.value.message


def campaign_data(**extra: Any) -> dict[str, Any]:
    fixed = {"rw": "read", "bs": "4k", "size": "8M"}
    return {"name": "sampled", "kind": "fio", "nodes": ["n1"], "fixed": fixed, **extra}


def test_a_campaign_stores_its_telemetry_settings_and_exports_them(db: None) -> None:
    from inventory.services import node_upsert

    node_upsert(name="n1", address="10.0.0.1")
    settings = {"interval": "1s", "fast_interval": "1ms", "fast": ["net", "rdma"], "groups": list(tool.GROUPS)}

    campaign = services.campaign_apply(data=campaign_data(telemetry=settings))

    assert campaign.telemetry == {**settings, "enabled": True}
    exported = selectors.campaign_spec(campaign=Campaign.objects.get(pk=campaign.pk))
    assert exported["telemetry"] == campaign.telemetry
    again = services.campaign_apply(data={**exported, "name": "sampled-again"})
    assert again.telemetry == campaign.telemetry


def test_a_campaign_with_bad_telemetry_is_refused_naming_the_field(db: None) -> None:
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=campaign_data(telemetry={"fast": ["gpu"]}))
    assert caught.value.field == "telemetry.fast"
    assert str(caught.value).startswith("telemetry.fast: gpu cannot be sampled at fast_interval")


def test_a_campaign_with_a_bad_prometheus_step_is_refused_naming_the_query(db: None) -> None:
    queries = [{"name": "load", "query": "node_load1", "step": "2 minutes"}]
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=campaign_data(telemetry={"groups": [], "prometheus": queries}))
    assert caught.value.field == "telemetry.prometheus[0].step"
    assert str(caught.value) == (
        "telemetry.prometheus[0].step: must be a duration such as 1s, 500ms or 1ms, got '2 minutes'"
    )


def test_a_bad_file_of_default_prometheus_queries_fails_the_system_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.conf import settings

    from telemetry.apps import check_prometheus_queries

    path = tmp_path / "queries.yaml"
    path.write_text("- {name: up, query: up, step: -1s}\n")
    monkeypatch.setitem(settings.RACKBENCH, "PROMETHEUS_QUERIES", str(path))

    (error,) = check_prometheus_queries()

    assert error.id == "telemetry.E001"
    assert error.msg.startswith("RACKBENCH_PROMETHEUS_QUERIES[0].step: must be a duration")
    path.write_text("- {name: up, query: up, step: 15s}\n")
    assert check_prometheus_queries() == []


def test_telemetry_under_slurm_is_refused(db: None) -> None:
    launcher = {"kind": "slurm", "login_node": "login1", "partition": "gpu"}
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=campaign_data(telemetry=True, launcher=launcher))
    assert caught.value.field == "telemetry"


def test_the_sampler_command_line_follows_the_settings() -> None:
    config = telemetry_config.validate_telemetry({"interval": "1s", "fast": ["net"], "groups": ["cpu", "net"]})

    argv = samplers.sampler_argv(config, end_marker="../exit_code", max_seconds=4200)

    assert argv == [
        "python3", "sampler.py", "--dir", ".", "--groups", "cpu,net", "--interval", "1000000000",
        "--fast", "net", "--fast-interval", "1000000", "--end-marker", "../exit_code", "--max-seconds", "4200",
    ]  # fmt: skip
    assert tool.parse_args(argv[2:]).fast == ["net"]
