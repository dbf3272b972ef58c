"""Facts discovery: one fixed shell script run over SSH, its output parsed into a facts dict.

The script takes no input at all: it is a constant, so nothing a user typed can reach the remote shell.
It prints one section per probe, each introduced by a ``@@rackbench-facts:NAME@@`` line, and ends with
the ``end`` section (its absence means the output was cut short). A probe whose tool is missing prints
an empty section. Each section is parsed on its own: a section that cannot be parsed is reported in
``facts["errors"]`` and the others are still stored.

nvidia-smi is asked for its CSV *with* the header line and units (``--format=csv``): the header makes the
output self-describing, so the parser finds columns by name, and the tests feed it verbatim captures from
real machines. It still reads header-less output (``noheader,nounits``) given the queried field list.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from collections import Counter
from typing import Any

from django.db import transaction

from inventory import services
from inventory.models import Node
from runners import database, remote, ssh

MARKER = "@@rackbench-facts:"
NVIDIA_SMI_FIELDS = ("name", "memory.total", "driver_version", "pci.bus_id")
MOUNT_TYPES = (
    "nfs|nfs4|lustre|xfs|ext4|ext3|btrfs|zfs|gpfs|beegfs|cifs|smb3|ceph|fuse\\.ceph-fuse|wekafs|fuse\\.weka|panfs"
)
MOUNT_FILTER = f"$3 ~ /^({MOUNT_TYPES})$/"  # awk program: /proc/mounts lines of storage file systems
RUNTIMES = ("docker", "podman", "enroot", "apptainer", "singularity")  # preference order
# After a runtime whose binary is there but which does not answer (``docker info`` fails: no daemon, no access).
SILENT = ": installed, but it does not answer"
SCRIPT_TIMEOUT = 90.0

# Every probe is bounded (timeout(1) where available): a wedged GPU driver can make nvidia-smi hang.
SCRIPT = f"""\
export LC_ALL=C PATH="$PATH:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
T=""; command -v timeout >/dev/null 2>&1 && T="timeout 30"
section() {{ printf '\\n{MARKER}%s@@\\n' "$1"; }}
section hostname; hostname 2>/dev/null || cat /proc/sys/kernel/hostname
section kernel; uname -r
section home; pwd -P
section lscpu; $T lscpu -J 2>/dev/null || $T lscpu 2>/dev/null
section meminfo; grep '^MemTotal:' /proc/meminfo
section nvidia-smi
if command -v nvidia-smi >/dev/null 2>&1; then
  $T nvidia-smi --query-gpu={",".join(NVIDIA_SMI_FIELDS)} --format=csv 2>&1
fi
section gpu-clocks
if command -v nvidia-smi >/dev/null 2>&1; then
  $T nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits 2>/dev/null
fi
section cuda
if command -v nvidia-smi >/dev/null 2>&1; then $T nvidia-smi 2>/dev/null | grep -m1 -o 'CUDA Version: *[0-9.]*'; fi
section nccl
for lib in $(ldconfig -p 2>/dev/null | awk '/libnccl\\.so/ {{print $NF}}'); do readlink -f "$lib"; done
section ofed
if command -v ofed_info >/dev/null 2>&1; then $T ofed_info -s 2>/dev/null; fi
section ip-addr; ip -j addr 2>/dev/null
section link-speed
for dev in /sys/class/net/*; do printf '%s %s\\n' "${{dev##*/}}" "$(cat "$dev/speed" 2>/dev/null)"; done
section ibv-devinfo
if command -v ibv_devinfo >/dev/null 2>&1; then $T ibv_devinfo 2>&1; fi
section mounts; awk {shlex.quote(MOUNT_FILTER)} /proc/mounts
section container-runtimes
for rt in {" ".join(RUNTIMES)}; do
  command -v "$rt" >/dev/null 2>&1 || continue
  case "$rt" in
    docker|podman) $T "$rt" info >/dev/null 2>&1 && echo "$rt" || echo "$rt{SILENT}";;
    *) echo "$rt";;
  esac
done
section end
"""

_SECTION = re.compile(rf"^{re.escape(MARKER)}([a-z-]+)@@$", re.MULTILINE)
_NOT_AVAILABLE = {"", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]"}


class FactsError(ValueError):
    """Facts output that cannot be read at all."""


def collect_facts(node: Node) -> dict[str, Any]:
    """Discover the node's facts over SSH, store them and its interfaces, and return them."""
    target = remote.node_target(node)
    # Run by sh explicitly: the login shell may be anything (bash, zsh, tcsh), the script is POSIX sh.
    result = target.run(shlex.join(["sh", "-c", SCRIPT]), timeout=SCRIPT_TIMEOUT)
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise ssh.PermanentSSHError(target.endpoint, f"facts script failed (exit {result.exit_code}): {detail}")
    try:
        facts = parse_facts(result.stdout)
    except FactsError as exc:
        raise ssh.PermanentSSHError(target.endpoint, str(exc)) from None
    database.call(_store, node, facts)  # from a fan-out thread too (dispatch.refresh_facts): on the bounded pool
    return facts


