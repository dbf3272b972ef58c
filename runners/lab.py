"""The built-in lab: real sshd daemons on loopback addresses that stand in for cluster nodes.

Node ``labN`` is an sshd listening on BASE+N (127.0.1.N by default; Linux routes all of 127/8 to ``lo``),
every node on the same port, so each looks like a distinct host with an sshd on a fixed port. Layout of the
lab directory (``settings.RACKBENCH["LAB_DIR"]``)::

    lab.json                      base address and port the nodes listen on
    .lock                         serialises concurrent ``lab_up``/``lab_down``
    authorized_keys               the client public key: the only key lab nodes accept
    client/id_ed25519{,.pub}      the client key pair (the inventory credential "lab")
    scratch/                      scratch space, only when the lab runs unprivileged
    nodes/labN/sshd_config        rewritten each time the node starts
    nodes/labN/ssh_host_ed25519_key{,.pub}   generated once, kept across down/up so pinned keys stay valid
    nodes/labN/sshd.pid, sshd.log

Run as root, the nodes log in as the system user ``rackbench-lab`` (shell ``/bin/sh``, home
``/var/lib/rackbench-lab``, scratch in ``~/scratch``), which sudoers allows exactly one thing: writing
``/proc/sys/vm/drop_caches`` through ``tee``. Run unprivileged, sshd can only authenticate the user running it,
so the nodes log in as that user, and flushing caches needs that user's own sudo rights.

All lab nodes share one home directory, as cluster nodes with NFS-mounted homes do: per-host files must carry
the host's name in their path. This module touches no database; ``manage.py lab`` registers what it starts.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself, so it must be started by absolute path
PRIVSEP_DIR = Path("/run/sshd")
LAB_USER = "rackbench-lab"
LAB_HOME = Path("/var/lib/rackbench-lab")
SUDOERS_FILE = Path("/etc/sudoers.d/rackbench-lab")
SUDOERS_TEXT = (
    "# Written by rackbench (manage.py lab up): the lab login may flush the page cache and nothing else.\n"
    f"{LAB_USER} ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches\n"
)
DEFAULT_BASE_ADDRESS = "127.0.1.0"
DEFAULT_PORT = 2222
MARKER = "RACKBENCH_LAB_NODE"  # set in every session of a node; how lab_down finds detached jobs
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0
# sshd_config has no quoting we could rely on for every keyword, and expands %-tokens in some paths.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_./+@:-]+")


class LabError(RuntimeError):
    """The lab cannot do what was asked; the message says why and what to do."""


@dataclass(frozen=True)
class LabAccount:
    user: str  # the account lab nodes log in as
    home: Path
    scratch: Path  # writable by ``user``; the lab's "local" storage
    private_key: Path  # client key accepted by every lab node


@dataclass(frozen=True)
class LabNode:
    name: str
    index: int
    address: str
    port: int
    pid: int | None  # the sshd listener, when running
    running: bool
    host_public_key: str  # "ssh-ed25519 AAAA... comment", or "" before the first start


@dataclass(frozen=True)
class _Endpoints:
    base_address: ipaddress.IPv4Address
    port: int

    def address(self, index: int) -> str:
        address = self.base_address + index
        if not address.is_loopback:
            raise LabError(f"lab{index} would listen on {address}, which is not a loopback address")
        return str(address)


# --- public API -------------------------------------------------------------------------------


def lab_account(*, lab_dir: Path | None = None) -> LabAccount:
    """Who the lab nodes log in as. Reads only; ``lab_up`` creates what is missing."""
    root = _root(lab_dir)
    private_key = root / "client" / "id_ed25519"
    if os.geteuid() == 0:
        home = _home_of(LAB_USER) or LAB_HOME
        return LabAccount(user=LAB_USER, home=home, scratch=home / "scratch", private_key=private_key)
    me = pwd.getpwuid(os.geteuid())
    return LabAccount(user=me.pw_name, home=Path(me.pw_dir), scratch=root / "scratch", private_key=private_key)


def lab_up(
    nodes: int, *, base_address: str | None = None, port: int | None = None, lab_dir: Path | None = None
) -> list[LabNode]:
    """Make sure lab1..labN run; running nodes are left alone. Returns those N nodes, all listening.

    ``base_address``/``port`` default to the lab's current ones, else 127.0.1.0 and 2222. Nodes never move
    while running: asking for other endpoints then is an error (``lab_down`` first).
    """
    if nodes < 1:
        raise LabError("a lab needs at least one node")
    root = _root(lab_dir)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        endpoints = _choose_endpoints(root, nodes, base_address, port)
        account = lab_account(lab_dir=root)
        if os.geteuid() == 0:
            _ensure_system_account()
        _ensure_scratch(account)
        _ensure_client_key(root, account)
        for index in range(1, nodes + 1):
            _ensure_node(root, index, endpoints, account)
        started = [_node(root, index, endpoints) for index in range(1, nodes + 1)]
        if os.geteuid() == 0:
            _ensure_node_to_node_ssh(account, started)
        return started


def lab_status(*, lab_dir: Path | None = None) -> list[LabNode]:
    """Every node the lab directory knows, running or not, in index order."""
    root = _root(lab_dir)
    endpoints = _read_endpoints(root)
    if endpoints is None:
        return []
    return [_node(root, index, endpoints) for index in _node_indexes(root)]


def lab_down(*, lab_dir: Path | None = None) -> int:
    """Stop every sshd of the lab and every process of its sessions. Returns how many daemons were running.

    Sessions outlive their listener in sshd, and detached jobs outlive their session: they are found by
    descent from the listeners and by the marker variable that every session of a lab node carries.
    """
    root = _root(lab_dir)
    if not (root / "nodes").is_dir():
        return 0
    with _locked(root):
        listeners = [pid for index in _node_indexes(root) if (pid := _listener_pid(_node_dir(root, index)))]
        _terminate(set(listeners) | _descendants(listeners) | _marked(root))
        _terminate(_marked(root))  # whatever a session forked while being stopped
        for index in _node_indexes(root):
            _node_dir(root, index).joinpath("sshd.pid").unlink(missing_ok=True)
    return len(listeners)


def lab_node_down(index: int, *, lab_dir: Path | None = None) -> bool:
    """Stop one node's sshd and its SSH sessions, as a node whose sshd dies would: the jobs it started detached go
    on running (fault drills). ``lab_up`` starts it again. Returns whether it was running."""
    root = _root(lab_dir)
    with _locked(root):
        node_dir = _node_dir(root, index)
        listener = _listener_pid(node_dir)
        if listener is None:
            return False
        sessions = {pid for pid in _descendants([listener]) if _comm(pid).startswith("sshd")}
        _terminate({listener} | sessions)
        node_dir.joinpath("sshd.pid").unlink(missing_ok=True)
    return True


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --- lab directory ----------------------------------------------------------------------------


def _root(lab_dir: Path | None) -> Path:
    root = Path(lab_dir if lab_dir is not None else settings.RACKBENCH["LAB_DIR"]).resolve()
    if not _SAFE_PATH.fullmatch(str(root)):
        raise LabError(f"lab directory {root} has characters sshd_config cannot take (space, %, quotes, ...)")
    return root


def _node_dir(root: Path, index: int) -> Path:
    return root / "nodes" / f"lab{index}"


def _node_indexes(root: Path) -> list[int]:
    nodes = root / "nodes"
    if not nodes.is_dir():
        return []
    return sorted(int(p.name[3:]) for p in nodes.iterdir() if p.name.startswith("lab") and p.name[3:].isdigit())


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read_endpoints(root: Path) -> _Endpoints | None:
    try:
        data = json.loads((root / "lab.json").read_text())
    except FileNotFoundError:
        return None
    return _Endpoints(ipaddress.IPv4Address(data["base_address"]), int(data["port"]))


def _choose_endpoints(root: Path, nodes: int, base_address: str | None, port: int | None) -> _Endpoints:
    current = _read_endpoints(root)
    default = current or _Endpoints(ipaddress.IPv4Address(DEFAULT_BASE_ADDRESS), DEFAULT_PORT)
    try:
        base = ipaddress.IPv4Address(base_address) if base_address else default.base_address
    except ValueError as exc:
        raise LabError(f"--base-address: {exc}") from None
    wanted = _Endpoints(base, port or default.port)
    if not 1 <= wanted.port <= 65535:
        raise LabError(f"--port {wanted.port} is not a TCP port")
    for index in range(1, nodes + 1):
        wanted.address(index)  # fail before anything is written or started
    if current and wanted != current:
        running = [n.name for n in lab_status(lab_dir=root) if n.running]
        if running:
            raise LabError(
                f"{', '.join(running)} run on {current.base_address}+N port {current.port}; "
                "run `manage.py lab down` before moving the lab"
            )
    (root / "lab.json").write_text(json.dumps({"base_address": str(wanted.base_address), "port": wanted.port}))
    return wanted


def _node(root: Path, index: int, endpoints: _Endpoints) -> LabNode:
    node_dir = _node_dir(root, index)
    pid = _listener_pid(node_dir)
    public_key = node_dir / "ssh_host_ed25519_key.pub"
    return LabNode(
        name=f"lab{index}",
        index=index,
        address=str(endpoints.base_address + index),
        port=endpoints.port,
        pid=pid,
        running=pid is not None,
        host_public_key=public_key.read_text().strip() if public_key.exists() else "",
    )


# --- login account and keys -------------------------------------------------------------------


def _home_of(user: str) -> Path | None:
    try:
        return Path(pwd.getpwnam(user).pw_dir)
    except KeyError:
        return None


def _ensure_system_account() -> None:
    """Root only: the lab user, its sudoers rule and sshd's privilege separation directory."""
    if _home_of(LAB_USER) is None:
        # Password "*" rather than useradd's "!": without PAM, sshd refuses key logins to "!"-locked accounts.
        created = _run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--create-home",
                "--home-dir",
                str(LAB_HOME),
                "--shell",
                "/bin/sh",
                "--password",
                "*",
                "--comment",
                "rackbench lab nodes",
                LAB_USER,
            ],
            check=False,
        )
        if _home_of(LAB_USER) is None:  # a concurrent lab_up may have won the race: then all is well
            raise LabError(f"could not create user {LAB_USER}: {created.stderr.strip()}")
    _ensure_sudoers()
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)


