"""torch_dist plug-in: rackbench's own torch.distributed benchmark (plugins/tools/torch_dist.py) under mpirun, one
rank per GPU (per slot without GPUs): collectives or a small synthetic DDP training loop. gloo runs on CPUs, so the
built-in lab runs it for real without a GPU; nccl on GPUs.

Parameters: ``op`` (``all_reduce`` default, ``all_gather``, ``ddp``), ``backend`` (``gloo`` default, ``nccl``),
``port`` (where rank 0 listens on the first host, default 29500), ``min_bytes``/``max_bytes`` (message sizes, bytes
or with K, M or G; defaults 8 and 4M), ``factor`` (size step, default 2), ``warmup`` and ``iters`` (per size,
defaults 2 and 10), ``batch_size``, ``steps`` and ``warmup_steps`` (ddp; defaults 32, 20, 3), ``python`` (python3
by default, or an absolute path) and the launch's ``mpi_*`` parameters. The program needs torch on every node: the
campaign's ``env`` (PYTHONPATH, ...) reaches every rank; so does the interface gloo or NCCL should use where the
host name does not resolve to it (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, e.g. on the netns lab, whose nodes
share one host name).

Collectives are printed in nccl-tests' table format and read by the nccl-tests parser (plugins/benchmarks/nccl.py),
so the metrics are nccl-tests' own: ``busbw_gbps``/``algbw_gbps``/``time_us``/``wrong`` per message size (labels
size_bytes and placement: in-place for all_reduce, out-of-place for all_gather), ``busbw_avg_gbps``,
``busbw_max_gbps``, ``ranks``. DDP gives ``images_per_sec`` (all ranks) and ``images_per_sec_per_device``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    Metric,
    MetricSpec,
    ParamError,
    ParseError,
    register,
)
from plugins.benchmarks.nccl import METRICS as NCCL_METRICS
from plugins.benchmarks.nccl import NcclTests
from plugins.launchers.mpi import MPI_PARAMS, mpirun_argv, options_from_params

PROGRAM = "torch_dist.py"
SOURCE = Path(__file__).resolve().parent.parent / "tools" / PROGRAM
OPS = ("all_reduce", "all_gather", "ddp")
BACKENDS = ("gloo", "nccl")
DDP_METRICS = (
    MetricSpec("images_per_sec", "img/s", True, "synthetic DDP training throughput of all ranks"),
    MetricSpec("images_per_sec_per_device", "img/s", True, "the same per rank"),
)
_TOTAL = re.compile(r"^Total img/sec on (\d+) (?:CPU|GPU)\(s\):\s*([0-9.]+)\s*$", re.MULTILINE)
_PER_DEVICE = re.compile(r"^Img/sec per (?:CPU|GPU):\s*([0-9.]+)\s*$", re.MULTILINE)
_SIZE = re.compile(r"([0-9]{1,12})([KMG]?)")
_PATH = re.compile(r"/[A-Za-z0-9_./+-]{1,4000}")
_INTEGERS = {
    "port": (1024, 65535, 29500),
    "factor": (2, 1024, 2),
    "warmup": (0, 10_000, 2),
    "iters": (1, 100_000, 10),
    "batch_size": (1, 65536, 32),
    "steps": (1, 1_000_000, 20),
    "warmup_steps": (0, 100_000, 3),
}
KNOWN = frozenset({"op", "backend", "min_bytes", "max_bytes", "python", *_INTEGERS, *MPI_PARAMS})


def _size(params: dict[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    match = _SIZE.fullmatch(str(value).upper()) if not isinstance(value, bool) else None
    if not match:
        raise ParamError(name, f"must be a size in bytes, with K, M or G (e.g. 4M), got {value!r}")
    size = int(match[1]) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[match[2]]
    if not 4 <= size <= 16 * 1024**3:
        raise ParamError(name, f"must be from 4 bytes to 16G, got {value!r}")
    return size


def _integer(params: dict[str, Any], name: str) -> int:
    low, high, default = _INTEGERS[name]
    value = params.get(name, default)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ParamError(name, f"must be a whole number from {low} to {high}, got {value!r}")
    return value


def _choice(params: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = params.get(name, allowed[0])
    if value not in allowed:
        raise ParamError(name, f"must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def program_args(params: dict[str, Any], master: str) -> list[str]:
    """The program's arguments after validation; each value is one argv element."""
    unknown = sorted(set(params) - KNOWN)
    if unknown:
        raise ParamError(unknown[0], f"unknown torch_dist parameter (known: {', '.join(sorted(KNOWN))})")
    op, backend = _choice(params, "op", OPS), _choice(params, "backend", BACKENDS)
    low, high = _size(params, "min_bytes", 8), _size(params, "max_bytes", 4 * 1024**2)
    if low > high:
        raise ParamError("min_bytes", f"is more than max_bytes ({high})")
    values = {name: _integer(params, name) for name in _INTEGERS}
    args = ["--op", op, "--backend", backend, "--master", master, "--port", str(values["port"])]
    if op == "ddp":
        names = ("batch_size", "steps", "warmup_steps")
    else:
        args += ["--min-bytes", str(low), "--max-bytes", str(high)]
        names = ("factor", "warmup", "iters")
    for name in names:
        args += [f"--{name.replace('_', '-')}", str(values[name])]
    return args