def _store(node: Node, facts: dict[str, Any]) -> None:
    with transaction.atomic():
        services.node_store_facts(node=node, facts=facts)
        services.node_sync_interfaces(node=node, nics=facts["nics"])


def split_sections(output: str) -> dict[str, str]:
    parts = _SECTION.split(output)
    # parts: [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip("\n") for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def parse_facts(output: str) -> dict[str, Any]:
    """Turn the script's whole output into the facts dict."""
    sections = split_sections(output)
    if "end" not in sections:
        raise FactsError("the facts script's output is incomplete (no end marker)")
    errors: dict[str, str] = {}

    def parsed(name: str, parser: Any, default: Any) -> Any:
        try:
            return parser(sections.get(name, ""))
        except (ValueError, KeyError, TypeError) as exc:
            errors[name] = str(exc)[:500]
            return default

    cpu = parsed("lscpu", parse_lscpu, {})
    gpus = parsed("nvidia-smi", parse_nvidia_smi, [])
    speeds = parsed("link-speed", parse_link_speeds, {})
    nics = parsed("ip-addr", parse_ip_addr, [])
    for nic in nics:
        nic["speed_mbps"] = speeds.get(nic["name"])
    facts: dict[str, Any] = {
        "hostname": sections.get("hostname", "").strip(),
        "kernel": sections.get("kernel", "").strip(),
        "home": sections.get("home", "").strip(),  # the login directory: where runs put rackbench's directory
        "cpu_model": cpu.get("model", ""),
        "cpu_cores": cpu.get("cores"),
        "cpu_threads": cpu.get("threads"),
        "cpu_sockets": cpu.get("sockets"),
        "ram_mb": parsed("meminfo", parse_meminfo, None),
        **gpu_summary(gpus),
        "gpu_max_sm_clocks_mhz": parsed("gpu-clocks", parse_gpu_clocks, []),
        "cuda_version": parse_cuda_version(sections.get("cuda", "")),
        "nccl_version": parse_nccl_version(sections.get("nccl", "")),
        "ofed_version": sections.get("ofed", "").strip().rstrip(":")[:100],
        "nics": nics,
        "ib_devices": parsed("ibv-devinfo", parse_ibv_devinfo, []),
        "mounts": parsed("mounts", parse_mounts, []),
        "container_runtimes": parse_runtimes(sections.get("container-runtimes", "")),
        "container_runtimes_silent": parse_runtimes(sections.get("container-runtimes", ""), silent=True),
        "errors": errors,
    }
    return facts


# --- CPU and memory ---------------------------------------------------------------------------


def parse_lscpu(text: str) -> dict[str, Any]:
    """Model, physical cores, hardware threads and sockets, from ``lscpu -J`` (flat or nested) or plain lscpu."""
    text = text.strip()
    if not text:
        return {}
    fields = _lscpu_json_fields(text) if text.startswith("{") else _lscpu_text_fields(text)
    threads = _int(fields.get("CPU(s)"))
    sockets = _int(fields.get("Socket(s)"))
    per_socket = _int(fields.get("Core(s) per socket"))
    per_core = _int(fields.get("Thread(s) per core"))
    cores: int | None
    if sockets and per_socket:
        cores = sockets * per_socket
    elif threads and per_core:
        cores = threads // per_core
    else:
        cores = threads
    return {"model": (fields.get("Model name") or "")[:200], "cores": cores, "threads": threads, "sockets": sockets}


