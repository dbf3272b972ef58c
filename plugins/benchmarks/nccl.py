"""nccl-tests plug-in: one of NVIDIA's nccl-tests binaries (``all_reduce_perf`` ...) under ``mpirun``, started on the
run's primary host across all its hosts, one rank per GPU.

Parameters become nccl-tests options (``-b 8 -e 128M`` ...) after validation, each an argv element; the campaign's
environment (``NCCL_IB_DISABLE=1``, ``NCCL_SOCKET_IFNAME`` ...) reaches every rank as ``mpirun -x NAME=value``.

Output. nccl-tests prints one result table (rank 0 only) and, with ``NCCL_DEBUG=INFO``, NCCL's own log lines from
every rank. The table's layout changed over the years, so columns are read from the table's header line:

- 2.0-2.12 (2019-2022): ``size count type redop time algbw busbw error ...``; ``redop`` is blank for alltoall, there
  is no ``root`` column, and ``error`` holds the largest deviation found (``5e-07``), not a count.
- 2.13 and later: ``size count type redop root time algbw busbw #wrong ...``, ``#wrong`` counting wrong elements.
- Options add or rename columns: ``-C`` names the time column ``cputime`` (2.13), ``-S`` adds a timestamp (2.18),
  ``-I`` adds per-iteration columns ``i_min i_max i_p99 i_cv%`` after each placement's ``#wrong`` (2.19).

Every version ends with ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``; a run that lacks
the latter did not finish.

Topology (param ``topology``): ``all`` (default) is one test across every host. The pairwise ones run a 2-node test
per pair of hosts (one ``mpirun`` across the pair's two hosts, every GPU of both, as ``all`` runs them), every pair
of a round at once, rounds one after another (plugins/localise.py plans them; a small helper on the primary host,
``rackbench_pairs.py``, starts each round's launches and stops one still running after ``pair_timeout`` seconds):
``pairs`` (host 0 with host 1, 2 with 3, ...; an even count), ``all_pairs`` (every pair), ``ring`` (each host with
the next) and ``two_pass`` (two-pass localisation with iperf3's parameters ``seed`` and ``threshold``; the campaign
adds pass 2 through ``follow_up`` with ``localise_pass: 2``, ``partners`` and pass 1's ``reference_gbps``). A pair
is judged by its ``busbw_max_gbps`` (the largest messages, where the link rather than latency bounds it). Each
pair's metrics are stored on both of its nodes, labelled ``{"peer": other node, "round": R}``; the run's aggregate
is the median pair's busbw_avg/busbw_max, the sum of wrong elements and out-of-bounds values, and the ranks of one
test. rackbench's torch_dist benchmark prints its pairs in the same format (``pair_metrics`` reads both).

Noise the parser removes: Open MPI's ``--tag-output`` prefixes (``[1,0]<stdout>:``), carriage returns and terminal
escapes, and NCCL log lines. rank 0's NCCL lines share its stdout buffer with the table, so with verbose
``NCCL_DEBUG_SUBSYS`` a table row is cut into pieces glued in front of log lines
(``     8388608   2097152   float   sum   -1host:64904:64904 [1] NCCL INFO AllReduce: ...``); the pieces are put
back together.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import statistics
import string
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import parameters
from plugins import localise
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    HostInfo,
    Metric,
    MetricSpec,
    PairMetric,
    ParamError,
    ParseError,
    header_sections,
    register,
)
from plugins.launchers.mpi import MPI_PARAMS, mpirun_argv, options_from_params
from plugins.tools import pairs_helper

BINARIES = (
    "all_reduce_perf",
    "all_gather_perf",
    "broadcast_perf",
    "reduce_scatter_perf",
    "reduce_perf",
    "alltoall_perf",
    "sendrecv_perf",
)
DEFAULT_BINARY = "all_reduce_perf"
DEFAULT_BINARY_DIR = "/opt/nccl-tests/build"
# nccl-tests' names (src/common.cu); an unknown one makes nccl-tests print "invalid type" and test float instead.
DATATYPES = (
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "half",
    "float",
    "double",
    "bfloat16",
    "f8e4m3",
    "f8e5m2",
)
OPS = ("sum", "prod", "max", "min", "avg", "mulsum")
DEFAULT_MIN_BYTES = 8
DEFAULT_MAX_BYTES = 128 * 1024**2
DEFAULT_STEP_FACTOR = 2
MAX_BYTES_LIMIT = 1024**4
MAX_COUNT = 1_000_000
PLACEMENTS = ("out-of-place", "in-place")

METRICS = (
    MetricSpec("algbw_gbps", "GB/s", True, "algorithm bandwidth, per message size and placement"),
    MetricSpec("busbw_gbps", "GB/s", True, "bus bandwidth, per message size and placement"),
    MetricSpec("time_us", "us", False, "time of one operation, per message size and placement"),
    MetricSpec("wrong", "elements", False, "wrong elements found by nccl-tests' data check (#wrong); 0 when correct"),
    MetricSpec("busbw_avg_gbps", "GB/s", True, "nccl-tests' 'Avg bus bandwidth' over all sizes and placements"),
    MetricSpec("busbw_max_gbps", "GB/s", True, "highest bus bandwidth over all sizes and placements"),
    MetricSpec("out_of_bounds", "results", False, "nccl-tests' 'Out of bounds values' count; 0 when correct"),
    MetricSpec("ranks", "ranks", True, "ranks (GPUs) in the run, from nccl-tests' device list"),
    MetricSpec("nodes", "nodes", True, "hosts in the run, from nccl-tests' device list"),
    MetricSpec(
        "transport_connections",
        "connections",
        True,
        "connections NCCL reported opening over a transport (label 'transport'); needs NCCL_DEBUG=INFO",
    ),
)
_UNITS = {spec.name: spec.unit for spec in METRICS}

TOPOLOGIES = ("all", *localise.TOPOLOGIES)
LOCALISER = localise.Localiser("reference_gbps", 1e9)
# Pairwise topologies, validated through common/parameters (check, default).
PAIR_PARAMS: dict[str, tuple[parameters.Check, Any]] = {
    "topology": (parameters.choice(*TOPOLOGIES), "all"),
    "pair_timeout": (parameters.integer(10, 86_400), 1800),  # seconds one pair's test may run before it is stopped
    **LOCALISER.params(),
}
PAIR_METRIC = "busbw_max_gbps"  # what a pair is judged by in two_pass
PAIRS_HELPER = "rackbench_pairs.py"
PAIRS_PLAN = "pairs.json"
PAIRS_HELPER_SCRIPT = Path(pairs_helper.__file__).read_text()  # shipped to the primary host as PAIRS_HELPER
PAIR_PREFIX = pairs_helper.PAIR_HEADER  # also what plugins/tools/torch_dist.py prints
_PAIR_HEADER = re.compile(r"^" + re.escape(PAIR_PREFIX), re.MULTILINE)
_PAIRS_FOOTER = re.compile(r"^" + re.escape(pairs_helper.PAIRS_FOOTER) + r"(.*)$", re.MULTILINE)


# --- parameters ---------------------------------------------------------------------------------------------------

_SIZE = parameters.size(1, MAX_BYTES_LIMIT, units="kmg")  # nccl-tests' own units: K, M and G are binary
_PATH = re.compile(r"/[A-Za-z0-9._+/-]*")
_SUFFIX = re.compile(r"[A-Za-z0-9_]{0,32}")
_NET_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,31}")
_DEVICE_SEGMENT = re.compile(r"[0-9]+(\([0-9]+\))?|x|\.\.\.", re.IGNORECASE)  # "0", "0(1)", "x": ignored


@dataclass(frozen=True)
class Transport:
    """A transport as NCCL names it after 'via', reduced to what matters: 'NET/IB/GDRDMA', 'P2P/CUMEM', 'SHM'.

    Device numbers, the PXN proxy rank ('0(1)'), '/Shared' and P2P's '/read' are left out."""

    kind: str  # NET, P2P, SHM or COLLNET
    detail: str = ""  # the network plug-in's name (IB, Socket, AWS Libfabric ...) or the P2P mechanism
    gdrdma: bool = False

    def __str__(self) -> str:
        return "/".join(part for part in (self.kind, self.detail, "GDRDMA" if self.gdrdma else "") if part)

    def matches(self, other: Transport) -> bool:
        """Whether ``other`` (seen) belongs to this family (expected): 'NET/IB' matches 'NET/IB/GDRDMA'."""
        if self.kind != other.kind:
            return False
        if self.detail and not _same_detail(self.detail, other.detail):
            return False
        return other.gdrdma or not self.gdrdma

    def shown(self) -> str:
        """As the seed papers write it: 'NET/IB/x/GDRDMA', here 'NET/IB/.../GDRDMA'."""
        if self.gdrdma:
            return f"{self.kind}/{self.detail}/.../GDRDMA"
        return str(self)


