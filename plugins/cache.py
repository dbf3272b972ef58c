"""Cache discipline, without I/O: what a host's kernel says about its page cache and what a run read from storage,
and whether the run read its data from where it was meant to.

Two sources of evidence, the first preferred:

- the job's own I/O accounting: each detached job's launcher keeps its ``/proc/<pid>/io`` as the command ends
  (runners/remote.py); the kernel adds to it every process the launcher waited for, so its ``read_bytes`` is what the
  benchmark's own processes fetched from block storage, whatever else the host did meanwhile. NFS reads are not
  block I/O: they are taken from the NFS mounts' counters (below) and added.
- the hosts' counters, read by ``SNAPSHOT_COMMAND`` before and after each page-cache flush, as the measured job
  starts and as it has ended: the page cache (``Cached`` less ``Shmem``: tmpfs and shared memory are counted in
  ``Cached`` but no flush can drop them), dirty and writeback pages, the bytes read from whole disks of
  /proc/diskstats (partitions, loop, ram, zram, device-mapper and md devices left out, so that nothing is counted
  twice) and from NFS servers (the server-read field of /proc/self/mountstats ``bytes:``). Hosts that share a kernel
  (the built-in lab, containers of one machine) share these counters: they are counted once per ``boot_id``. They
  stand in for the job's accounting where it does not cover the run's reads (a Slurm job, a container, a run whose
  services do the I/O such as fio --client, an MPI job's ranks on other hosts); there, other processes' reads on the
  hosts add to them.

The judgement of a run compares what the benchmark says it read with what was read from storage meanwhile:

- a run meant to read from storage (the campaign flushes the clients' page cache) that fetched less than
  ``STORAGE_MIN_FRACTION`` of it from storage was served by a cache: flagged ``cache-hits``;
- a run meant to read from the page cache (no client flush, and warm-up runs that fill the cache, as seed 000's
  "Linux cache" case; the warm-ups themselves are not judged) that fetched more than ``CACHE_MAX_FRACTION`` of it
  from storage: flagged ``storage-reads``;
- runs that read less than ``MIN_JUDGED_BYTES`` are not judged (loading the tool itself after a flush, metadata and
  readahead are of that order); a run whose intent cannot be told (no flush, no warm-up) is recorded, not judged;
- a flush after which a host's page cache still holds more than ``FLUSH_LEFT_FRACTION`` of what it held before, and
  more than ``FLUSH_LEFT_MIN_BYTES``, not counting pages that running processes map (libraries, mmapped files: no
  flush drops them): flagged ``flush-left-cache`` (the flush did not take effect).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from common import numbers
from plugins.tools.sampler import parse_diskstats, parse_meminfo, parse_mountstats

MIB = 1024**2
MIN_JUDGED_BYTES = 32 * MIB
STORAGE_MIN_FRACTION = 0.5
CACHE_MAX_FRACTION = 0.1
FLUSH_LEFT_FRACTION = 0.5
FLUSH_LEFT_MIN_BYTES = 256 * MIB

EXPECT_STORAGE = "storage"
EXPECT_CACHE = "cache"

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the disk
VIRTUAL_DISKS = ("loop", "ram", "zram", "dm-", "md")
_FILES = ("/proc/sys/kernel/random/boot_id", "/proc/meminfo", "/proc/diskstats", "/proc/self/mountstats")
# One process for the files (tail heads each with "==> <file> <==" and skips a missing one), the shell's own loop
# for the block devices: a snapshot is taken on every host as its job starts and as it ends, and each process more
# is a fork and an exec on a host that may be busy.
SNAPSHOT_COMMAND = (
    f"tail -n +1 {' '.join(_FILES)} 2>/dev/null; "
    'echo "==> /sys/block"; for b in /sys/block/*; do echo "${b##*/}"; done'
)


@dataclass(frozen=True)
class Snapshot:
    """One host's page cache and storage read counters at one moment, in bytes."""

    boot_id: str
    cached: int  # page cache of files: Cached - Shmem
    mapped: int  # of it, pages mapped by running processes (libraries, mmapped files): no flush drops them
    dirty: int
    writeback: int
    disk_read: int
    nfs_read: int

    @property
    def droppable(self) -> int:
        """The page cache a flush can drop: not mapped by a process (Mapped counts mapped shared memory too, so
        this may be a little low: a flush is then judged leniently)."""
        return max(self.cached - self.mapped, 0)

    @property
    def storage_read(self) -> int:
        return self.disk_read + self.nfs_read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        fields = ("boot_id", "cached", "dirty", "writeback", "disk_read", "nfs_read")
        return cls(mapped=data.get("mapped", 0), **{k: data[k] for k in fields})


def _sections(text: str) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("==> "):
            current = found.setdefault(line[4:].removesuffix(" <==").strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in found.items()}


