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

Topology (param ``topology``, collectives only): ``all`` (default) runs one collective across every rank. The
pairwise ones run a 2-rank collective per pair of nodes, one rank per node (``mpi_slots`` 1), every pair of a round
at once, rounds one after another (plugins/localise.py plans them):

- ``pairs``: host 0 with host 1, host 2 with host 3, ... (an odd host count is refused), one round.
- ``all_pairs``: every pair, in rounds of disjoint pairs (the circle method, as iperf3's all_pairs).
- ``ring``: every host with the next, the last with the first, in rounds of disjoint pairs.
- ``two_pass``: two-pass localisation exactly as iperf3's (``seed``, ``threshold``; the campaign adds pass 2 through
  ``follow_up`` with ``localise_pass: 2``, ``partners`` and pass 1's ``reference_gbps``). A pair's value is its
  ``busbw_max_gbps``: the largest messages, where the link rather than latency bounds it.

They run under one mpirun with a process group per pair, not one mpirun per pair: the rounds must not overlap (a
shared good partner of pass 2 would carry two tests at once), and a world barrier keeps them apart where separate
launches would need a clock; it is also the one launch path the lab already proves (one ssh fan-out, one rendezvous
on the first host), and rank 0 prints every pair's table. Each pair's metrics are stored on both of its nodes,
labelled ``{"peer": other node, "round": R}`` (so the fleet view judges nodes by their pairs); the run's aggregate
is the median pair's busbw_avg/busbw_max, and the sum of wrong elements.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import parameters
from plugins import localise
from plugins.benchmarks import nccl
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    Metric,
    MetricSpec,
    PairMetric,
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
TOPOLOGIES = ("all", "pairs", "all_pairs", "ring", "two_pass")
PLAN = "torch_pairs.json"
PAIR_METRIC = nccl.PAIR_METRIC  # what a pair is judged by in two_pass: busbw_max_gbps
PAIR_PREFIX = nccl.PAIR_PREFIX  # plugins/tools/torch_dist.PAIR_HEADER (that module needs torch)
LOCALISER = localise.Localiser("reference_gbps", 1e9)
# Pairwise topologies, validated through common/parameters (check, default).
PAIR_PARAMS: dict[str, tuple[parameters.Check, Any]] = {
    "topology": (parameters.choice(*TOPOLOGIES), "all"),
    **LOCALISER.params(),
}
KNOWN = frozenset({"op", "backend", "min_bytes", "max_bytes", "python", *_INTEGERS, *MPI_PARAMS, *PAIR_PARAMS})


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
    pair_params(params)
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


def pair_params(params: dict[str, Any]) -> dict[str, Any]:
    """The topology and two_pass parameters, checked together; ParamError names the field."""
    given = {key: parameters.checked(key, PAIR_PARAMS[key][0], params[key]) for key in PAIR_PARAMS if key in params}
    merged = {key: given.get(key, default) for key, (_, default) in PAIR_PARAMS.items()}
    if merged["topology"] != "all" and params.get("op") == "ddp":
        raise ParamError("topology", "pairwise topologies run collectives (all_reduce, all_gather), not ddp")
    if merged["topology"] != "all" and params.get("mpi_slots", 1) not in (1, "1"):
        raise ParamError("mpi_slots", f"{merged['topology']} runs one rank per node: leave mpi_slots at 1")
    LOCALISER.check(given, merged)
    return merged


def pair_plan(params: dict[str, Any], names: list[str]) -> list[list[tuple[int, int]]]:
    """The rounds of pairs (host indexes) a pairwise topology runs on these hosts."""
    p = pair_params(params)
    return LOCALISER.rounds(p["topology"], names, p)


pair_flows = nccl.pair_flows  # {(node, peer): busbw_max_gbps}: the pairs' format is nccl-tests' pairwise one


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
        """On the primary host: mpirun starting the program once per slot on every host; rank 0 on the first
        (pairwise: one rank per host, and the plan of pairs beside the program)."""
        args = program_args(params, host.hosts[0].address if host.hosts else "")
        topology = pair_params(params)["topology"]
        files = {PROGRAM: SOURCE.read_text(encoding="utf-8")}
        if topology != "all":
            names = [h.name for h in host.hosts]
            rounds = pair_plan(params, names)
            files[PLAN] = json.dumps({"names": names, "rounds": rounds}) + "\n"
            args += ["--pairs", PLAN]
        if not host.is_primary:
            return None
        options = options_from_params(params, host.env)
        if topology != "all":
            options = replace(options, slots=1)
        argv = mpirun_argv(host.hosts, [_python(params), "-u", PROGRAM, *args], options)
        if len(host.hosts) > 1:  # the runner writes files on the primary only: mpirun copies them to the others
            argv[1:1] = ["--preload-files", ",".join(files)]
        return HostCommand(argv=argv, files=files)

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """The whole run's metrics (host ""): the nccl-tests table of a collective, or the DDP loop's images/s."""
        total = _TOTAL.search(text)
        if total:
            metrics = [Metric("images_per_sec", float(total[2]), "img/s")]
            per_device = _PER_DEVICE.search(text)
            if per_device:
                metrics.append(Metric("images_per_sec_per_device", float(per_device[1]), "img/s"))
            return metrics
        if PAIR_PREFIX in text:
            return nccl.pair_metrics(text, "torch_dist")
        try:
            return NcclTests().parse(text, host=host)
        except ParseError as exc:
            raise ParseError(f"no torch_dist result: {exc}") from None

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Pairwise runs: the median pair's busbw_avg_gbps/busbw_max_gbps, the wrong elements of every pair, and
        the ranks of one test (2); each pair counted once (its metrics are on both of its nodes)."""
        return nccl.pair_aggregate(per_host)

    def follow_up(self, params: dict[str, Any], metrics: list[Metric]) -> dict[str, Any] | None:
        """two_pass: after pass 1, the parameters of pass 2 (each suspect with a known-good partner), or None."""
        return LOCALISER.follow_up(params, pair_params(params), pair_flows(metrics))

    def pair_flows(self, metrics: list[Metric]) -> localise.Flows:
        return pair_flows(metrics)

    def pair_metric(self, params: dict[str, Any]) -> PairMetric | None:
        if pair_params(params)["topology"] == "all":
            return None
        return nccl.pair_metric(str(params.get("op", OPS[0])))

    def second_pass_of(self, params: dict[str, Any]) -> localise.SecondPass | None:
        return LOCALISER.second_pass(pair_params(params))

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        names = {m.name for m in metrics if m.host == "" and not m.labels}
        if "images_per_sec" in names or {"busbw_avg_gbps", "busbw_max_gbps"} <= names:
            return []
        return ["torch_dist did not finish: no busbw_avg_gbps/busbw_max_gbps (collectives) or images_per_sec (ddp)"]

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        wrong = sum(m.value for m in metrics if m.name == "wrong" and m.host == "" and not m.labels)
        return [f"torch_dist found {wrong:g} wrong elements in the collectives' results"] if wrong else []
