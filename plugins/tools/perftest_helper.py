"""Written by rackbench (plugins/benchmarks/perftest.py): runs one host's perftest steps from a plan, in order.

  python3 rackbench_perftest.py steps.json

Each step is a server (a perftest program without an address: it waits for one client, runs the test, exits) or a
client (the same program with the server's address). Both hosts of a pair reach their step in the same order, so the
steps keep in step without a clock: a client whose server is not listening yet fails to connect and is started again
(for up to ``wait + timeout`` seconds: its partner may still be in its previous test); a step still running past its
limit is killed (its partner failed). Before each step's output it prints ``#rackbench-perftest {...}`` (role, peer,
step, the HCA and port the plan names, exit code, the end of its stderr), which is how the plug-in's parser tells the
sections apart.

It runs on the hosts with their own python3 (3.6 and later): standard library only; every command is an argv list
from the plan, nothing goes through a shell.
"""

import json
import signal
import subprocess
import sys
import time

HEADER = "#rackbench-perftest "
STDERR_KEPT = 4000
# What a perftest client prints when nothing listens on the server's port yet (socket and rdma_cm exchange).
NOT_LISTENING = (
    "Couldn't connect",
    "Unable to open file descriptor for socket connection",
    "Unable to init the socket connection",
    "Unable to perform rdma_client function",
)
RETRY_PAUSE = 0.2
KILLED = 124  # the exit status a step gets when it ran past its time

running: list = []  # the step's process, for the signal handler (plain ``list``: python 3.6 can evaluate it)


def stop(signum, frame):
    for proc in running:
        if proc.poll() is None:
            proc.kill()
    sys.exit(128 + signum)


def run_once(argv, limit):
    """(exit status, stdout, stderr) of argv, killed after limit seconds."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return 127, "", f"cannot start {argv[0]}: {exc}\n"
    running.append(proc)
    try:
        out, err = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"rackbench: stopped after {limit:.0f} s\n".encode()
        code = KILLED
    running.remove(proc)
    return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def run_step(step, wait, timeout):
    """A partner may still be in its previous test (up to ``timeout``) before it reaches this step (within ``wait``):
    a client tries again for that long, a server waits that long for its client and then runs the test."""
    if step["role"] == "server":
        return run_once(step["argv"], wait + 2 * timeout)
    deadline = time.time() + wait + timeout
    while True:
        code, out, err = run_once(step["argv"], wait + timeout)
        refused = code != 0 and any(text in out + err for text in NOT_LISTENING)
        if not refused or time.time() > deadline:
            return code, out, err
        time.sleep(RETRY_PAUSE)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        plan = json.load(f)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    status = 0
    for step in plan["steps"]:
        code, out, err = run_step(step, plan["wait"], plan["timeout"])
        status = status or (code if 0 < code < 256 else 1 if code else 0)
        header = {key: step[key] for key in ("role", "peer", "step", "round", "hca", "ib_port") if key in step}
        header.update(exit_code=code, stderr=err[-STDERR_KEPT:])
        sys.stdout.write(HEADER + json.dumps(header, sort_keys=True) + "\n")
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
        for line in err.splitlines():
            sys.stderr.write("[{} {}] {}\n".format(step["role"], step["peer"], line))
        sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
