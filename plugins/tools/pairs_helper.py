"""Written by rackbench (plugins/benchmarks/nccl.py): runs a pairwise plan's launches on the primary host, round by
round, every launch of a round at once.

  python3 rackbench_pairs.py pairs.json

The plan: ``{"timeout": seconds, "rounds": [[{"nodes": [A, B], "argv": [...]}, ...], ...]}``; each launch is one
2-node test (an ``mpirun`` across A and B). A round starts once every launch of the previous one has ended, so no
node is ever in two tests at once; a launch still running past ``timeout`` is killed (exit status 124). Then, in
plan order, each launch's output follows a ``#rackbench-pair {"round": R, "nodes": [A, B], "exit_code": N, "stderr":
...}`` line, and ``#rackbench-pairs {"pairs": N}`` ends the output: the format rackbench's torch_dist program prints,
read by the same parser.

It runs on the host with its own python3 (3.6 and later): standard library only; every command is an argv list from
the plan, nothing goes through a shell.
"""

import json
import signal
import subprocess
import sys
import tempfile
import time

PAIR_HEADER = "#rackbench-pair "
PAIRS_FOOTER = "#rackbench-pairs "
STDERR_KEPT = 4000
KILLED = 124

running: list = []  # the round's processes, for the signal handler (plain ``list``: python 3.6 can evaluate it)


def stop(signum, frame):
    for proc in running:
        if proc.poll() is None:
            proc.kill()
    sys.exit(128 + signum)


def run_round(launches, timeout):
    """[(exit status, stdout, stderr)] of the launches, all started at once; output goes to files, not pipes, so a
    launch that prints much never blocks on a pipe nobody reads yet."""
    started = []
    for launch in launches:
        out = tempfile.TemporaryFile()  # noqa: SIM115 (read back after the launch ends, then closed)
        err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            proc = subprocess.Popen(launch["argv"], stdout=out, stderr=err)
        except OSError as exc:
            err.write("cannot start {}: {}\n".format(launch["argv"][0], exc).encode())
            proc = None
        else:
            running.append(proc)
        started.append((proc, out, err))
    deadline = time.time() + timeout
    results = []
    for proc, out, err in started:
        code = 127
        if proc is not None:
            try:
                code = proc.wait(timeout=max(deadline - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                err.write(f"rackbench: stopped after {timeout:.0f} s\n".encode())
                code = KILLED
            running.remove(proc)
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
            f.close()
        results.append((code, texts[0], texts[1]))
    return results


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    status, pairs = 0, 0
    for number, launches in enumerate(plan["rounds"]):
        ended = run_round(launches, plan["timeout"])
        for launch, (code, out, err) in zip(launches, ended):  # noqa: B905 (strict= is 3.10+; hosts may be older)
            status = status or (code if 0 < code < 256 else 1 if code else 0)
            header = {"round": number, "nodes": launch["nodes"], "exit_code": code, "stderr": err[-STDERR_KEPT:]}
            sys.stdout.write(PAIR_HEADER + json.dumps(header, sort_keys=True) + "\n")
            sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
            for line in err.splitlines():
                sys.stderr.write("[{}] {}\n".format("-".join(launch["nodes"]), line))
            sys.stdout.flush()
            pairs += 1
    sys.stdout.write(PAIRS_FOOTER + json.dumps({"pairs": pairs}) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
