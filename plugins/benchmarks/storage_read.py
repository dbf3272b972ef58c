"""storage_read plug-in: rackbench's storage-only read benchmark (seed 000's "TensorFlow Storage Benchmark").

Every MPI rank reads record files batch by batch and reports its throughput (plugins/tools/storage_read.py),
ranks spread over the campaign's mount points by plugins/tools/round_robin_mpi.py. build() ships both programs
as files of the run directory (their source text, read when the command is built) and, on the primary host only,
runs::

    mpirun ... python3 round_robin_mpi.py --dirs <mount points, or the data_dir> -- \\
        python3 storage_read.py --dir {data_dir}[/<subdir>] --format file --batch-size 64 --duration 60 ...

With more than one host, ``--preload-files`` has mpirun copy the two programs into the working directory of the
other hosts' ranks (the runner writes files on the primary only).

Parameters: ``subdir`` (relative path of the dataset inside every data directory), ``pattern`` (glob of the
record files, default ``*``), ``format`` (``file``: a record is a file; ``tfrecord``: a record is one TFRecord
entry), ``batch_size`` (default 64), ``duration`` (seconds, default 60) or ``batches``, ``create_files`` with
``record_size`` (bytes, or a number with k, m or g) and ``records_per_file`` (write a synthetic dataset first;
each rank writes its share and reuses files already there), ``drop_cache`` (default true: drop this node's
cached pages of the files before reading), ``sync`` (keep the ranks in step after every batch, as synchronous
training does; rank 0 listens on ``sync_port``, default 29400, of the first host), ``interval`` (seconds between
progress lines, default 10), ``round_robin_by`` (``global`` or ``local`` rank), ``python`` (default ``python3``)
and the launch's ``mpi_*`` parameters.

With ``create_files``, ``layout`` runs the same ranks with ``--create-only`` before the cache flush: the dataset is
written (or kept, when already there) before the flush, and the measured run only reads.

Metrics: per rank (host: the primary, whose output holds every rank's lines; labels {"rank": r}):
``read_mb_per_sec`` (MB/s, 10^6 bytes), ``records_per_sec``, ``read_bytes`` and ``sync_wait_s``. For the run
(host "", labels {}): ``read_mb_per_sec`` and ``records_per_sec``, sums over the ranks; ``read_bytes``;
``ranks``; ``read_mb_per_sec_per_rank`` (the mean) and ``read_mb_per_sec_slowest_rank`` (the minimum: in
synchronous mode every rank waits for it). A run fails when a rank printed no summary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from common import parameters
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
from plugins.launchers.mpi import MPI_PARAMS, mpirun_argv, options_from_params

TOOLS = Path(__file__).resolve().parent.parent / "tools"
READER = "storage_read.py"
SPREADER = "round_robin_mpi.py"
TOOL = "rackbench-storage-read"  # the "tool" field of storage_read.py's JSON lines
TOKEN = "{data_dir}"  # round_robin_mpi.py's placeholder
FORMATS = ("file", "tfrecord")
KNOWN = frozenset(
    {
        "subdir",
        "pattern",
        "format",
        "batch_size",
        "duration",
        "batches",
        "create_files",
        "record_size",
        "records_per_file",
        "drop_cache",
        "sync",
        "sync_port",
        "interval",
        "round_robin_by",
        "python",
    }
)
PATTERN = re.compile(r"[A-Za-z0-9._*?\[\]/-]{1,256}")
SUBDIR = re.compile(r"[A-Za-z0-9._/-]{1,1024}")
PROGRAM = re.compile(r"[A-Za-z0-9_.+/-]{1,255}")
MAX_RECORD = 1 << 32
_RECORD_SIZE = parameters.size(1, MAX_RECORD, units="kmg")

METRICS = (
    MetricSpec("read_mb_per_sec", "MB/s", True, "read throughput (10^6 bytes/s): per rank, and summed over ranks"),
    MetricSpec("records_per_sec", "records/s", True, "records read per second: per rank, and summed over ranks"),
    MetricSpec("read_bytes", "B", True, "bytes read"),
    MetricSpec("sync_wait_s", "s", False, "time a rank waited for the others (sync mode)"),
    MetricSpec("ranks", "ranks", True, "ranks that reported"),
    MetricSpec("read_mb_per_sec_per_rank", "MB/s", True, "mean read throughput of one rank"),
    MetricSpec("read_mb_per_sec_slowest_rank", "MB/s", True, "read throughput of the slowest rank"),
)
_UNITS = {spec.name: spec.unit for spec in METRICS}


# --- parameters -------------------------------------------------------------------------------------------------


def _number(params: dict[str, Any], name: str, low: float, high: float, *, whole: bool = True) -> Any:
    value = params.get(name)
    if value is None:
        return None
    check = parameters.integer(int(low), int(high)) if whole else parameters.number(low, high)
    return parameters.checked(name, check, value)


def _flag(params: dict[str, Any], name: str, default: bool) -> bool:
    return bool(parameters.checked(name, parameters.boolean, params.get(name, default)))


def _matching(params: dict[str, Any], name: str, regex: re.Pattern[str], default: str, what: str) -> str:
    value = params.get(name, default)
    if not isinstance(value, str) or not regex.fullmatch(value) or value.startswith("-"):
        raise ParamError(name, f"must be {what}, got {value!r}")
    return value


def _relative(params: dict[str, Any], name: str, regex: re.Pattern[str], default: str, what: str) -> str:
    value = _matching(params, name, regex, default, what)
    if value.startswith("/") or ".." in value.split("/"):
        raise ParamError(name, "must be a relative path inside the data directory (no leading '/', no '..')")
    return value


def _record_size(params: dict[str, Any]) -> int | None:
    value = params.get("record_size")
    return None if value is None else parameters.size_bytes(parameters.checked("record_size", _RECORD_SIZE, value))


def _directories(host: HostContext) -> list[str]:
    dirs = list(host.mounts) or [host.data_dir]
    for d in dirs:
        if not d.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in d):
            raise ParamError("mounts", f"data directories must be absolute paths, got {d!r}")
    return dirs


def reader_args(params: dict[str, Any]) -> list[str]:
    """storage_read.py's arguments after ``--dir``; raises ParamError naming the first bad parameter."""
    for key in params:
        if key not in KNOWN and key not in MPI_PARAMS:
            raise ParamError(str(key), "unknown storage_read parameter")
    _flag(params, "mpi_tag_output", False)
    fmt = params.get("format", "file")
    if fmt not in FORMATS:
        raise ParamError("format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
    pattern = _relative(params, "pattern", PATTERN, "*", "a glob of letters, digits and '._*?[]/-'")
    args = ["--pattern", pattern, "--format", fmt, "--batch-size", str(_number(params, "batch_size", 1, 10**6) or 64)]
    duration = _number(params, "duration", 1, 86_400, whole=False)
    batches = _number(params, "batches", 1, 10**9)
    if duration is not None and batches is not None:
        raise ParamError("batches", "cannot be combined with duration")
    args += ["--batches", str(batches)] if batches is not None else ["--duration", f"{duration or 60:g}"]
    create = _number(params, "create_files", 1, 10**8)
    size = _record_size(params)
    per_file = _number(params, "records_per_file", 1, 10**6)
    if create is not None:
        if size is None:
            raise ParamError("record_size", "is required with create_files")
        args += ["--create", str(create), "--record-size", str(size)]
        if per_file is not None:
            args += ["--records-per-file", str(per_file)]
    elif size is not None or per_file is not None:
        raise ParamError("record_size" if size is not None else "records_per_file", "only applies with create_files")
    if _flag(params, "drop_cache", True):
        args.append("--drop-cache")
    interval = _number(params, "interval", 0, 3600, whole=False)
    return [*args, "--interval", f"{10 if interval is None else interval:g}"]


def _data_dir_arg(params: dict[str, Any]) -> str:
    if params.get("subdir") is None:
        return TOKEN
    return f"{TOKEN}/{_relative(params, 'subdir', SUBDIR, '', 'a path of letters, digits and ._/-')}"


def _programs(params: dict[str, Any]) -> tuple[str, str]:
    python = _matching(params, "python", PROGRAM, "python3", "a program name or path (letters, digits, '._+/-')")
    by = params.get("round_robin_by", "global")
    if by not in ("global", "local"):
        raise ParamError("round_robin_by", f"must be global or local, got {by!r}")
    return python, by


def _sync(params: dict[str, Any], host: HostContext | None) -> list[str]:
    port = _number(params, "sync_port", 1024, 65535) or 29400
    if not _flag(params, "sync", False) or host is None:
        return []
    if not host.hosts:
        raise ParamError("nodes", "sync needs the run's host list")
    return ["--sync", f"{host.hosts[0].address}:{port}"]


def _source(name: str) -> str:
    return (TOOLS / name).read_text(encoding="utf-8")


# --- output -----------------------------------------------------------------------------------------------------


SUMMARY_START = re.compile(r'\{"type": "summary"')


def summaries(text: str) -> dict[int, dict[str, Any]]:
    """Rank -> its summary (a JSON object, wherever it starts: behind mpirun --tag-output's prefix, or after
    another rank's output that mpirun forwarded without its newline)."""
    found: dict[int, dict[str, Any]] = {}
    decoder = json.JSONDecoder()
    for match in SUMMARY_START.finditer(text):
        try:
            doc, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("tool") == TOOL:
            rank = doc.get("rank")
            if isinstance(rank, int) and not isinstance(rank, bool):
                found[rank] = doc
    return found


def _value(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParseError(f"rank {doc.get('rank')}: summary has no number {key!r}")
    return float(value)


def parse_summaries(text: str, host: str) -> list[Metric]:
    ranks = summaries(text)
    if not ranks:
        raise ParseError("no storage_read summary line found: the benchmark did not finish on any rank")
    size = max(int(_value(doc, "size")) for doc in ranks.values())
    if len(ranks) < size:
        absent = sorted(set(range(size)) - set(ranks))
        raise ParseError(f"only {len(ranks)} of {size} ranks printed a summary (missing: {absent[:10]})")

    def metric(name: str, value: float, where: str, labels: dict[str, Any]) -> Metric:
        return Metric(name=name, value=value, unit=_UNITS[name], host=where, labels=labels)

    out: list[Metric] = []
    rates = []
    for rank, doc in sorted(ranks.items()):
        labels = {"rank": rank}
        rate = _value(doc, "mb_per_sec")
        rates.append(rate)
        out += [
            metric("read_mb_per_sec", rate, host, labels),
            metric("records_per_sec", _value(doc, "records_per_sec"), host, dict(labels)),
            metric("read_bytes", _value(doc, "bytes"), host, dict(labels)),
            metric("sync_wait_s", _value(doc, "sync_wait_seconds"), host, dict(labels)),
        ]
    docs = ranks.values()
    return out + [
        metric("read_mb_per_sec", sum(rates), "", {}),
        metric("records_per_sec", sum(_value(d, "records_per_sec") for d in docs), "", {}),
        metric("read_bytes", sum(_value(d, "bytes") for d in docs), "", {}),
        metric("ranks", float(len(ranks)), "", {}),
        metric("read_mb_per_sec_per_rank", sum(rates) / len(rates), "", {}),
        metric("read_mb_per_sec_slowest_rank", min(rates), "", {}),
    ]


def _command(params: dict[str, Any], host: HostContext, args: list[str]) -> HostCommand | None:
    """mpirun of the spreader and the reader with ``args``, from the primary host (None on the others)."""
    python, by = _programs(params)
    rank_argv = [python, SPREADER, "--by", by, "--dirs", *_directories(host), "--",
                 python, READER, "--dir", _data_dir_arg(params), *args]  # fmt: skip
    if not host.is_primary:
        return None
    argv = mpirun_argv(host.hosts, rank_argv, options_from_params(params, host.env))
    if len(host.hosts) > 1:
        argv[1:1] = ["--preload-files", f"{SPREADER},{READER}"]
    return HostCommand(argv=argv, files={SPREADER: _source(SPREADER), READER: _source(READER)})


@register
class StorageRead(Benchmark):
    kind = "storage_read"
    description = "Storage-only read benchmark: MPI ranks read record files batch by batch (seed 000)"
    metrics = METRICS
    version_argv = ["python3", "--version"]
    uses_mpi = True

    def validate(self, params: dict[str, Any]) -> None:
        reader_args(params)
        _data_dir_arg(params)
        _programs(params)
        _sync(params, None)
        options_from_params(params, {})

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        return _command(params, host, reader_args(params) + _sync(params, host))

    def layout(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        """With ``create_files``: the same ranks write their share of the dataset (``--create-only``) before the
        cache flush, so that the measured run reads what no cache just received; files already there are kept."""
        args = reader_args(params)
        return _command(params, host, [*args, "--create-only"]) if "--create" in args else None

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        return parse_summaries(text, host)

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        if any(m.host == "" and m.name == "read_mb_per_sec" for m in metrics):
            return []
        return ["expected metric read_mb_per_sec for the run (the sum over ranks) is missing"]
