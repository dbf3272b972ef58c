"""How close together a run's hosts really start (issue 16: spread under 0.5 s at 256 nodes, under 2 s at 1,000).

    RACKBENCH_BENCH_NODES=64,256 PYTHONPATH=. .venv/bin/pytest -p tests.conftest -m drill -s -o timeout=3600 \
        bench/test_start_spread.py

Real worker, real PostgreSQL and Redis, and a lab of its own (RACKBENCH_BENCH_PORT, default 3000, on addresses from
127.0.40.1; brought down after). For each size N, one campaign of one run of the allow-listed ``uname -r`` (kind
"command") across nodes bench1..benchN goes through the worker as a user's would. Reported per size:

- run start: from the run's start step (started_at: preparing begins) to the first and to the last host's real start;
- start spread: max - min of the hosts' real start instants. Each host's instant is what its launcher recorded
  (the ``started`` file, ns) where it records one, else the modification time of its ``pid`` file (written as the
  launcher begins: what runs without a start barrier have). The lab's nodes share this machine's clock;
- collect: from the last host's exit code file to the run's finished_at (noticing the end, reading every host,
  storing);
- the peak of the connections to the bench database during the run (sampled every 50 ms): the worker's, and one
  of this process's own;
- the worker's processes during the run (its main process and its pool's, sampled every 200 ms from /proc): the
  peak of their resident memory summed, the peak of the largest one's, the peak of their proportional set size
  summed (shared pages counted once: what they take together), and the most database connections one of them held
  at once (its TCP sockets to PostgreSQL's port; runners.database bounds it to RACKBENCH_DB_POOL_SIZE + 1);
- the load average as the run ended.

``RACKBENCH_BENCH_WORKERS=2`` starts two workers on the same broker (each with ``RACKBENCH_BENCH_CONCURRENCY``
pool processes, default 3): a run's steps then go to whichever process takes them, and each process opens its own
SSH connections to the hosts of the steps it runs (the figures add the SSH connections to the lab open at once).

For 1,000 nodes (it loads a 2-core machine to a load average of ~130 for minutes: run it alone)::

    RACKBENCH_BENCH_NODES=1000 PYTHONPATH=. .venv/bin/pytest -p tests.conftest -m drill -s -o timeout=3600 \
        bench/test_start_spread.py
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection

from campaigns import services
from campaigns.models import Run
from inventory.models import AllowedCommand
from runners import lab
from tests.conftest import ROOT, Worker, finished, purge_broker, spare_broker, worker_env

SIZES = [int(n) for n in os.environ.get("RACKBENCH_BENCH_NODES", "64,256").split(",")]
PORT = int(os.environ.get("RACKBENCH_BENCH_PORT", "3000"))
BASE = os.environ.get("RACKBENCH_BENCH_BASE", "127.0.40.0")
WORKERS = int(os.environ.get("RACKBENCH_BENCH_WORKERS", "1"))  # workers on one broker sharing the run's steps
CONCURRENCY = int(os.environ.get("RACKBENCH_BENCH_CONCURRENCY", "3"))  # each worker's pool processes


def start_instant(remote_dir: str) -> float:
    """The host's real start (s since the epoch), read from the lab's shared filesystem."""
    started = Path(remote_dir, "started")
    if started.exists():
        return int(started.read_text().split()[0]) / 1e9
    return Path(remote_dir, "pid").stat().st_mtime


class ConnectionPeak:
    """The most connections to the bench database seen at once, sampled from another connection."""

    def __init__(self) -> None:
        db = connection.settings_dict
        self.dsn = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        password = connection.settings_dict["PASSWORD"] or None
        # autocommit: pg_stat_activity is a snapshot taken once per transaction
        with psycopg.connect(self.dsn, password=password, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                mine = "datname = current_database() AND pid <> pg_backend_pid()"
                row = conn.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {mine}").fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)

    def __enter__(self) -> ConnectionPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def memory_bytes(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of the process: PSS shares each page among the processes that map it (a forked pool's children
    share much of their parent's memory), so the PSS of a worker's processes add up to what they take together."""
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss


