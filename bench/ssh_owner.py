"""Who should own a run's SSH connections: paramiko threads (rackbench's runners.ssh.Pool) or one asyncssh event loop.

    .venv/bin/pip install -r requirements-bench.txt    # asyncssh, for this bench only
    .venv/bin/python bench/ssh_owner.py [--nodes 64,256,1000] [--rounds 3] [--idle 20] [--pooled 5]
        [--variants paramiko-0.1,paramiko,paramiko-N,asyncssh]

Starts its own lab (RACKBENCH_BENCH_PORT, default 3100, on addresses from 127.0.60.1; brought down after). Each
variant runs in a fresh process (so that its CPU, threads and memory are its own), the variants alternate in every
round, and each process does the same three things on N nodes:

1. first contact: connect to every node (fresh in-memory host key store: the key a node offers is pinned, as
   runners.ssh does) and run ``true`` on it;
2. a pooled fan-out: ``true`` on every node at once over the open connections, ``--pooled`` times;
3. holding the N idle connections for ``--idle`` seconds.

Variants: ``paramiko`` is runners.ssh.Pool with runners.ssh.fan_out's 64 threads, as a worker runs it;
``paramiko-N`` the same with one fan-out thread per node; ``paramiko-0.1`` is ``paramiko`` with the transport
threads waking every 0.1 s while idle, as before ``runners.ssh.IDLE_CHECK_S`` (paramiko's own
``_active_check_timeout``); ``asyncssh`` is asyncssh in one event loop in the main thread, every node at once.
All are held to the key exchange curve25519-sha256, cipher aes128-ctr, MAC hmac-sha2-256, no compression (what
paramiko negotiates with OpenSSH by default, apart from the key exchange), with the lab's user key.

Reported per variant, medians over the rounds: wall time and client CPU (the whole process, every thread:
``time.process_time``) of each step; the lab's sshd CPU meanwhile (listeners, their live sessions and the sessions
they reaped: /proc); the client's threads and resident memory growth with N connections open; during the idle
hold, the client's CPU as a share of one core and its voluntary context switches per second (getrusage: every
thread's wake-ups). The load average is printed with every size. The lab's sshd shares the machine's two cores
with the client, so first-contact wall times include the server's handshakes.

Measured 2026-11-28 on the 2-core lab machine (client and the lab's sshd on the same cores), medians; 64 and 256
nodes 3 rounds each (1-min load average 2.2-7.7 and 9.6-21.4: other sessions were at work), 1,000 nodes 2 rounds
(load average 40-166, mostly this bench's own 1,000 concurrent handshakes). Negotiated on every connection:
curve25519-sha256, aes128-ctr, hmac-sha2-256. Client CPU counts every thread of the process.

| N | variant | first contact: wall / client CPU | pooled `true`: wall / CPU | idle: % core, wakes/s | threads, RSS |
| --- | --- | --- | --- | --- | --- |
| 64 | paramiko, 0.1 s wake-ups | 0.65 s / 0.18 s | 0.112 s / 0.062 s | 2.0 %, 721 | 67, 4.5 MiB |
| 64 | paramiko, 1 s (now) | 0.64 s / 0.20 s | 0.108 s / 0.066 s | 0.3 %, 80 | 67, 4.6 MiB |
| 64 | asyncssh | 0.66 s / 0.12 s | 0.089 s / 0.021 s | 0.0 %, 0 | 7, 4.2 MiB |
| 256 | paramiko, 0.1 s | 2.75 s / 0.85 s | 0.456 s / 0.319 s | 5.2 %, 2,868 | 259, 16.3 MiB |
| 256 | paramiko, 1 s (now) | 2.72 s / 0.79 s | 0.424 s / 0.232 s | 0.8 %, 265 | 259, 16.3 MiB |
| 256 | paramiko, 256 threads | 2.84 s / 0.93 s | 0.484 s / 0.278 s | 0.8 %, 263 | 259, 18.2 MiB |
| 256 | asyncssh | 2.93 s / 0.46 s | 0.384 s / 0.087 s | 0.2 %, 2 | 7, 11.8 MiB |
| 1,000 | paramiko, 0.1 s | 11.65 s / 5.43 s | 2.20 s / 2.03 s | 20.2 %, 12,839 | 1,003, 61.5 MiB |
| 1,000 | paramiko, 1 s (now) | 11.10 s / 3.61 s | 1.96 s / 1.30 s | 3.4 %, 1,150 | 1,003, 61.6 MiB |
| 1,000 | paramiko, 1,000 threads | 13.4 and 36.2 s / 8.7 and 48.6 s | 1.95 s / 1.44 s | 2.9 %, 1,056 | 997, 65.9 MiB |
| 1,000 | asyncssh | 11.67 s / 1.84 s | 1.67 s / 0.43 s | 0.5 %, 5 | 7, 35.9 MiB |

The lab's sshd used ~10 ms of CPU per first contact whoever the client was (0.62-0.63 s for 64 nodes, 2.5-2.75 s
for 256, 10.1-11.0 s for 1,000) and ~0.7 ms per pooled command (0.04 / 0.17 / 0.69 s per wave); at 256 nodes only
the later rounds read it (before, live sessions were read from /proc/PID/stat, whose whole ticks rounded each
session's few ms down to nothing).
With one paramiko thread per host, 12 of 1,000 hosts failed one first contact with "SSH handshake failed" (paramiko's
own 15 s handshake timeout, under 1,000 handshake threads and 1,000 sshd on two cores) and that round cost 48.6 s of
client CPU: runners.ssh.fan_out's 64 threads are the right bound for paramiko.

Reading:

- paramiko's idle wake-ups (runners.ssh.IDLE_CHECK_S, now 1 s instead of paramiko's 0.1 s): holding 1,000 idle
  connections costs 3.4 % of a core instead of 20 %, and the same process's first contact to 1,000 nodes 3.6 s of
  CPU instead of 5.4 s, its pooled wave 1.3 s instead of 2.0 s (the open transports' wake-ups ran under both).
- asyncssh, one loop owning every connection, against that pool: client CPU 0.5-0.6x on first contact (1.84 s against
  3.61 s at 1,000 nodes; 0.46 s against 0.79 s at 256), 0.32-0.37x on a pooled wave (0.43 s against 1.30 s at 1,000;
  0.087 s against 0.232 s at 256), idle 0.5 % of a core against 3.4 % at 1,000, 7 threads against N + 3, 0.6x the
  memory at 1,000 nodes. Wall time: the same on first contact (10 ms of sshd per handshake on the same two cores is
  the bound here), 0.85-0.9x on a pooled wave at 256 and 1,000 nodes (0.82x at 64).
- Decision: asyncssh is the better owner of a run's connections, by client CPU and threads, not by wall time on this
  machine, where the nodes' sshd shares the client's cores; on a real cluster the sshd runs on the nodes and the
  client's CPU becomes the bound, which is where the 2-3x matters (first contact to 1,000 nodes: 1.8 s against 3.6 s
  of one core). It is worth moving to when a run's connections get one owning process (issue 16): that owner holding
  1,000 paramiko transports is 1,000 threads and 3.4 % of a core idle, with asyncssh 7 threads and 0.5 %. It is not
  worth swapping under today's design, in which each prefork worker process calls runners.ssh synchronously and
  opens its own connections: an event loop per process (and a bridge from synchronous tasks to it) would not remove
  the 3 x 1,000 connections, and paramiko with 1 s wake-ups already does a pooled wave over 1,000 nodes in 1.96 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

KEX_PARAMIKO = "curve25519-sha256@libssh.org"  # the same algorithm as OpenSSH's curve25519-sha256
KEX_ASYNCSSH = "curve25519-sha256"
CIPHER = "aes128-ctr"
MAC = "hmac-sha2-256"
VARIANTS = ("paramiko-0.1", "paramiko", "paramiko-N", "asyncssh")


class MemoryKeys:
    def __init__(self) -> None:
        self.keys: dict[tuple[str, int], tuple[str, str]] = {}

    def pinned(self, address: str, port: int) -> tuple[str, str] | None:
        return self.keys.get((address, port))

    def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
        return self.keys.setdefault((address, port), (key_type, key_base64))


# --- measuring -----------------------------------------------------------------------------------------------


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _stat_fields(pid: int | str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _runtime(pid: int) -> float:
    """CPU seconds of a live single-threaded process, to the nanosecond (/proc/PID/stat rounds each process down to
    whole ticks of 10 ms: a session's handshake, a few ms, would read as nothing)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def sshd_cpu(lab_dir: Path) -> float:
    """CPU seconds of the lab's sshd so far: the listeners, the sessions they reaped, and their live descendants
    (open sessions)."""
    listeners = set()
    for pid_file in lab_dir.glob("nodes/*/sshd.pid"):
        try:
            listeners.add(int(pid_file.read_text()))
        except (OSError, ValueError):
            continue
    children: dict[int, list[int]] = {}
    reaped_ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry.name)
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        if pid in listeners:
            reaped_ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    total = reaped_ticks / os.sysconf("SC_CLK_TCK")
    todo = [pid for pid in listeners if pid in children or Path(f"/proc/{pid}").exists()]
    while todo:
        pid = todo.pop()
        total += _runtime(pid)
        todo.extend(children.get(pid, []))
    return total