def _same_detail(expected: str, seen: str) -> bool:
    expected, seen = expected.lower(), seen.lower()
    # The SHARP plug-in (nccl-rdma-sharp-plugins) names its InfiniBand verbs transport "IBext".
    return seen == expected or (expected == "ib" and seen.startswith("ibext"))


@dataclass(frozen=True)
class Config:
    binary: str
    binary_dir: str
    binary_suffix: str
    min_bytes: int
    max_bytes: int
    step_factor: int | None
    step_bytes: int | None
    gpus_per_rank: int
    iters: int | None
    warmup_iters: int | None
    check: int | None
    op: str | None
    datatype: str | None
    root: int | None
    expect_transport: Transport | None

    def rank_argv(self) -> list[str]:
        argv = [posixpath.join(self.binary_dir, self.binary + self.binary_suffix)]
        argv += ["-b", str(self.min_bytes), "-e", str(self.max_bytes)]
        if self.step_bytes is not None:
            argv += ["-i", str(self.step_bytes)]
        else:
            argv += ["-f", str(self.step_factor or DEFAULT_STEP_FACTOR)]
        argv += ["-g", str(self.gpus_per_rank)]
        optional = (
            ("-n", self.iters),
            ("-w", self.warmup_iters),
            ("-c", self.check),
            ("-o", self.op),
            ("-d", self.datatype),
            ("-r", self.root),
        )
        for flag, value in optional:
            if value is not None:
                argv += [flag, str(value)]
        return argv