def sockets_to(port: int) -> set[int]:
    """The inodes of this network namespace's TCP sockets connected to ``port``."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes


def socket_inodes(pid: int) -> set[int]:
    found: set[int] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


class WorkerPeak:
    """The workers' processes (sampled every 200 ms): peak resident memory, summed and of the largest, the most
    database connections one process held at once, and the most SSH connections to the lab open at once."""

    def __init__(self, *roots: int) -> None:
        self.roots = roots
        self.ssh_connections = 0
        self.db_port = int(connection.settings_dict["PORT"] or 5432)
        self.rss_sum = 0
        self.rss_max = 0
        self.pss_sum = 0
        self.processes = 0
        self.db_per_process = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stop.wait(0.2):
            to_db = sockets_to(self.db_port)
            self.ssh_connections = max(self.ssh_connections, len(sockets_to(PORT)))
            sizes, shares = [], []
            for pid in (pid for root in self.roots for pid in process_tree(root)):
                try:
                    rss, pss = memory_bytes(pid)
                    self.db_per_process = max(self.db_per_process, len(socket_inodes(pid) & to_db))
                except OSError:  # the process ended meanwhile
                    continue
                sizes.append(rss)
                shares.append(pss)
            self.rss_sum = max(self.rss_sum, sum(sizes))
            self.rss_max = max(self.rss_max, max(sizes, default=0))
            self.pss_sum = max(self.pss_sum, sum(shares))
            self.processes = max(self.processes, len(sizes))

    def __enter__(self) -> WorkerPeak:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def measure(size: int, environment: dict[str, str], workers: list[Worker]) -> dict[str, float]:
    name = f"spread-{size}-{time.monotonic_ns()}"
    data = {"name": name, "kind": "command", "nodes": [f"lab{i}" for i in range(1, size + 1)], "repetitions": 1,
            "fixed": {"command": "uname", "args": "-r"}, "cache": {"flush_clients": False},
            "timeout": 600}  # fmt: skip
    campaign = services.campaign_apply(data=data)
    with ConnectionPeak() as peak, WorkerPeak(*(w.proc.pid for w in workers)) as processes:
        subprocess.run([sys.executable, "manage.py", "campaign", "run", name], cwd=ROOT, env=environment,
                       check=True, timeout=120)  # fmt: skip
        finished(campaign, timeout=900)
    run = Run.objects.get(campaign=campaign)
    assert run.status == "succeeded", run.error
    hosts = list(run.hosts.all())
    starts = [start_instant(h.remote_dir) for h in hosts]
    ends = [Path(h.remote_dir, "exit_code").stat().st_mtime for h in hosts]
    assert run.started_at and run.finished_at
    t0 = run.started_at.timestamp()
    record = run.provenance.get("start") or {}
    if record:  # the start barrier's own figures: what its margin was reckoned from, and each host's offset
        offsets = sorted((record.get("offsets_ms") or {}).values())
        attempts = record.get("attempts") or [{}]
        print(f"probe {record.get('probe_s')} s, margin {record.get('margin_s')} s, submit wave "
              f"{attempts[-1].get('wave_s')} s, attempts {len(attempts)}; offsets from the instant (ms): "
              f"min {offsets[0]:.1f}, p50 {offsets[len(offsets) // 2]:.1f}, "
              f"p90 {offsets[int(0.9 * len(offsets))]:.1f}, "
              f"max {offsets[-1]:.1f}", flush=True)  # fmt: skip
    return {
        "run start to first host (s)": min(starts) - t0,
        "run start to last host (s)": max(starts) - t0,
        "start spread max-min (s)": max(starts) - min(starts),
        "start spread recorded (s)": float((run.provenance.get("start") or {}).get("spread_s", float("nan"))),
        "collect: last exit to finished (s)": run.finished_at.timestamp() - max(ends),
        "PostgreSQL connections peak": float(peak.peak),
        "worker processes": float(processes.processes),
        "worker RSS peak, sum (MiB)": processes.rss_sum / 2**20,
        "worker RSS peak, largest process (MiB)": processes.rss_max / 2**20,
        "worker PSS peak, sum (MiB)": processes.pss_sum / 2**20,
        "DB connections, most in one process": float(processes.db_per_process),
        "SSH connections to the lab, peak": float(processes.ssh_connections),
        "load average (1 min) at the end": os.getloadavg()[0],
    }


@pytest.mark.drill
@pytest.mark.timeout(3600)
def test_start_spread(transactional_db: None) -> None:
    lab_dir = Path(tempfile.mkdtemp(prefix="rackbench-bench-spread-"))
    lab_dir.chmod(0o755)
    broker = spare_broker(1, settings.CELERY_BROKER_URL)  # the second spare: tests' own workers use the first
    purge_broker(broker)
    settings.RACKBENCH["LAB_DIR"] = lab_dir
    environment = worker_env(CELERY_BROKER_URL=broker, RACKBENCH_LAB_DIR=str(lab_dir), RACKBENCH_RETRY_MAX="3")
    AllowedCommand.objects.create(name="uname", program="uname", max_args=1, arg_pattern="-[r]")
    workers: list[Worker] = []
    figures: dict[int, dict[str, float]] = {}
    try:
        for size in SIZES:
            began = time.perf_counter()
            call_command("lab", "up", "--nodes", str(size), "--port", str(PORT), "--base-address", BASE,
                         stdout=io.StringIO(), stderr=io.StringIO())  # fmt: skip
            print(f"\nlab of {size} nodes up and registered in {time.perf_counter() - began:.0f} s", flush=True)
            if not workers:
                workers = [Worker(f"bench-spread-{i}", environment, concurrency=CONCURRENCY) for i in range(WORKERS)]
            figures[size] = measure(size, environment, workers)
            print(figures[size], flush=True)
    finally:
        for worker in workers:
            worker.stop()
        purge_broker(broker)
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)
    print(f"\none run of `uname -r` across N lab nodes through {WORKERS} worker(s) of {CONCURRENCY} process(es)")
    print(f"{'':40}" + "".join(f"{n:>10}" for n in figures))
    for key in next(iter(figures.values())):
        print(f"{key:40}" + "".join(f"{figures[n][key]:10.3f}" for n in figures))
