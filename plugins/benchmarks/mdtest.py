"""mdtest plug-in: file-system metadata rates (create, stat, read, remove) under mpirun (seeds 002 and 003).

The primary host runs ``mpirun ... mdtest -n 10000 -i 3 -u -d <directory>`` across every host of the run; the
others run nothing. Every parameter reaches mdtest as its own argv element, after an allowlist check.

Parameters: ``files_per_rank`` (-n, default 1000) or ``items_per_dir`` (-I), ``iterations`` (-i, default 3),
``unique_dir`` (-u, default true), ``directory`` (-d, default the host's data_dir; absolute, without '@', which
mdtest reads as a list of directories), ``write_bytes`` (-w), ``read_bytes`` (-e), ``depth`` (-z),
``branching`` (-b), ``leaf_only`` (-L), ``files_only`` (-F), ``dirs_only`` (-D), ``phases`` (a subset of
create/stat/read/remove: -C/-T/-E/-r; all phases when absent), ``binary`` (default ``mdtest``) and the launch's
``mpi_*`` parameters (plugins.launchers.mpi).

Output: the SUMMARY table mdtest prints once at the end, in any of the layouts its versions use:
``SUMMARY (in ops/sec): (of N iterations)`` (1.8), ``SUMMARY: (of N iterations)`` (1.9),
``SUMMARY rate: (of N iterations)`` (IOR-bundled 3.x, 4.x; its rows lost their ':' in 4.0). A ``SUMMARY time``
table (``-P``) is ignored. Each row gives Max, Min, Mean and Std Dev over the iterations; with
``--show-rank-statistics`` more columns come first, so the last four are read.

Several tests in one output (a script that ran mdtest four times into one log: a single directory, a unique
directory per process with -u, a single tree with -z, a tree per process with -u -z; or one command's table per
task count with -f/-l/-s): every table is read, its metrics labelled ``{"test": "single directory" | "unique
directory" | "single tree" | "tree per process"}`` (from its "Command line used" line) and, where one test printed
several tables, ``"tasks": N`` (from its "N tasks, M files/directories" line). One table alone keeps labels {}.

Metrics, all for the whole run (host "", labels {} for an output of one table): for each operation in the table
(``directory_creation``, ``directory_stat``, ``directory_rename``, ``directory_removal``, ``file_creation``,
``file_stat``, ``file_read``, ``file_removal``, ``tree_creation``, ``tree_removal``):

- ``<op>_ops_per_sec``: the mean over the iterations (ops/s, higher is better), the headline number;
- ``<op>_ops_per_sec_max`` and ``<op>_ops_per_sec_min`` (ops/s, higher is better);
- ``<op>_ops_per_sec_stdev`` (ops/s, lower is better).

The statistics are separate metric names rather than a ``stat`` label because a metric's name is what carries
its direction and what the campaign summary groups repetitions by; a label would put max and mean in one
group. A row whose Max, Min and Mean are all zero is a phase mdtest did not run (``-C`` alone prints zeros for
stat, read and removal) and gives no metric. A run fails when the table is missing (mdtest interrupted or
failed), and when an operation its parameters ask for has no rate (check()).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
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

OPERATIONS = {
    "Directory creation": "directory_creation",
    "Directory stat": "directory_stat",
    "Directory read": "directory_read",
    "Directory rename": "directory_rename",
    "Directory removal": "directory_removal",
    "File creation": "file_creation",
    "File stat": "file_stat",
    "File read": "file_read",
    "File removal": "file_removal",
    "Tree creation": "tree_creation",
    "Tree removal": "tree_removal",
}
STATISTICS = (("_max", True, "maximum"), ("_min", True, "minimum"), ("", True, "mean"), ("_stdev", False, "std dev"))
PHASES = {"create": "-C", "stat": "-T", "read": "-E", "remove": "-r"}
# What each phase measures, for files and for directories ("read" has no directory row).
PHASE_OPERATIONS = {
    "create": ("file_creation", "directory_creation"),
    "stat": ("file_stat", "directory_stat"),
    "read": ("file_read", None),
    "remove": ("file_removal", "directory_removal"),
}
MAX_COUNT = 10**9
MAX_BYTES = 1 << 40
BINARY = re.compile(r"[A-Za-z0-9_.+/-]{1,255}")


def _metric_specs() -> tuple[MetricSpec, ...]:
    specs = []
    for title, op in OPERATIONS.items():
        for suffix, higher, what in STATISTICS:
            specs.append(MetricSpec(f"{op}_ops_per_sec{suffix}", "ops/s", higher, f"{title}: {what} over iterations"))
    return tuple(specs)


METRICS = _metric_specs()
_UNITS = {spec.name: spec.unit for spec in METRICS}


# --- parameters -------------------------------------------------------------------------------------------------


def _count(params: dict[str, Any], name: str, low: int, high: int = MAX_COUNT) -> int | None:
    value = params.get(name)
    return None if value is None else parameters.checked(name, parameters.integer(low, high), value)


def _flag(params: dict[str, Any], name: str, default: bool = False) -> bool:
    return bool(parameters.checked(name, parameters.boolean, params.get(name, default)))


def _path(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ParamError(name, f"must be an absolute path, got {value!r}")
    if len(value) > 4096 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ParamError(name, "must be at most 4096 characters, without control characters")
    if "@" in value:
        raise ParamError(name, "must not contain '@' (mdtest reads it as a list of directories)")
    return value


def _binary(params: dict[str, Any], default: str) -> str:
    value = params.get("binary", default)
    if not isinstance(value, str) or not BINARY.fullmatch(value) or value.startswith("-"):
        raise ParamError("binary", f"must be a program name or path (letters, digits, '._+/-'), got {value!r}")
    return value


def _phases(params: dict[str, Any]) -> list[str]:
    value = params.get("phases")
    if value is None:
        return list(PHASES)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or any(p not in PHASES for p in value):
        raise ParamError("phases", f"must be a non-empty list of {', '.join(PHASES)}; got {value!r}")
    return [p for p in PHASES if p in value]


KNOWN = frozenset(
    {
        "files_per_rank",
        "items_per_dir",
        "iterations",
        "unique_dir",
        "directory",
        "write_bytes",
        "read_bytes",
        "depth",
        "branching",
        "leaf_only",
        "files_only",
        "dirs_only",
        "phases",
        "binary",
    }
)


def rank_argv(params: dict[str, Any], data_dir: str) -> list[str]:
    """What every rank runs: mdtest and its arguments; raises ParamError naming the first bad parameter."""
    for key in params:
        if key not in KNOWN and key not in MPI_PARAMS:
            raise ParamError(str(key), "unknown mdtest parameter")
    _flag(params, "mpi_tag_output")
    binary = _binary(params, "mdtest")
    files = _count(params, "files_per_rank", 1)
    per_dir = _count(params, "items_per_dir", 1)
    if files is not None and per_dir is not None:
        raise ParamError("items_per_dir", "cannot be combined with files_per_rank (mdtest takes -n or -I)")
    if _flag(params, "files_only") and _flag(params, "dirs_only"):
        raise ParamError("dirs_only", "cannot be combined with files_only")
    argv = [binary, *(["-I", str(per_dir)] if per_dir is not None else ["-n", str(files or 1000)])]
    argv += ["-i", str(_count(params, "iterations", 1, 1000) or 3)]
    if _flag(params, "unique_dir", default=True):
        argv.append("-u")
    for name, option, low, high in (
        ("write_bytes", "-w", 0, MAX_BYTES),
        ("read_bytes", "-e", 0, MAX_BYTES),
        ("depth", "-z", 0, 64),
        ("branching", "-b", 1, 1_000_000),
    ):
        value = _count(params, name, low, high)
        if value is not None:
            argv += [option, str(value)]
    for name, option in (("leaf_only", "-L"), ("files_only", "-F"), ("dirs_only", "-D")):
        if _flag(params, name):
            argv.append(option)
    phases = _phases(params)
    if len(phases) < len(PHASES):
        argv += [PHASES[p] for p in phases]
    directory = params.get("directory")
    argv += ["-d", _path(directory, "directory") if directory is not None else _path(data_dir, "directory")]
    return argv


def expected_operations(params: dict[str, Any]) -> list[str]:
    """The operations whose rates a run with these parameters must report."""
    files = not _flag(params, "dirs_only")
    dirs = not _flag(params, "files_only")
    wanted = []
    for phase in _phases(params):
        file_op, dir_op = PHASE_OPERATIONS[phase]
        if files:
            wanted.append(file_op)
        if dirs and dir_op:
            wanted.append(dir_op)
    return wanted


# --- output -----------------------------------------------------------------------------------------------------

TAG_PREFIX = re.compile(
    r"^\[\d+,\d+\]<std(?:out|err)>: ?", re.MULTILINE
)  # some Open MPI versions put a blank after the tag
SUMMARY = re.compile(r"^\s*SUMMARY([^:\n]*):\s*\(of (\d+) iterations?\)", re.MULTILINE)
ROW = re.compile(r"^\s*(Directory|File|Tree)\s+(creation|stat|read|rename|removal)\s*:?\s+(.*)$")
NUMBER = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$|^[-+]?(inf|nan)$", re.IGNORECASE)


def clean(text: str) -> str:
    """Output as mdtest wrote it: without carriage returns (a pseudo-terminal's CRLF) and mpirun --tag-output."""
    return TAG_PREFIX.sub("", text.replace("\r", ""))


def _rate_tables(text: str) -> list[list[str]]:
    """The lines of every rate table ("SUMMARY rate", "SUMMARY", "SUMMARY (in ops/sec)"; not "SUMMARY time")."""
    tables = []
    for match in SUMMARY.finditer(text):
        if match.group(1).strip().lower() not in ("", "rate", "(in ops/sec)"):
            continue
        lines = text[match.end() :].split("\n")[1:]
        rows = []
        for line in lines:
            if line.strip().startswith(("Operation", "---")):
                continue
            if not ROW.match(line):
                break
            rows.append(line)
        tables.append(rows)
    return tables


def _statistics(rest: str) -> tuple[float, float, float, float] | None:
    """(max, min, mean, stdev): the last four numbers of a row."""
    tokens = rest.split()
    if len(tokens) < 4 or not all(NUMBER.match(t) for t in tokens[-4:]):
        return None
    values = tuple(float(t) for t in tokens[-4:])
    if not all(math.isfinite(v) for v in values):
        return None
    return values[0], values[1], values[2], values[3]


FAILURE = re.compile(r"^.*\b(?:ERROR|Error)\b.*$", re.MULTILINE)


def _failure_hint(text: str) -> str:
    match = FAILURE.search(text)
    return f" (it said: {match.group(0).strip()[:200]})" if match else ""


COMMAND = re.compile(r"^Command line used: (.*)$", re.MULTILINE)
TASKS = re.compile(r"^(\d+) tasks, \d+ (?:files/directories|files|directories)\s*$", re.MULTILINE)


def test_name(command_line: str) -> str:
    """What an mdtest command measures, from its options: a single directory shared by every task, a unique
    directory per task (-u), a single tree (-z depth > 0) or a tree per task (-u with -z)."""
    try:
        tokens = shlex.split(command_line)
    except ValueError:
        tokens = command_line.split()
    unique = "-u" in tokens
    depth = tokens[tokens.index("-z") + 1] if "-z" in tokens[:-1] else "0"
    if depth.isdigit() and int(depth) > 0:
        return "tree per process" if unique else "single tree"
    return "unique directory" if unique else "single directory"


@dataclass(frozen=True)
class _Table:
    rows: list[str]
    test: str  # test_name() of the command that printed it ("" without a "Command line used" line)
    tasks: int | None  # the task count it is for ("96 tasks, 3072 files/directories")


def _tables(text: str) -> list[_Table]:
    """Every rate table, with the test (the mdtest command) and the task count it belongs to. Several mdtest
    commands may have written to one output (a script running the four classic tests one after the other), and one
    command prints a table per task count with -f/-l/-s."""
    commands = list(COMMAND.finditer(text))
    starts = [0] + [m.start() for m in commands[1:]] if commands else [0]
    found = []
    for i, start in enumerate(starts):
        section = text[start : starts[i + 1] if i + 1 < len(starts) else len(text)]
        test = test_name(commands[i].group(1)) if commands else ""
        for rows, table_at in _rate_tables_at(section):
            counts = [int(m.group(1)) for m in TASKS.finditer(section[:table_at])]
            found.append(_Table(rows, test, counts[-1] if counts else None))
    return found


def _rate_tables_at(text: str) -> list[tuple[list[str], int]]:
    return [(rows, at) for rows, at in zip(_rate_tables(text), _table_starts(text), strict=True)]


def _table_starts(text: str) -> list[int]:
    return [m.start() for m in SUMMARY.finditer(text) if m.group(1).strip().lower() in ("", "rate", "(in ops/sec)")]


def _labels(table: _Table, tables: list[_Table]) -> dict[str, Any]:
    """{} for the one table of a one-test output (the common case: a run of rackbench's own command); else the
    test and, where one test has several, the task count, so that no table's rates are lost or mixed up."""
    if len(tables) == 1:
        return {}
    labels: dict[str, Any] = {}
    tests = [t.test for t in tables]
    if len(set(tests)) > 1 or tests[0]:
        labels["test"] = table.test
    if sum(1 for t in tables if t.test == table.test) > 1:
        labels["tasks"] = table.tasks
    return labels


def parse_summary(text: str) -> list[Metric]:
    """The rates of every SUMMARY table: labelled {test: ..., tasks: ...} when the output holds several."""
    text = clean(text)
    tables = _tables(text)
    if not tables:
        raise ParseError(f"no mdtest SUMMARY rate table found: mdtest did not finish{_failure_hint(text)}")
    metrics: list[Metric] = []
    for table in tables:
        labels = _labels(table, tables)
        for line in table.rows:
            match = ROW.match(line)
            assert match is not None
            op = OPERATIONS[f"{match.group(1)} {match.group(2)}"]
            stats = _statistics(match.group(3))
            if stats is None or not any(stats[:3]):
                continue  # unreadable, or a phase mdtest did not run
            for (suffix, _, _), value in zip(STATISTICS, stats, strict=True):
                name = f"{op}_ops_per_sec{suffix}"
                metrics.append(Metric(name=name, value=value, unit=_UNITS[name], host="", labels=dict(labels)))
    if not metrics:
        raise ParseError("mdtest's SUMMARY table has no rates (every operation reads zero)")
    return metrics


@register
class Mdtest(MpiToolBenchmark):
    kind = "mdtest"
    description = "mdtest: file-system metadata operation rates across MPI ranks"
    metrics = METRICS
    version_argv = ["sh", "-c", "command -v mdtest"]  # mdtest has no version option; its output names it

    metric_suffix = "_ops_per_sec"
    summary_name = "mdtest's SUMMARY rates"

    def rank_argv(self, params: dict[str, Any], data_dir: str) -> list[str]:
        return rank_argv(params, data_dir=data_dir)

    def summary(self, text: str) -> list[Metric]:
        return parse_summary(text)

    def operations(self, params: dict[str, Any]) -> list[str]:
        return expected_operations(params)

    def not_printed(self, operation: str) -> str:
        return f"mdtest printed no {operation.replace('_', ' ')} rate"
