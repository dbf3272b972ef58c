"""The telemetry sampler's own CPU use and cadence, and what a 1 ms node file costs to fetch and store.

    .venv/bin/python bench/sampler_overhead.py [--seconds 30]
    DATABASE_URL=postgres://rackbench:rackbench@127.0.0.1:5432/postgres .venv/bin/python bench/sampler_overhead.py

1. The sampler as rackbench runs it (``python3 plugins/tools/sampler.py`` in a session of its own), measured for
   --seconds after a one-second warm-up, in five shapes:

   - every group at 1 s: what this machine has of them (cpu, mem, net, disk; no NFS mount, HCA or GPU here);
   - net at 1 ms over the interfaces present, sampled by the compiled loop (plugins/tools/fastloop.c);
   - net at 1 ms over 8 NICs: where fewer than 8 interfaces exist, the ones present are read over again until there
     are 16 counter files (8 NICs' rx and tx). The kernel's cost per read depends on the driver (lo and virtio
     here, mlx5 on a DGX), so treat it as an order of magnitude. Once with the compiled loop, once with the
     Python loop a node without a C compiler gets;
   - both at once, as a campaign with ``fast: [net]`` runs it (the slow process and the fast one).

   CPU time is the on-CPU nanoseconds of /proc/PID/schedstat summed over every process of the sampler's process
   group, between two readings, in % of one core. Targets (issue "Telemetry during runs"): under 1 % at 1 s,
   under 5 % at 1 ms. The 1 ms stream's cadence is read back from the file it wrote. For scale, the same figure
   for a Python loop that does nothing but sleep to 1 ms deadlines: what 1000 wake-ups a second cost on this
   machine before anything is read (in a VM, a timed sleep and its wake-up are far dearer than on bare metal, and
   dearer still when the core goes idle in between). The 1 ms shapes are measured again with every core kept
   busy by a CPU-bound process, as during a benchmark that loads the node.

2. One node's file of a 600 s run sampling 8 NICs every 1 ms (600,000 ticks x 16 counters = 9.6 M samples; three
   such nodes are the 14.4 M-sample case of bench/telemetry_ingest.py), written with the sampler's own writer
   from bursty synthetic RoCE counters (bench/telemetry_ingest.py's ``link_counter``): its size; fetched over SSH
   from a lab sshd node with the same call runners.samplers uses (needs root and sshd, as ``manage.py lab``;
   ``--no-fetch`` skips it); and, when DATABASE_URL names a PostgreSQL server, stored with
   telemetry.ingest.sampler_ingest
   and summarised, in a scratch database (``rackbench_sampler_bench``, created and dropped here).
"""

from __future__ import annotations

import argparse
import array
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from plugins.tools import sampler as tool  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLER = ROOT / "plugins" / "tools" / "sampler.py"
SCRATCH_DATABASE = "rackbench_sampler_bench"
MS = 1_000_000
SECOND = 1_000_000_000
LAB_PORT = 2262
Row = tuple[str, str, str]  # what, result, target


# --- 1. the sampler's own CPU use -------------------------------------------------------------------------------


def group_cpu_ns(pgid: int) -> int:
    """On-CPU ns of every live process of a process group (from /proc/PID/schedstat)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                total += int((stat.parent / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


# A loop that keeps a 1 ms cadence the way the sampler does, and reads nothing.
SLEEPER = """
import time
tick = time.time_ns()
while True:
    tick += 1_000_000
    delay = tick - time.time_ns()
    if delay > 0:
        time.sleep(delay / 1e9)
"""


def cpu_percent(proc: subprocess.Popen[bytes], seconds: float) -> float:
    """% of one core used by ``proc``'s process group over ``seconds``, after a warm-up; then SIGTERM it."""
    time.sleep(1.0)  # warm-up: Python's start and the first frames are not what a long run pays
    cpu0, wall0 = group_cpu_ns(proc.pid), time.monotonic_ns()
    time.sleep(seconds)
    cpu1, wall1 = group_cpu_ns(proc.pid), time.monotonic_ns()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)
    return 100 * (cpu1 - cpu0) / (wall1 - wall0)


def floor(seconds: float) -> list[Row]:
    print(f"sleeping to 1 ms deadlines for {seconds:g} s (the floor) ...", flush=True)
    proc = subprocess.Popen(["python3", "-c", SLEEPER], start_new_session=True)
    percent = cpu_percent(proc, seconds)
    return [("floor: a loop that only sleeps to 1 ms deadlines", f"{percent:.2f} % of a core", "")]


