"""IOR plug-in: parallel file-system bandwidth under mpirun (``mpirun ... ior -a POSIX -t 1m -b 16m -F -C -i 3``).

The primary host runs mpirun across every host of the run; the others run nothing. Every parameter reaches IOR
as its own argv element, after an allowlist check.

Parameters: ``api`` (-a: POSIX or MPIIO, default POSIX), ``transfer_size`` (-t, default 1m) and
``block_size`` (-b, default 16m; bytes as a number, or a number with k, m, g or t; the block size must be a
multiple of the transfer size), ``segments`` (-s), ``file_per_proc`` (-F), ``reorder`` (-C: read what another
node wrote, defeating the client cache), ``fsync`` (-e), ``keep_file`` (-k), ``write`` (-w) and ``read`` (-r)
(when neither is given both run, as in IOR itself), ``iterations`` (-i, default 3), ``test_file`` (-o, default
``<data_dir>/ior-testfile``), ``binary`` (default ``ior``; IOR 2.x installs ``IOR``) and the launch's ``mpi_*``
parameters (plugins.launchers.mpi).

Output: the summary IOR prints at the end, in both layouts its versions use. IOR 2.10 prints a "Summary:"
block and then ``Operation  Max (MiB)  Min (MiB)  Mean (MiB)  Std Dev  Max (OPs) ...``; IOR 3.0 and later print
"Summary of all tests:" and ``Operation   Max(MiB)   Min(MiB)  Mean(MiB)     StdDev   Max(OPs) ...`` (3.0 has no
OPs columns). Columns are found by their header names. Until 3.3, IOR also prints ``Max Write: 123.45 MiB/sec
(129.45 MB/sec)`` lines; they are used only when no summary table is there. An output holding several tests
(an IOR script) gives the first test's row for each operation: rackbench runs one test per run.

Metrics, all for the whole run (host "", labels {}), for ``write`` and ``read`` when that operation ran:

- ``<op>_bw_mib_s``: mean bandwidth over the iterations (MiB/s, higher is better), the headline number;
- ``<op>_bw_mib_s_max``, ``<op>_bw_mib_s_min`` (MiB/s) and ``<op>_bw_mib_s_stdev`` (MiB/s, lower is better);
- ``<op>_ops`` and ``<op>_ops_max``: transfers per second, mean and max (ops/s), where IOR prints them;
- ``<op>_time_s``: mean time of one iteration (s, lower is better).

Statistics are separate metric names, not labels, for the reason given in plugins.benchmarks.mdtest. A run fails
when no summary is found (IOR failed or was interrupted: the ParseError quotes IOR's ERROR line) and when an
operation its parameters ask for has no mean bandwidth (check()).
"""

from __future__ import annotations

import math
import re
from typing import Any

from common import parameters
from plugins.benchmarks.base import (
    Metric,
    MetricSpec,
    ParamError,
    ParseError,
    register,
)
from plugins.launchers.mpi import MPI_PARAMS, MpiToolBenchmark

OPERATIONS = ("write", "read")
APIS = ("POSIX", "MPIIO")
FLAGS = {"file_per_proc": "-F", "reorder": "-C", "fsync": "-e", "keep_file": "-k"}
KNOWN = frozenset(
    {"api", "transfer_size", "block_size", "segments", "iterations", "test_file", "binary", "read", "write", *FLAGS}
)
BINARY = re.compile(r"[A-Za-z0-9_.+/-]{1,255}")
DEFAULT_TRANSFER = "1m"
DEFAULT_BLOCK = "16m"
TEST_FILE = "ior-testfile"

