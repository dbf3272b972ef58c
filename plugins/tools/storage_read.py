#!/usr/bin/env python3
"""Storage-only read benchmark: every rank reads record files batch by batch and reports its throughput.

The idea is seed 000's "TensorFlow Storage Benchmark": read the training records (the same files training
reads), do no preprocessing and no GPU work, only count the bytes, optionally keeping all readers in step
after every batch the way synchronous data-parallel training does. This is plain Python (standard library,
3.8+) so it runs on any node with a ``python3``.

Every process is one rank. Rank and size come from the MPI launcher's environment
(``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``, ``PMI_RANK``/``PMI_SIZE``, ``MV2_COMM_WORLD_RANK``/
``MV2_COMM_WORLD_SIZE``, ``SLURM_PROCID``/``SLURM_NTASKS``); without them it is rank 0 of 1. Typical use, one
rank per GPU, ranks spread over mount points by round_robin_mpi.py::

    mpirun ... python3 round_robin_mpi.py --dirs /mnt/a /mnt/b -- python3 storage_read.py --dir {data_dir} ...

What a rank reads: the files in ``--dir`` matching ``--pattern`` (a glob, ``**`` allowed), sorted by name,
rank r taking every size-th file starting at the r-th, so ranks read different files of one dataset even when
they reach it through different mount points. With ``--create N --record-size BYTES`` the rank first writes its
share of a synthetic dataset of N files (kept and reused when a file of the right size is already there) and
reads exactly those. A record is a whole file (``--format file``, like one JPEG per image) or one entry of a
TFRecord file (``--format tfrecord``: 8-byte length, 4-byte CRC, data, 4-byte CRC; CRCs are not checked). A
batch is ``--batch-size`` records read one after the other with blocking reads; files are reread from the
start (a new epoch) when a rank has read all of its share. The run lasts ``--duration`` seconds or
``--batches`` batches.

``--sync HOST:PORT`` keeps the ranks in step: after every batch each rank waits until all have finished it
(rank 0 listens on HOST:PORT, the others connect to it; rank 0 also decides when the run ends, so every rank
reads the same number of batches, and the ranks start their clocks together). Time spent waiting counts in
the rank's elapsed time, as it does in training, and is reported as ``sync_wait_seconds``.

``--drop-cache`` asks the kernel to drop this node's cached pages of the rank's files before reading
(``posix_fadvise(DONTNEED)``; no root needed, works for NFS clients too); files the rank has just created are
always dropped after being written. Caches on the storage system itself are not touched.

Output, one JSON object per line on stdout (``bytes`` counts every byte read from the files, TFRecord framing
included; MB is 10^6 bytes)::

    {"type": "progress", "tool": "rackbench-storage-read", "rank": 0, "seconds": ..., "bytes": ..., ...}
    {"type": "summary", "tool": "rackbench-storage-read", "rank": 0, "size": 2, "host": "...", "dir": "...",
     "files": 8, "bytes": ..., "records": ..., "batches": ..., "epochs": ..., "seconds": ...,
     "mb_per_sec": ..., "records_per_sec": ..., "sync_wait_seconds": ...}

Exit status: 0 on success, 2 for bad arguments, 1 when the benchmark cannot run (no files, unreadable or
truncated file, a peer lost in --sync mode); the reason is printed on stderr.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import socket
import struct
import sys
import time

TOOL = "rackbench-storage-read"
RANK_VARS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)
CHUNK = 1 << 20  # bytes per read() call for whole-file records
TFRECORD_HEADER = 12  # uint64 length + uint32 masked CRC of the length
TFRECORD_FOOTER = 4  # uint32 masked CRC of the data
CONNECT_TIMEOUT = 120.0  # seconds the ranks have to reach rank 0 in --sync mode
PREFIX = "rbsr"  # file names of a synthetic dataset: rbsr-000000.rec, rbsr-000001.rec, ...


class BenchmarkError(Exception):
    """The benchmark cannot run; the message says why."""


def rank_and_size(environ: dict[str, str]) -> tuple[int, int]:
    for rank_var, size_var in RANK_VARS:
        rank, size = environ.get(rank_var, "").strip(), environ.get(size_var, "").strip()
        if rank.isdigit() and size.isdigit() and int(rank) < int(size):
            return int(rank), int(size)
    return 0, 1


def size_in_bytes(text: str) -> int:
    """A byte count such as 4096, 128k, 1M or 2g (powers of 1024)."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    number, unit = text.strip().lower(), ""
    if number and number[-1] in "kmg":
        number, unit = number[:-1], number[-1]
    if not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(number) * units[unit]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return int(text)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="storage_read.py", description="Read record files batch by batch.")
    p.add_argument("--dir", required=True, help="data directory of this rank")
    p.add_argument("--pattern", default="*", help="glob of the record files inside --dir (default: *)")
    p.add_argument("--format", choices=("file", "tfrecord"), default="file", help="what one record is")
    p.add_argument("--batch-size", type=positive, default=64, help="records per batch (default: 64)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=float, help="seconds to read for (default: 60)")
    stop.add_argument("--batches", type=positive, help="number of batches to read")
    p.add_argument("--create", type=positive, metavar="N", help="first create a synthetic dataset of N files")
    p.add_argument("--create-only", action="store_true", help="create the --create dataset, read nothing, exit")
    p.add_argument("--record-size", type=size_in_bytes, help="bytes per record of the synthetic dataset")
    p.add_argument("--records-per-file", type=positive, default=1, help="records per synthetic TFRecord file")
    p.add_argument("--drop-cache", action="store_true", help="drop this node's cached pages of the files first")
    p.add_argument("--sync", metavar="HOST:PORT", help="keep all ranks in step after every batch")
    p.add_argument("--interval", type=float, default=10.0, help="seconds between progress lines (0: none)")
    args = p.parse_args(argv)
    if args.duration is None and args.batches is None:
        args.duration = 60.0
    if args.duration is not None and args.duration <= 0:
        p.error("--duration must be positive")
    if args.create and not args.record_size:
        p.error("--create needs --record-size")
    if args.sync:
        host, _, port = args.sync.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            p.error(f"--sync must be HOST:PORT, got {args.sync!r}")
        args.sync = (host, int(port))
    return args


# --- the dataset --------------------------------------------------------------------------------------------


def drop_cache(path: str) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def tfrecord_frame(data: bytes) -> bytes:
    """One TFRecord entry. The CRC fields are left zero: this benchmark never checks them."""
    return struct.pack("<QI", len(data), 0) + data + struct.pack("<I", 0)


def create_dataset(directory: str, count: int, record_size: int, fmt: str, per_file: int, rank: int, size: int):
    """Write this rank's share (every size-th file from the rank-th) of a count-file dataset; return its paths."""
    os.makedirs(directory, exist_ok=True)
    extension = "tfrecord" if fmt == "tfrecord" else "rec"
    records = per_file if fmt == "tfrecord" else 1
    expected = records * (record_size + (TFRECORD_HEADER + TFRECORD_FOOTER if fmt == "tfrecord" else 0))
    paths = []
    for i in range(rank, count, size):
        path = os.path.join(directory, f"{PREFIX}-{i:06d}.{extension}")
        paths.append(path)
        if os.path.isfile(path) and os.path.getsize(path) == expected:
            continue
        partial = f"{path}.partial-{rank}"
        with open(partial, "wb") as f:
            for _ in range(records):
                data = os.urandom(record_size)
                f.write(tfrecord_frame(data) if fmt == "tfrecord" else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)  # readers never see a half-written file under the final name
        drop_cache(path)
    return paths


def find_files(directory: str, pattern: str, rank: int, size: int) -> list[str]:
    found = sorted(p for p in glob.glob(os.path.join(directory, pattern), recursive=True) if os.path.isfile(p))
    if not found:
        raise BenchmarkError(f"no record files match {pattern!r} in {directory}")
    return found[rank::size] or [found[rank % len(found)]]


class Reader:
    """Reads records from a list of files, one after the other, starting over (a new epoch) at the end."""

    def __init__(self, paths: list[str], fmt: str) -> None:
        self.paths = paths
        self.fmt = fmt
        self.index = 0
        self.epochs = 0
        self.handle: io.FileIO | None = None
        self.buffer = bytearray(CHUNK)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def _fill(self, want: int) -> int:
        """Read up to want bytes from the open file; the number read (less only at the end of the file)."""
        if len(self.buffer) < want:
            self.buffer = bytearray(want)
        assert self.handle is not None
        view = memoryview(self.buffer)[:want]
        done = 0
        while done < want:
            n = self.handle.readinto(view[done:])
            if not n:
                break
            done += n
        return done

    def _open_next(self) -> None:
        self.close()
        if self.index == len(self.paths):
            self.index = 0
        if self.index == 0:
            self.epochs += 1
        path = self.paths[self.index]
        self.index += 1
        try:
            self.handle = open(path, "rb", buffering=0)  # noqa: SIM115 (kept open across record() calls)
        except OSError as exc:
            raise BenchmarkError(f"cannot open {path}: {exc}") from None

    def record(self) -> int:
        """Read the next record; the bytes read for it."""
        for _ in range(len(self.paths) + 1):  # skips empty files, but not forever
            if self.handle is None:
                self._open_next()
            got = self._read_file() if self.fmt == "file" else self._read_tfrecord()
            if got:
                return got
            self.close()
        raise BenchmarkError("every record file is empty")

    def _read_file(self) -> int:
        total = 0
        while True:
            n = self._fill(CHUNK)
            total += n
            if n < CHUNK:
                self.close()
                return total

    def _read_tfrecord(self) -> int:
        n = self._fill(TFRECORD_HEADER)
        if n == 0:
            return 0
        if n < TFRECORD_HEADER:
            raise BenchmarkError(f"truncated TFRecord header in {self.paths[self.index - 1]}")
        (length,) = struct.unpack_from("<Q", self.buffer)
        body = self._fill(length + TFRECORD_FOOTER)
        if body < length + TFRECORD_FOOTER:
            raise BenchmarkError(f"truncated TFRecord in {self.paths[self.index - 1]}")
        return n + body


# --- keeping ranks in step ----------------------------------------------------------------------------------


class Barrier:
    """All ranks meet after every batch; rank 0's decision to stop reaches every rank at the same batch."""

    GO, STOP, ARRIVED = b"G", b"S", b"A"

    def __init__(self, rank: int, size: int, address: tuple[str, int]) -> None:
        self.rank = rank
        self.peers: list[socket.socket] = []
        if size == 1:
            return
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(address)
            server.listen(size)
            server.settimeout(CONNECT_TIMEOUT)
            try:
                for _ in range(size - 1):
                    peer, _ = server.accept()
                    peer.settimeout(None)
                    self.peers.append(peer)
            except OSError as exc:
                raise BenchmarkError(f"--sync: {len(self.peers)} of {size - 1} ranks connected: {exc}") from None
            finally:
                server.close()
        else:
            self.peers.append(self._connect(address))
        for peer in self.peers:
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @staticmethod
    def _connect(address: tuple[str, int]) -> socket.socket:
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while True:
            try:
                peer = socket.create_connection(address, timeout=5)
                peer.settimeout(None)
                return peer
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise BenchmarkError(f"--sync: cannot reach rank 0 at {address[0]}:{address[1]}: {exc}") from None
                time.sleep(0.2)

    @staticmethod
    def _receive(peer: socket.socket) -> bytes:
        data = peer.recv(1)
        if not data:
            raise BenchmarkError("--sync: a rank disconnected")
        return data

    def wait(self, stop: bool) -> bool:
        """Meet the other ranks; whether the run ends now (rank 0's ``stop``, whatever the others passed)."""
        if not self.peers:
            return stop
        if self.rank == 0:
            for peer in self.peers:
                self._receive(peer)
            for peer in self.peers:
                peer.sendall(self.STOP if stop else self.GO)
            return stop
        self.peers[0].sendall(self.ARRIVED)
        return self._receive(self.peers[0]) == self.STOP

    def close(self) -> None:
        for peer in self.peers:
            peer.close()


# --- the run ------------------------------------------------------------------------------------------------


def emit(line: dict) -> None:
    # One write per line: with unbuffered output (PYTHONUNBUFFERED) print() writes the newline separately, and
    # mpirun --tag-output would then interleave other ranks' lines between the two.
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def run(args: argparse.Namespace, rank: int, size: int) -> dict:
    if args.create:
        paths = create_dataset(args.dir, args.create, args.record_size, args.format, args.records_per_file, rank, size)
    else:
        paths = find_files(args.dir, args.pattern, rank, size)
    if args.create_only:
        return {"type": "layout", "tool": TOOL, "rank": rank, "size": size, "dir": args.dir, "files": len(paths)}
    if args.drop_cache:
        for path in paths:
            drop_cache(path)
    barrier = Barrier(rank, size, args.sync) if args.sync else None
    reader = Reader(paths, args.format)
    total_bytes = records = batches = 0
    waited = 0.0
    if barrier is not None:  # start together: a rank still opening its files would otherwise measure less
        barrier.wait(False)
    start = time.monotonic()
    next_report = start + args.interval if args.interval > 0 else float("inf")
    try:
        while True:
            for _ in range(args.batch_size):
                total_bytes += reader.record()
            records += args.batch_size
            batches += 1
            now = time.monotonic()
            stop = batches >= args.batches if args.batches is not None else now - start >= args.duration
            if barrier is not None:
                stop = barrier.wait(stop)
                waited += time.monotonic() - now
                now = time.monotonic()
            if now >= next_report and not stop:
                emit(
                    {
                        "type": "progress",
                        "tool": TOOL,
                        "rank": rank,
                        "seconds": round(now - start, 6),
                        "bytes": total_bytes,
                        "records": records,
                        "batches": batches,
                    }
                )
                next_report = now + args.interval
            if stop:
                break
    finally:
        reader.close()
        if barrier is not None:
            barrier.close()
    seconds = time.monotonic() - start
    return {
        "type": "summary",
        "tool": TOOL,
        "rank": rank,
        "size": size,
        "host": socket.gethostname(),
        "dir": args.dir,
        "files": len(paths),
        "bytes": total_bytes,
        "records": records,
        "batches": batches,
        "epochs": reader.epochs,
        "seconds": round(seconds, 6),
        "mb_per_sec": round(total_bytes / seconds / 1e6, 3),
        "records_per_sec": round(records / seconds, 3),
        "sync_wait_seconds": round(waited, 6),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rank, size = rank_and_size(dict(os.environ))
    try:
        emit(run(args, rank, size))
    except (BenchmarkError, OSError) as exc:
        print(f"storage_read.py: rank {rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