class Step:
    """Wall time, this process's CPU (every thread), its voluntary context switches and the lab's sshd CPU over a
    step; the sshd is read outside the client's figures."""

    def __init__(self, lab_dir: Path) -> None:
        self.lab_dir = lab_dir

    def __enter__(self) -> Step:
        self.sshd = sshd_cpu(self.lab_dir)
        self.switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        self.cpu = time.process_time()
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - self.switches
        self.sshd = sshd_cpu(self.lab_dir) - self.sshd

    def as_dict(self) -> dict[str, float]:
        return {"wall": self.wall, "cpu": self.cpu, "sshd": self.sshd, "switches": self.switches}


# --- one variant in its own process --------------------------------------------------------------------------


def child(variant: str, nodes: list[dict[str, Any]], lab_dir: Path, user: str, key_path: Path, args: Any) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    out: dict[str, Any] = {"variant": variant, "nodes": len(nodes)}
    if variant == "asyncssh":
        asyncio.run(_asyncssh(nodes, lab_dir, user, key_path, args, out))
    else:
        _paramiko(variant, nodes, lab_dir, user, key_path, args, out)
    print(json.dumps(out))


def _record_failures(out: dict[str, Any], what: str, failed: list[Any]) -> None:
    """Hosts that failed are counted (and the first reason kept) instead of ending the variant: a failure rate is a
    result too."""
    failures = out.setdefault("failures", {})
    failures[what] = failures.get(what, 0) + len(failed)
    if failed and "first_failure" not in out:
        out["first_failure"] = f"{what}: {failed[0]!r}"[:300]