def _ensure_sudoers() -> None:
    if shutil.which("visudo") is None:
        return  # no sudo on this machine: cache flushes will fail, saying so, and everything else works
    if SUDOERS_FILE.exists() and SUDOERS_FILE.read_text() == SUDOERS_TEXT:
        return
    # sudo skips names with a dot, so the rule appears whole or not at all.
    draft = SUDOERS_FILE.with_name(".rackbench-lab.draft")
    draft.write_text(SUDOERS_TEXT)
    draft.chmod(0o440)
    check = _run(["visudo", "-cf", str(draft)], check=False)
    if check.returncode != 0:
        draft.unlink()
        raise LabError(f"visudo rejected the lab's sudoers rule: {check.stdout.strip()} {check.stderr.strip()}")
    os.replace(draft, SUDOERS_FILE)


def _ensure_scratch(account: LabAccount) -> None:
    account.scratch.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(account.scratch, account.user, account.user)


def _ensure_client_key(root: Path, account: LabAccount) -> None:
    """One client key per lab directory, authorised for the lab user on every node."""
    key = account.private_key
    key.parent.mkdir(mode=0o700, exist_ok=True)
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"rackbench-lab@{root}", "-f", str(key)])
    key.chmod(0o600)
    authorized = root / "authorized_keys"
    authorized.write_text(key.with_suffix(".pub").read_text())
    authorized.chmod(0o644)
    if os.geteuid() == 0:
        _check_readable_by(authorized, pwd.getpwnam(account.user).pw_uid)