# (metric-name suffix, summary column, unit, higher is better, description)
COLUMNS = (
    ("_bw_mib_s", "Mean(MiB)", "MiB/s", True, "mean bandwidth over iterations"),
    ("_bw_mib_s_max", "Max(MiB)", "MiB/s", True, "maximum bandwidth over iterations"),
    ("_bw_mib_s_min", "Min(MiB)", "MiB/s", True, "minimum bandwidth over iterations"),
    ("_bw_mib_s_stdev", "StdDev(MiB)", "MiB/s", False, "std dev of bandwidth over iterations"),
    ("_ops", "Mean(OPs)", "ops/s", True, "mean transfers per second over iterations"),
    ("_ops_max", "Max(OPs)", "ops/s", True, "maximum transfers per second over iterations"),
    ("_time_s", "Mean(s)", "s", False, "mean time of one iteration"),
)
METRICS = tuple(
    MetricSpec(f"{op}{suffix}", unit, higher, f"IOR {op}: {what}")
    for op in OPERATIONS
    for suffix, _, unit, higher, what in COLUMNS
)
_UNITS = {spec.name: spec.unit for spec in METRICS}


# --- parameters -------------------------------------------------------------------------------------------------


def _count(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    value = params.get(name)
    return None if value is None else parameters.checked(name, parameters.integer(low, high), value)


def _flag(params: dict[str, Any], name: str) -> bool | None:
    value = params.get(name)
    return None if value is None else parameters.checked(name, parameters.boolean, value)


_SIZE = parameters.size(1, 2**50, units="kmgt")


def _size(params: dict[str, Any], name: str, default: str) -> tuple[str, int]:
    """(the size as IOR is given it, in bytes)."""
    text = parameters.checked(name, _SIZE, params.get(name, default))
    return text, parameters.size_bytes(text)


def _test_file(params: dict[str, Any], data_dir: str) -> str:
    value = params.get("test_file", f"{data_dir.rstrip('/')}/{TEST_FILE}")
    if not isinstance(value, str) or not value.startswith("/") or value.endswith("/"):
        raise ParamError("test_file", f"must be the absolute path of a file, got {value!r}")
    if len(value) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ParamError("test_file", "must be at most 4096 characters, without control characters")
    return value


def operations(params: dict[str, Any]) -> list[str]:
    """The operations a run does: those asked for, or both when neither read nor write is given (IOR's default)."""
    write, read = _flag(params, "write"), _flag(params, "read")
    if write is None and read is None:
        return list(OPERATIONS)
    chosen = [op for op, on in (("write", write), ("read", read)) if on]
    if not chosen:
        raise ParamError("write", "write and read cannot both be false")
    return chosen


def rank_argv(params: dict[str, Any], data_dir: str) -> list[str]:
    """What every rank runs: IOR and its arguments; raises ParamError naming the first bad parameter."""
    for key in params:
        if key not in KNOWN and key not in MPI_PARAMS:
            raise ParamError(str(key), "unknown IOR parameter")
    binary = params.get("binary", "ior")
    if not isinstance(binary, str) or not BINARY.fullmatch(binary) or binary.startswith("-"):
        raise ParamError("binary", f"must be a program name or path (letters, digits, '._+/-'), got {binary!r}")
    api = parameters.checked("api", parameters.choice(*APIS), params.get("api", "POSIX"))
    transfer, transfer_bytes = _size(params, "transfer_size", DEFAULT_TRANSFER)
    block, block_bytes = _size(params, "block_size", DEFAULT_BLOCK)
    if block_bytes % transfer_bytes:
        raise ParamError("block_size", f"must be a multiple of transfer_size ({transfer}), got {block}")
    _flag(params, "mpi_tag_output")
    argv = [binary, "-a", api, "-t", transfer, "-b", block]
    segments = _count(params, "segments", 1, 10**9)
    if segments is not None:
        argv += ["-s", str(segments)]
    argv += ["-i", str(_count(params, "iterations", 1, 1000) or 3)]
    argv += [option for name, option in FLAGS.items() if _flag(params, name)]
    argv += [{"write": "-w", "read": "-r"}[op] for op in operations(params)]
    return [*argv, "-o", _test_file(params, data_dir)]


# --- output -----------------------------------------------------------------------------------------------------

TAG_PREFIX = re.compile(
    r"^\[\d+,\d+\]<std(?:out|err)>: ?", re.MULTILINE
)  # some Open MPI versions put a blank after the tag
HEADER = re.compile(r"^Operation\s+Max\s*\(MiB\)", re.MULTILINE)
MAX_LINE = re.compile(r"^Max (Write|Read):\s+([0-9.]+) MiB/sec", re.MULTILINE)
FAILURE = re.compile(r"^.*\b(?:ERROR|Error)\b.*$", re.MULTILINE)


def clean(text: str) -> str:
    """Output as IOR wrote it: without carriage returns (a pseudo-terminal's CRLF) and mpirun --tag-output."""
    return TAG_PREFIX.sub("", text.replace("\r", ""))


def _column_names(header: str) -> list[str]:
    """Header names without their inner blanks (IOR 2.10's "Max (MiB)", "Std Dev"); a StdDev column is named
    after the statistic before it, StdDev(MiB) or StdDev(OPs)."""
    squeezed = re.sub(r"\s+\(", "(", header.replace("Std Dev", "StdDev"))
    names: list[str] = []
    for name in squeezed.split():
        if name == "StdDev" and names:
            name = "StdDev(OPs)" if names[-1].endswith("(OPs)") else "StdDev(MiB)"
        names.append(name)
    return names


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _summary_rows(text: str) -> dict[str, dict[str, float]]:
    """Operation -> column -> value, from the first summary table."""
    match = HEADER.search(text)
    if match is None:
        return {}
    lines = text[match.start() :].split("\n")
    names = _column_names(lines[0])
    rows: dict[str, dict[str, float]] = {}
    for line in lines[1:]:
        tokens = line.split()
        if tokens and set(tokens[0]) == {"-"}:
            continue  # IOR 2.10's dashed line under the header
        if not tokens or tokens[0] not in OPERATIONS:
            break
        if tokens[0] in rows:
            continue  # a later test of an IOR script
        values = {name: _number(token) for name, token in zip(names[1:], tokens[1:], strict=False)}
        rows[tokens[0]] = {name: value for name, value in values.items() if value is not None}
    return rows


def parse_summary(text: str) -> list[Metric]:
    text = clean(text)
    rows = _summary_rows(text)
    metrics: list[Metric] = []
    for op in OPERATIONS:
        row = rows.get(op, {})
        for suffix, column, _, _, _ in COLUMNS:
            if column in row:
                name = f"{op}{suffix}"
                metrics.append(Metric(name=name, value=row[column], unit=_UNITS[name], host=""))
    if not rows:
        for match in MAX_LINE.finditer(text):
            name = f"{match.group(1).lower()}_bw_mib_s_max"
            metrics.append(Metric(name=name, value=float(match.group(2)), unit=_UNITS[name], host=""))
    if not metrics:
        failure = FAILURE.search(text)
        said = f" (it said: {failure.group(0).strip()[:200]})" if failure else ""
        raise ParseError(f"no IOR summary found: IOR did not finish{said}")
    return metrics


@register
class Ior(MpiToolBenchmark):
    kind = "ior"
    description = "IOR: parallel file-system read and write bandwidth across MPI ranks"
    metrics = METRICS
    version_argv = ["sh", "-c", "command -v ior"]  # IOR has no version option; its output's first line names it

    metric_suffix = "_bw_mib_s"
    summary_name = "IOR's mean write or read bandwidth"

    def rank_argv(self, params: dict[str, Any], data_dir: str) -> list[str]:
        return rank_argv(params, data_dir=data_dir)

    def summary(self, text: str) -> list[Metric]:
        return parse_summary(text)

    def operations(self, params: dict[str, Any]) -> list[str]:
        return operations(params)

    def not_printed(self, operation: str) -> str:
        return f"IOR printed no {operation} summary"