def parse_snapshot(text: str) -> Snapshot:
    """A snapshot from ``SNAPSHOT_COMMAND``'s output; ValueError when it holds no /proc/meminfo."""
    parts = _sections(text)
    meminfo = parse_meminfo(parts.get("/proc/meminfo", "").encode())
    if "Cached" not in meminfo:
        raise ValueError("no page cache size (Cached:) in /proc/meminfo")
    blocks = set(parts.get("/sys/block", "").split())
    disks = parse_diskstats(parts.get("/proc/diskstats", "").encode())
    whole = [d for d in disks if d in blocks and not d.startswith(VIRTUAL_DISKS)]
    mounts = parse_mountstats(parts.get("/proc/self/mountstats", "").encode())
    return Snapshot(
        boot_id=parts.get("/proc/sys/kernel/random/boot_id", "").strip(),
        cached=(meminfo["Cached"] - meminfo.get("Shmem", 0)) * 1024,
        mapped=meminfo.get("Mapped", 0) * 1024,
        dirty=meminfo.get("Dirty", 0) * 1024,
        writeback=meminfo.get("Writeback", 0) * 1024,
        disk_read=sum(disks[d][0] for d in whole) * SECTOR,
        nfs_read=sum(counters[4] for *_, counters in mounts),
    )


def _size(value: float) -> str:
    return numbers.quantity(value, "B")


def flag(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def flush_flags(host: str, before: Snapshot, after: Snapshot) -> list[dict[str, str]]:
    """``flush-left-cache`` when the flush left most of the host's droppable page cache in place."""
    left, was = after.droppable, before.droppable
    if left > FLUSH_LEFT_MIN_BYTES and left > FLUSH_LEFT_FRACTION * was:
        return [
            flag(
                "flush-left-cache",
                f"the page-cache flush on {host} did not take effect: {_size(left)} cached after it, {_size(was)} "
                "before (not counting what processes map)",
            )
        ]
    return []


def expectation(*, flush_clients: bool, warmup_runs: int, is_warmup: bool) -> str:
    """Where a run is meant to read its data from: storage, the page cache, or "" when that cannot be told."""
    if flush_clients:
        return EXPECT_STORAGE
    if warmup_runs > 0 and not is_warmup:
        return EXPECT_CACHE
    return ""


def parse_proc_io(text: str) -> dict[str, int]:
    """/proc/<pid>/io as {name: value} (rchar, read_bytes, write_bytes, ...); {} for anything else."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            found[key.strip()] = int(value)
    return found if "read_bytes" in found else {}


def _per_kernel(start: dict[str, Snapshot], end: dict[str, Snapshot], field: str) -> int | None:
    kernels: dict[str, int] = {}
    for host, first in start.items():
        last = end.get(host)
        if last is None or last.boot_id != first.boot_id:
            return None
        kernels[first.boot_id or host] = max(getattr(last, field) - getattr(first, field), 0)
    return sum(kernels.values()) if kernels else None


def storage_read_between(start: dict[str, Snapshot], end: dict[str, Snapshot]) -> int | None:
    """Bytes the run's kernels read from storage between the two snapshots (each kernel once); None when a host's
    snapshots are missing or its kernel restarted."""
    return _per_kernel(start, end, "storage_read")


def storage_reads(
    start: dict[str, Snapshot], end: dict[str, Snapshot], processes: dict[str, dict[str, int]] | None
) -> tuple[int | None, str]:
    """(bytes read from storage during the run, where that figure comes from): the job's own block reads plus the
    NFS mounts' reads when every job kept its accounting (``processes``), else the hosts' counters."""
    if processes:
        nfs = _per_kernel(start, end, "nfs_read") if start else 0
        return sum(p["read_bytes"] for p in processes.values()) + (nfs or 0), "the job's own I/O accounting"
    return storage_read_between(start, end), "the hosts' disk and NFS counters"


def judge_reads(expect: str, benchmark_read: float | None, storage_read: int | None) -> dict[str, Any]:
    """What a run read against where it was meant to read it from: the evidence, and its flags."""
    evidence: dict[str, Any] = {"expect": expect, "benchmark_read": benchmark_read, "storage_read": storage_read}
    if benchmark_read is None or storage_read is None:
        return {**evidence, "judged": False, "why": "the benchmark or the hosts' counters do not say what was read",
                "flags": []}  # fmt: skip
    fraction = storage_read / benchmark_read if benchmark_read else None
    evidence["storage_fraction"] = fraction
    if not expect:
        return {**evidence, "judged": False, "why": "the campaign neither flushes the page cache nor warms it",
                "flags": []}  # fmt: skip
    if benchmark_read < MIN_JUDGED_BYTES or fraction is None:
        return {**evidence, "judged": False, "why": f"it read less than {_size(MIN_JUDGED_BYTES)}", "flags": []}
    read = f"the benchmark read {_size(benchmark_read)}, of which {_size(storage_read)} came from storage"
    flags = []
    if expect == EXPECT_STORAGE and fraction < STORAGE_MIN_FRACTION:
        flags.append(
            flag(
                "cache-hits",
                f"meant to read from storage, but served from a cache: {read} ({fraction:.0%}, less than "
                f"{STORAGE_MIN_FRACTION:.0%})",
            )
        )
    if expect == EXPECT_CACHE and fraction > CACHE_MAX_FRACTION:
        flags.append(
            flag(
                "storage-reads",
                f"meant to read from the page cache, but read from storage: {read} ({fraction:.0%}, more than "
                f"{CACHE_MAX_FRACTION:.0%})",
            )
        )
    return {**evidence, "judged": True, "why": "", "flags": flags}
