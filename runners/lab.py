"""The built-in lab: real sshd daemons that stand in for cluster nodes, on loopback or on real links.

Two networks (``lab_up(network=...)``):

- ``loopback`` (the default): node ``labN`` is an sshd listening on BASE+N (127.0.1.N by default; Linux routes all
  of 127/8 to ``lo``), every node on the same port, so each looks like a distinct host with an sshd on a fixed port.
  All nodes share one network stack: traffic between them never crosses a link.
- ``netns`` (root only): every node is a network namespace with one interface, ``eth0``, the end of a veth pair whose
  other end joins a bridge on this machine; its sshd runs inside the namespace. Addresses come from 198.18.0.0/15,
  the range set aside for network benchmarks (RFC 2544): one /24 per lab, chosen from the port
  (:func:`netns_subnet`), labN at .N and this machine at .254 on the bridge. The bridge, namespace and veth names
  carry the port too (``rbl<port>``, ``rbl<port>-labN``, ``rbl<port>vN``), so labs on other ports (parallel test
  sessions) never share or remove each other's. iperf3, mpirun and collectives then cross a real network stack, and
  ``lab_degrade`` can shape a node's link with tc (both directions: the host end of its veth shapes what the node
  receives, its ``eth0`` what it sends) or load its CPU. Where namespaces cannot be made (not root, no ``ip``, a
  kernel or container that refuses them), ``lab_up`` says so (``LabNode.network`` and a logged warning) and starts
  loopback nodes instead.

Layout of the lab directory (``settings.RACKBENCH["LAB_DIR"]``)::

    lab.json                      network, base address and port the nodes listen on
    .lock                         serialises concurrent ``lab_up``/``lab_down``
    authorized_keys               the client public key: the only key lab nodes accept
    client/id_ed25519{,.pub}      the client key pair (the inventory credential "lab")
    scratch/                      scratch space, only when the lab runs unprivileged
    nodes/labN/sshd_config        rewritten each time the node starts
    nodes/labN/ssh_host_ed25519_key{,.pub}   generated once, kept across down/up so pinned keys stay valid
    nodes/labN/sshd.pid, sshd.log
    nodes/labN/cpuhog.pid         the CPU hog of ``lab_degrade(cpu=...)`` where no cpu cgroup can be made

Run as root, the nodes log in as the system user ``rackbench-lab`` (shell ``/bin/sh``, home
``/var/lib/rackbench-lab``, scratch in ``~/scratch``), which sudoers allows exactly one thing: writing
``/proc/sys/vm/drop_caches`` through ``tee``. Run unprivileged, sshd can only authenticate the user running it,
so the nodes log in as that user, and flushing caches needs that user's own sudo rights.

All lab nodes share one home directory, as cluster nodes with NFS-mounted homes do: per-host files must carry
the host's name in their path. This module touches no database; ``manage.py lab`` registers what it starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)

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
LOOPBACK = "loopback"
NETNS = "netns"
NETWORKS = (LOOPBACK, NETNS)
BENCHMARK_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544: for network benchmarks, never routed
HOST_OCTET = 254  # this machine's address on a netns lab's bridge
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
    network: str = LOOPBACK  # LOOPBACK or NETNS
    namespace: str = ""  # the node's network namespace (NETNS)
    link: str = ""  # this machine's end of the node's veth pair (NETNS): where tc shapes what the node receives
    cpu_fault: str = ""  # what lab_degrade(cpu=...) did, in words


@dataclass(frozen=True)
class _Endpoints:
    base_address: ipaddress.IPv4Address
    port: int
    network: str = LOOPBACK

    def address(self, index: int) -> str:
        address = self.base_address + index
        if self.network == NETNS:
            if address not in self.subnet or int(address) & 0xFF in (0, HOST_OCTET, 255):
                raise LabError(f"lab{index} would get {address}, outside .1-.253 of the lab's subnet {self.subnet}")
            return str(address)
        if not address.is_loopback:
            raise LabError(f"lab{index} would listen on {address}, which is not a loopback address")
        return str(address)

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.base_address}/24", strict=False)

    @property
    def host_address(self) -> str:
        return str(self.subnet.network_address + HOST_OCTET)

    @property
    def bridge(self) -> str:
        return f"rbl{self.port}"

    def namespace(self, index: int) -> str:
        return f"rbl{self.port}-lab{index}" if self.network == NETNS else ""

    def link(self, index: int) -> str:
        return f"rbl{self.port}v{index}" if self.network == NETNS else ""

    def as_json(self) -> str:
        return json.dumps({"base_address": str(self.base_address), "port": self.port, "network": self.network})


def netns_subnet(port: int) -> ipaddress.IPv4Network:
    """The /24 of 198.18.0.0/15 a netns lab on ``port`` uses: one of the range's 512, chosen by the port, so labs on
    ports that differ by less than 512 (parallel test sessions) get different subnets."""
    return list(BENCHMARK_RANGE.subnets(new_prefix=24))[port % 512]


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
    nodes: int,
    *,
    base_address: str | None = None,
    port: int | None = None,
    lab_dir: Path | None = None,
    network: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[LabNode]:
    """Make sure lab1..labN run; running nodes are left alone. Returns those N nodes, all listening.
    ``on_progress(done, total)`` hears of each node once it runs (``lab up``'s progress bar).

    ``network``/``port`` default to the lab's current ones, else loopback and 2222; ``base_address`` to the lab's,
    else 127.0.1.0 (loopback) or the port's subnet of 198.18.0.0/15 (netns, see :func:`netns_subnet`). Nodes never
    move while running: asking for other endpoints then is an error (``lab_down`` first). A netns lab that cannot
    be made falls back to loopback, with a warning; its nodes then say ``network="loopback"``.
    """
    if nodes < 1:
        raise LabError("a lab needs at least one node")
    if network is not None and network not in NETWORKS:
        raise LabError(f"--network must be one of {', '.join(NETWORKS)}, not {network!r}")
    root = _root(lab_dir)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        endpoints = _choose_endpoints(root, nodes, base_address, port, network)
        account = lab_account(lab_dir=root)
        if os.geteuid() == 0:
            _ensure_system_account()
        _ensure_scratch(account)
        _ensure_client_key(root, account)
        if endpoints.network == NETNS:
            _ensure_bridge(endpoints)
        for index in range(1, nodes + 1):
            if endpoints.network == NETNS:
                _ensure_namespace(endpoints, index)
            _ensure_node(root, index, endpoints, account)
            if on_progress:
                on_progress(index, nodes)
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
            _node_dir(root, index).joinpath("cpuhog.pid").unlink(missing_ok=True)
            _node_dir(root, index).joinpath("cpucap").unlink(missing_ok=True)
        endpoints = _read_endpoints(root)
        if endpoints is not None and endpoints.network == NETNS:
            for index in _node_indexes(root):
                _cpu_uncap(_node(root, index, endpoints).namespace)
            _remove_network(endpoints, _node_indexes(root))
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


def lab_degrade(
    name: str,
    *,
    rate: str | None = None,
    delay: str | None = None,
    loss: str | None = None,
    cpu: bool | str = False,
    lab_dir: Path | None = None,
) -> LabNode:
    """Make one node of a netns lab worse: its link (tc, both directions: ``rate`` like 300mbit, ``delay`` like
    2ms, ``loss`` like 0.5%), and/or its CPU (``cpu``: True or a share like "25%").

    The CPU fault caps the node alone: its sshd, and so every session and job it starts from then on, goes into a
    cpu cgroup of its own allowed that share of one core (``DEFAULT_CPU_SHARE``), as if a hog took the rest. The
    lab's nodes share this machine's cores, so a busy loop would slow every node alike; the cap slows this one.
    Where no cpu cgroup can be made (no cgroup v1 cpu controller or v2 ``cpu.max`` writable here), a busy loop
    pinned to one core in the node's namespace stands in, and the returned node's ``cpu_fault`` says which.

    A link fault replaces the node's previous one. ``rate`` alone is a token bucket filter (tbf); ``delay`` or
    ``loss`` need netem, which some kernels lack: that is then an error naming it. Values are checked here and
    reach tc as single argv elements.
    """
    if rate is None and delay is None and loss is None and not cpu:
        raise LabError("say what to degrade: --rate, --delay, --loss and/or --cpu")
    share = (DEFAULT_CPU_SHARE if cpu is True else _cpu_share(str(cpu))) if cpu else None
    qdisc = _qdisc(rate=rate, delay=delay, loss=loss) if (rate or delay or loss) else None
    root = _root(lab_dir)
    with _locked(root):
        node, _ = _netns_node(root, name)
        if qdisc is not None:
            for argv_prefix, device in ((["tc"], node.link), (["ip", "netns", "exec", node.namespace, "tc"], "eth0")):
                done = _run([*argv_prefix, "qdisc", "replace", "dev", device, "root", *qdisc], check=False)
                if done.returncode != 0 and qdisc[0] == "netem" and "unknown" in done.stderr:
                    raise LabError(
                        "--delay/--loss need the netem qdisc (kernel module sch_netem): this kernel lacks it"
                    )
                if done.returncode != 0:
                    raise LabError(f"{name}: tc could not shape {device}: {done.stderr.strip()}")
        if share is not None:
            node_dir = _node_dir(root, node.index)
            listener = _listener_pid(node_dir)
            if listener is None:
                raise LabError(f"{name}: its sshd is not running (lab up starts it)")
            if _cpu_cap(node.namespace, listener, share):
                node_dir.joinpath("cpucap").write_text(f"{share:g}\n")
            else:
                _start_cpu_hog(root, node)
            return dataclasses.replace(node, cpu_fault=_cpu_fault(node_dir))
        return node


def lab_heal(name: str | None = None, *, lab_dir: Path | None = None) -> list[str]:
    """Undo ``lab_degrade`` on one node, or on every node of the lab; returns the names healed."""
    root = _root(lab_dir)
    with _locked(root):
        endpoints = _read_endpoints(root)
        if endpoints is None or endpoints.network != NETNS:
            raise LabError("the lab is not a netns lab: there is nothing to heal")
        names = [name] if name else [f"lab{index}" for index in _node_indexes(root)]
        for each in names:
            node, _ = _netns_node(root, each)
            _run(["tc", "qdisc", "del", "dev", node.link, "root"], check=False)  # absent: nothing to undo
            _run(["ip", "netns", "exec", node.namespace, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
            _stop_cpu_hog(root, node)
            _cpu_uncap(node.namespace)
            _node_dir(root, node.index).joinpath("cpucap").unlink(missing_ok=True)
        return names


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
    return _Endpoints(ipaddress.IPv4Address(data["base_address"]), int(data["port"]), data.get("network", LOOPBACK))


def _choose_endpoints(
    root: Path, nodes: int, base_address: str | None, port: int | None, network: str | None
) -> _Endpoints:
    current = _read_endpoints(root)
    default = current or _Endpoints(ipaddress.IPv4Address(DEFAULT_BASE_ADDRESS), DEFAULT_PORT)
    wanted_network = network or default.network
    wanted_port = port or default.port
    if not 1 <= wanted_port <= 65535:
        raise LabError(f"--port {wanted_port} is not a TCP port")
    if wanted_network == NETNS and (why := _netns_unavailable()):
        logger.warning("lab: cannot give nodes their own network namespaces (%s); starting loopback nodes", why)
        wanted_network = LOOPBACK
    if base_address:
        try:
            base = ipaddress.IPv4Address(base_address)
        except ValueError as exc:
            raise LabError(f"--base-address: {exc}") from None
    elif current and current.network == wanted_network:
        base = current.base_address
    elif wanted_network == NETNS:
        base = netns_subnet(wanted_port).network_address
    else:
        base = ipaddress.IPv4Address(DEFAULT_BASE_ADDRESS)
    if wanted_network == NETNS and base not in BENCHMARK_RANGE:
        raise LabError(f"--base-address {base}: a netns lab uses addresses of {BENCHMARK_RANGE} only")
    wanted = _Endpoints(base, wanted_port, wanted_network)
    for index in range(1, nodes + 1):
        wanted.address(index)  # fail before anything is written or started
    if current and wanted != current:
        running = [n.name for n in lab_status(lab_dir=root) if n.running]
        if running:
            raise LabError(
                f"{', '.join(running)} run on {current.base_address}+N port {current.port} ({current.network}); "
                "run `manage.py lab down` before moving the lab"
            )
        if current.network == NETNS:
            _remove_network(current, _node_indexes(root))
    (root / "lab.json").write_text(wanted.as_json())
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
        network=endpoints.network,
        namespace=endpoints.namespace(index),
        link=endpoints.link(index),
        cpu_fault=_cpu_fault(node_dir),
    )


def _cpu_fault(node_dir: Path) -> str:
    cap = node_dir / "cpucap"
    if cap.exists():
        return f"cgroup cap {float(cap.read_text()):.0%} of a core"
    return "busy loop pinned to one core" if (node_dir / "cpuhog.pid").exists() else ""


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


MAX_LAB_KEYS = 20  # identity files named in the lab user's ~/.ssh/config


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
    # This lab's key first (ssh offers them in this order, so its own logins succeed at the first try), then the
    # other labs' most recent ones: ssh refuses a config naming more than 100, and labs on random ports (tests)
    # leave theirs behind.
    others = sorted(
        (p for p in ssh_dir.glob("rackbench-lab-*") if p.name != key.name),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    keys = [key.name] + [p.name for p in others[: MAX_LAB_KEYS - 1]]
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
    _start_sshd(node_dir, address, endpoints.port, namespace=endpoints.namespace(index))
    cap, listener = node_dir / "cpucap", _listener_pid(node_dir)
    if cap.exists() and listener is not None:  # a node restarted while degraded keeps its CPU fault
        _cpu_cap(endpoints.namespace(index), listener, float(cap.read_text()))


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
# Node-to-node logins offer every lab's key (~/.ssh/config names one per port): more than the default 6 tries.
MaxAuthTries 100
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
# A campaign opens many channels per connection and many connections at once.
MaxSessions 64
MaxStartups 200
# No AcceptEnv: nothing from the client's environment reaches a session.
# Open MPI's daemons (orted 4.1) share their hwloc topology through a segment mapped into a "hole" of their address
# space; on these VMs that write crashed orted now and then (SIGSEGV in hwloc_shmem_topology_write). Without a hole
# they read the topology themselves: binding works as before.
# The nodes share one host name and one /tmp, so the daemons of one job that a real cluster runs on separate machines
# here share a session directory, in which PMIx's shared-memory data store (gds ds21/ds12) of each daemon collided
# with the others' ("PMIX ERROR ... dstore_base.c"): now and then a daemon died after daemonizing and mpirun waited
# for it forever. PMIx's hash store keeps each daemon's data in its own memory.
SetEnv {MARKER}={node_dir} OMPI_MCA_rtc_hwloc_vmhole=none PMIX_MCA_gds=hash
PrintMotd no
PrintLastLog no
LogLevel ERROR
Subsystem sftp internal-sftp
"""


def _start_sshd(node_dir: Path, address: str, port: int, *, namespace: str = "") -> None:
    """Start the daemon (inside ``namespace`` when given) and return once it listens. sshd writes its pid file only
    after binding."""
    log = node_dir / "sshd.log"
    log_start = log.stat().st_size if log.exists() else 0
    inside = ["ip", "netns", "exec", namespace] if namespace else []
    started = _run([*inside, SSHD, "-f", str(node_dir / "sshd_config"), "-E", str(log)], check=False)
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


# --- netns network ----------------------------------------------------------------------------


def _netns_unavailable() -> str:
    """Why this machine cannot give lab nodes network namespaces; empty when it can (checked by making one)."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = f"rbl-probe-{os.getpid()}"
    made = _run(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return ""


def _link_exists(name: str, namespace: str = "") -> bool:
    inside = ["-n", namespace] if namespace else []
    return _run(["ip", *inside, "link", "show", "dev", name], check=False).returncode == 0


def _ensure_bridge(endpoints: _Endpoints) -> None:
    bridge = endpoints.bridge
    if not _link_exists(bridge):
        _run(["ip", "link", "add", "name", bridge, "type", "bridge"])
    have = _run(["ip", "-o", "-4", "addr", "show", "dev", bridge]).stdout
    if f" {endpoints.host_address}/" not in have:
        _run(["ip", "addr", "add", f"{endpoints.host_address}/24", "dev", bridge])
    _run(["ip", "link", "set", bridge, "up"])


def _ensure_namespace(endpoints: _Endpoints, index: int) -> None:
    """The node's namespace, with ``eth0`` (its end of a veth pair, the other end on the bridge) and ``lo`` up."""
    namespace, link = endpoints.namespace(index), endpoints.link(index)
    if not Path("/run/netns", namespace).exists():
        _run(["ip", "netns", "add", namespace])
    if not _link_exists("eth0", namespace):
        if _link_exists(link):  # a half-made pair from an interrupted start
            _run(["ip", "link", "del", link])
        peer = f"rbl{endpoints.port}p{index}"
        _run(["ip", "link", "add", "name", link, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", namespace])
        _run(["ip", "-n", namespace, "link", "set", peer, "name", "eth0"])
        _run(["ip", "-n", namespace, "addr", "add", f"{endpoints.address(index)}/24", "dev", "eth0"])
    _run(["ip", "link", "set", link, "master", endpoints.bridge, "up"])
    _run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
    _run(["ip", "-n", namespace, "link", "set", "lo", "up"])


def _remove_network(endpoints: _Endpoints, indexes: Iterable[int]) -> None:
    """This lab's namespaces (their veth pairs go with them) and bridge; nothing another lab owns."""
    for index in indexes:
        _run(["ip", "netns", "del", endpoints.namespace(index)], check=False)
        if _link_exists(endpoints.link(index)):
            _run(["ip", "link", "del", endpoints.link(index)], check=False)
    if _link_exists(endpoints.bridge):
        _run(["ip", "link", "del", endpoints.bridge], check=False)


def _netns_node(root: Path, name: str) -> tuple[LabNode, _Endpoints]:
    endpoints = _read_endpoints(root)
    if endpoints is None or endpoints.network != NETNS:
        raise LabError("faults need a netns lab (manage.py lab up --network netns)")
    match = re.fullmatch(r"lab([0-9]{1,4})", name)
    if not match or int(match[1]) not in _node_indexes(root):
        raise LabError(f"{name!r} is not a node of this lab")
    node = _node(root, int(match[1]), endpoints)
    if not node.running:
        raise LabError(f"{name} is not running (manage.py lab up)")
    return node, endpoints


_RATE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?(kbit|mbit|gbit)")
_DELAY = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?(us|ms|s)")
_LOSS = re.compile(r"[0-9]{1,2}(\.[0-9]{1,3})?%|100%")
_BITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def _qdisc(*, rate: str | None, delay: str | None, loss: str | None) -> list[str]:
    """tc's words for the fault, after checking each value (the error names the option)."""
    for option, value, pattern, example in (
        ("--rate", rate, _RATE, "300mbit"),
        ("--delay", delay, _DELAY, "2ms"),
        ("--loss", loss, _LOSS, "0.5%"),
    ):
        if value is not None and not pattern.fullmatch(value):
            raise LabError(f"{option} {value!r}: expected a value such as {example}")
    if delay is None and loss is None:
        assert rate is not None
        bits = float(rate[: -len(rate.lstrip("0123456789."))]) * _BITS[rate.lstrip("0123456789.")]
        if bits <= 0:
            raise LabError(f"--rate {rate!r}: must be more than 0")
        burst = max(32_000, int(bits / 8 / 250))  # at least one timer tick's worth of bytes at HZ=250
        return ["tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
    words = ["netem"]
    for word, value in (("rate", rate), ("delay", delay), ("loss", loss)):
        if value is not None:
            words += [word, value]
    return words


# --- CPU faults ----------------------------------------------------------------------------------------------

DEFAULT_CPU_SHARE = 0.25  # of one core
_CFS_PERIOD_US = 100_000
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cpu_share(text: str) -> float:
    """A share of one core: "25%" or "0.25", more than 0 and at most 1."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(%?)", str(text).strip())
    if match is None:
        raise LabError(f"--cpu {text!r}: a share of one core, like 25% or 0.25")
    share = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 < share <= 1:
        raise LabError(f"--cpu {text!r}: must be more than 0% and at most 100% of a core")
    return share


def _cpu_controller() -> tuple[Path, str] | None:
    """Where cpu cgroups are made here and their kind: cgroup v1's cpu controller, else a v2 hierarchy with cpu."""
    v1 = _CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists() and os.access(v1, os.W_OK):
        return v1, "v1"
    for v2 in (_CGROUP_ROOT, _CGROUP_ROOT / "unified"):
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split() and os.access(v2, os.W_OK):
            return v2, "v2"
    return None


def _cpu_cap(namespace: str, pid: int, share: float) -> bool:
    """Put ``pid`` (the node's sshd) in a cpu cgroup named after the node, capped at ``share`` of one core; what it
    starts afterwards inherits the cgroup. False where no cpu cgroup can be made."""
    found = _cpu_controller()
    if found is None:
        return False
    base, kind = found
    group = base / namespace
    quota = max(1000, int(share * _CFS_PERIOD_US))
    try:
        group.mkdir(exist_ok=True)
        if kind == "v1":
            (group / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (base / "cgroup.subtree_control").write_text("+cpu")
            (group / "cpu.max").write_text(f"{quota} {_CFS_PERIOD_US}")
        (group / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        logger.warning("lab: no cpu cgroup for %s (%s); a busy loop stands in", namespace, exc)
        _cpu_uncap(namespace)
        return False
    return True


def _cpu_uncap(namespace: str) -> None:
    """Move whatever runs in the node's cpu cgroup back to the root group and remove the group (absent: nothing)."""
    found = _cpu_controller()
    if found is None:
        return
    base, _ = found
    group = base / namespace
    if not group.is_dir():
        return
    for _attempt in range(20):  # a process may fork while its siblings are moved
        try:
            pids = group.joinpath("cgroup.procs").read_text().split()
        except OSError:
            return
        for pid in pids:
            with contextlib.suppress(OSError):  # gone meanwhile
                (base / "cgroup.procs").write_text(pid)
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.05)
    logger.warning("lab: could not remove the cpu cgroup %s", group)


def _start_cpu_hog(root: Path, node: LabNode) -> None:
    """A busy loop in the node's namespace, pinned to the machine's last core, marked as the node's (lab_down
    stops it)."""
    pid_file = _node_dir(root, node.index) / "cpuhog.pid"
    if pid_file.exists() and _alive(int(pid_file.read_text())):
        return
    core = str((os.cpu_count() or 1) - 1)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER: str(_node_dir(root, node.index))}
    hog = subprocess.Popen(
        ["ip", "netns", "exec", node.namespace, "taskset", "-c", core, "sh", "-c", "while :; do :; done"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pid_file.write_text(str(hog.pid))


def _stop_cpu_hog(root: Path, node: LabNode) -> None:
    pid_file = _node_dir(root, node.index) / "cpuhog.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    if pid in _marked(root):  # still the hog, not a process that got its pid since
        _terminate({pid})
    pid_file.unlink()


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