def _after_contact(out: dict[str, Any], rss_before: int) -> None:
    out["threads"] = _status("Threads")
    out["rss_growth_mib"] = (_status("VmRSS") - rss_before) / 1024


def _paramiko(
    variant: str, nodes: list[dict[str, Any]], lab_dir: Path, user: str, key_path: Path, args: Any, out: dict[str, Any]
) -> None:
    import django

    django.setup()
    import paramiko

    from runners import ssh

    if variant == "paramiko-0.1":
        ssh.IDLE_CHECK_S = paramiko.Transport._active_check_timeout  # type: ignore[attr-defined]
    workers = len(nodes) if variant == "paramiko-N" else 64
    T = paramiko.Transport
    disabled = {
        "kex": [k for k in T._preferred_kex if k != KEX_PARAMIKO],  # type: ignore[attr-defined]
        "ciphers": [c for c in T._preferred_ciphers if c != CIPHER],  # type: ignore[attr-defined]
        "macs": [m for m in T._preferred_macs if m != MAC],  # type: ignore[attr-defined]
    }
    pkey = ssh.load_private_key(key_path.read_text())
    endpoints = [ssh.Endpoint(n["address"], n["port"], user, n["name"]) for n in nodes]
    pool = ssh.Pool(MemoryKeys(), ssh.Timeouts(connect=60.0, command=120.0), disabled_algorithms=disabled)

    def fan_out(what: str) -> None:
        results = ssh.fan_out(endpoints, lambda e: pool.run(e, pkey, "true"), workers=workers)
        failed = [r for r in results if isinstance(r, BaseException) or r.exit_code != 0]
        _record_failures(out, what, failed)
        if what == "contact":  # the rest goes to the connections that came up
            endpoints[:] = [e for e, r in zip(endpoints, results, strict=True) if not isinstance(r, BaseException)]

    rss_before = _status("VmRSS")
    with Step(lab_dir) as contact:
        fan_out("contact")
    _after_contact(out, rss_before)
    out["contact"] = contact.as_dict()
    pooled = []
    for _ in range(args.pooled):
        with Step(lab_dir) as step:
            fan_out("pooled")
        pooled.append(step.as_dict())
    out["pooled"] = pooled
    with Step(lab_dir) as idle:
        time.sleep(args.idle)
    out["idle"] = idle.as_dict()
    transport = pool.client(endpoints[0], pkey).get_transport()
    assert transport is not None
    out["negotiated"] = f"{KEX_PARAMIKO}, {transport.local_cipher}, {transport.local_mac}"
    pool.close_all()