def _integer(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    return None if value is None else parameters.checked(name, parameters.integer(low, high), value)


def _size(params: dict[str, Any], name: str, default: int) -> int:
    return parameters.size_bytes(parameters.checked(name, _SIZE, params.get(name, default)))


def _choice(params: dict[str, Any], name: str, allowed: tuple[str, ...], default: str | None = None) -> str | None:
    value = params.get(name, default)
    return None if value is None else parameters.checked(name, parameters.choice(*allowed), value)


def _binary_dir(params: dict[str, Any]) -> str:
    value = params.get("binary_dir", DEFAULT_BINARY_DIR)
    if not isinstance(value, str) or not _PATH.fullmatch(value):
        raise ParamError("binary_dir", f"must be an absolute path of letters, digits and . _ + - /; got {value!r}")
    if ".." in value.split("/"):
        raise ParamError("binary_dir", "must not contain '..'")
    return value.rstrip("/") or "/"


def _binary_suffix(params: dict[str, Any]) -> str:
    value = params.get("binary_suffix", "")
    if not isinstance(value, str) or not _SUFFIX.fullmatch(value):
        raise ParamError("binary_suffix", f"must be up to 32 letters, digits or '_' (e.g. _mpi), got {value!r}")
    return value


def parse_transport_expectation(value: Any) -> Transport:
    """'NET/IB/GDRDMA', 'NET/IB/x/GDRDMA', 'NET/IB/0/GDRDMA', 'NET/IB', 'NET/Socket', 'NET', 'P2P', 'P2P/CUMEM', 'SHM'.

    Device numbers are ignored: NCCL picks them per rank."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be a transport such as NET/IB/GDRDMA, NET/IB, NET/Socket, P2P or SHM")
    parts = [p.strip() for p in value.strip().split("/") if p.strip() and not _DEVICE_SEGMENT.fullmatch(p.strip())]
    if not parts:
        raise ValueError(f"must be a transport such as NET/IB/GDRDMA, NET/IB, NET/Socket, P2P or SHM, got {value!r}")
    kind, rest = parts[0].upper(), parts[1:]
    if kind == "NET":
        gdrdma = bool(rest) and rest[-1].upper() == "GDRDMA"
        if gdrdma:
            rest = rest[:-1]
        if len(rest) > 1 or (rest and not _NET_NAME.fullmatch(rest[0])) or (gdrdma and not rest):
            raise ValueError(f"must be NET, NET/<network> or NET/<network>/GDRDMA (e.g. NET/IB/GDRDMA), got {value!r}")
        return Transport("NET", rest[0] if rest else "", gdrdma)
    if kind == "P2P" and len(rest) <= 1 and all(_NET_NAME.fullmatch(p) for p in rest):
        return Transport("P2P", rest[0] if rest else "")
    if kind == "SHM" and not rest:
        return Transport("SHM")
    raise ValueError(f"must be NET/<network>[/GDRDMA], P2P[/<mechanism>] or SHM, got {value!r}")


KNOWN_PARAMS = frozenset(
    {
        "binary",
        "binary_dir",
        "binary_suffix",
        "min_bytes",
        "max_bytes",
        "step_factor",
        "step_bytes",
        "gpus_per_rank",
        "iters",
        "warmup_iters",
        "check",
        "op",
        "datatype",
        "root",
        "expect_transport",
        *MPI_PARAMS,
        *PAIR_PARAMS,
    }
)


def pair_params(params: dict[str, Any]) -> dict[str, Any]:
    """The topology and two_pass parameters, checked together; ParamError names the field."""
    given = {key: parameters.checked(key, PAIR_PARAMS[key][0], params[key]) for key in PAIR_PARAMS if key in params}
    merged = {key: given.get(key, default) for key, (_, default) in PAIR_PARAMS.items()}
    if "pair_timeout" in given and merged["topology"] == "all":
        raise ParamError("pair_timeout", "applies to the pairwise topologies only (pairs, all_pairs, ring, two_pass)")
    LOCALISER.check(given, merged)
    return merged


def config(params: dict[str, Any]) -> Config:
    """The validated parameters; ParamError names the first bad one."""
    for name in params:
        if name not in KNOWN_PARAMS:
            raise ParamError(str(name), "unknown or unsupported nccl-tests parameter")
    options_from_params(params)  # validates the mpi_* parameters
    pair_params(params)
    min_bytes = _size(params, "min_bytes", DEFAULT_MIN_BYTES)
    max_bytes = _size(params, "max_bytes", max(DEFAULT_MAX_BYTES, min_bytes))
    if min_bytes > max_bytes:
        raise ParamError("max_bytes", f"must not be below min_bytes ({min_bytes}), got {max_bytes}")
    step_factor = _integer(params, "step_factor", 2, 1024)
    step_bytes = _integer(params, "step_bytes", 1, MAX_BYTES_LIMIT)
    if step_factor is not None and step_bytes is not None:
        raise ParamError("step_bytes", "give step_factor (-f) or step_bytes (-i), not both")
    check = params.get("check")
    if isinstance(check, bool):
        check = int(check)
    expect = params.get("expect_transport")
    try:
        transport = None if expect is None else parse_transport_expectation(expect)
    except ValueError as exc:
        raise ParamError("expect_transport", str(exc)) from None
    return Config(
        binary=_choice(params, "binary", BINARIES, DEFAULT_BINARY) or DEFAULT_BINARY,
        binary_dir=_binary_dir(params),
        binary_suffix=_binary_suffix(params),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        step_factor=step_factor,
        step_bytes=step_bytes,
        gpus_per_rank=_integer(params, "gpus_per_rank", 1, 64) or 1,
        iters=_integer(params, "iters", 1, MAX_COUNT),
        warmup_iters=_integer(params, "warmup_iters", 0, MAX_COUNT),
        check=_integer({"check": check}, "check", 0, 1000),
        op=_choice(params, "op", OPS),
        datatype=_choice(params, "datatype", DATATYPES),
        root=_integer(params, "root", 0, 65535),
        expect_transport=transport,
    )


def transport_problem(expect: Any, logs: dict[str, str]) -> str:
    """For other MPI jobs that use NCCL (training): what is wrong with the transport in their logs, or ""."""
    lines = [line for text in logs.values() for line, _ in _logical_lines(text)]
    return _transport_problem(parse_transport_expectation(expect), transports(lines))


def transport_env(expect: Any, env: dict[str, str]) -> dict[str, str]:
    """The environment that makes NCCL log its transports (NCCL_DEBUG=INFO), refused when the campaign hides them."""
    return _debug_env(parse_transport_expectation(expect) if expect else None, env)


def _debug_env(expected: Transport | None, env: dict[str, str]) -> dict[str, str]:
    """The campaign's environment, plus NCCL_DEBUG=INFO when the transport is to be checked: NCCL names the
    transport of each connection only at that level, on stdout."""
    env = dict(env)
    if expected is None:
        return env
    level = env.setdefault("NCCL_DEBUG", "INFO")
    if level.upper() not in ("INFO", "TRACE"):
        raise ParamError("expect_transport", f"needs NCCL_DEBUG=INFO, but the campaign sets NCCL_DEBUG={level}")
    if env.get("NCCL_DEBUG_FILE"):
        raise ParamError("expect_transport", "needs NCCL's log on stdout, but the campaign sets NCCL_DEBUG_FILE")
    subsys = env.get("NCCL_DEBUG_SUBSYS", "").upper().replace(" ", "")
    if subsys:
        wanted = {"ALL", "INIT", "NET" if expected.kind == "NET" else expected.kind}
        names = set(subsys.lstrip("^").split(","))
        if (subsys.startswith("^") and names & wanted) or (not subsys.startswith("^") and not names & wanted):
            raise ParamError(
                "expect_transport",
                f"NCCL_DEBUG_SUBSYS={env['NCCL_DEBUG_SUBSYS']} hides the transport lines (they are logged as INIT)",
            )
    return env


def _rank_hosts(hosts: tuple[HostInfo, ...], gpus_per_rank: int) -> tuple[HostInfo, ...]:
    """Hosts with their slot count in ranks: one rank drives gpus_per_rank GPUs (nccl-tests -g)."""
    if gpus_per_rank == 1:
        return hosts
    for h in hosts:
        if h.slots % gpus_per_rank:
            raise ParamError("gpus_per_rank", f"{h.name} has {h.slots} GPUs, not a multiple of {gpus_per_rank}")
    return tuple(HostInfo(name=h.name, address=h.address, slots=h.slots // gpus_per_rank) for h in hosts)


# --- output: lines ----------------------------------------------------------------------------------------------

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|[\x00-\x08\x0b-\x1f\x7f]")
_TAG = re.compile(r"\[\d+,\d+\]<(?:stdout|stderr|stddiag)>: ?")
# What follows "host" in NCCL's log lines: ":pid:tid [cudaDev] " then, for warnings of NCCL >= 2.23, "file.cc:line ".
_LOG_MARK = re.compile(r":\d+:\d+ \[\d+\] (?:[\w./-]+:\d+ )?NCCL (?:INFO|WARN|TRACE|ABORT)\b")
_LOG_START = re.compile(r"\s*(?:\[[^\]]*\]\s*)?([A-Za-z0-9._-]+)" + _LOG_MARK.pattern)
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "._-")
_NUMBER_HEAD = re.compile(r"(N/A|-?[0-9]+(?:\.[0-9]+)?(?:e[+-][0-9]+)?)([A-Za-z].*)")
# A piece of a table row: the start of a row (size, count, type ...) or the numbers of one placement.
_ROW_PIECE = re.compile(r"\s*[0-9]+\s+[0-9]+\s+[A-Za-z_]\w*(\s.*)?")
_NUMBERS_PIECE = re.compile(r"[\s0-9.eE+/NA-]*")


def _clean(line: str) -> tuple[str, str]:
    """(the Open MPI tag naming the rank and stream, or ""; the line without tag and control characters)."""
    line = _ESCAPES.sub("", line)
    tag = _TAG.search(line)
    return (tag.group(), line[tag.end() :]) if tag else ("", line)


def _split_log(line: str, hosts: set[str]) -> tuple[str, str | None]:
    """(table text glued before an NCCL log line, the log line), or (line, None) when the line holds no NCCL log."""
    mark = _LOG_MARK.search(line)
    if mark is None:
        return line, None
    start = mark.start()
    while start > 0 and line[start - 1] in _HOST_CHARS:
        start -= 1
    glued = line[start : mark.start()]  # the host name, possibly after the end of a table row
    known = next((h for h in sorted(hosts, key=len, reverse=True) if glued.endswith(h)), None)
    if known is not None:
        head = glued[: len(glued) - len(known)]
    else:
        number = _NUMBER_HEAD.fullmatch(glued)
        head = number.group(1) if number else ""
    piece = line[:start] + head
    if not (_ROW_PIECE.fullmatch(piece) or _NUMBERS_PIECE.fullmatch(piece)):
        piece = ""  # a timestamp or other prefix of the log line, not part of the table
    return piece, line[start + len(head) :]


def _logical_lines(text: str) -> Iterator[tuple[str, bool]]:
    """(line, is_nccl_log) with prefixes removed and table rows reassembled from the pieces NCCL log lines cut
    them into. Pieces are joined per Open MPI stream, so another rank's line never lands inside a row."""
    lines = [_clean(raw) for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    hosts = {m.group(1) for m in (_LOG_START.match(line) for _, line in lines) if m}
    pending: dict[str, str] = {}
    for stream, line in lines:
        piece, log = _split_log(line, hosts)
        if log is not None:
            if piece.strip():
                pending[stream] = pending.get(stream, "") + " " + piece
            yield log, True
            continue
        before = pending.pop(stream, "")
        if before and line.strip() and _NUMBERS_PIECE.fullmatch(line):
            yield before + " " + line, False
            continue
        if before:
            yield before, False  # a row cut short: it will not parse
        yield line, False
    for before in pending.values():
        yield before, False


# --- output: the table ------------------------------------------------------------------------------------------

_TIME_COLUMNS = ("time", "cputime")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_CLOCK = re.compile(r"[0-9]{2}:[0-9]{2}:[0-9]{2}")
_WORD = re.compile(r"[A-Za-z_]\w*")
_INT = re.compile(r"-?[0-9]+")
_NUMERIC = re.compile(r"N/A|[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?(?:inf|nan)", re.IGNORECASE)
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\b")
_OUT_OF_BOUNDS = re.compile(r"\s*#?\s*Out of bounds values\s*:\s*(\d+)")
_AVG_BUSBW = re.compile(r"\s*#?\s*Avg bus bandwidth\s*:\s*(\S+)")
_FAILURE = re.compile(r"Test (?:NCCL|CUDA) failure .*|NCCL failure .*")


@dataclass(frozen=True)
class _Layout:
    """Column names of a result table, from its header: the leading columns (size, count, type, redop, root) and,
    per placement (out-of-place, in-place), the measured ones (time, algbw, busbw, #wrong or error, ...)."""

    lead: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]

    @property
    def width(self) -> int:
        return sum(len(g) for g in self.groups)


def _layout(line: str) -> _Layout | None:
    names = line.strip().lstrip("#").split()
    if len(names) < 4 or names[0] != "size" or "busbw" not in names:
        return None
    names = [n for n in names if n != "timestamp"]
    starts = [i for i, n in enumerate(names) if n in _TIME_COLUMNS]
    if not starts or starts[0] < 3:
        return None
    bounds = [*starts, len(names)]
    groups = tuple(tuple(names[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return _Layout(lead=tuple(names[: starts[0]]), groups=groups)


@dataclass(frozen=True)
class _Row:
    size: int
    placement: str
    values: dict[str, float]  # time_us, algbw_gbps, busbw_gbps, wrong (when reported)


def _number(token: str) -> float | None:
    if token == "N/A":
        return None
    value = float(token)
    return value if math.isfinite(value) else None


def _rows(line: str, layout: _Layout) -> list[_Row]:
    """The results of one table line (one per placement), or [] for a line that is not a complete row."""
    tokens = line.split()
    if len(tokens) >= 2 and _TIMESTAMP.fullmatch(tokens[-2]) and _CLOCK.fullmatch(tokens[-1]):
        tokens = tokens[:-2]
    if len(tokens) < 3 or not (_INT.fullmatch(tokens[0]) and _INT.fullmatch(tokens[1]) and _WORD.fullmatch(tokens[2])):
        return []
    extra = len(tokens) - 3 - layout.width  # redop and root; alltoall's redop was printed blank before 2.13
    if not 0 <= extra <= len(layout.lead) - 3:
        return []
    body = tokens[3 + extra :]
    if not all(_WORD.fullmatch(t) or _INT.fullmatch(t) for t in tokens[3 : 3 + extra]):
        return []
    if not all(_NUMERIC.fullmatch(t) for t in body):
        return []
    size = int(tokens[0])
    rows: list[_Row] = []
    offset = 0
    for placement, names in zip(PLACEMENTS, layout.groups, strict=False):
        cells = dict(zip(names, body[offset : offset + len(names)], strict=True))
        offset += len(names)
        values: dict[str, float] = {}
        for column, metric in (("algbw", "algbw_gbps"), ("busbw", "busbw_gbps"), ("#wrong", "wrong")):
            value = _number(cells[column]) if column in cells else None
            if value is not None:
                values[metric] = value
        time = next((_number(cells[c]) for c in _TIME_COLUMNS if c in cells), None)
        if time is not None:
            values["time_us"] = time
        rows.append(_Row(size=size, placement=placement, values=values))
    return rows


# --- output: NCCL's transport lines -------------------------------------------------------------------------------

# "Ring 00 : 24 -> 40 [receive] via NET/IB/0/GDRDMA" (NCCL 2.4), "Channel 00 : 0[1b000] -> 1[1c000] via P2P/IPC"
# (2.5-2.11), "Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0(1)/GDRDMA/Shared" (2.12 and later),
# "CollNet 00/0 : 3 [send] via COLLNET/IBext/0/GDRDMA".
_CONNECTION = re.compile(r"NCCL INFO (?:Ring|Channel|CollNet|Coll) \d+(?:/\d+)? : .*?\bvia (\S.*?)\s*$")


def transport(via: str) -> Transport:
    """The transport NCCL names after 'via'."""
    parts = via.split("/")
    kind = parts[0].upper()
    if kind in ("NET", "COLLNET") and len(parts) > 1:
        return Transport(kind, parts[1], any(p.startswith("GDRDMA") for p in parts[2:]))  # "GDRDMA(PCI)" too
    if kind == "P2P":
        return Transport("P2P", parts[1] if len(parts) > 1 else "")
    if kind == "SHM" or via.startswith("direct shared memory"):  # "direct shared memory" until NCCL 2.12
        return Transport("SHM")
    return Transport(kind)


def transports(lines: Iterable[str]) -> Counter[Transport]:
    """How many connections NCCL reported over each transport."""
    found: Counter[Transport] = Counter()
    for line in lines:
        match = _CONNECTION.search(line)
        if match:
            found[transport(match.group(1))] += 1
    return found


# --- output: everything -----------------------------------------------------------------------------------------


@dataclass
class Output:
    """What one nccl-tests run printed."""

    rows: list[_Row] = field(default_factory=list)
    avg_busbw: float | None = None
    out_of_bounds: int | None = None
    ranks: list[tuple[int, str]] = field(default_factory=list)
    transports: Counter[Transport] = field(default_factory=Counter)
    tables: int = 0  # result table headers seen
    failure: str = ""  # nccl-tests' first "Test ... failure" line


def read_output(text: str) -> Output:
    out = Output()
    layout: _Layout | None = None
    for line, is_log in _logical_lines(text):
        if is_log:
            out.transports.update(transports([line]))
            continue
        failure = _FAILURE.search(line)
        if failure and not out.failure:
            out.failure = failure.group().strip()
        if rank := _RANK.match(line.strip()):
            out.ranks.append((int(rank.group(1)), rank.group(2)))
        elif found := _layout(line):
            layout = found
            out.tables += 1
        elif bounds := _OUT_OF_BOUNDS.match(line):
            out.out_of_bounds = int(bounds.group(1))
        elif avg := _AVG_BUSBW.match(line):
            number = _NUMERIC.fullmatch(avg.group(1))
            out.avg_busbw = _number(avg.group(1)) if number else None
        elif layout is not None:
            out.rows += _rows(line, layout)
    return out


def _metric(name: str, value: float, labels: dict[str, Any] | None = None) -> Metric:
    return Metric(name=name, value=value, unit=_UNITS[name], host="", labels=labels or {})


def _output_metrics(out: Output) -> list[Metric]:
    metrics: list[Metric] = []
    seen: set[tuple[int, str]] = set()
    busbw: list[float] = []
    wrong: list[float] = []
    for row in out.rows:
        # Rows of 0 bytes (sizes below one element) move nothing; a size seen again keeps its first result.
        if row.size == 0 or (row.size, row.placement) in seen:
            continue
        seen.add((row.size, row.placement))
        labels = {"size_bytes": row.size, "placement": row.placement}
        metrics += [_metric(name, value, labels) for name, value in row.values.items()]
        busbw += [row.values["busbw_gbps"]] if "busbw_gbps" in row.values else []
        wrong += [row.values["wrong"]] if "wrong" in row.values else []
    if busbw:
        metrics.append(_metric("busbw_max_gbps", max(busbw)))
    if wrong:
        metrics.append(_metric("wrong", sum(wrong)))
    if out.avg_busbw is not None:
        metrics.append(_metric("busbw_avg_gbps", out.avg_busbw))
    if out.out_of_bounds is not None:
        metrics.append(_metric("out_of_bounds", out.out_of_bounds))
    if out.ranks:
        metrics.append(_metric("ranks", len({rank for rank, _ in out.ranks})))
        metrics.append(_metric("nodes", len({host for _, host in out.ranks})))
    metrics += [
        _metric("transport_connections", count, {"transport": str(t)})
        for t, count in sorted(out.transports.items(), key=lambda item: str(item[0]))
    ]
    return metrics


def _transport_problem(expected: Transport, seen: Counter[Transport]) -> str:
    """Why the connections NCCL reported do not match the expectation ("" when they do)."""
    between = expected.kind == "NET"
    where = "between nodes" if between else "within nodes"
    relevant = {t: n for t, n in seen.items() if (t.kind == "NET") == between and t.kind != "COLLNET"}
    if not seen:
        return (
            f"expected {expected.shown()} {where}, but the output holds none of NCCL's transport lines"
            " (NCCL_DEBUG=INFO not set, or NCCL failed before connecting)"
        )
    if not relevant:
        reason = "a single-node run?" if between else "one GPU per node?"
        return f"expected {expected.shown()} {where}, but NCCL reported no connection {where} ({reason})"
    wrong = {t: n for t, n in relevant.items() if not expected.matches(t)}
    if not wrong:
        return ""
    total = sum(relevant.values())
    got = ", ".join(
        f"{t} on {n} of {total} connections" for t, n in sorted(wrong.items(), key=lambda i: (-i[1], str(i[0])))
    )
    hint = _hint(expected, list(wrong))
    return f"expected {expected.shown()} {where}, got {got}" + (f" ({hint})" if hint else "")


def _hint(expected: Transport, got: list[Transport]) -> str:
    if expected.kind == "NET" and expected.detail.lower() == "ib" and any(t.detail == "Socket" for t in got):
        return "NCCL_IB_DISABLE=1, or no usable HCA in NCCL_IB_HCA?"
    if expected.gdrdma and any(t.kind == "NET" and _same_detail(expected.detail, t.detail) for t in got):
        return "GPUDirect RDMA not used: nvidia-peermem not loaded, or NCCL_NET_GDR_LEVEL too low?"
    if expected.kind == "P2P" and any(t.kind == "SHM" for t in got):
        return "NCCL_P2P_DISABLE=1, or peer-to-peer not available between these GPUs?"
    return ""


_INVALID_CHOICE = re.compile(r"invalid (?:type|op) \S+, defaulting to \S+")


@register
class NcclTests(Benchmark):
    uses_mpi = True
    kind = "nccl"
    description = "NVIDIA nccl-tests: collective bandwidth across GPUs and nodes, under mpirun"
    metrics = METRICS
    # Both need a finished run: the average is the table's last line, the maximum needs at least one row.
    required_metrics = ("busbw_avg_gbps", "busbw_max_gbps")
    headline = ("busbw_avg_gbps", "busbw_max_gbps")
    # No version_argv: nccl-tests has no version option (recent ones print '# nccl-tests version' in their output).

    def validate(self, params: dict[str, Any]) -> None:
        config(params)

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        """On the primary host: mpirun starting one rank per GPU (per gpus_per_rank GPUs) on every host; pairwise,
        the helper running one such mpirun per pair, round by round."""
        cfg, p = config(params), pair_params(params)
        if not host.is_primary:
            return None
        options = options_from_params(params, _debug_env(cfg.expect_transport, host.env))
        hosts = host.hosts if options.slots else _rank_hosts(host.hosts, cfg.gpus_per_rank)
        if p["topology"] == "all":
            return HostCommand(argv=mpirun_argv(hosts, cfg.rank_argv(), options))
        rounds = LOCALISER.rounds(p["topology"], [h.name for h in hosts], p)
        launches = [
            [{"nodes": [hosts[a].name, hosts[b].name], "argv": mpirun_argv((hosts[a], hosts[b]), cfg.rank_argv(),
                                                                           options)} for a, b in pairs]
            for pairs in rounds
        ]  # fmt: skip
        plan = {"timeout": p["pair_timeout"], "rounds": launches}
        return HostCommand(
            argv=["python3", PAIRS_HELPER, PAIRS_PLAN],
            files={PAIRS_HELPER: PAIRS_HELPER_SCRIPT, PAIRS_PLAN: json.dumps(plan, indent=1) + "\n"},
        )

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """The whole run's metrics (host=""): mpirun gathers every rank's output on the primary host. Pairwise,
        every pair's metrics on both of its nodes (``pair_metrics``)."""
        if _PAIR_HEADER.search(text):
            return pair_metrics(text, "nccl-tests")
        return self.parse_one(text)

    def parse_one(self, text: str) -> list[Metric]:
        """The metrics (host="") of one nccl-tests output."""
        out = read_output(text)
        duplicated = [rank for rank, n in Counter(rank for rank, _ in out.ranks).items() if n > 1]
        if duplicated or out.tables > 1:
            which = f"rank {duplicated[0]} is listed twice" if duplicated else f"{out.tables} result tables"
            raise ParseError(
                f"nccl-tests printed its device list or results more than once ({which}): every MPI process ran a "
                "test of its own, so nccl-tests was built without MPI support (make MPI=1)"
            )
        if not out.tables and out.avg_busbw is None:
            reason = f": {out.failure}" if out.failure else " (no '#  size  count  type ...' table header)"
            raise ParseError(f"no nccl-tests results in the output{reason}")
        return _output_metrics(out)

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Pairwise runs: the pairs' aggregate (``pair_aggregate``); a run across every host has none (its metrics
        are the run's already)."""
        return pair_aggregate(per_host)

    def follow_up(self, params: dict[str, Any], metrics: list[Metric]) -> dict[str, Any] | None:
        """two_pass: after pass 1, the parameters of pass 2 (each suspect with a known-good partner), or None."""
        return LOCALISER.follow_up(params, pair_params(params), pair_flows(metrics))

    def pair_flows(self, metrics: list[Metric]) -> localise.Flows:
        return pair_flows(metrics)

    def pair_metric(self, params: dict[str, Any]) -> PairMetric | None:
        if pair_params(params)["topology"] == "all":
            return None
        return pair_metric(str(params.get("binary", DEFAULT_BINARY)))

    def second_pass_of(self, params: dict[str, Any]) -> localise.SecondPass | None:
        return LOCALISER.second_pass(pair_params(params))

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        """The run's metrics are the primary host's aggregate (host=""), whichever hosts ran."""
        found = {m.name for m in metrics if m.host == ""}
        reasons = {
            "busbw_avg_gbps": "nccl-tests did not finish (its last line, '# Avg bus bandwidth', is missing)",
            "busbw_max_gbps": "nccl-tests printed no result rows",
        }
        return [
            f"{reasons[name]}: expected metric {name} is missing" for name in self.required_metrics if name not in found
        ]

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        problems: list[str] = []
        total = {m.name: m.value for m in metrics if m.host == "" and not m.labels}
        if total.get("wrong", 0) > 0:
            sizes = sorted({m.labels["size_bytes"] for m in metrics if m.name == "wrong" and "size_bytes" in m.labels
                            and m.value > 0})  # fmt: skip
            problems.append(
                f"nccl-tests found {total['wrong']:g} wrong elements (data corruption) at message sizes "
                f"{', '.join(map(str, sizes))} bytes"
            )
        if total.get("out_of_bounds", 0) > 0:
            problems.append(f"nccl-tests reported {total['out_of_bounds']:g} out-of-bounds results (FAILED)")
        lines = [line for text in logs.values() for line, _ in _logical_lines(text)]
        problems += [f"nccl-tests ignored a parameter: {m.group()}" for m in map(_INVALID_CHOICE.search, lines) if m]
        expected = config(params).expect_transport
        if expected is not None:
            problem = _transport_problem(expected, transports(lines))
            if problem:
                problems.append(problem)
        return problems


# --- pairwise runs ------------------------------------------------------------------------------------------------


def pair_metrics(text: str, tool: str) -> list[Metric]:
    """Each pair's table (after its ``#rackbench-pair`` line) read by the nccl-tests parser, its metrics on both of
    its nodes labelled with the other one and the round; ParseError naming the pair when a pair's table (with its
    launch's exit status, where the header gives it), or the ``#rackbench-pairs`` end, is missing."""
    text = text.replace("\r\n", "\n")
    footer = _PAIRS_FOOTER.search(text)
    if footer is None:
        pairs = len(_PAIR_HEADER.findall(text))
        raise ParseError(f"{tool} ended before every pair had run ({pairs} pair table(s) printed)")
    metrics: list[Metric] = []
    sections = header_sections(text, PAIR_PREFIX, end=footer.start())
    for header, table in sections:
        try:
            number, (a, b) = int(header["round"]), [str(n) for n in header["nodes"]]
        except (ValueError, KeyError, TypeError):
            raise ParseError(f"unreadable rackbench-pair line: {json.dumps(header)[:200]!r}") from None
        try:
            found = NcclTests().parse_one(table)
        except ParseError as exc:
            code, said = header.get("exit_code"), str(header.get("stderr", "")).strip()
            status = f" (exit status {code})" if code else ""
            tail = f"; its stderr ends: {said[-300:]!r}" if said else ""
            raise ParseError(f"pair {a}-{b}: {exc}{status}{tail}") from None
        for node, peer in ((a, b), (b, a)):
            metrics += [
                Metric(m.name, m.value, m.unit, host=node, labels={**m.labels, "peer": peer, "round": number})
                for m in found
            ]
    try:
        expected = int(json.loads(footer.group(1))["pairs"])
    except (ValueError, KeyError, TypeError):
        raise ParseError(f"unreadable rackbench-pairs line: {footer.group(0)[:200]!r}") from None
    if expected != len(sections):
        raise ParseError(f"{tool} ran {expected} pairs but printed {len(sections)} pair tables")
    return metrics


def pair_metric(test: str) -> PairMetric:
    """The link matrix of a pairwise run of ``test`` (a collective), symmetric: a pair's value is on both nodes."""
    return PairMetric(PAIR_METRIC, _UNITS[PAIR_METRIC], True, f"bus bandwidth of the pair's 2-node {test}, the "
                      "highest over message sizes (busbw_max)", rows="node", columns="peer",
                      symmetric=True)  # fmt: skip


def pair_flows(metrics: list[Metric]) -> localise.Flows:
    """{(node, peer): busbw_max_gbps} of every pair in a run's per-host metrics."""
    return {
        (m.host, str(m.labels["peer"])): m.value
        for m in metrics
        if m.name == PAIR_METRIC and m.host and "peer" in m.labels
    }


def pair_aggregate(per_host: list[Metric]) -> list[Metric]:
    """Pairwise runs: the median pair's busbw_avg_gbps/busbw_max_gbps, the wrong elements and out-of-bounds values
    of every pair, and the ranks of one test (the median pair's; 2 where the output lists no ranks); each pair
    counted once (its metrics are on both of its nodes)."""
    per_pair: dict[tuple[str, str, Any], dict[str, float]] = {}
    for m in per_host:
        if m.host and "peer" in m.labels and not set(m.labels) - {"peer", "round"} and m.host < m.labels["peer"]:
            per_pair.setdefault((m.host, str(m.labels["peer"]), m.labels.get("round")), {})[m.name] = m.value
    if not per_pair:
        return []
    out = [
        _metric(name, statistics.median(found))
        for name in ("busbw_avg_gbps", "busbw_max_gbps")
        if (found := [pair[name] for pair in per_pair.values() if name in pair])
    ]
    out.append(_metric("wrong", sum(pair.get("wrong", 0) for pair in per_pair.values())))
    if any("out_of_bounds" in pair for pair in per_pair.values()):
        out.append(_metric("out_of_bounds", sum(pair.get("out_of_bounds", 0) for pair in per_pair.values())))
    ranks = [pair["ranks"] for pair in per_pair.values() if "ranks" in pair]
    return [*out, _metric("ranks", statistics.median(ranks) if ranks else 2)]
