"""SSH fan-out on the built-in lab: first contact and pooled commands on 1..N real sshd nodes.

    .venv/bin/python bench/ssh_fanout.py [--nodes 64] [--repeat 5]

Starts its own lab (separate directory and port), pins host keys in memory, and prints the median wall
time of: connecting to every node (first contact), then running `true` on 1, 8, ... N pooled nodes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

import django  # noqa: E402

django.setup()

from runners import lab, ssh  # noqa: E402


class MemoryKeys:
    def __init__(self) -> None:
        self.keys: dict[tuple[str, int], tuple[str, str]] = {}

    def pinned(self, address: str, port: int) -> tuple[str, str] | None:
        return self.keys.get((address, port))

    def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
        return self.keys.setdefault((address, port), (key_type, key_base64))


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--port", type=int, default=2251)
    args = parser.parse_args()

    lab_dir = Path(tempfile.mkdtemp(prefix="rackbench-bench-lab-"))
    lab_dir.chmod(0o755)
    try:
        started = time.perf_counter()
        nodes = lab.lab_up(args.nodes, port=args.port, base_address="127.0.2.0", lab_dir=lab_dir)
        print(f"lab of {len(nodes)} sshd nodes up in {time.perf_counter() - started:.1f} s")
        account = lab.lab_account(lab_dir=lab_dir)
        pkey = ssh.load_private_key(account.private_key.read_text())
        endpoints = [ssh.Endpoint(n.address, n.port, account.user, n.name) for n in nodes]
        pool = ssh.Pool(MemoryKeys())

        def run_on(targets: list[ssh.Endpoint]) -> None:
            results = ssh.fan_out(targets, lambda e: pool.run(e, pkey, "true"), workers=64)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise SystemExit(f"{len(failed)} nodes failed: {failed[0]}")

        first = timed(lambda: run_on(endpoints))
        print(f"first contact + `true` on {len(endpoints)} nodes: {first:.2f} s")
        sizes = sorted({1, 8, 16, 32, args.nodes} & set(range(1, args.nodes + 1)))
        print(f"{'nodes':>6} {'median s':>9} {'min s':>7}   pooled `true` on every node at once")
        for size in sizes:
            samples = [timed(lambda s=size: run_on(endpoints[:s])) for _ in range(args.repeat)]
            print(f"{size:>6} {statistics.median(samples):>9.3f} {min(samples):>7.3f}")
        pool.close_all()
    finally:
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