def _python(params: dict[str, Any]) -> str:
    value = params.get("python", "python3")
    if value in ("python", "python3") or (isinstance(value, str) and _PATH.fullmatch(value) and ".." not in value):
        return str(value)
    raise ParamError("python", f"must be python, python3 or an absolute path, got {value!r}")


@register
class TorchDist(Benchmark):
    uses_mpi = True
    kind = "torch_dist"
    description = "rackbench's torch.distributed benchmark under mpirun: all_reduce/all_gather busbw, DDP images/s"
    metrics = (*NCCL_METRICS, *DDP_METRICS)

    def validate(self, params: dict[str, Any]) -> None:
        program_args(params, "first-host")
        _python(params)
        options_from_params(params, {})

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        """On the primary host: mpirun starting the program once per slot on every host; rank 0 on the first."""
        args = program_args(params, host.hosts[0].address if host.hosts else "")
        if not host.is_primary:
            return None
        rank_argv = [_python(params), "-u", PROGRAM, *args]
        argv = mpirun_argv(host.hosts, rank_argv, options_from_params(params, host.env))
        if len(host.hosts) > 1:  # the runner writes files on the primary only: mpirun copies it to the others
            argv[1:1] = ["--preload-files", PROGRAM]
        return HostCommand(argv=argv, files={PROGRAM: SOURCE.read_text(encoding="utf-8")})

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """The whole run's metrics (host ""): the nccl-tests table of a collective, or the DDP loop's images/s."""
        total = _TOTAL.search(text)
        if total:
            metrics = [Metric("images_per_sec", float(total[2]), "img/s")]
            per_device = _PER_DEVICE.search(text)
            if per_device:
                metrics.append(Metric("images_per_sec_per_device", float(per_device[1]), "img/s"))
            return metrics
        try:
            return NcclTests().parse(text, host=host)
        except ParseError as exc:
            raise ParseError(f"no torch_dist result: {exc}") from None

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        names = {m.name for m in metrics if m.host == ""}
        if "images_per_sec" in names or {"busbw_avg_gbps", "busbw_max_gbps"} <= names:
            return []
        return ["torch_dist did not finish: no busbw_avg_gbps/busbw_max_gbps (collectives) or images_per_sec (ddp)"]

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        wrong = sum(m.value for m in metrics if m.name == "wrong" and m.host == "" and not m.labels)
        return [f"torch_dist found {wrong:g} wrong elements in the collectives' results"] if wrong else []