async def _asyncssh(
    nodes: list[dict[str, Any]], lab_dir: Path, user: str, key_path: Path, args: Any, out: dict[str, Any]
) -> None:
    import asyncssh

    client_key = asyncssh.import_private_key(key_path.read_text())
    store = MemoryKeys()

    async def connect(node: dict[str, Any]) -> asyncssh.SSHClientConnection:
        pinned = store.pinned(node["address"], node["port"])
        known: Any = ([asyncssh.import_public_key(" ".join(pinned))], [], []) if pinned else None
        conn = await asyncssh.connect(
            node["address"],
            node["port"],
            username=user,
            client_keys=[client_key],
            known_hosts=known,  # None: first contact, the key offered is pinned below
            config=None,
            agent_path=None,
            kex_algs=[KEX_ASYNCSSH],
            encryption_algs=[CIPHER],
            mac_algs=[MAC],
            compression_algs=None,
            connect_timeout=60,
            login_timeout=60,
            keepalive_interval=15,
        )
        offered = conn.get_server_host_key()
        assert offered is not None
        text = offered.export_public_key("openssh").decode().split()
        if store.pin(node["address"], node["port"], text[0], text[1]) != (text[0], text[1]):
            conn.close()
            raise RuntimeError(f"{node['name']}: host key changed")
        return conn

    async def first(node: dict[str, Any]) -> asyncssh.SSHClientConnection:
        conn = await connect(node)
        result = await conn.run("true", check=False, timeout=120)
        if result.exit_status != 0:
            raise RuntimeError(f"{node['name']}: exit {result.exit_status}")
        return conn

    def check(results: list[Any], what: str) -> None:
        _record_failures(out, what, [r for r in results if isinstance(r, BaseException)])

    rss_before = _status("VmRSS")
    with Step(lab_dir) as contact:
        opened = await asyncio.gather(*(first(n) for n in nodes), return_exceptions=True)
        check(opened, "contact")
    conns = [c for c in opened if not isinstance(c, BaseException)]
    _after_contact(out, rss_before)
    out["contact"] = contact.as_dict()
    pooled = []
    for _ in range(args.pooled):
        with Step(lab_dir) as step:
            runs = (c.run("true", check=True, timeout=120) for c in conns)
            results = await asyncio.gather(*runs, return_exceptions=True)
            check(results, "pooled")
        pooled.append(step.as_dict())
    out["pooled"] = pooled
    with Step(lab_dir) as idle:
        await asyncio.sleep(args.idle)
    out["idle"] = idle.as_dict()
    info = conns[0].get_extra_info
    out["negotiated"] = f"{KEX_ASYNCSSH}, {info('send_cipher')}, {info('send_mac')}"
    for conn in conns:
        conn.close()
    await asyncio.gather(*(c.wait_closed() for c in conns))


# --- the parent: lab, rounds, table --------------------------------------------------------------------------


