"""SSH fan-out on the built-in lab: first contact side by side with pdsh (same key exchange), then pooled commands.

    .venv/bin/python bench/ssh_fanout.py [--nodes 64] [--repeat 5] [--peer pdsh|ssh] [--profile]

Starts its own lab (separate directory and port), pins host keys in memory, and prints:

- first contact, `true` on every node: rackbench (runners.ssh.Pool, a fresh pool each time, the fan-out's threads)
  against the peer, both held to the key exchange curve25519-sha256 (OpenSSH 9.2's default, sntrup761x25519, costs
  the client about 6x the CPU); the two alternate, ``--repeat`` times each. For each: median wall time and median
  client CPU (user + sys: this process's for rackbench, which runs in a worker already started; pdsh's and its ssh
  processes' for the peer), and the ratios rackbench / peer. The lab's sshd runs on the same cores, so the wall
  time counts the server's handshakes too; the client CPU is what the fan-out itself costs;
- the CPU the lab's sshd used meanwhile (the same work for both: it shares the client's cores, so it bounds how
  short the wall time can be, whatever the client does);
- then `true` on 1, 8, ... N pooled nodes (connections already open).

``--hostkeys database`` pins in rackbench's HostKey table (DATABASE_URL, migrated) through runners.database's pool,
as a worker does; the default keeps them in memory. ``--hostkeys pinned`` keeps the keys pinned there after the first
round, as a worker finds them when it opens new connections to known nodes: looked up in one query before the
fan-out, as ``runners.remote.fan_out`` does (``pinned-unbatched``: one query per host, from the fan-out's threads).

The peer is pdsh (``apt-get install pdsh``; ``-R ssh -f 64``, its ssh run with ``-o KexAlgorithms=...``), or with
``--peer ssh`` (or without pdsh) one ``ssh`` per node started by ``xargs -P 64``. ``--profile`` adds one first
contact under cProfile, every thread profiled (paramiko's transport threads do the key exchange), the functions
that took the most CPU first.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

import paramiko  # noqa: E402

from runners import lab, ssh  # noqa: E402
from runners.remote import DatabaseHostKeys  # noqa: E402

KEX_PARAMIKO = "curve25519-sha256@libssh.org"  # the same algorithm as OpenSSH's curve25519-sha256
KEX_OPENSSH = "curve25519-sha256,curve25519-sha256@libssh.org"


class MemoryKeys:
    def __init__(self) -> None:
        self.keys: dict[tuple[str, int], tuple[str, str]] = {}

    def pinned(self, address: str, port: int) -> tuple[str, str] | None:
        return self.keys.get((address, port))

    def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
        return self.keys.setdefault((address, port), (key_type, key_base64))


def one_kex() -> dict[str, list[str]]:
    """paramiko's disabled_algorithms that leave curve25519 as its only key exchange."""
    preferred: tuple[str, ...] = paramiko.Transport._preferred_kex  # type: ignore[attr-defined]
    return {"kex": [k for k in preferred if k != KEX_PARAMIKO]}


