"""The bridge between the inventory and runners.ssh: endpoints, credentials, pinned keys, detached jobs.

A detached job lives in its own directory on the host::

    command.sh   the exact command (written by rackbench, built with shlex)
    launch.sh    records its pid, waits for the start instant it was given, records the instant it really starts
                 (``started``, ns since the epoch), runs command.sh with stdout/stderr to files, then writes exit_code
    submitted    marker written before launching, holding the start attempt's id: a redelivered submit of the same
                 attempt never starts a second copy, and a submit of another attempt is refused
    started      the instant the launcher ran command.sh (its modification time; once the command ended, its
                 content: that time in ns since the epoch, the node's clock)
    killed       marker written by job_kill: rackbench stopped it (not someone else, not a reboot)
    ended        a FIFO the launcher writes to once the exit code is there: what a poll waiting for the end blocks on
    pid, stdout, stderr, exit_code
    io           the launcher's /proc/<pid>/io as the command ended: the kernel adds every process it waited for
                 (the command, and what that reaped in turn), so it is the I/O the job itself did

The job runs in its own session (setsid) with its directory in its environment (``RACKBENCH_JOB``), so cancel
and timeout kill the whole process group and every process carrying the marker (also those that started a
session of their own), and a dropped SSH connection or a restarted worker loses nothing: the next poll reads
the files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paramiko
from django.conf import settings

from campaigns import plan
from inventory.crypto import decrypt
from inventory.models import Credential, HostKey, Node, StorageSystem
from inventory.services import hostkey_pin
from runners import database, ssh


class DatabaseHostKeys:
    """Pinned host keys in the HostKey table.

    Looked up on every new connection, from the SSH fan-out's threads too: through ``database.call``, so on the
    process's bounded pool of connections. A fan-out about to open many connections looks them all up first, in one
    query (``prefetch``): each new connection then takes its host's answer from memory once, within
    ``PREFETCH_TTL`` seconds, instead of a query of its own (about 3 ms of a worker's CPU per host, queued on the
    pool's few connections)."""

    PREFETCH_TTL = 30.0

    def __init__(self) -> None:
        self._prefetched: dict[tuple[str, int], tuple[float, tuple[str, str] | None]] = {}
        self._lock = threading.Lock()

    def prefetch(self, endpoints: list[tuple[str, int]]) -> None:
        """Look up the pinned keys of these (address, port) in one query, for the connections about to open."""
        if not endpoints:
            return
        found = database.call(_pinned_many, endpoints)
        expires = time.monotonic() + self.PREFETCH_TTL
        with self._lock:
            now = time.monotonic()
            self._prefetched = {k: v for k, v in self._prefetched.items() if v[0] > now}
            for endpoint in endpoints:
                self._prefetched[endpoint] = (expires, found.get(endpoint))

    def pinned(self, address: str, port: int) -> tuple[str, str] | None:
        with self._lock:
            taken = self._prefetched.pop((address, port), None)
        if taken is not None and taken[0] > time.monotonic():
            return taken[1]
        return database.call(_pinned, address, port)

    def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
        return database.call(_pin, address, port, key_type, key_base64)


def _pinned(address: str, port: int) -> tuple[str, str] | None:
    row = HostKey.objects.filter(address=address, port=port).values_list("key_type", "key_base64").first()
    return (row[0], row[1]) if row else None


def _pinned_many(endpoints: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[str, str]]:
    wanted = set(endpoints)
    rows = HostKey.objects.filter(address__in={a for a, _ in wanted}, port__in={p for _, p in wanted}).values_list(
        "address", "port", "key_type", "key_base64"
    )
    return {(a, p): (t, b) for a, p, t, b in rows if (a, p) in wanted}


def _pin(address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
    row = hostkey_pin(address=address, port=port, key_type=key_type, key_base64=key_base64)
    return row.key_type, row.key_base64


_pool: ssh.Pool | None = None
_pool_lock = threading.Lock()


def pool() -> ssh.Pool:
    """The worker process's connection pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            cfg = settings.RACKBENCH
            _pool = ssh.Pool(
                DatabaseHostKeys(),
                ssh.Timeouts(
                    connect=cfg["SSH_CONNECT_TIMEOUT"],
                    command=cfg["SSH_COMMAND_TIMEOUT"],
                    keepalive=cfg["SSH_KEEPALIVE"],
                    max_age=cfg["SSH_MAX_AGE"],
                ),
            )
        return _pool


def reset_pool() -> None:
    """Close every pooled connection (after a fork, or in tests)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            _pool.close_all()
        _pool = None


@dataclass(frozen=True)
class Target:
    """An SSH endpoint with the key to log in with."""

    endpoint: ssh.Endpoint
    pkey: paramiko.PKey

    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> ssh.CommandResult:
        return pool().run(self.endpoint, self.pkey, command, timeout=timeout, stdin=stdin)

    def check(
        self, command: str, *, what: str, timeout: float | None = None, stdin: bytes | None = None
    ) -> ssh.CommandResult:
        """Run a command that must succeed; a non-zero exit is a permanent error naming ``what``."""
        result = self.run(command, timeout=timeout, stdin=stdin)
        if not result.ok:
            detail = (result.stderr or result.stdout).strip()[-500:]
            raise ssh.PermanentSSHError(self.endpoint, f"{what} failed (exit {result.exit_code}): {detail}")
        return result

    def put(self, files: dict[str, str], *, mode: int = 0o644) -> None:
        pool().put(self.endpoint, self.pkey, files, mode=mode)

    def get(self, path: str, *, limit: int | None = None) -> bytes | None:
        return pool().get(self.endpoint, self.pkey, path, limit=limit)

    def home(self) -> str:
        return pool().home(self.endpoint, self.pkey)


_keys: dict[tuple[int, str], paramiko.PKey] = {}


def _pkey(credential: Credential | None, label: str) -> paramiko.PKey:
    if credential is None:
        raise ssh.PermanentSSHError(None, f"{label} has no SSH credential")
    cache_key = (credential.pk, credential.fingerprint)
    if cache_key not in _keys:
        _keys[cache_key] = ssh.load_private_key(decrypt(credential.private_key_encrypted))
    return _keys[cache_key]


def node_target(node: Node) -> Target:
    credential = node.credential
    endpoint = ssh.Endpoint(
        address=node.address,
        port=node.ssh_port,
        username=node.login_user,
        name=node.name,
        key_id=credential.fingerprint if credential else "",
    )
    return Target(endpoint, _pkey(credential, f"node {node.name}"))


def storage_target(storage: StorageSystem) -> Target:
    if not storage.admin_address:
        raise ssh.PermanentSSHError(
            None, f"storage system {storage.name} has no admin endpoint to run its flush command"
        )
    credential = storage.admin_credential
    endpoint = ssh.Endpoint(
        address=storage.admin_address,
        port=storage.admin_port,
        username=storage.admin_user or (credential.username if credential else "root"),
        name=f"storage {storage.name}",
        key_id=credential.fingerprint if credential else "",
    )
    return Target(endpoint, _pkey(credential, f"storage system {storage.name}"))


def remote_root(target: Target) -> str:
    return plan.remote_root(target.home())


# --- detached jobs ------------------------------------------------------------------------------

LATE_EXIT = 75  # a submit that came after the start instant (beyond the tolerance): nothing was started
OTHER_ATTEMPT_EXIT = 76  # a submit that found the job started by another attempt

# $1: the start instant (ns since the epoch, the node's clock; 0 or none: at once). The submit that starts it has
# checked that the instant is not past; should the launcher itself run after it (a node too loaded to fork it in
# time), it starts at once, and its ``started`` shows by how much: the run's provenance keeps each host's offset.
# The wait, where the node has bash: one bash reads its clock (EPOCHREALTIME, a variable: no process) and times out a
# read on the job's FIFO (nobody writes to it before the end) for what is left, so no process starts between reading
# the clock and starting the timer (``sleep "$(( at - $(date +%s%N) ))"`` forks two there: under a submit wave, a
# launcher woke as late as its timer started after its clock read). Without bash or the FIFO, that one sleep
# (GNU date). The start is recorded without a process of its own between the wake-up and command.sh: ``: > started``
# (a shell builtin) stamps the file's modification time, turned into ns in its content once the command has ended
# (``date -r``). Its resolution is the kernel's file timestamps' (a clock tick, 1-4 ms, and up to a tick behind the
# clock): on 256 lab nodes waking together on two cores, one ``date`` each before its command doubled the measured
# spread. Once the exit code is there, a few bytes into the FIFO ``ended`` (made with the job's files) wake whoever
# waits for the end (``job_state``); opened read-write, it never blocks, and with nobody waiting the bytes are gone
# once it is closed.
LAUNCHER = """#!/bin/sh
# Written by rackbench. Runs command.sh detached at its start instant; the files beside it are the job's state.
cd "$(dirname "$0")" || exit 90
echo $$ > pid.tmp && mv pid.tmp pid
WAIT='at=$(( $1 / 1000 ))
while now=${EPOCHREALTIME/[.,]/}; [ -n "$now" ] || now=$(( $(date +%s%N) / 1000 )); (( at > now )); do
  left=$(( at - now )); printf -v frac %06d $(( left % 1000000 ))
  read -r -t "$(( left / 1000000 )).$frac" -u 3 _ || [ $? -gt 128 ] || sleep 0.001
done'
if [ "${1:-0}" -gt 0 ] && [ -p ended ] && command -v bash > /dev/null 2>&1; then
  bash -c "$WAIT" wait "$1" 3<>ended 2>/dev/null
elif [ "${1:-0}" -gt 0 ]; then
  delay=$(( $1 - $(date +%s%N) ))
  [ "$delay" -gt 0 ] && sleep "$(( delay / 1000000000 )).$(printf %09d $(( delay % 1000000000 )))"
fi
: > started
sh ./command.sh > stdout 2> stderr < /dev/null
rc=$?
date -r started +%s%N > started.tmp 2>/dev/null && mv started.tmp started
cat /proc/$$/io > io.tmp 2>/dev/null && mv io.tmp io
echo $rc > exit_code.tmp && mv exit_code.tmp exit_code
[ -p ended ] && { printf rackbench >&3; } 3<>ended 2>/dev/null
"""


def command_script(argv: list[str], env: dict[str, str]) -> str:
    lines = ["#!/bin/sh", "# Written by rackbench: the exact command of this run on this host."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    lines.append("exec " + shlex.join(argv))
    return "\n".join(lines) + "\n"


def job_prepare(target: Target, job_dir: str, *, extra_dirs: list[str], files: dict[str, str]) -> None:
    """Create the job directory (and any data directories) and write its files, in one round trip."""
    jobs_prepare(target, {job_dir: files}, extra_dirs=extra_dirs)


@dataclass(frozen=True)
class Prepared:
    """What ``jobs_prepare`` ran once the files were written: the layout's own result (None where none was asked),
    the output of the command asked for after it, and the submit's result (each None where none was asked, or the
    layout failed)."""

    layout: ssh.CommandResult | None = None
    after: str | None = None
    submitted: ssh.CommandResult | None = None


def jobs_prepare(
    target: Target,
    jobs: dict[str, dict[str, str]],
    *,
    extra_dirs: list[str],
    layout: str = "",
    after: str = "",
    submit: str = "",
    timeout: float | None = None,
) -> Prepared:
    """Create job directories (job directory -> its files) and ``extra_dirs`` and write every job's files and
    launcher, in one round trip: ``sh -s`` reads the script of ``prepare_script`` on its standard input. In the same
    round trip, once the files are written, it runs ``layout`` (a command line laying out the benchmark's data), then
    ``after`` (a command whose output is wanted, e.g. the cache snapshot), then ``submit`` (``submit_line``: the job
    started), all of which a failed layout skips: what would otherwise take round trips of their own. Their outputs
    are told apart by a mark of this call's own."""
    script = prepare_script(jobs, extra_dirs=extra_dirs)
    if not layout and not after and not submit:
        target.check("sh -s", what="creating the run directory and writing its files", stdin=script.encode())
        return Prepared()
    mark = f"--rackbench-{uuid.uuid4().hex}"
    script += f"set +e\necho {mark}\n"
    if layout:
        script += f"( {layout}\n); rc=$?; echo {mark} $rc; echo {mark} >&2; [ $rc -eq 0 ] || exit 0\n"
    if after:
        script += f"{{ {after}\n}} 2>/dev/null\n"
    if submit:
        script += f"printf '\\n%s\\n' {mark}; echo {mark} >&2; ( {submit}\n); echo {mark} $?\n"
    result = target.check(
        "sh -s", what="creating the run directory and writing its files", stdin=script.encode(), timeout=timeout
    )
    try:
        return _prepared(result, mark, layout=bool(layout), after=bool(after), submit=bool(submit))
    except ValueError as exc:
        raise ssh.TransientSSHError(target.endpoint, f"preparing the run: {exc}") from None


def _prepared(result: ssh.CommandResult, mark: str, *, layout: bool, after: bool, submit: bool) -> Prepared:
    out, err = result.stdout, result.stderr
    begin = out.find(f"{mark}\n")
    if begin < 0:
        raise ValueError("the output was cut short")
    rest = out[begin + len(mark) + 1 :]
    found = None
    if layout:
        end = rest.find(f"{mark} ")
        line_end = rest.find("\n", end)
        if end < 0 or line_end < 0:
            raise ValueError("the layout's output was cut short")
        code = int(rest[end + len(mark) + 1 : line_end])
        err_end = err.find(mark)
        found = ssh.CommandResult(code, rest[:end], err[:err_end] if err_end >= 0 else err, result.seconds)
        err = err[err_end + len(mark) + 1 :] if err_end >= 0 else err
        rest = rest[line_end + 1 :]
        if code != 0:
            return Prepared(found)
    submitted = None
    if submit:
        split = rest.rfind(f"\n{mark}\n")
        end = rest.rfind(f"{mark} ")
        if split < 0 or end < split:
            raise ValueError("the submit's output was cut short")
        code = int(rest[end + len(mark) + 1 :].strip())
        err_start = err.rfind(f"{mark}\n")
        err = err[err_start + len(mark) + 1 :] if err_start >= 0 else ""
        submitted = ssh.CommandResult(code, rest[split + len(mark) + 2 : end], err, result.seconds)
        rest = rest[:split]
    return Prepared(found, rest if after else None, submitted)


def prepare_script(jobs: dict[str, dict[str, str]], *, extra_dirs: list[str]) -> str:
    """A shell script that makes the directories and the job's FIFO and writes the files: each file with the shell's
    own printf (no process per file), its content and path through shlex.quote. Files are 0644, the launcher 0755.
    It stops at the first failure. On standard input it has no length limit, where a command line has."""
    lines = ["set -e", shlex.join(["mkdir", "-p", *jobs, *extra_dirs])]
    fifos = [f"{job_dir}/ended" for job_dir in jobs]
    lines.append(f"mkfifo {shlex.join(fifos)} 2>/dev/null || true")  # made once: a directory prepared again keeps it
    lines.append("umask 022")  # the files are 0644 as printf makes them (rackbench only ever writes them so)
    launchers: list[str] = []
    for job_dir, files in jobs.items():
        for name, content in [*files.items(), ("launch.sh", LAUNCHER)]:
            if "\0" in content:
                raise ValueError(f"{name}: a job's file is text, without NUL characters")
            path = f"{job_dir}/{name}"
            lines.append(f"printf %s {shlex.quote(content)} > {shlex.quote(path)}")
            if name == "launch.sh":
                launchers.append(path)
    lines.append(shlex.join(["chmod", "755", *launchers]))
    return "\n".join(lines) + "\n"


LAYOUT_KEPT = "rackbench: the data is as the same layout left it, not laid out again"


def layout_once(line: str, *, key: list[Any], data_dirs: list[str], memo_dir: str) -> str:
    """``line`` (a layout command) made to run only where it would change something: the files directly in
    ``data_dirs`` (path, size, modification time, inode) as it leaves them are kept in ``memo_dir``, under a digest
    of ``key`` (what makes the layout what it is: its command, files and environment, the host); where they are
    the same the next time, it is not run and prints LAYOUT_KEPT instead. Anything that writes, removes or replaces
    one of those files changes that listing, and the layout runs again; so does a host whose ``find`` cannot
    list them (not GNU find): no listing is kept for it. (The listing is find's, unsorted: a directory left as it
    was lists in the same order, and one listed in another order only has its layout run again.)"""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    memo = shlex.quote(f"{memo_dir}/{digest}")
    listing = f"find {shlex.join(data_dirs)} -maxdepth 1 -type f -printf '%p %s %T@ %i\\n' 2>/dev/null"
    return (
        f'm={memo}; if {listing} | cmp -s - "$m"; then echo {shlex.quote(LAYOUT_KEPT)}; exit 0; fi; '
        f"( {line} ) || exit $?; "
        f'{{ mkdir -p {shlex.quote(memo_dir)} && {listing} > "$m.tmp" && [ -s "$m.tmp" ] && mv "$m.tmp" "$m"; }} '
        "2>/dev/null || true"
    )


JOB_MARKER = "RACKBENCH_JOB"  # in the environment of every process a job starts: its directory


def job_submit(
    target: Target, job_dir: str, *, attempt: str = "", start_at_ns: int = 0, tolerance_ns: int = 0
) -> int | None:
    """Start the job detached, with its marker in its environment, at most once per directory: its command runs at
    ``start_at_ns`` (ns since the epoch on the node's clock; 0: at once).

    ``attempt`` names the start attempt: a submit of the same attempt delivered again starts nothing (and says
    nothing), one of another attempt is refused (TransientSSHError: the earlier attempt's job must be undone first).
    Returns None when the job is started, or how late (ns) the submit came when it came more than ``tolerance_ns``
    after ``start_at_ns``: then nothing is started, and no marker left.
    """
    line = submit_line(job_dir, attempt=attempt, start_at_ns=start_at_ns, tolerance_ns=tolerance_ns)
    return submit_answer(target, job_dir, target.run(line))


def submit_line(job_dir: str, *, attempt: str = "", start_at_ns: int = 0, tolerance_ns: int = 0) -> str:
    """The command line of ``job_submit`` (also sent at the end of ``jobs_prepare``'s round trip). It prints how late
    (ns, negative: how early) it checked the instant, unless it found the job submitted already."""
    d = shlex.quote(job_dir)
    mark = shlex.quote(attempt)
    # The marker is created with noclobber (O_EXCL): of two copies of one submit arriving together, one launches.
    return (
        f'cd {d} || exit 1; if [ -e submitted ]; then [ "$(cat submitted)" = {mark} ] && exit 0; '
        f'echo "started by attempt $(cat submitted)"; exit {OTHER_ATTEMPT_EXIT}; fi; '
        f"at={int(start_at_ns)}; late=$(( $(date +%s%N) - at )); echo $late; "
        f'if [ "$at" -gt 0 ] && [ "$late" -gt {int(tolerance_ns)} ]; then exit {LATE_EXIT}; fi; '
        f"set -C; printf %s {mark} 2>/dev/null > submitted || exit 0; set +C; "
        f"{JOB_MARKER}={d} setsid sh ./launch.sh $at < /dev/null > /dev/null 2>&1 &"
    )


def submit_answer(target: Target, job_dir: str, result: ssh.CommandResult) -> int | None:
    """What ``submit_line``'s result says, as ``job_submit`` returns or raises it."""
    if result.exit_code == LATE_EXIT:
        return int(result.stdout.strip() or 0)
    if result.exit_code == OTHER_ATTEMPT_EXIT:
        raise ssh.TransientSSHError(
            target.endpoint, f"{job_dir} was {result.stdout.strip()}, not by this one: it must be undone first"
        )
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise ssh.PermanentSSHError(target.endpoint, f"starting the job failed (exit {result.exit_code}): {detail}")
    return None


WATCH_TICK = 0.05  # seconds between looks at a watched job without its FIFO
WATCH_SLICE = 0.5  # seconds a watch blocks on the job's FIFO before it looks whether the job's process is alive
COMMAND_TIMEOUT = 30.0  # seconds a watching job_state may take beyond its wait


@dataclass(frozen=True)
class JobState:
    pid: int | None
    exit_code: int | None
    alive: bool
    submitted: bool
    killed: bool = False  # rackbench killed it (job_kill leaves a "killed" file)
    attempt: str = ""  # the start attempt that submitted it

    @property
    def finished(self) -> bool:
        return self.exit_code is not None

    @property
    def vanished(self) -> bool:
        """Started, not running, and no exit code: killed from outside or the host rebooted."""
        return self.submitted and self.pid is not None and not self.alive and self.exit_code is None


def job_state(target: Target, job_dir: str, *, wait: float = 0.0) -> JobState:
    """The job's state; with ``wait``, read once it has ended (an exit code, or its process gone) or after ``wait``
    seconds, whichever comes first: the end of a short job is noticed as it happens instead of a poll interval later.

    The wait blocks on the job's FIFO (``ended``), which its launcher writes to once the exit code is there; every
    WATCH_SLICE seconds it looks whether the job's process is still alive. Where the FIFO is missing (a job prepared
    by an earlier version) or the node has no ``timeout``/``dd``, it looks every WATCH_TICK seconds instead. The
    files are read with the shell's own ``read``: no process per file."""
    d = shlex.quote(job_dir)
    ticks = int(wait / WATCH_TICK)
    per_slice = int(WATCH_SLICE / WATCH_TICK)
    alive = '[ -n "$p" ] && ! kill -0 "$p" 2>/dev/null && break'
    watch = (
        f'ticks() {{ n=$1; while [ "$n" -gt 0 ] && [ ! -e exit_code ]; do {alive}; sleep {WATCH_TICK}; '
        f"n=$((n-1)); done; }}; w={ticks}; "
        f'if [ -p ended ]; then {{ while [ "$w" -gt 0 ] && [ ! -e exit_code ]; do {alive}; '
        f"timeout {WATCH_SLICE} dd bs=1 count=1 of=/dev/null <&3 2>/dev/null; r=$?; [ $r -eq 0 ] && break; "
        f'[ $r -eq 124 ] || {{ ticks "$w"; break; }}; w=$((w-{per_slice})); done; }} 3<>ended; '
        f'else ticks "$w"; fi; '
        if ticks > 0
        else ""
    )
    line = (
        f"cd {d} 2>/dev/null || exit 0; p=; e=; t=; {{ read p < pid; }} 2>/dev/null; {watch}{{ read p < pid; }} "
        f"2>/dev/null; {{ read e < exit_code; }} 2>/dev/null; {{ read t < submitted; }} 2>/dev/null; "
        f'a=no; [ -n "$p" ] && kill -0 "$p" 2>/dev/null && a=yes; s=no; [ -e submitted ] && s=yes; '
        f'k=no; [ -e killed ] && k=yes; echo "$p|$e|$a|$s|$k|$t"'
    )
    out = target.run(line, timeout=(wait + COMMAND_TIMEOUT) if ticks > 0 else None).stdout.strip()
    if not out:
        return JobState(None, None, False, False)
    pid, code, alive_, submitted, killed, attempt = (out.split("|", 5) + [""] * 6)[:6]
    return JobState(
        pid=int(pid) if pid.isdigit() else None,
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        alive=alive_ == "yes",
        submitted=submitted == "yes",
        killed=killed == "yes",
        attempt=attempt,
    )


def job_kill(target: Target, job_dir: str, *, grace: float = 3.0) -> list[int]:
    """TERM everything the job started, then KILL what is left after ``grace`` seconds; returns the pids still
    alive after that (empty: the kill is confirmed).

    "Everything" is its process group and every process carrying the job's marker in its environment: processes
    that left the group for a session of their own (fio's job processes do) are found by scanning
    /proc/*/environ, so they die too even when the job's main process does not exit on TERM (hung storage).
    """
    d = shlex.quote(job_dir)
    marker = shlex.quote(f"{JOB_MARKER}={job_dir}")
    steps = int(max(grace, 0.1) / 0.1)
    # "kill -SIG -PGID", not "kill -SIG -- -PGID": dash's kill builtin rejects "--". A zombie's environ is empty,
    # so only live processes are listed; the kill command's own shell carries no marker.
    line = (
        f"cd {d} 2>/dev/null || exit 0; : > killed 2>/dev/null; p=$(cat pid 2>/dev/null); "
        f"marked() {{ grep -lzxF -- {marker} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }}; "
        f'group() {{ [ -n "$p" ] && kill -0 -"$p" 2>/dev/null; }}; '
        f'[ -n "$p" ] && kill -TERM -"$p" 2>/dev/null; kill -TERM $(marked) 2>/dev/null; '
        f'i=0; while {{ group || [ -n "$(marked)" ]; }} && [ $i -lt {steps} ]; do sleep 0.1; i=$((i+1)); done; '
        f'[ -n "$p" ] && kill -KILL -"$p" 2>/dev/null; kill -KILL $(marked) 2>/dev/null; '
        f'i=0; while [ -n "$(marked)" ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; '
        f'echo "left:" $(marked)'
    )
    out = target.run(line, timeout=grace + 30).stdout
    left = out.rsplit("left:", 1)[1].split() if "left:" in out else []
    return [int(pid) for pid in left if pid.isdigit()]


def job_undo(target: Target, job_dir: str) -> None:
    """Kill a job and forget that it was started, so that it can be started again (a start undone half way)."""
    job_kill(target, job_dir)
    target.check(
        f"cd {shlex.quote(job_dir)} && rm -f submitted pid exit_code stdout stderr killed io started",
        what="resetting the job",
    )


FRAME = "--rackbench-file"  # begins each section's header line: base64 text never holds a "-"
LINE_FILES = frozenset({"exit_code", "started", "io", "pid"})  # a few ASCII lines each, written by the launcher


@dataclass(frozen=True)
class Collected:
    """What one command read in a job's directory: the output of the command run before (``before``) and each file
    asked for, None where it does not exist (every one when the directory does not)."""

    before: str
    files: dict[str, bytes | None]

    def text(self, name: str) -> str:
        """The file as text: undecodable bytes, and NUL (which PostgreSQL's text refuses), as U+FFFD."""
        return (self.files.get(name) or b"").decode(errors="replace").replace("\0", "\ufffd")

    @property
    def exit_code(self) -> int | None:
        code = self.text("exit_code").strip()
        return int(code) if code.lstrip("-").isdigit() else None


def collect_script(job_dir: str, names: list[str], *, mark: str, limit: int | None = None, before: str = "") -> str:
    """A shell script that prints ``before``'s output (a fixed command line, never a user's text) as it is, ended by
    a line holding ``mark`` (a random mark of the call's own: no output can hold it), then each of the job's files
    ``names`` (only its last ``limit`` bytes when given), each in a section of its own: a header line, then the
    content in base64, so that binary bytes, a missing last newline or a line that looks like a header cannot blur
    two sections, and an end line, so that output cut short is never taken for shorter files. The files are read in
    the order given: with ``exit_code`` first, the outputs are read after the launcher closed them. One process a
    file, and none for the mark; none either for the few lines of text the launcher writes itself (LINE_FILES, read
    whole): the shell's own ``read`` gives them line by line, each behind a "=" that keeps it from looking like a
    header (a last line without its newline comes back with one)."""
    lines = [f"{{ {before}\n}} 2>/dev/null" if before else ":", f"echo; echo {shlex.quote(mark)}"]
    lines.append(f"cd {shlex.quote(job_dir)} 2>/dev/null || {{ echo '{FRAME} end'; exit 0; }}")
    for i, name in enumerate(names):
        path = shlex.quote(name)
        if name in LINE_FILES and limit is None:
            each = f'while IFS= read -r l || [ -n "$l" ]; do printf \'=%s\\n\' "$l"; done < {path}'
            lines.append(f"if [ -f {path} ]; then echo '{FRAME} {i} lines'; {each}; fi")
            continue
        read = f"base64 {path}" if limit is None else f"tail -c {int(limit)} {path} | base64"
        lines.append(f"if [ -f {path} ]; then echo '{FRAME} {i}'; {read}; fi")
    lines.append(f"echo '{FRAME} end'")
    return "\n".join(lines) + "\n"


def parse_collected(out: str, names: list[str], *, mark: str) -> Collected:
    """``collect_script``'s output split into its sections; ValueError when it is not whole."""
    split = out.find(f"\n{mark}\n")
    if split < 0:
        raise ValueError("the output was cut short")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out[split + len(mark) + 2 :].split("\n")[:-1]:  # lines end with \n alone (not \r, as splitlines)
        if line.startswith(f"{FRAME} "):
            current = sections.setdefault(line[len(FRAME) + 1 :], [])
        elif current is None:
            raise ValueError("output before the first section")
        else:
            current.append(line)
    if list(sections)[-1:] != ["end"]:
        raise ValueError("the output was cut short")
    found: dict[str, bytes] = {}
    for key, content in sections.items():
        index, _, kind = key.partition(" ")
        if kind == "lines":
            if any(not line.startswith("=") for line in content):
                raise ValueError("a line of a text section without its mark")
            found[index] = "".join(f"{line[1:]}\n" for line in content).encode()
        elif key != "end":
            found[key] = base64.b64decode("".join(content), validate=True)
    return Collected(out[:split], {name: found.get(str(i)) for i, name in enumerate(names)})


def job_collect(
    target: Target, job_dir: str, names: list[str], *, limit: int | None = None, before: str = ""
) -> Collected:
    """Read the job's files ``names`` (and the output of ``before``, run first) in one round trip: ``sh -s`` reads
    ``collect_script`` on its standard input."""
    mark = f"--rackbench-{uuid.uuid4().hex}"
    script = collect_script(job_dir, names, mark=mark, limit=limit, before=before)
    result = target.check("sh -s", what="reading the job's files", stdin=script.encode())
    try:
        return parse_collected(result.stdout, names, mark=mark)
    except ValueError as exc:  # binascii.Error is one
        raise ssh.TransientSSHError(target.endpoint, f"reading the job's files: {exc}") from None


def job_output(target: Target, job_dir: str, *, limit: int | None = None) -> tuple[str, str]:
    """The job's stdout and stderr (each only its last ``limit`` bytes when given), in one round trip."""
    found = job_collect(target, job_dir, ["stdout", "stderr"], limit=limit)
    return found.text("stdout"), found.text("stderr")


def fan_out(items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``ssh.fan_out`` bounded by RACKBENCH_SSH_FANOUT: how every step of a run reaches its hosts.

    Its threads do SSH only: they open no database connection, and what database work ``fn`` has goes through
    ``database.call`` (the process's RACKBENCH_DB_POOL_SIZE connections), however many threads there are."""
    if len(items) > 1:
        _prefetch_host_keys(items)
    return ssh.fan_out(items, fn, workers=settings.RACKBENCH["SSH_FANOUT"], on_thread_start=database.refuse_connections)


def _prefetch_host_keys(items: list[Any]) -> None:
    """Before a fan-out over targets (or what carries one: a run's hosts), the pinned keys of those it has no open
    connection to, in one query."""
    connections = pool()
    store = connections.store
    if not isinstance(store, DatabaseHostKeys):
        return
    wanted = []
    for item in items:
        target = item if isinstance(item, Target) else getattr(item, "target", None)
        endpoint = target.endpoint if isinstance(target, Target) else None
        if endpoint is not None and not connections.connected(endpoint):
            wanted.append((endpoint.address, endpoint.port))
    if len(wanted) > 1:
        store.prefetch(list(dict.fromkeys(wanted)))