def run_child(variant: str, nodes: list[Any], lab_dir: Path, user: str, key: Path, args: Any) -> dict[str, Any]:
    spec = {
        "nodes": [{"address": n.address, "port": n.port, "name": n.name} for n in nodes],
        "lab_dir": str(lab_dir),
        "user": user,
        "key": str(key),
        "idle": args.idle,
        "pooled": args.pooled,
    }
    done = subprocess.run(
        [sys.executable, __file__, "--child", variant],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant} on {len(nodes)} nodes failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(samples: list[dict[str, Any]], get: Callable[[dict[str, Any]], float]) -> float:
    return statistics.median(get(s) for s in samples)


def report(size: int, results: dict[str, list[dict[str, Any]]], loads: list[float]) -> None:
    print(f"\n{size} nodes, medians of {len(next(iter(results.values())))} rounds "
          f"(1-min load average during them: {min(loads):.1f}-{max(loads):.1f})")  # fmt: skip
    print(f"{'':14}|{'first contact + true':^26}|{'pooled true on all':^21}|{'idle hold':^17}|{'with N open':^15}|")
    print(f"{'variant':14}|{'wall s':>8}{'CPU s':>8}{'sshd s':>9} |{'wall s':>8}{'CPU s':>7}{'sshd':>6}"
          f"|{'%core':>7}{'wakes/s':>9} |{'threads':>8}{'RSS MiB':>8}| negotiated")  # fmt: skip
    for variant, samples in results.items():
        pooled = [p for s in samples for p in s["pooled"]]
        idle = [s["idle"] for s in samples]
        contact = [s["contact"] for s in samples]
        columns = (
            f"{median(contact, lambda c: c['wall']):>8.2f}{median(contact, lambda c: c['cpu']):>8.2f}"
            f"{median(contact, lambda c: c['sshd']):>9.2f} |",
            f"{median(pooled, lambda p: p['wall']):>8.3f}{median(pooled, lambda p: p['cpu']):>7.3f}"
            f"{median(pooled, lambda p: p['sshd']):>6.2f}|",
            f"{median(idle, lambda i: 100 * i['cpu'] / i['wall']):>7.1f}"
            f"{median(idle, lambda i: i['switches'] / i['wall']):>9.0f} |",
            f"{median(samples, lambda s: s['threads']):>8.0f}{median(samples, lambda s: s['rss_growth_mib']):>8.1f}|",
        )
        print(f"{variant:14}|{''.join(columns)} {samples[0]['negotiated']}")
        for sample in samples:
            if any(sample.get("failures", {}).values()):
                print(f"{'':14}  failed hosts in a round: {sample['failures']}; first: {sample['first_failure']}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--pooled", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--port", type=int, default=int(os.environ.get("RACKBENCH_BENCH_PORT", "3100")))
    parser.add_argument("--base", default="127.0.60.0")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(sys.stdin.read())
        args.idle, args.pooled = spec["idle"], spec["pooled"]
        child(args.child, spec["nodes"], Path(spec["lab_dir"]), spec["user"], Path(spec["key"]), args)
        return
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}; known: {', '.join(VARIANTS)}")

    import django

    django.setup()
    from runners import lab

    lab_dir = Path(tempfile.mkdtemp(prefix="rackbench-bench-owner-"))
    lab_dir.chmod(0o755)
    everything: dict[int, dict[str, list[dict[str, Any]]]] = {}
    try:
        for size in [int(n) for n in args.nodes.split(",")]:
            started = time.perf_counter()
            nodes = lab.lab_up(size, port=args.port, base_address=args.base, lab_dir=lab_dir)
            print(f"lab of {len(nodes)} sshd nodes up in {time.perf_counter() - started:.1f} s", flush=True)
            account = lab.lab_account(lab_dir=lab_dir)
            results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
            loads = []
            for round_ in range(args.rounds):
                for variant in variants if round_ % 2 == 0 else variants[::-1]:
                    results[variant].append(run_child(variant, nodes, lab_dir, account.user, account.private_key, args))
                    loads.append(os.getloadavg()[0])
                    time.sleep(2)  # the lab's sshd reap the sessions just closed
            report(size, results, loads)
            everything[size] = results
    finally:
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