def _ensure_node_to_node_ssh(account: LabAccount, nodes: list[LabNode]) -> None:
    """Let the lab user SSH from one lab node to another, as mpirun does, with every host key pinned.

    Only for the dedicated account (run as root): ``~/.ssh`` gets this lab's client key (one file per port,
    so labs on other ports keep theirs), known_hosts lines for these nodes, and a config naming every key.
    """
    user = pwd.getpwnam(account.user)
    ssh_dir = account.home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    port = nodes[0].port
    key = ssh_dir / f"rackbench-lab-{port}"
    shutil.copyfile(account.private_key, key)
    key.chmod(0o600)
    known_hosts = ssh_dir / "known_hosts"
    ours = {f"[{n.address}]:{n.port}": " ".join(n.host_public_key.split()[:2]) for n in nodes if n.host_public_key}
    kept = [
        line
        for line in (known_hosts.read_text().splitlines() if known_hosts.exists() else [])
        if line.split(" ", 1)[0] not in ours
    ]
    known_hosts.write_text("\n".join(kept + [f"{host} {key_text}" for host, key_text in ours.items()]) + "\n")
    keys = sorted(p.name for p in ssh_dir.glob("rackbench-lab-*"))
    config = "# Written by rackbench (manage.py lab up): lab nodes reach each other with pinned host keys.\n"
    config += "Host *\n  StrictHostKeyChecking yes\n  BatchMode yes\n"
    config += "".join(f"  IdentityFile ~/.ssh/{name}\n" for name in keys)
    (ssh_dir / "config").write_text(config)
    for path in [ssh_dir, key, known_hosts, ssh_dir / "config"]:
        os.chown(path, user.pw_uid, user.pw_gid)
    (ssh_dir / "config").chmod(0o600)


