#!/usr/bin/env python3
"""Samples a node's counters and gauges while a benchmark runs, into a compact binary file (rackbench telemetry).

Plain Python (standard library, 3.8+) so it runs on any node with a ``python3``. rackbench starts it detached in
the run directory right before the benchmark and stops it with SIGTERM afterwards; it flushes and exits.

Groups, and what each records (``kind`` counter: cumulative, read as rates by rackbench; gauge: a level):

    cpu   /proc/stat: cpu.util (all cores), cpu.busiest_util (the busiest core at each sample),
          cpu.core_util {core}: % busy over the last interval (gauges; no sample until the second tick)
    mem   /proc/meminfo: mem.used_bytes (MemTotal - MemAvailable), mem.available_bytes, mem.cached_bytes,
          mem.dirty_bytes (gauges)
    net   /sys/class/net/*/statistics/{rx,tx}_bytes: net.rx_bytes, net.tx_bytes {nic} (counters; veth* left out)
    rdma  /sys/class/infiniband/*/ports/*/counters/port_{rcv,xmit}_data: rdma.rx_bytes, rdma.tx_bytes
          {device, port} (counters; the kernel counts 4-byte words: recorded as read, scaled by 4 on ingest)
    nfs   /proc/self/mountstats, the ``bytes:`` line of each NFS mount: nfs.read_bytes, nfs.write_bytes
          {mount, export} (counters: bytes read from / written to the server, i.e. what crossed the network)
    disk  /proc/diskstats, whole disks (not partitions, loop, ram or zram devices): disk.read_bytes,
          disk.write_bytes {device} (counters of 512-byte sectors, scaled on ingest)
    gpu   ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms MS`` when nvidia-smi exists: gpu.util,
          gpu.mem_util, gpu.memory_used_bytes, gpu.power_w, gpu.sm_clock_mhz, gpu.temperature_c {gpu}; and
          ``nvidia-smi dmon -s t`` for gpu.pcie_rx, gpu.pcie_tx {gpu} in MB/s where the GPU reports them (gauges);
          ``nvidia-smi nvlink -gt d`` every ``--nvlink-every`` ns (one-shot: it has no loop) for gpu.nvlink_tx_bytes,
          gpu.nvlink_rx_bytes {gpu}: data payload summed over the GPU's links (counters of KiB, scaled on ingest;
          none on a GPU without NVLink)

Groups not in ``--fast`` are sampled every ``--interval`` ns, those in it (net and rdma only: one small sysfs file
per counter) every ``--fast-interval`` ns, by a second process so that the slow groups' parsing never delays a
fast tick. Each process keeps its cadence by sleeping until its next deadline (ticks it missed are skipped, not
caught up), reads counters with ``os.pread`` on files opened once, appends to ``array`` columns and writes a frame
every few seconds. Timestamps are ``time.time_ns()``, taken just before a tick's reads. Where a C compiler exists
(``--fast-loop auto``), the fast process hands the reads to ``fastloop`` (fastloop.c next to this file, built into
``--dir`` once) over the same open files, and only moves its records into the columns ten times a second: at 1 ms
the Python loop's own work per wake-up is as large as its reads.

Output: ``slow.rbs`` and ``fast.rbs`` in ``--dir`` (only those with something to sample), then an empty ``ready``
file once every process has taken its first sample. A file is ``MAGIC`` then frames, each ``kind`` (one byte) and
payload length (uint32 LE), then the payload:

    D   a stream's definition, JSON: {"stream": id, "group": ..., "interval_ns": ..., "type": "q" or "d",
        "columns": [{"name", "labels", "unit", "kind", "scale", "precision"}, ...]}
    S   samples of a stream: stream id (uint16), rows (uint32), compressed (uint8), then the body (zlib'd when
        compressed): rows int64 timestamps, then each column's rows values (int64 or float64), column after
        column. A missing value is -1 in an int64 column (counters are never negative), NaN in a float64 one.
    E   JSON {"main_ended_ns": ...}: when the file named by ``--end-marker`` (the benchmark's exit_code) was
        written, if it exists when the sampler stops

A sampler killed without SIGTERM loses at most its last few seconds; a frame cut short at the end is ignored by
``read_frames``. ``--probe`` prints what would be sampled, as JSON, and exits. Exit status: 0, 2 for bad
arguments, 1 when a file cannot be written (the reason on stderr).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import fcntl
import glob
import json
import math
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

MAGIC = b"RBSAMPL1"
FRAME = struct.Struct("<cI")  # kind, payload length
SAMPLES = struct.Struct("<HIB")  # stream id, rows, compressed
DEFINE, SAMPLE, END = b"D", b"S", b"E"
GROUPS = ("cpu", "mem", "net", "rdma", "nfs", "disk", "gpu")
FAST_GROUPS = ("net", "rdma")  # counters read from one small sysfs file each
FILES = {"slow": "slow.rbs", "fast": "fast.rbs"}
READY = "ready"
MISSING = -1
FLUSH_NS = 2 * 10**9  # each stream gets a frame this often
ZLIB_LEVEL = 1
GPU_FIELDS = (
    "index",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "power.draw",
    "clocks.sm",
    "temperature.gpu",
)
# query field -> (series name, unit, scale)
GPU_COLUMNS = {
    "utilization.gpu": ("gpu.util", "%", 1),
    "utilization.memory": ("gpu.mem_util", "%", 1),
    "memory.used": ("gpu.memory_used_bytes", "B", 1 << 20),  # MiB without units
    "power.draw": ("gpu.power_w", "W", 1),
    "clocks.sm": ("gpu.sm_clock_mhz", "MHz", 1),
    "temperature.gpu": ("gpu.temperature_c", "C", 1),
}
PCIE_COLUMNS = {"rxpci": ("gpu.pcie_rx", "MB/s"), "txpci": ("gpu.pcie_tx", "MB/s")}
# ``nvidia-smi nvlink -gt d``: data payload counters per link in KiB, summed per GPU
NVLINK_COLUMNS = {"Tx": "gpu.nvlink_tx_bytes", "Rx": "gpu.nvlink_rx_bytes"}
NVLINK_HEADER = re.compile(r"^GPU (\d+): ")
NVLINK_LINK = re.compile(r"^\s*Link (\d+): (Data|Raw) (Tx|Rx): (\d+) KiB\s*$")
NVLINK_EVERY_NS = 10 * 10**9  # a one-shot nvidia-smi per read: not at every 1 s tick
MEMINFO = (  # series name, /proc/meminfo key (kB); used is MemTotal - MemAvailable
    ("mem.used_bytes", None),
    ("mem.available_bytes", "MemAvailable"),
    ("mem.cached_bytes", "Cached"),
    ("mem.dirty_bytes", "Dirty"),
)
SKIPPED_DISKS = ("loop", "ram", "zram")


def pairs(a: Iterable[Any], b: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """zip() of two sequences of one length (zip's strict= needs Python 3.10; the tools run on 3.8)."""
    return zip(a, b)  # noqa: B905


class Stop(Exception):
    """The sampler was asked to stop, or cannot go on (the message says why)."""


_stopping = False


def _on_signal(signum: int, frame: object) -> None:
    global _stopping
    _stopping = True


# --- parsers (pure functions of the files' text) ------------------------------------------------------------


def parse_proc_stat(text: bytes) -> list[tuple[str, int, int]]:
    """(name, busy, total) jiffies for the "cpu" line and each "cpuN" line of /proc/stat, in file order.

    total is user + nice + system + idle + iowait + irq + softirq + steal (guest time is already in user and
    nice); busy is total less idle and iowait.
    """
    out: list[tuple[str, int, int]] = []
    for line in text.split(b"\n"):
        if not line.startswith(b"cpu"):
            if out:
                break  # the cpu lines come first and together
            continue
        fields = line.split()
        values = [int(v) for v in fields[1:9]]
        values += [0] * (8 - len(values))  # old kernels print fewer columns
        total = sum(values)
        out.append((fields[0].decode(), total - values[3] - values[4], total))
    return out


def utilisation(previous: tuple[int, int], current: tuple[int, int]) -> float:
    """% busy between two (busy, total) readings; NaN when no time passed (an offline core)."""
    busy, total = current[0] - previous[0], current[1] - previous[1]
    if total <= 0:
        return math.nan
    return 100.0 * min(max(busy, 0), total) / total


def parse_meminfo(text: bytes) -> dict[str, int]:
    """/proc/meminfo as {key: kB} (the few lines without a unit, e.g. HugePages_Total, as their counts)."""
    out = {}
    for line in text.split(b"\n"):
        key, _, rest = line.partition(b":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[key.decode()] = int(fields[0])
    return out


def parse_diskstats(text: bytes) -> dict[str, tuple[int, int]]:
    """/proc/diskstats as {device: (sectors read, sectors written)}; sectors are 512 bytes whatever the disk."""
    out = {}
    for line in text.split(b"\n"):
        fields = line.split()
        if len(fields) >= 10:
            out[fields[2].decode()] = (int(fields[5]), int(fields[9]))
    return out


def _unescape(path: str) -> str:
    """Mount paths as the kernel writes them in mountstats (space, tab, newline, backslash as octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def parse_mountstats(text: bytes) -> list[tuple[str, str, str, list[int]]]:
    """(export, mount point, fstype, bytes counters) for each NFS mount of /proc/self/mountstats.

    The ``bytes:`` line holds normal read, normal write, direct read, direct write, server read and server
    write bytes, then read and write pages (nfs-utils' mountstats names them so).
    """
    out: list[tuple[str, str, str, list[int]]] = []
    current = None
    for raw in text.decode(errors="replace").split("\n"):
        line = raw.strip()
        if line.startswith("device "):
            current = None
            words = line.split()
            # device EXPORT mounted on MOUNT with fstype TYPE [statvers=...]
            shaped = len(words) >= 8 and words[2:4] == ["mounted", "on"] and words[5:7] == ["with", "fstype"]
            if shaped and words[7].startswith("nfs"):
                current = (words[1], _unescape(words[4]), words[7])
        elif current is not None and line.startswith("bytes:"):
            numbers = [int(v) for v in line[len("bytes:") :].split()]
            if len(numbers) >= 6:
                out.append((current[0], current[1], current[2], numbers))
            current = None
    return out


GPU_NUMBER = re.compile(r"^[-+]?\d+(?:\.\d+)?")


def gpu_number(text: str) -> float:
    """One value of nvidia-smi's CSV or dmon, with or without its unit ("45 %", "231.45 W", "1410"); NaN for
    [N/A], N/A, [Not Supported], -, ... (the one reader of nvidia-smi's values: the nvidia_smi plug-in uses it too)"""
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "-"):
        return math.nan
    match = GPU_NUMBER.match(text)
    return float(match.group(0)) if match else math.nan


def parse_gpu_line(line: str, fields: tuple[str, ...] | list[str] = GPU_FIELDS) -> dict[str, float] | None:
    """One line of ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader[,nounits]``; None if it is not one."""
    cells = line.split(",")
    if len(cells) != len(fields):
        return None
    values = {field: gpu_number(cell) for field, cell in pairs(fields, cells)}
    if "index" in values and math.isnan(values["index"]):
        return None  # a message, not a sample
    return values


class DmonParser:
    """``nvidia-smi dmon`` lines: ``#`` headers name the columns (a repeated header starts over); ``-`` is none."""

    def __init__(self) -> None:
        self.columns: list[str] = []

    def feed(self, line: str) -> tuple[int, dict[str, float]] | None:
        """(gpu index, {column: value}) for a sample line; None for headers, blank and foreign lines."""
        if line.startswith("#"):
            names = line.lstrip("#").split()
            if "gpu" in names:
                self.columns = names
            return None
        cells = line.split()
        if not self.columns or len(cells) != len(self.columns):
            return None
        row = dict(pairs(self.columns, cells))
        if not row["gpu"].isdigit():
            return None
        return int(row["gpu"]), {name: gpu_number(cell) for name, cell in row.items() if name != "gpu"}


def parse_nvlink(text: str, counter: str = "Data") -> dict[int, dict[str, int]]:
    """``nvidia-smi nvlink -gt d`` (``counter`` "Data": payload) or ``-gt r`` ("Raw": with protocol overhead): each
    GPU's counters summed over its links, in KiB: ``{gpu: {"Tx": ..., "Rx": ...}}``. A GPU that lists no link (no
    NVLink) is left out."""
    found: dict[int, dict[str, int]] = {}
    gpu = None
    for line in text.splitlines():
        header = NVLINK_HEADER.match(line)
        if header:
            gpu = int(header.group(1))
            continue
        link = NVLINK_LINK.match(line)
        if link and gpu is not None and link.group(2) == counter:
            totals = found.setdefault(gpu, {"Tx": 0, "Rx": 0})
            totals[link.group(3)] += int(link.group(4))
    return found


# --- streams and the output file ----------------------------------------------------------------------------


def column(name: str, labels: dict, unit: str, kind: str, scale: float = 1, precision: float | None = None) -> dict:
    return {"name": name, "labels": labels, "unit": unit, "kind": kind, "scale": scale, "precision": precision}


class Stream:
    """Rows of one tick's values: a timestamp array and one array per column, written out as frames."""

    def __init__(self, sid: int, group: str, interval_ns: int, typecode: str, columns: list[dict]) -> None:
        self.sid = sid
        self.typecode = typecode
        self.missing: float = MISSING if typecode == "q" else math.nan
        self.definition: dict[str, Any] = {
            "stream": sid,
            "group": group,
            "interval_ns": interval_ns,
            "type": typecode,
            "columns": columns,
        }
        self.ts = array.array("q")
        self.cols: list[array.array[Any]] = [array.array(typecode) for _ in columns]
        self.appenders: list[Callable[[Any], None]] = [c.append for c in self.cols]

    def pad(self) -> None:
        """After a tick failed part way: give every column a value for every timestamp."""
        for col in self.cols:
            while len(col) < len(self.ts):
                col.append(self.missing)

    def frame(self) -> bytes:
        rows = len(self.ts)
        body = self.ts.tobytes() + b"".join(c.tobytes() for c in self.cols)
        packed = zlib.compress(body, ZLIB_LEVEL)
        compressed = len(packed) < len(body)
        payload = SAMPLES.pack(self.sid, rows, compressed) + (packed if compressed else body)
        del self.ts[:]
        for col in self.cols:
            del col[:]
        return FRAME.pack(SAMPLE, len(payload)) + payload


class Output:
    def __init__(self, path: str, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        self.write(MAGIC)

    def write(self, data: bytes) -> None:
        if self.size + len(data) > self.max_bytes:
            raise Stop(f"{self.path} reached --max-bytes ({self.max_bytes}); sampling stopped")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        self.size += len(data)

    def define(self, stream: Stream) -> None:
        payload = json.dumps(stream.definition, separators=(",", ":")).encode()
        self.write(FRAME.pack(DEFINE, len(payload)) + payload)

    def end(self, info: dict) -> None:
        payload = json.dumps(info, separators=(",", ":")).encode()
        self.write(FRAME.pack(END, len(payload)) + payload)


def read_frames(data: bytes) -> Iterator[tuple[bytes, memoryview]]:
    """(kind, payload) of each whole frame of a sampler file; stops at a frame cut short."""
    if data[: len(MAGIC)] != MAGIC:
        raise ValueError("not a rackbench sampler file")
    view = memoryview(data)
    offset = len(MAGIC)
    while offset + FRAME.size <= len(data):
        kind, length = FRAME.unpack_from(view, offset)
        start = offset + FRAME.size
        if start + length > len(data):
            return
        yield kind, view[start : start + length]
        offset = start + length


def sample_body(payload: memoryview) -> tuple[int, int, bytes]:
    """(stream id, rows, uncompressed body) of an S frame's payload."""
    sid, rows, compressed = SAMPLES.unpack_from(payload, 0)
    body = payload[SAMPLES.size :]
    return sid, rows, zlib.decompress(body) if compressed else bytes(body)


# --- sources ----------------------------------------------------------------------------------------------


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY)


def _read_all(fd: int, size: int) -> tuple[bytes, int]:
    """The whole of a /proc file through its kept-open fd (read from 0 again), and a size that fits it."""
    while True:
        data = os.pread(fd, size, 0)
        if len(data) < size:
            return data, size
        size *= 2


class Group:
    name = ""

    def __init__(self, sid: int, interval_ns: int) -> None:
        self.sid = sid
        self.interval_ns = interval_ns
        self.streams: list[Stream] = []

    def sources(self) -> Any:
        """What probe reports: the instances sampled (each label set once)."""
        seen: list[dict] = []
        for stream in self.streams:
            for col in stream.definition["columns"]:
                if col["labels"] not in seen:
                    seen.append(col["labels"])
        return seen

    def sample(self, now: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class CounterFiles(Group):
    """Counters that are one number per sysfs file (net, rdma): the 1 ms path, kept as lean as possible."""

    def __init__(self, sid: int, interval_ns: int, files: list[tuple[str, dict]]) -> None:
        super().__init__(sid, interval_ns)
        self.fds: list[int] = []
        columns = []
        for path, col in files:
            try:
                fd = _open(path)
                int(os.pread(fd, 32, 0))
            except (OSError, ValueError):
                continue  # gone, or not readable here: not sampled
            self.fds.append(fd)
            columns.append(col)
        if columns:
            stream = Stream(sid, self.name, interval_ns, "q", columns)
            self.streams.append(stream)
            self.pairs = list(pairs(self.fds, stream.appenders))
            self.ts_append = stream.ts.append

    def sample(self, now: int) -> None:
        if not self.streams:
            return
        pread = os.pread
        self.ts_append(now)
        try:
            for fd, append in self.pairs:
                append(int(pread(fd, 32, 0)))
        except (OSError, ValueError):
            self.streams[0].pad()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class Net(CounterFiles):
    name = "net"

    def __init__(self, sid: int, interval_ns: int, root: str = "/sys/class/net", nics: list[str] | None = None) -> None:
        names = nics if nics is not None else net_interfaces(root)
        files = []
        for nic in names:
            for direction in ("rx", "tx"):
                path = f"{root}/{nic}/statistics/{direction}_bytes"
                files.append((path, column(f"net.{direction}_bytes", {"nic": nic}, "B", "counter")))
        super().__init__(sid, interval_ns, files)


def net_interfaces(root: str = "/sys/class/net") -> list[str]:
    """Every interface but veth* (a container's end of a pair: hundreds on a busy host, and double counting)."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [n for n in names if os.path.isdir(f"{root}/{n}/statistics") and not n.startswith("veth")]


class Rdma(CounterFiles):
    name = "rdma"

    def __init__(self, sid: int, interval_ns: int, root: str = "/sys/class/infiniband") -> None:
        files = []
        for device, port in rdma_ports(root):
            base = f"{root}/{device}/ports/{port}/counters"
            labels = {"device": device, "port": int(port)}
            files.append((f"{base}/port_rcv_data", column("rdma.rx_bytes", labels, "B", "counter", 4)))
            files.append((f"{base}/port_xmit_data", column("rdma.tx_bytes", labels, "B", "counter", 4)))
        super().__init__(sid, interval_ns, files)


def rdma_ports(root: str = "/sys/class/infiniband") -> list[tuple[str, str]]:
    found = []
    for path in sorted(glob.glob(f"{root}/*/ports/*/counters/port_xmit_data")):
        parts = path[len(root) + 1 :].split("/")
        found.append((parts[0], parts[2]))
    return found


class Cpu(Group):
    name = "cpu"

    def __init__(self, sid: int, interval_ns: int, path: str = "/proc/stat") -> None:
        super().__init__(sid, interval_ns)
        self.fd = _open(path)
        text, self.size = _read_all(self.fd, 1 << 16)
        self.cores = [name for name, _busy, _total in parse_proc_stat(text) if name != "cpu"]
        self.previous: dict[str, tuple[int, int]] | None = None  # the first tick only reads
        columns = [
            column("cpu.util", {}, "%", "gauge", precision=0.01),
            column("cpu.busiest_util", {}, "%", "gauge", precision=0.01),
        ]
        columns += [column("cpu.core_util", {"core": int(c[3:])}, "%", "gauge", precision=0.01) for c in self.cores]
        self.stream = Stream(sid, self.name, interval_ns, "d", columns)
        self.streams.append(self.stream)

    def sources(self) -> Any:
        return {"cores": len(self.cores)}

    def sample(self, now: int) -> None:
        text, self.size = _read_all(self.fd, self.size)
        current = {name: (busy, total) for name, busy, total in parse_proc_stat(text)}
        previous, self.previous = self.previous, current
        if previous is None:
            return
        util = {name: utilisation(previous[name], value) for name, value in current.items() if name in previous}
        cores = [util.get(c, math.nan) for c in self.cores]
        known = [u for u in cores if not math.isnan(u)]
        self.stream.ts.append(now)
        values = [util.get("cpu", math.nan), max(known) if known else math.nan] + cores
        for append, value in pairs(self.stream.appenders, values):
            append(value)

    def close(self) -> None:
        os.close(self.fd)


class Mem(Group):
    name = "mem"

    def __init__(self, sid: int, interval_ns: int, path: str = "/proc/meminfo") -> None:
        super().__init__(sid, interval_ns)
        self.fd = _open(path)
        self.size = _read_all(self.fd, 1 << 14)[1]
        columns = [column(name, {}, "B", "gauge", 1024) for name, _key in MEMINFO]
        self.stream = Stream(sid, self.name, interval_ns, "q", columns)
        self.streams.append(self.stream)

    def sources(self) -> Any:
        return [name for name, _key in MEMINFO]

    def sample(self, now: int) -> None:
        text, self.size = _read_all(self.fd, self.size)
        info = parse_meminfo(text)
        self.stream.ts.append(now)
        for append, (_name, key) in pairs(self.stream.appenders, MEMINFO):
            if key is None:
                total, available = info.get("MemTotal"), info.get("MemAvailable")
                append(total - available if total is not None and available is not None else MISSING)
            else:
                append(info.get(key, MISSING))

    def close(self) -> None:
        os.close(self.fd)


class Disk(Group):
    name = "disk"

    def __init__(
        self, sid: int, interval_ns: int, path: str = "/proc/diskstats", sys_block: str = "/sys/block"
    ) -> None:
        super().__init__(sid, interval_ns)
        self.fd = _open(path)
        text, self.size = _read_all(self.fd, 1 << 14)
        self.devices = whole_disks(parse_diskstats(text), sys_block)
        columns = []
        for device in self.devices:
            columns.append(column("disk.read_bytes", {"device": device}, "B", "counter", 512))
            columns.append(column("disk.write_bytes", {"device": device}, "B", "counter", 512))
        if columns:
            self.stream = Stream(sid, self.name, interval_ns, "q", columns)
            self.streams.append(self.stream)

    def sample(self, now: int) -> None:
        if not self.streams:
            return
        text, self.size = _read_all(self.fd, self.size)
        stats = parse_diskstats(text)
        self.stream.ts.append(now)
        appenders = iter(self.stream.appenders)
        for device in self.devices:
            read, written = stats.get(device, (MISSING, MISSING))
            next(appenders)(read)
            next(appenders)(written)

    def close(self) -> None:
        os.close(self.fd)


def whole_disks(stats: dict[str, tuple[int, int]], sys_block: str = "/sys/block") -> list[str]:
    """The devices of /proc/diskstats that are whole disks (in /sys/block), less loop, ram and zram devices."""
    names = set(os.listdir(sys_block)) if os.path.isdir(sys_block) else set()
    return [d for d in stats if d in names and not d.startswith(SKIPPED_DISKS)]


class Nfs(Group):
    name = "nfs"

    def __init__(self, sid: int, interval_ns: int, path: str = "/proc/self/mountstats") -> None:
        super().__init__(sid, interval_ns)
        self.fd = _open(path)
        text, self.size = _read_all(self.fd, 1 << 16)
        self.mounts: list[str] = []
        columns = []
        for export, mount, _fstype, _counters in parse_mountstats(text):
            if mount in self.mounts:
                continue  # the same mount point twice (stacked mounts): the top one is read
            self.mounts.append(mount)
            labels = {"mount": mount, "export": export}
            columns.append(column("nfs.read_bytes", labels, "B", "counter"))
            columns.append(column("nfs.write_bytes", labels, "B", "counter"))
        if columns:
            self.stream = Stream(sid, self.name, interval_ns, "q", columns)
            self.streams.append(self.stream)

    def sample(self, now: int) -> None:
        if not self.streams:
            return
        text, self.size = _read_all(self.fd, self.size)
        counters = {mount: values for _export, mount, _fstype, values in parse_mountstats(text)}
        self.stream.ts.append(now)
        appenders = iter(self.stream.appenders)
        for mount in self.mounts:
            values = counters.get(mount)
            next(appenders)(values[4] if values else MISSING)  # server read bytes
            next(appenders)(values[5] if values else MISSING)  # server write bytes

    def close(self) -> None:
        os.close(self.fd)


class Gpu(Group):
    """nvidia-smi's own loops, read as their lines arrive (stamped when read); one stream per GPU and kind, made on
    sight. NVLink counters have no loop: a one-shot ``nvidia-smi nvlink -gt d`` every ``nvlink_every_ns`` (or
    every interval when that is longer), not started again once it has shown no link."""

    name = "gpu"

    def __init__(
        self, sid: int, interval_ns: int, nvidia_smi: str | None = None, nvlink_every_ns: int = NVLINK_EVERY_NS
    ) -> None:
        super().__init__(sid, interval_ns)
        self.nvidia_smi = nvidia_smi if nvidia_smi is not None else shutil.which("nvidia-smi")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pending: dict[int, bytes] = {}
        self.handlers: dict[int, Callable[[str, int], None]] = {}
        self.nvlink_every_ns = max(interval_ns, nvlink_every_ns)
        self.nvlink_next = 0
        self.nvlink_fd: int | None = None  # the read under way
        self.nvlink_lines: list[str] = []
        self.nvlink_seen = True  # until a read shows no link
        self.by_gpu: dict[tuple[str, int], Stream] = {}
        self.next_sid = sid
        self.dmon = DmonParser()
        self.new_streams: list[Stream] = []

    def sources(self) -> Any:
        return self.nvidia_smi

    def start(self) -> None:
        if not self.nvidia_smi:
            return
        ms = max(1, self.interval_ns // 1_000_000)
        query = [self.nvidia_smi, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]
        self._spawn([*query, "-lms", str(ms)], self._query_line)
        seconds = max(1, round(self.interval_ns / 1e9))
        self._spawn([self.nvidia_smi, "dmon", "-s", "t", "-d", str(seconds)], self._dmon_line)

    def _spawn(self, argv: list[str], handler: Callable[[str, int], None], **popen: Any) -> int | None:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, bufsize=0, **popen)
        except OSError as exc:
            print(f"sampler.py: cannot run {argv[0]}: {exc}", file=sys.stderr, flush=True)
            return None
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        self.procs.append(proc)
        self.pending[fd] = b""
        self.handlers[fd] = handler
        return fd

    def fds(self) -> list[int]:
        return list(self.pending)

    def readable(self, fd: int, now: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:  # nvidia-smi ended
            del self.pending[fd]
            if fd == self.nvlink_fd:
                self._nvlink_end(now)
            return
        lines = (self.pending[fd] + data).split(b"\n")
        self.pending[fd] = lines.pop()
        for line in lines:
            self.handlers[fd](line.decode(errors="replace").strip(), now)

    def _stream(
        self, kind: str, gpu: int, columns: list[dict], typecode: str = "d", interval_ns: int | None = None
    ) -> Stream:
        key = (kind, gpu)
        if key not in self.by_gpu:
            self.next_sid += 1
            stream = Stream(self.next_sid, self.name, interval_ns or self.interval_ns, typecode, columns)
            self.by_gpu[key] = stream
            self.streams.append(stream)
            self.new_streams.append(stream)
        return self.by_gpu[key]

    def _query_line(self, line: str, now: int) -> None:
        values = parse_gpu_line(line)
        if values is None:
            return
        gpu = int(values["index"])
        columns = [
            column(name, {"gpu": gpu}, unit, "gauge", scale, precision=0.01)
            for name, unit, scale in GPU_COLUMNS.values()
        ]
        stream = self._stream("query", gpu, columns)
        stream.ts.append(now)
        for append, field in pairs(stream.appenders, GPU_COLUMNS):
            append(values[field])

    def _dmon_line(self, line: str, now: int) -> None:
        parsed = self.dmon.feed(line)
        if parsed is None:
            return
        gpu, row = parsed
        if not any(name in row for name in PCIE_COLUMNS):
            return
        columns = [column(name, {"gpu": gpu}, unit, "gauge", precision=0.01) for name, unit in PCIE_COLUMNS.values()]
        stream = self._stream("pcie", gpu, columns)
        stream.ts.append(now)
        for append, name in pairs(stream.appenders, PCIE_COLUMNS):
            append(row.get(name, math.nan))

    def sample(self, now: int) -> None:
        """Start an NVLink read when one is due (the other samples arrive on nvidia-smi's pipes)."""
        if not self.nvidia_smi or not self.nvlink_seen or self.nvlink_fd is not None or now < self.nvlink_next:
            return
        self.nvlink_next = now + self.nvlink_every_ns
        self.nvlink_lines = []
        argv = [self.nvidia_smi, "nvlink", "-gt", "d"]
        self.nvlink_fd = self._spawn(argv, lambda line, _now: self.nvlink_lines.append(line), stderr=subprocess.DEVNULL)

    def _nvlink_end(self, now: int) -> None:
        fd, self.nvlink_fd = self.nvlink_fd, None
        for proc in [p for p in self.procs if p.stdout is not None and p.stdout.fileno() == fd]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)  # it closed its output as it exited
            assert proc.stdout is not None
            proc.stdout.close()
            self.procs.remove(proc)
        counters = parse_nvlink("\n".join(self.nvlink_lines))
        if not counters:
            self.nvlink_seen = False  # no NVLink here (or this nvidia-smi cannot read it): not asked again
            return
        for gpu, totals in sorted(counters.items()):
            columns = [column(name, {"gpu": gpu}, "B", "counter", 1024) for name in NVLINK_COLUMNS.values()]
            stream = self._stream("nvlink", gpu, columns, typecode="q", interval_ns=self.nvlink_every_ns)
            stream.ts.append(now)
            for append, key in pairs(stream.appenders, NVLINK_COLUMNS):
                append(totals[key])

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()


GROUP_CLASSES: dict[str, type[Group]] = {
    "cpu": Cpu, "mem": Mem, "net": Net, "rdma": Rdma, "nfs": Nfs, "disk": Disk, "gpu": Gpu
}  # fmt: skip


def open_groups(
    names: list[str],
    interval_ns: int,
    first_sid: int,
    nics: list[str] | None = None,
    nvlink_every_ns: int = NVLINK_EVERY_NS,
) -> list[Group]:
    groups: list[Group] = []
    for i, name in enumerate(names):
        sid = first_sid + 256 * i  # GPU streams (3 per GPU) are numbered from their group's id on: room for 85 GPUs
        if name == "net":
            groups.append(Net(sid, interval_ns, nics=nics))
        elif name == "gpu":
            groups.append(Gpu(sid, interval_ns, nvlink_every_ns=nvlink_every_ns))
        else:
            groups.append(GROUP_CLASSES[name](sid, interval_ns))
    return groups


# --- the sampling loop --------------------------------------------------------------------------------------


def _wakeup_fd() -> int:
    """The read end of a pipe that a signal's arrival writes to (signal.set_wakeup_fd): a loop selecting on it
    wakes at SIGTERM at once, instead of at the end of its sleep."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    return wake_r


def _drain(wake_r: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(wake_r, 512)


class Loop:
    """One process's groups, all at one interval, written to one file."""

    def __init__(
        self, groups: list[Group], interval_ns: int, output: Output, max_seconds: float, parent: int | None
    ) -> None:
        self.groups = groups
        self.parent = parent  # the fast process stops when the slow one, its parent, is gone
        self.interval_ns = interval_ns
        self.output = output
        self.deadline_ns = time.time_ns() + int(max_seconds * 1e9)
        self.gpus = [g for g in groups if isinstance(g, Gpu)]
        self.defined: set[int] = set()
        self.broken: set[str] = set()

    def run(self, on_first_tick: Callable[[], None]) -> None:
        wake_r = _wakeup_fd()
        for gpu in self.gpus:
            gpu.start()
        self._define_new()
        interval, groups, wake = self.interval_ns, self.groups, [wake_r]
        next_tick = time.time_ns()
        flush_at = next_tick + FLUSH_NS
        first = True
        while not _stopping:
            now = time.time_ns()
            if now < next_tick:
                self._wait(wake, next_tick - now)
                continue
            for group in groups:
                try:
                    group.sample(now)
                except Exception as exc:  # noqa: BLE001 - a source that changed shape must not stop the others
                    self._broken(group, exc)
            if first:
                first = False
                on_first_tick()
            next_tick += interval
            if next_tick <= now:  # late by a whole interval or more: skip the ticks missed, keep the phase
                next_tick += ((now - next_tick) // interval + 1) * interval
            flush_at = self._flush_when_due(now, flush_at)

    def _flush_when_due(self, now: int, flush_at: int) -> int:
        """Write the frames when ``flush_at`` has come, and stop past --max-seconds or once the parent is gone;
        returns when to flush next."""
        if now < flush_at:
            return flush_at
        self.flush()
        if now >= self.deadline_ns:
            raise Stop("--max-seconds reached")
        if self.parent is not None and os.getppid() != self.parent:
            raise Stop("the slow sampler process is gone")
        return now + FLUSH_NS

    def _broken(self, group: Group, exc: Exception) -> None:
        for stream in group.streams:
            stream.pad()
        if group.name not in self.broken:
            self.broken.add(group.name)
            message = f"sampler.py: {group.name}: {type(exc).__name__}: {exc} (its values are missing)"
            print(message, file=sys.stderr, flush=True)

    def _wait(self, wake: list[int], delay_ns: int) -> None:
        """Sleep until the next tick, reading nvidia-smi's lines as they come; a signal ends it early."""
        fds = wake + [fd for gpu in self.gpus for fd in gpu.fds()] if self.gpus else wake
        ready, _, _ = select.select(fds, (), (), delay_ns / 1e9)
        if not ready:
            return
        now = time.time_ns()
        for fd in ready:
            if fd == wake[0]:
                _drain(fd)
                continue
            for gpu in self.gpus:
                if fd in gpu.pending:
                    gpu.readable(fd, now)
        if any(gpu.new_streams for gpu in self.gpus):
            self._define_new()

    def _define_new(self) -> None:
        for group in self.groups:
            for stream in group.streams:
                if stream.sid not in self.defined:
                    self.output.define(stream)
                    self.defined.add(stream.sid)
            if isinstance(group, Gpu):
                group.new_streams.clear()

    def flush(self) -> None:
        self._define_new()
        for group in self.groups:
            for stream in group.streams:
                if stream.ts:
                    self.output.write(stream.frame())

    def close(self) -> None:
        for group in self.groups:
            group.close()


# --- the compiled fast loop --------------------------------------------------------------------------------

FASTLOOP_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fastloop.c")
FASTLOOP_BATCH_NS = 100 * 10**6  # how often the compiled loop hands its records over


def build_fastloop(directory: str) -> tuple[str | None, str]:
    """The compiled fast loop, built from fastloop.c (shipped next to this file) with the node's C compiler into
    ``directory`` once; (its path, "") or (None, why not). Without it the fast groups are sampled by Python."""
    binary = os.path.join(directory, "fastloop")
    if not os.path.exists(FASTLOOP_SOURCE):
        return None, "fastloop.c is not next to sampler.py"
    if os.path.exists(binary) and os.path.getmtime(binary) >= os.path.getmtime(FASTLOOP_SOURCE):
        return binary, ""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None, "no C compiler (cc) on this node"
    partial = f"{binary}.{os.getpid()}"
    try:
        built = subprocess.run(
            [compiler, "-O2", "-o", partial, FASTLOOP_SOURCE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{compiler}: {exc}"
    if built.returncode != 0:
        return None, f"{compiler} failed: {(built.stderr or built.stdout).strip()[-300:]}"
    os.replace(partial, binary)
    return binary, ""


class CompiledLoop(Loop):
    """The fast groups (counter files only) sampled by the compiled loop: this process only moves its records into
    the groups' streams and writes frames, waking ten times a second instead of every tick."""

    def __init__(self, binary: str, groups: list[Group], *args: Any) -> None:
        super().__init__(groups, *args)
        self.binary = binary
        self.counters = [g for g in groups if isinstance(g, CounterFiles) and g.streams]
        self.width = 1 + sum(len(g.fds) for g in self.counters)
        self.pending = b""  # the start of a record not read whole yet

    def run(self, on_first_tick: Callable[[], None]) -> None:
        wake_r = _wakeup_fd()
        self._define_new()
        fds = [fd for g in self.counters for fd in g.fds]
        argv = [self.binary, str(self.interval_ns), str(FASTLOOP_BATCH_NS), *map(str, fds)]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, pass_fds=fds, bufsize=0)
        assert proc.stdout is not None
        out = proc.stdout.fileno()
        with contextlib.suppress(AttributeError, OSError):  # room for seconds of records (Linux, Python 3.10+)
            fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, 1 << 20)
        first = True
        flush_at = time.time_ns() + FLUSH_NS
        try:
            while True:
                ready, _, _ = select.select([out, wake_r], (), (), 1.0)
                if wake_r in ready:
                    _drain(wake_r)
                if _stopping:
                    break
                if out in ready:
                    data = os.read(out, 1 << 20)
                    if not data:
                        raise Stop(f"the compiled fast loop ended (exit status {proc.wait()})")
                    self._take(data)
                    if first and self.counters[0].streams[0].ts:
                        first = False
                        on_first_tick()
                flush_at = self._flush_when_due(time.time_ns(), flush_at)
        finally:
            proc.terminate()
            self._take(proc.stdout.read())  # what it held when it stopped
            proc.wait()

    def _take(self, data: bytes) -> None:
        """Whole records into the streams: timestamps, then each group's columns, column by column."""
        data = self.pending + data
        whole = len(data) - len(data) % (8 * self.width)
        self.pending = data[whole:]
        records = array.array("q")
        records.frombytes(data[:whole])
        ts = records[0 :: self.width]
        first = 1
        for group in self.counters:
            stream = group.streams[0]
            stream.ts.extend(ts)
            for i, col in enumerate(stream.cols):
                col.extend(records[first + i :: self.width])
            first += len(stream.cols)


def _write_ready(directory: str) -> None:
    with open(os.path.join(directory, READY), "w"):
        pass


def run_process(
    groups: list[Group],
    interval_ns: int,
    path: str,
    args: argparse.Namespace,
    on_first_tick: Callable[[], None],
    parent: int | None = None,
    fastloop: str | None = None,
) -> int:
    """Sample until SIGTERM; returns the exit status. With ``fastloop``, the compiled loop samples the groups."""
    loop: Loop | None = None
    status = 0
    try:
        output = Output(path, args.max_bytes)
        if fastloop:
            loop = CompiledLoop(fastloop, groups, interval_ns, output, args.max_seconds, parent)
        else:
            loop = Loop(groups, interval_ns, output, args.max_seconds, parent)
        loop.run(on_first_tick)
    except Stop as exc:
        print(f"sampler.py: {exc}", file=sys.stderr, flush=True)
    except OSError as exc:
        print(f"sampler.py: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        if loop is not None:
            try:
                loop.flush()
                if args.end_marker and os.path.exists(args.end_marker):
                    loop.output.end({"main_ended_ns": os.stat(args.end_marker).st_mtime_ns})
            except (Stop, OSError) as exc:
                print(f"sampler.py: {exc}", file=sys.stderr, flush=True)
            loop.close()
    return status


# --- command line -----------------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    names = [n for n in text.split(",") if n] if text else []
    unknown = [n for n in names if n not in GROUPS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown group {unknown[0]!r} (known: {', '.join(GROUPS)})")
    return names


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sampler.py", description="Sample a node's counters and gauges.")
    p.add_argument("--dir", default=".", help="where slow.rbs, fast.rbs and ready are written (default: .)")
    p.add_argument("--groups", type=_names, default=list(GROUPS), help=f"comma-separated, of {','.join(GROUPS)}")
    p.add_argument("--interval", type=_positive, default=10**9, help="ns between samples (default: 1 s)")
    p.add_argument("--fast", type=_names, default=[], help="groups sampled every --fast-interval (net, rdma)")
    p.add_argument("--fast-interval", type=_positive, default=10**6, help="ns (default: 1 ms)")
    p.add_argument("--nics", type=lambda t: [n for n in t.split(",") if n], help="interfaces (default: all but veth*)")
    p.add_argument(
        "--nvlink-every", type=_positive, default=NVLINK_EVERY_NS, help="ns between NVLink reads (default: 10 s)"
    )
    p.add_argument(
        "--fast-loop",
        choices=("auto", "compiled", "python"),
        default="auto",
        help="what samples --fast groups: the compiled loop (fastloop.c, built with cc) or Python (default: auto, "
        "the compiled one where a C compiler exists)",
    )
    p.add_argument("--end-marker", help="a file whose mtime is recorded at the end (the benchmark's exit_code)")
    p.add_argument("--max-bytes", type=_positive, default=2 << 30, help="per output file (default: 2 GiB)")
    p.add_argument("--max-seconds", type=float, default=7 * 86400, help="stop by itself after this long")
    p.add_argument("--probe", action="store_true", help="print what would be sampled, as JSON, and exit")
    args = p.parse_args(argv)
    slow_only = [g for g in args.fast if g not in FAST_GROUPS]
    if slow_only:
        p.error(f"--fast: {slow_only[0]} cannot be sampled fast (only {', '.join(FAST_GROUPS)})")
    args.fast = [g for g in args.groups if g in args.fast]
    args.slow = [g for g in args.groups if g not in args.fast]
    return args


def probe(args: argparse.Namespace) -> dict:
    """What would be sampled; the compiled fast loop is built here already (the run is being prepared)."""
    found: dict = {"python": sys.version.split()[0]}
    for names, interval in ((args.slow, args.interval), (args.fast, args.fast_interval)):
        for group in open_groups(names, interval, 1, args.nics):
            found[group.name] = group.sources()
            group.close()
    if args.fast:
        found["fast_loop"] = "compiled" if fast_loop(args) else "python"
    return found


def fast_loop(args: argparse.Namespace) -> str | None:
    """The compiled fast loop to use (``--fast-loop auto`` builds it where a C compiler exists), or None: Python."""
    if args.fast_loop == "python":
        return None
    binary, why = build_fastloop(args.dir)
    if binary is None:
        if args.fast_loop == "compiled":
            raise Stop(f"--fast-loop compiled: {why}")
        print(f"sampler.py: the fast groups are sampled by Python: {why}", file=sys.stderr, flush=True)
    return binary


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    try:
        if args.probe:
            print(json.dumps(probe(args), sort_keys=True))
            return 0
        fastloop = fast_loop(args) if args.fast else None
    except Stop as exc:
        print(f"sampler.py: {exc}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    slow = open_groups(args.slow, args.interval, 1, args.nics, args.nvlink_every)
    fast = open_groups(args.fast, args.fast_interval, 1 + 256 * len(GROUPS), args.nics)
    slow = [g for g in slow if g.streams or isinstance(g, Gpu) and g.nvidia_smi]
    fast = [g for g in fast if g.streams]
    path = {name: os.path.join(args.dir, FILES[name]) for name in FILES}
    if slow and fast:
        child_ready_r, child_ready_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(child_ready_r)
            for group in slow:
                group.close()

            def tell_parent() -> None:
                os.write(child_ready_w, b"!")
                os.close(child_ready_w)

            status = 1
            try:
                status = run_process(fast, args.fast_interval, path["fast"], args, tell_parent, parent, fastloop)
            finally:
                os._exit(status)  # never back into the parent's code
        os.close(child_ready_w)
        for group in fast:
            group.close()

        def ready_when_child_is() -> None:
            select.select([child_ready_r], (), (), 10.0)  # the child's first tick, or it died: carry on
            os.close(child_ready_r)
            _write_ready(args.dir)

        status = run_process(slow, args.interval, path["slow"], args, ready_when_child_is)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # stopped alone (not through its process group): stop the child too
        _pid, child_status = os.waitpid(pid, 0)
        return status or (os.waitstatus_to_exitcode(child_status) if hasattr(os, "waitstatus_to_exitcode") else 0)
    if slow:
        return run_process(slow, args.interval, path["slow"], args, lambda: _write_ready(args.dir))
    if fast:
        return run_process(fast, args.fast_interval, path["fast"], args, lambda: _write_ready(args.dir), None, fastloop)
    _write_ready(args.dir)  # nothing to sample on this node
    while not _stopping:
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