def measured(fn: Callable[[], object], *, children: bool) -> tuple[float, float]:
    """(wall s, CPU s) of ``fn``: this process's CPU, or that of the children it waited for."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    before = resource.getrusage(who)
    started = time.perf_counter()
    fn()
    wall = time.perf_counter() - started
    after = resource.getrusage(who)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def server_cpu(lab_dir: Path) -> float:
    """CPU seconds the lab's sshd used so far: each listener's own, plus that of the connection processes it reaped
    (every session's sshd and shell)."""
    total = 0
    for pid_file in lab_dir.glob("nodes/*/sshd.pid"):
        try:
            fields = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def ssh_options(key: Path, port: int) -> list[str]:
    return [
        "-i", str(key), "-p", str(port), "-o", f"KexAlgorithms={KEX_OPENSSH}", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
        "-o", "IdentitiesOnly=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
    ]  # fmt: skip


def peer_command(peer: str, hosts: list[str], user: str, key: Path, port: int) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if peer == "pdsh":
        # pdsh runs: ssh $PDSH_SSH_ARGS (with %u, %h filled in) COMMAND
        env["PDSH_SSH_ARGS"] = " ".join([*map(shlex.quote, ssh_options(key, port)), "-l%u", "%h"])
        return ["pdsh", "-R", "ssh", "-f", "64", "-S", "-l", user, "-w", ",".join(hosts), "true"], env
    line = shlex.join(["ssh", *ssh_options(key, port), "-l", user])
    return ["sh", "-c", f'printf "%s\\n" {shlex.join(hosts)} | xargs -P 64 -I{{}} {line} {{}} true'], env


def host_keys(
    kind: str, nodes: list[lab.LabNode]
) -> tuple[Callable[[], ssh.HostKeyStore], Callable[[], object], Callable[[], None] | None]:
    """(a new store, forget the lab's pinned keys, the fan-out threads' set-up) for ``--hostkeys``."""
    if kind == "memory":
        return MemoryKeys, lambda: None, None
    from inventory.models import HostKey
    from runners import database, remote

    lab_keys = HostKey.objects.filter(port=nodes[0].port, address__in=[n.address for n in nodes])
    lab_keys.delete()  # another lab's, on the same addresses

    def forget() -> object:
        database.pool_close()  # its threads start with the fan-out, as in a worker whose pool sat idle
        if kind != "database":  # pinned: the keys stay (pinned before the first round), only looked up
            return None
        return lab_keys.delete()

    return remote.DatabaseHostKeys, forget, database.refuse_connections


def profile_first_contact(
    endpoints: list[ssh.Endpoint],
    pkey: paramiko.PKey,
    keys: tuple[Callable[[], ssh.HostKeyStore], Callable[[], object], Callable[[], None] | None],
) -> None:
    """One first contact with every thread profiled (threading.setprofile starts a profiler in each new thread)."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()

    def start(*_: object) -> None:
        profile = cProfile.Profile(time.thread_time)  # CPU time: waiting on the server is not what is profiled
        with lock:
            profiles.append(profile)
        profile.enable()  # replaces this hook in the thread

    store, forget, on_thread_start = keys
    forget()
    pool = ssh.Pool(store(), disabled_algorithms=one_kex())
    main = cProfile.Profile(time.thread_time)
    threading.setprofile(start)
    main.enable()
    try:
        ssh.fan_out(endpoints, lambda e: pool.run(e, pkey, "true"), workers=64, on_thread_start=on_thread_start)
    finally:
        main.disable()
        threading.setprofile(None)
    pool.close_all()
    stats = pstats.Stats(main)
    for profile in profiles:
        profile.create_stats()
        stats.add(profile)
    print(f"\nfirst contact to {len(endpoints)} nodes under cProfile, every thread, in CPU time; by own time:")
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats("paramiko|runners|django|psycopg", 40)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--port", type=int, default=2251)
    parser.add_argument("--peer", choices=["pdsh", "ssh"], default="pdsh" if shutil.which("pdsh") else "ssh")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--hostkeys",
        choices=["memory", "database", "pinned", "pinned-unbatched"],
        default="memory",
        help="database: rackbench's own HostKey table (DATABASE_URL, migrated), each lookup and pin through "
        "runners.database's pool as in a worker; every first contact forgets the lab's keys first. pinned: the "
        "keys stay pinned there (a worker's new connections to known nodes), looked up in one query before the "
        "fan-out as runners.remote.fan_out does; pinned-unbatched: looked up one query per host",
    )
    args = parser.parse_args()
    if args.peer == "pdsh" and not shutil.which("pdsh"):
        raise SystemExit("pdsh is not installed (apt-get install pdsh), or use --peer ssh")

    lab_dir = Path(tempfile.mkdtemp(prefix="rackbench-bench-lab-"))
    lab_dir.chmod(0o755)
    try:
        started = time.perf_counter()
        nodes = lab.lab_up(args.nodes, port=args.port, base_address="127.0.2.0", lab_dir=lab_dir)
        print(f"lab of {len(nodes)} sshd nodes up in {time.perf_counter() - started:.1f} s")
        account = lab.lab_account(lab_dir=lab_dir)
        pkey = ssh.load_private_key(account.private_key.read_text())
        endpoints = [ssh.Endpoint(n.address, n.port, account.user, n.name) for n in nodes]
        argv, env = peer_command(args.peer, [n.address for n in nodes], account.user, account.private_key, args.port)

        store, forget, on_thread_start = host_keys(args.hostkeys, nodes)
        if args.hostkeys.startswith("pinned"):  # pinned once, untimed: the rounds look them up
            pinning = ssh.Pool(store(), disabled_algorithms=one_kex())
            ssh.fan_out(endpoints, lambda e: pinning.run(e, pkey, "true"), workers=64, on_thread_start=on_thread_start)
            pinning.close_all()

        def rackbench_once() -> tuple[float, float, float]:
            forget()
            pool = ssh.Pool(store(), disabled_algorithms=one_kex())

            def run_all() -> None:
                keys = pool.store
                if args.hostkeys == "pinned" and isinstance(keys, DatabaseHostKeys):  # as runners.remote.fan_out
                    keys.prefetch([(e.address, e.port) for e in endpoints])
                results = ssh.fan_out(
                    endpoints, lambda e: pool.run(e, pkey, "true"), workers=64, on_thread_start=on_thread_start
                )
                failed = [r for r in results if isinstance(r, BaseException)]
                if failed:
                    raise SystemExit(f"rackbench: {len(failed)} nodes failed: {failed[0]}")

            served = server_cpu(lab_dir)
            try:
                wall, cpu = measured(run_all, children=False)
            finally:
                pool.close_all()
            time.sleep(1)  # the lab's sshd reap their sessions
            return wall, cpu, server_cpu(lab_dir) - served

        def peer_once() -> tuple[float, float, float]:
            def run_all() -> None:
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise SystemExit(f"{args.peer} failed ({done.returncode}): {done.stderr[-2000:]}")

            served = server_cpu(lab_dir)
            wall, cpu = measured(run_all, children=True)
            time.sleep(1)
            return wall, cpu, server_cpu(lab_dir) - served

        kex_seen = ssh.Pool(MemoryKeys(), disabled_algorithms=one_kex())
        transport = kex_seen.client(endpoints[0], pkey).get_transport()
        assert transport is not None
        print(f"rackbench's key exchanges allowed: {', '.join(transport.preferred_kex)}; cipher "
              f"{transport.local_cipher}, MAC {transport.local_mac}; host keys {args.hostkeys}")  # fmt: skip
        kex_seen.close_all()
        ours: list[tuple[float, float, float]] = []
        theirs: list[tuple[float, float, float]] = []
        loads = []
        for _ in range(args.repeat):
            ours.append(rackbench_once())
            theirs.append(peer_once())
            loads.append(os.getloadavg()[0])
        peer_name = "pdsh -R ssh -f 64" if args.peer == "pdsh" else "xargs -P 64 ssh"
        rows = [("rackbench (paramiko, fan-out threads)", ours), (peer_name, theirs)]
        print(
            f"\nfirst contact + `true` on {len(endpoints)} nodes, kex curve25519-sha256 on both sides, "
            f"{args.repeat} runs each (1-min load average during them: {min(loads):.1f}-{max(loads):.1f})"
        )
        print(f"{'':40}{'wall median':>12}{'wall min':>10}{'client CPU':>12}{'sshd CPU':>10}   (medians)")
        for name, samples in rows:
            walls = [w for w, _, _ in samples]
            print(f"{name:40}{statistics.median(walls):>11.2f}s{min(walls):>9.2f}s"
                  f"{statistics.median(c for _, c, _ in samples):>11.2f}s"
                  f"{statistics.median(c for _, _, c in samples):>9.2f}s")  # fmt: skip
        wall_ratio = statistics.median(w for w, _, _ in ours) / statistics.median(w for w, _, _ in theirs)
        cpu_ratio = statistics.median(c for _, c, _ in ours) / statistics.median(c for _, c, _ in theirs)
        print(f"rackbench / {args.peer}: wall {wall_ratio:.2f}x, client CPU {cpu_ratio:.2f}x")

        if args.profile:
            profile_first_contact(endpoints, pkey, host_keys(args.hostkeys, nodes))

        pool = ssh.Pool(MemoryKeys(), disabled_algorithms=one_kex())

        def run_on(targets: list[ssh.Endpoint]) -> None:
            results = ssh.fan_out(targets, lambda e: pool.run(e, pkey, "true"), workers=64)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise SystemExit(f"{len(failed)} nodes failed: {failed[0]}")

        run_on(endpoints)  # connect
        sizes = sorted({1, 8, 16, 32, args.nodes} & set(range(1, args.nodes + 1)))
        print(f"\n{'nodes':>6} {'median s':>9} {'min s':>7}   pooled `true` on every node at once")
        for size in sizes:
            pooled = [measured(partial(run_on, endpoints[:size]), children=False)[0] for _ in range(args.repeat)]
            print(f"{size:>6} {statistics.median(pooled):>9.3f} {min(pooled):>7.3f}")
        pool.close_all()
    finally:
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