def _lscpu_json_fields(text: str) -> dict[str, str]:
    """util-linux before 2.37 prints a flat list; later versions nest entries under "children"."""
    fields: dict[str, str] = {}

    def walk(entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            name = str(entry.get("field", "")).rstrip(":")
            if entry.get("data") is not None:
                fields.setdefault(name, str(entry["data"]).strip())
            walk(entry.get("children") or [])

    walk(json.loads(text)["lscpu"])
    return fields


def _lscpu_text_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip():
            fields.setdefault(name.strip(), value.strip())
    return fields


def parse_meminfo(text: str) -> int | None:
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(match.group(1)) // 1024 if match else None


# --- GPUs -------------------------------------------------------------------------------------


def parse_nvidia_smi(text: str, *, fields: tuple[str, ...] = NVIDIA_SMI_FIELDS) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    With a header line, columns are found by name (units such as ``[MiB]`` stripped), so any query that
    includes name and memory.total can be read; without one, the columns are ``fields`` in order.
    """
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in row)]
    if not rows:
        return []
    header = [re.sub(r"\s*\[.*\]$", "", cell.strip()) for cell in rows[0]]
    if "name" in header:
        columns, data = header, rows[1:]
    else:
        columns, data = list(fields), rows
    gpus = []
    for row in data:
        if len(row) != len(columns):
            raise ValueError(f"nvidia-smi printed something other than its CSV: {','.join(row)[:300]}")
        values = dict(zip(columns, (cell.strip() for cell in row), strict=True))
        gpus.append(
            {
                "name": _available(values.get("name")),
                "memory_mb": _int(values.get("memory.total")),
                "driver_version": _available(values.get("driver_version")),
                "pci_bus_id": _available(values.get("pci.bus_id")),
            }
        )
    return gpus


def gpu_summary(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The inventory's GPU fields: the most common model, and that model's memory."""
    names = Counter(gpu["name"] for gpu in gpus if gpu["name"])
    model = names.most_common(1)[0][0] if names else ""
    memory = next((gpu["memory_mb"] for gpu in gpus if gpu["name"] == model and gpu["memory_mb"]), None)
    driver = next((gpu["driver_version"] for gpu in gpus if gpu["driver_version"]), "")
    return {
        "gpus": gpus,
        "gpu_model": model[:100],
        "gpu_count": len(gpus),
        "gpu_memory_mb": memory,
        "driver_version": driver,
    }


def parse_gpu_clocks(text: str) -> list[int]:
    """Each GPU's maximum SM clock (MHz), from ``nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits``;
    a GPU that does not report it is left out."""
    return [clock for line in text.splitlines() if (clock := _int(line)) is not None]


def parse_cuda_version(text: str) -> str:
    """The CUDA version the driver supports, from nvidia-smi's banner (``CUDA Version: 12.4``)."""
    match = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return match.group(1) if match else ""


def parse_nccl_version(text: str) -> str:
    """The newest NCCL among the libraries ldconfig knows (``/usr/lib/.../libnccl.so.2.21.5``)."""
    versions = re.findall(r"libnccl\.so\.([0-9]+(?:\.[0-9]+)*)\s*$", text, re.MULTILINE)
    return max(versions, key=lambda v: [int(p) for p in v.split(".")], default="")


# --- network ----------------------------------------------------------------------------------


def parse_ip_addr(text: str) -> list[dict[str, Any]]:
    """Interfaces from ``ip -j addr``, loopback left out."""
    if not text.strip():
        return []
    nics = []
    for link in json.loads(text):
        if not link.get("ifname") or link.get("link_type") == "loopback":
            continue  # some iproute2 versions emit empty objects
        addresses = [f"{info['local']}/{info['prefixlen']}" for info in link.get("addr_info", []) if info.get("local")]
        nics.append(
            {
                "name": link["ifname"],
                "mtu": link.get("mtu"),
                "mac": link.get("address", ""),
                "state": link.get("operstate", ""),
                "addresses": addresses,
            }
        )
    return nics


def parse_link_speeds(text: str) -> dict[str, int | None]:
    """``NAME SPEED`` lines from /sys/class/net/*/speed; unknown speeds (-1, unreadable) are None."""
    speeds: dict[str, int | None] = {}
    for line in text.splitlines():
        name, _, speed = line.strip().partition(" ")
        if name:
            value = _int(speed)
            speeds[name] = value if value and value > 0 else None
    return speeds


def parse_ibv_devinfo(text: str) -> list[dict[str, Any]]:
    """HCAs and their ports from ``ibv_devinfo``; every ``key: value`` kept as text.

    Device attributes are indented once, ports' attributes deeper than their ``port:`` line.
    """
    devices: list[dict[str, Any]] = []
    port: dict[str, Any] | None = None
    port_indent = 0
    for raw in text.splitlines():
        line = raw.expandtabs(8)
        key, sep, value = line.strip().partition(":")
        if not sep or not key:
            continue
        indent = len(line) - len(line.lstrip())
        value = value.strip()
        if key == "hca_id":
            devices.append({"name": value, "ports": []})
            port = None
        elif not devices:
            continue
        elif key == "port":
            port = {"port": _int(value)}
            port_indent = indent
            devices[-1]["ports"].append(port)
        elif port is not None and indent > port_indent:
            port[key] = value
        else:
            port = None
            devices[-1][key] = value
    return devices


# --- storage and runtimes ---------------------------------------------------------------------


def parse_mounts(text: str) -> list[dict[str, str]]:
    """/proc/mounts lines (already filtered to storage file systems by the script)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4:
            source, target, fstype, options = (_unescape_mount(f) for f in fields[:4])
            mounts.append({"source": source, "target": target, "fstype": fstype, "options": options})
    return mounts


def _unescape_mount(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in /proc/mounts as octal escapes (\\040 ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_runtimes(text: str, *, silent: bool = False) -> list[str]:
    """The runtimes that answer (a daemon runtime only when ``docker info``/``podman info`` works; a binary alone
    makes no runtime), or with ``silent`` those installed that do not answer."""
    found = {line.strip() for line in text.splitlines()}
    return [runtime for runtime in RUNTIMES if (runtime + SILENT if silent else runtime) in found]


# --- helpers ----------------------------------------------------------------------------------


def _available(value: str | None) -> str:
    return "" if value is None or value.strip() in _NOT_AVAILABLE else value.strip()


def _int(value: Any) -> int | None:
    """The leading integer of a value such as ``81559 MiB`` or ``3400.0000``; None when there is none."""
    match = re.match(r"\s*(-?\d+)", str(value)) if value is not None else None
    return int(match.group(1)) if match else None