def _check_readable_by(path: Path, uid: int) -> None:
    """sshd reads authorized_keys with the user's rights: every directory above it must let that user in."""
    for directory in reversed(path.parents):
        st = directory.stat()
        if st.st_uid != uid and not st.st_mode & 0o001:
            raise LabError(
                f"{LAB_USER} cannot enter {directory}, so sshd cannot read {path}; "
                "put the lab elsewhere (RACKBENCH_LAB_DIR) or allow others to traverse that directory"
            )
    if path.stat().st_uid != uid and not path.stat().st_mode & 0o004:
        raise LabError(f"{LAB_USER} cannot read {path}")


# --- nodes ------------------------------------------------------------------------------------


def _ensure_node(root: Path, index: int, endpoints: _Endpoints, account: LabAccount) -> None:
    node_dir = _node_dir(root, index)
    node_dir.mkdir(parents=True, exist_ok=True)
    if _listener_pid(node_dir) is not None:
        return
    host_key = node_dir / "ssh_host_ed25519_key"
    if not host_key.exists():  # never regenerated: clients pin it
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"lab{index}", "-f", str(host_key)])
    address = endpoints.address(index)
    config = node_dir / "sshd_config"
    config.write_text(_sshd_config(root, node_dir, address, endpoints.port, account.user))
    (node_dir / "sshd.pid").unlink(missing_ok=True)
    _start_sshd(node_dir, address, endpoints.port)


def _sshd_config(root: Path, node_dir: Path, address: str, port: int, user: str) -> str:
    return f"""\
# Written by rackbench (manage.py lab up) each time {node_dir.name} starts; edits are lost.
ListenAddress {address}
Port {port}
HostKey {node_dir}/ssh_host_ed25519_key
PidFile {node_dir}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
# The lab directory may sit under /tmp, whose mode StrictModes rejects; lab.py writes the key file itself.
StrictModes no
AllowUsers {user}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
# A campaign opens many channels per connection and many connections at once.
MaxSessions 64
MaxStartups 200
# No AcceptEnv: nothing from the client's environment reaches a session.
SetEnv {MARKER}={node_dir}
PrintMotd no
PrintLastLog no
LogLevel ERROR
Subsystem sftp internal-sftp
"""


def _start_sshd(node_dir: Path, address: str, port: int) -> None:
    """Start the daemon and return once it listens. sshd writes its pid file only after binding."""
    log = node_dir / "sshd.log"
    log_start = log.stat().st_size if log.exists() else 0
    started = _run([SSHD, "-f", str(node_dir / "sshd_config"), "-E", str(log)], check=False)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        errors = _read_from(log, log_start)
        if started.returncode != 0 or "fatal" in errors:
            raise LabError(f"sshd for {node_dir.name} did not start: {(started.stderr + errors).strip()}")
        if _listener_pid(node_dir) is not None and _answers_ssh(address, port):
            return
        if time.monotonic() > deadline:
            raise LabError(f"sshd for {node_dir.name} is not listening on {address}:{port}: {errors.strip()}")
        time.sleep(0.05)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()
    except FileNotFoundError:
        return ""


def _answers_ssh(address: str, port: int) -> bool:
    """Whether an SSH server answers there. Sends an identification back, or sshd logs an error per probe."""
    try:
        with socket.create_connection((address, port), timeout=1.0) as sock:
            banner = sock.recv(256)
            sock.sendall(b"SSH-2.0-rackbench-lab-probe\r\n")
    except OSError:
        return False
    return banner.startswith(b"SSH-")


def _listener_pid(node_dir: Path) -> int | None:
    """The pid in the node's pid file, if that process is alive and is this node's sshd (pids get reused)."""
    try:
        pid = int((node_dir / "sshd.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    if f"-f {node_dir / 'sshd_config'}" not in cmdline or not _alive(pid):
        return None
    return pid


# --- stopping processes -----------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """False once the process is gone or a zombie (which the init process here may reap late)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _descendants(pids: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _marked(root: Path) -> set[int]:
    """Processes started in a session of one of this lab's nodes, detached or not."""
    prefix = f"{MARKER}={root / 'nodes'}/".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
        if any(entry.startswith(prefix) for entry in environ.split(b"\0")):
            found.add(int(proc.name))
    return found


def _terminate(pids: set[int]) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after STOP_TIMEOUT."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, STOP_TIMEOUT)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + wait
        while (pids := {pid for pid in pids if _alive(pid)}) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids:
            return
    raise LabError(f"processes {sorted(pids)} of the lab survived SIGKILL")


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise LabError(f"{argv[0]} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result
