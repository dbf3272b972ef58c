"""Written by rackbench (plugins/benchmarks/iperf.py): runs iperf servers or clients from a plan.

Every command is an argv list from the plan; nothing goes through a shell.

  python3 rackbench_iperf.py serve servers.json    start every server; exit when one of them exits
  python3 rackbench_iperf.py ready servers.json    exit 0 once every server's port listens on the plan's address
  python3 rackbench_iperf.py clients clients.json  start every client at once; then print each one's output
                                                   after a "#rackbench-iperf {...}" line

It runs on the hosts with their own python3 (3.6 and later): standard library only.
"""

import json
import signal
import socket
import subprocess
import sys
import time

HEADER = "#rackbench-iperf "
STDERR_KEPT = 4000  # the end of each client's stderr goes into its header line, where parse finds its errors


def load(path):
    with open(path) as f:
        return json.load(f)


def stop_children(procs, grace=2.0):
    """TERM every child, then KILL those still running after grace seconds (an idle iperf 2 server takes its time)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.time() + grace
    for proc in procs:
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop_children_on_signal(procs):
    def stop(signum, frame):
        stop_children(procs)
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)


def start(procs, argv, **kwargs):
    try:
        procs.append(subprocess.Popen(argv, **kwargs))
    except OSError as exc:
        sys.stderr.write(f"cannot start {argv[0]}: {exc}\n")
        stop_children(procs)
        sys.exit(127)
    return procs[-1]


def serve(plan):
    procs: list = []  # a local annotation: never evaluated, fine on the hosts' python3
    stop_children_on_signal(procs)
    for server in plan["servers"]:
        start(procs, server["argv"])
    while True:
        for server, proc in zip(plan["servers"], procs):  # noqa: B905 (strict= is 3.10+; hosts may be older)
            code = proc.poll()
            if code is not None:
                peer, port = server["peer"], server["port"]
                sys.stderr.write(f"iperf server for {peer} on port {port} exited with status {code}\n")
                stop_children(procs)
                return code if 0 < code < 256 else 1
        time.sleep(0.2)


def listening(udp=False):
    """(address, port) of every listening TCP socket (state 0A in /proc/net/tcp and /proc/net/tcp6), or with udp
    of every bound UDP socket (state 07 in /proc/net/udp and /proc/net/udp6)."""
    found = set()
    proto, state = ("udp", "07") if udp else ("tcp", "0A")
    for path, family in (("/proc/net/" + proto, socket.AF_INET), (f"/proc/net/{proto}6", socket.AF_INET6)):
        try:
            with open(path) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 4 or fields[3] != state:
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            if sys.byteorder == "little":  # the kernel prints each 32-bit word in host byte order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def ready(plan):
    try:
        infos = socket.getaddrinfo(plan["address"], None, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        sys.stderr.write("cannot resolve {}: {}\n".format(plan["address"], exc))
        return 1
    wanted = {str(info[4][0]).split("%")[0] for info in infos}
    listen = listening() | (listening(udp=True) if plan.get("udp") else set())
    missing = [s["port"] for s in plan["servers"] if not any((a, s["port"]) in listen for a in wanted)]
    if missing:
        sys.stderr.write("not listening yet on {} port {}\n".format(plan["address"], ", ".join(map(str, missing))))
        return 1
    return 0


def never_started(text):
    """Whether an iperf3 client failed before its test started: its JSON has an error and no interval. Then the
    server was busy with another round's flow, or between two tests (a persistent server closes and reopens its
    socket), and trying again is right."""
    try:
        doc = json.loads(text.decode("utf-8", "replace"))
    except ValueError:
        return False
    return isinstance(doc, dict) and bool(doc.get("error")) and not doc.get("intervals")


def run_in_turn(client, index, procs, deadline):
    """One client of a round, retried until its test starts (all_pairs)."""
    while True:
        out = open(f"client-{index}.out", "w+b")  # noqa: SIM115 (read back after the client ends, then closed)
        err = open(f"client-{index}.err", "w+b")  # noqa: SIM115
        proc = start(procs, client["argv"], stdout=out, stderr=err)
        proc.wait()
        procs.remove(proc)
        out.seek(0)
        if not never_started(out.read()) or time.time() > deadline:
            out.seek(0)
            err.seek(0)
            return proc, out, err
        out.close()
        err.close()
        time.sleep(0.1)


def clients(plan):
    procs: list = []
    stop_children_on_signal(procs)
    runs = []
    if plan.get("in_turn"):
        deadline = time.time() + plan["busy_wait"]
        for index, client in enumerate(plan["clients"]):
            runs.append((client, *run_in_turn(client, index, procs, deadline)))
    for index, client in enumerate(plan["clients"] if not plan.get("in_turn") else []):
        out = open(f"client-{index}.out", "w+b")  # noqa: SIM115 (read back after the client ends, then closed)
        err = open(f"client-{index}.err", "w+b")  # noqa: SIM115
        runs.append((client, start(procs, client["argv"], stdout=out, stderr=err), out, err))
    status = 0
    for client, proc, out, err in runs:
        code = proc.wait()
        status = status or (code if 0 < code < 256 else 1 if code else 0)
        out.seek(0)
        err.seek(0)
        text = out.read().decode("utf-8", "replace")
        errors = err.read().decode("utf-8", "replace")
        header = {
            "peer": client["peer"],
            "address": client["address"],
            "port": client["port"],
            "exit_code": code,
            "stderr": errors[-STDERR_KEPT:],
        }
        if "round" in client:
            header["round"] = client["round"]
        sys.stdout.write(HEADER + json.dumps(header, sort_keys=True) + "\n")
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        for line in errors.splitlines():
            sys.stderr.write("[{}] {}\n".format(client["peer"], line))
    sys.stdout.flush()
    return status


def main(argv):
    commands = {"serve": serve, "ready": ready, "clients": clients}
    if len(argv) != 3 or argv[1] not in commands:
        sys.stderr.write(__doc__)
        return 2
    return commands[argv[1]](load(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