def measure(label: str, args: list[str], seconds: float, target: str) -> tuple[list[Row], Path]:
    """Run the sampler with ``args``; its CPU use over ``seconds`` after a warm-up, and the directory it wrote."""
    out = Path(tempfile.mkdtemp(prefix="rb-sampler-bench-"))
    proc = subprocess.Popen(["python3", str(SAMPLER), "--dir", str(out), *args], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (out / tool.READY).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the sampler did not start ({label})")
        time.sleep(0.01)
    percent = cpu_percent(proc, seconds)
    size = sum(p.stat().st_size for p in out.glob("*.rbs"))
    rows = [(label, f"{percent:.2f} % of a core", target), ("  file written", f"{size / seconds / 1024:.1f} KiB/s", "")]
    return rows, out


def cadence(path: Path, interval_ns: int) -> list[Row]:
    """Intervals between the ticks of a sampler file's net stream."""
    parts = []
    for kind, payload in tool.read_frames(path.read_bytes()):
        if kind == tool.SAMPLE:
            _sid, rows, body = tool.sample_body(payload)
            parts.append(np.frombuffer(body, "<i8", count=rows))
    gaps = np.diff(np.concatenate(parts))
    missed = int(((gaps + interval_ns // 2) // interval_ns - 1).clip(min=0).sum())
    ticks = len(gaps) + 1
    p50, p99 = np.percentile(gaps, [50, 99]) / 1e6
    return [
        ("  interval median / p99 / max", f"{p50:.3f} / {p99:.3f} / {gaps.max() / 1e6:.1f} ms", "median 1 ms"),
        ("  ticks missed (skipped, not caught up)", f"{100 * missed / (ticks + missed):.2f} %", ""),
    ]


def eight_nics() -> list[str]:
    present = tool.net_interfaces()
    return [present[i % len(present)] for i in range(8)]


def shapes() -> list[tuple[str, list[str], str]]:
    groups = ",".join(tool.GROUPS)
    nics = eight_nics()
    present = tool.net_interfaces()
    fast = ["--groups", "net", "--fast", "net", "--fast-interval", str(MS)]
    return [
        ("every group at 1 s", ["--groups", groups], "< 1 %"),
        (
            f"net at 1 ms, {len(present)} NICs ({', '.join(present)}), compiled loop",
            [*fast, "--fast-loop", "compiled"],
            "",
        ),
        (
            f"net at 1 ms, 8 NICs ({', '.join(nics)}), compiled loop",
            [*fast, "--nics", ",".join(nics), "--fast-loop", "compiled"],
            "< 5 %",
        ),
        (
            "net at 1 ms, 8 NICs, Python loop (a node without a C compiler)",
            [*fast, "--nics", ",".join(nics), "--fast-loop", "python"],
            "< 5 %",
        ),
        (
            "every group at 1 s + net (8 NICs) at 1 ms, compiled loop",
            ["--groups", groups, "--fast", "net", "--nics", ",".join(nics), "--fast-loop", "compiled"],
            "< 1 % + < 5 %",
        ),
    ]


def overhead(seconds: float, *, busy: bool) -> list[Row]:
    """Every shape; with ``busy``, only the 1 ms ones, while one CPU-bound process per core runs."""
    burners = []
    if busy:
        burners = [subprocess.Popen(["python3", "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        rows = floor(seconds)
        for label, args, target in shapes():
            if busy and "1 ms" not in label:
                continue
            print(f"sampling for {seconds:g} s: {label} ...", flush=True)
            measured, out = measure(label, args, seconds, target)
            rows += measured
            if "1 ms" in label:
                rows += cadence(out / "fast.rbs", MS)
            shutil.rmtree(out)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    if busy:
        rows = [
            (f"{what} [cores busy]" if not what.startswith("  ") else what, result, target)
            for what, result, target in rows
        ]
    return rows


# --- 2. one node's 1 ms file ------------------------------------------------------------------------------------


def node_file(seconds: int, path: Path) -> int:
    """A sampler file of 8 NICs' rx and tx every 1 ms for ``seconds``, frames as the sampler writes them."""
    from telemetry_ingest import link_counter

    rng = np.random.default_rng(0)
    n = seconds * 1000
    ts, first = link_counter(n, rng, timestamps="ns")
    counters = [first] + [link_counter(n, rng, timestamps="ns")[1] for _ in range(15)]
    columns = [
        tool.column(f"net.{direction}_bytes", {"nic": f"mlx5_{i}"}, "B", "counter")
        for i in range(8)
        for direction in ("rx", "tx")
    ]
    stream = tool.Stream(1, "net", MS, "q", columns)
    output = tool.Output(str(path), 1 << 40)
    output.define(stream)
    rows = int(tool.FLUSH_NS // MS)  # what the sampler writes per frame at 1 ms
    for start in range(0, n, rows):
        stream.ts.frombytes(ts[start : start + rows].astype("<i8").tobytes())
        for col, values in zip(stream.cols, counters, strict=True):
            col.frombytes(values[start : start + rows].astype("<i8").tobytes())
        output.write(stream.frame())
    os.close(output.fd)
    return n * len(columns)


def fetch(path: Path) -> list[Row]:
    """Fetch the file from a lab node with runners.ssh, as runners.samplers does."""
    from runners import lab, ssh

    if os.geteuid() != 0 or not Path(lab.SSHD).exists():
        return [("fetch over SSH", "skipped (needs root and sshd)", "")]
    lab_dir = Path(tempfile.mkdtemp(prefix="rb-sampler-bench-lab-"))
    lab_dir.chmod(0o755)
    try:
        node = lab.lab_up(1, port=LAB_PORT, lab_dir=lab_dir)[0]
        account = lab.lab_account(lab_dir=lab_dir)
        remote = account.home / f"sampler-bench-{os.getpid()}.rbs"
        shutil.copy(path, remote)
        shutil.chown(remote, user=account.user)

        class Pins:
            keys: dict[tuple[str, int], tuple[str, str]] = {}

            def pinned(self, address: str, port: int) -> tuple[str, str] | None:
                return self.keys.get((address, port))

            def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
                return self.keys.setdefault((address, port), (key_type, key_base64))

        pool = ssh.Pool(Pins())
        endpoint = ssh.Endpoint(node.address, node.port, account.user)
        pkey = ssh.load_private_key(account.private_key.read_text())
        pool.run(endpoint, pkey, "true")  # connected before the clock starts, as the worker's pool is
        times = []
        for _ in range(3):
            started = time.perf_counter()
            data = pool.get(endpoint, pkey, str(remote))
            times.append(time.perf_counter() - started)
            assert data is not None and len(data) == path.stat().st_size
        pool.close_all()
        remote.unlink()
        elapsed = statistics.median(times)
        return [
            (
                "fetch over SSH from a lab node (median of 3)",
                f"{elapsed:.2f} s, {len(data) / elapsed / 1e6:.0f} MB/s",
                "",
            )
        ]
    finally:
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)


def store(path: Path, samples: int) -> list[Row]:
    """telemetry.ingest.sampler_ingest and the summaries, in a scratch PostgreSQL database."""
    from campaigns.models import Campaign, Run
    from telemetry.ingest import sampler_ingest
    from telemetry.services import run_telemetry_summarize

    if connection.vendor != "postgresql":
        return [("store as series", "skipped (DATABASE_URL is not PostgreSQL)", "")]
    connection.settings_dict.setdefault("TEST", {})["NAME"] = SCRATCH_DATABASE
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        run = Run.objects.create(
            campaign=Campaign.objects.create(name="sampler-bench", telemetry={"enabled": True}),
            sequence=1,
            point=0,
            repetition=1,
        )
        blob = path.read_bytes()
        started = time.perf_counter()
        stored = sampler_ingest(run=run, host="node0", blobs=[blob])
        ingest = time.perf_counter() - started
        started = time.perf_counter()
        results = run_telemetry_summarize(run=run)
        summarise = time.perf_counter() - started
    finally:
        connection.creation.destroy_test_db(SCRATCH_DATABASE, verbosity=0)
    assert stored["samples"] == samples
    return [
        (f"decode and store {stored['series']} series", f"{ingest:.2f} s, {samples / ingest:,.0f} samples/s", ""),
        (f"summarise them ({len(results)} results)", f"{summarise:.2f} s", ""),
    ]


def node_file_costs(seconds: int, do_fetch: bool) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="rb-sampler-bench-") as tmp:
        path = Path(tmp) / "fast.rbs"
        print(f"writing a {seconds} s, 8-NIC, 1 ms sampler file ...", flush=True)
        samples = node_file(seconds, path)
        size = path.stat().st_size
        rows: list[Row] = [
            (f"{seconds} s x 8 NICs x rx, tx at 1 ms: file", f"{size / 1e6:.1f} MB, {size / samples:.2f} B/sample", "")
        ]
        if do_fetch:
            print("fetching it from a lab node ...", flush=True)
            rows += fetch(path)
        print("storing it ...", flush=True)
        rows += store(path, samples)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each sampler shape is measured")
    parser.add_argument("--file-seconds", type=int, default=600, help="run length of the 1 ms node file")
    parser.add_argument("--no-fetch", action="store_true", help="do not start a lab node to fetch the file")
    args = parser.parse_args()
    assert array.array("q").itemsize == 8
    rows = overhead(args.seconds, busy=False) + overhead(args.seconds, busy=True)
    rows += node_file_costs(args.file_seconds, not args.no_fetch)
    print(f"\ntelemetry sampler, {os.cpu_count()} CPUs, python3 {sys.version.split()[0]}\n")
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':>28}  target")
    for what, result, target in rows:
        print(f"{what:<{width}}  {result:>28}  {target}")


if __name__ == "__main__":
    main()
