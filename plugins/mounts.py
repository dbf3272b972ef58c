"""Per-campaign mounts of the storage system: N mount points per node, spread round-robin over the
storage's data addresses (seed 000: 16 mount points per DGX-2 over the Isilon nodes' addresses).

Mounted before a run when not mounted yet (so a resumed or later run finds them), unmounted when the
campaign ends. Benchmarks see the mount points as ``HostContext.mounts`` and spread ranks over them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from plugins.benchmarks.base import ParamError

OPTIONS = re.compile(r"^[A-Za-z0-9_=,.:+/-]*$")
PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")
NFS_KINDS = {"nfs", "isilon-powerscale", "ontap", "flashblade", "other"}


@dataclass(frozen=True)
class MountPlan:
    point: str  # where it is mounted on the node
    source: str  # address:/export, or a local directory for a bind mount
    fstype: str  # nfs, lustre, or bind
    options: str


def plan_mounts(spec: dict[str, Any], *, storage: Any, node_index: int) -> list[MountPlan]:
    """The mount points of one node (the node_index-th of the run) for a campaign's ``mounts`` definition."""
    count, base = spec["count"], spec["path"].rstrip("/")
    options = spec.get("options", storage.mount_options or "")
    if storage.kind == "local":
        return [MountPlan(f"{base}/{i}", storage.export_path, "bind", "") for i in range(count)]
    addresses = list(storage.data_addresses) or [storage.admin_address]
    fstype = "lustre" if storage.kind == "lustre" else "nfs"
    plans = []
    for i in range(count):
        address = addresses[(node_index * count + i) % len(addresses)]
        source = (
            f"{address}:{storage.export_path}" if fstype == "nfs" else f"{address}:/{storage.export_path.strip('/')}"
        )
        plans.append(MountPlan(f"{base}/{i}", source, fstype, options))
    return plans


def validate_mounts(value: Any, storage: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - {"count", "path", "options"}:
        raise ParamError("mounts", "must be {count: N, path: /mnt/..., options: ...}")
    count = value.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
        raise ParamError("mounts.count", "must be a whole number from 1 to 64")
    path = value.get("path", "/mnt/rackbench")
    if not isinstance(path, str) or not PATH.match(path) or ".." in path.split("/") or path.rstrip("/") in ("", "/mnt"):
        raise ParamError("mounts.path", "must be an absolute directory of its own, e.g. /mnt/rackbench")
    spec: dict[str, Any] = {"count": count, "path": path}
    if "options" in value:
        if not isinstance(value["options"], str) or not OPTIONS.match(value["options"]):
            raise ParamError("mounts.options", "must be mount options such as rsize=1048576,nolock,nconnect=8")
        spec["options"] = value["options"]
    if storage is None:
        raise ParamError("mounts", "needs the campaign's storage system (storage: NAME)")
    if not storage.export_path:
        raise ParamError("mounts", f"storage system {storage.name} has no export path to mount")
    return spec


def _sudo(user: str, argv: list[str]) -> list[str]:
    return argv if user == "root" else ["sudo", "-n", *argv]


def mount_command(plans: list[MountPlan], user: str) -> str:
    """One shell line mounting every point that is not mounted yet (idempotent)."""
    steps = []
    for p in plans:
        # "--": whatever the storage's address or export path holds, mount never reads it as an option.
        if p.fstype == "bind":
            mount = ["mount", "--bind", "--", p.source, p.point]
        else:
            mount = ["mount", "-t", p.fstype] + (["-o", p.options] if p.options else []) + ["--", p.source, p.point]
        mkdir = shlex.join(_sudo(user, ["mkdir", "-p", "--", p.point]))
        steps.append(f"{mkdir} && {{ mountpoint -q {shlex.quote(p.point)} || {shlex.join(_sudo(user, mount))}; }}")
    return " && ".join(steps)


def unmount_command(plans: list[MountPlan], user: str) -> str:
    """One shell line unmounting every point that is mounted; carries on past failures, reports the last."""
    steps = [
        f"if mountpoint -q {shlex.quote(p.point)}; then {shlex.join(_sudo(user, ['umount', p.point]))} || rc=1; fi"
        for p in plans
    ]
    return "rc=0; " + "; ".join(steps) + "; exit $rc"
