"""fio plug-in: runs one fio job (``numjobs`` processes) per host and reads fio's JSON output.

The campaign's parameters are fio job options from a curated allowlist; they are written, one per line, into a job
file that fio reads itself, so no value ever reaches a shell. fio does interpret a few things inside job-file values,
and validation closes each of them:

- ``${VAR}`` is replaced by an environment variable and ``$pagesize``, ``$mb_memory`` and ``$ncpus`` by system
  values, after which fio pipes the value through ``bc`` in a shell when it looks like arithmetic. fio has no
  escape for ``$``, so a value containing ``$`` is refused.
- fio reads a job file in lines of at most 8191 characters and starts a new option where a line was cut, so values
  are limited to ``MAX_VALUE_LENGTH`` characters and may hold no control characters (newline, CR, NUL, ...).
- fio cuts every job-file line at its first ``;`` or ``#`` (the rest is a comment) and strips the blanks around a
  value, so values hold neither ``;`` nor ``#`` and do not start or end with a blank: fio would run something else.
- A section name starting with ``global`` makes a global section, so the job name is checked too.

Job file layout: [global] holds where the data goes, ``name=`` when the campaign names the job, rackbench's default
``size`` when the campaign gives none, and the options listed in ``global_options`` (comma-separated), so that a
paper's job file (seeds 000 and 001) comes out section for section; every other option goes into the job section.

Data placement: fio's files go to ``directory``, by default the host's ``data_dir``, which the runner creates before
the run (``mkdir -p`` in runners.execution). fio refuses a ``directory`` that does not exist ("<dir> is not a
directory"), and that is kept on purpose: a directory a campaign names is usually a mount point, and creating it
would benchmark whatever file system lies underneath. (fio 3.2 and later would create it when given as
``filename_format=<dir>/$jobname.$jobnum.$filenum``; not used, for that reason.)

Layout: a job that reads has its files laid out by ``fio --create_only=1`` on the same job file before the caches
are flushed (``layout``), so that the measured run reads data that neither the page cache nor the storage's cache
just received, and no layout writeback competes with its reads.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
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

JOB_FILE = "job.fio"
LAYOUT_FILE = "layout.fio"  # the host's job file, for the layout pass (in client mode the primary holds the others)
DEFAULT_JOB_NAME = "rackbench"
DEFAULT_SIZE = "64M"
MAX_VALUE_LENGTH = 1024
FIO_DEFAULT_PORT = 8765
ALL_CLIENTS = "All clients"

DIRECTIONS = ("read", "write")
# metric-name suffix -> percentile as fio prints it ("99.900000")
PERCENTILES = {"p50": 50.0, "p99": 99.0, "p99_9": 99.9}

RW_MODES = ("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw")
READING_MODES = ("read", "randread", "rw", "readwrite", "randrw")  # modes whose files are laid out before the flush
IO_ENGINES = ("sync", "psync", "vsync", "pvsync", "pvsync2", "libaio", "io_uring", "posixaio", "mmap", "null")
# Options people reach for that stay refused, with the reason given back to them.
REFUSED = {
    "group_reporting": "rackbench needs fio's per-job results and sums the jobs itself",
    "exec_prerun": "runs a shell command",
    "exec_postrun": "runs a shell command",
    "include": "reads another job file",
}
PSEUDO_FILESYSTEMS = ("/dev", "/proc", "/sys")


def _metric_specs() -> tuple[MetricSpec, ...]:
    specs = [
        MetricSpec("bw_bytes", "B/s", True, "read + write bandwidth"),
        MetricSpec("iops", "IOPS", True, "read + write I/O operations per second"),
    ]
    for d in DIRECTIONS:
        specs += [
            MetricSpec(f"{d}_bw_bytes", "B/s", True, f"{d} bandwidth"),
            MetricSpec(f"{d}_iops", "IOPS", True, f"{d} I/O operations per second"),
            MetricSpec(f"{d}_lat_mean_ns", "ns", False, f"mean total {d} latency (submission + completion)"),
        ]
        specs += [
            MetricSpec(f"{d}_lat_{suffix}_ns", "ns", False, f"{p:g}th percentile {d} completion latency")
            for suffix, p in PERCENTILES.items()
        ]
    return tuple(specs)


METRICS = _metric_specs()
_UNITS = {spec.name: spec.unit for spec in METRICS}


# --- parameter validation -------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """The value as job-file text, refused where fio would read it differently from what was given."""
    text = parameters.text(value, max_length=MAX_VALUE_LENGTH)
    if "$" in text:
        raise ValueError("must not contain '$' (fio expands $-variables in job files and has no escape for it)")
    if ";" in text or "#" in text:
        raise ValueError("must not contain ';' or '#' (fio reads the rest of the line as a comment)")
    if text != text.strip():
        raise ValueError("must not start or end with whitespace")
    return text


def _job_value(check: parameters.Check) -> parameters.Check:
    """A shared check whose result is written into the job file: booleans as fio's 1/0, the rest as text."""

    def job_value(value: Any) -> str:
        found = check(value)
        if isinstance(found, bool):
            return "1" if found else "0"
        return _text(found)

    return job_value


def _ioengine(value: Any) -> str:
    text = _text(value)
    if text == "exec" or text.startswith("external"):
        raise ValueError(f"{text!r} runs an external program or library")
    return str(parameters.choice(*IO_ENGINES)(text))


def _directory(value: Any) -> str:
    text = _text(value)
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    if ":" in text:
        raise ValueError("must not contain ':' (fio reads it as a list of directories)")
    if any(text == p or text.startswith(p + "/") for p in PSEUDO_FILESYSTEMS):
        raise ValueError(f"must not be under {', '.join(PSEUDO_FILESYSTEMS)}")
    return text


def _filename(value: Any) -> str:
    text = _text(value)
    if "/" in text or ":" in text or text in (".", ".."):
        raise ValueError("must be a plain file name inside 'directory' (no '/' or ':')")
    return text


def _job_name(value: Any) -> str:
    text = _text(value)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", text):
        raise ValueError("must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if text.lower().startswith("global"):
        raise ValueError("must not start with 'global' (fio would read the job as a global section)")
    return text


_SIZE = r"[0-9]+([kmgtp]i?b?)?"
_MAX_INT = 2**31 - 1
_DURATION_UNITS = ("us", "ms", "s", "m", "h", "d")
_flag = _job_value(parameters.boolean)


def _integer(low: int, high: int) -> parameters.Check:
    return _job_value(parameters.integer(low, high))


def _sizes(expected: str) -> parameters.Check:
    """fio's size lists (``bs=4k,64k``: read,write[,trim]): each one a size of the shared rule."""
    one = parameters.size(1, 2**50, units="kmgtp", iec=True)

    def check(value: Any) -> str:
        text = _text(value)
        parts = text.split(",")
        if len(parts) > 3:
            raise ValueError(f"must be {expected}, got {text!r}")
        for part in parts:
            try:
                one(part)
            except ValueError:
                raise ValueError(f"must be {expected}, got {text!r}") from None
        return text

    return check


# fio job options a campaign may set, each with its check. Everything else is refused.
FIO_OPTIONS: dict[str, parameters.Check] = {
    "rw": _job_value(parameters.choice(*RW_MODES)),
    "bs": _sizes("a block size such as 4k, or read,write[,trim] sizes"),
    "size": _job_value(
        parameters.matching(rf"{_SIZE}|[0-9]{{1,3}}%", "a size such as 64M, or a percentage such as 50%", flags=re.I)
    ),
    "numjobs": _integer(1, 1024),
    "iodepth": _integer(1, 65536),
    "ioengine": _ioengine,
    "direct": _flag,
    "nrfiles": _integer(1, 100_000),
    "runtime": _job_value(parameters.duration(0, 30 * 86400, units=_DURATION_UNITS)),
    "time_based": _flag,
    "ramp_time": _job_value(parameters.duration(0, 86400, units=_DURATION_UNITS)),
    "startdelay": _job_value(parameters.duration(0, 86400, units=_DURATION_UNITS)),
    "loops": _integer(1, 1_000_000),
    "rwmixread": _integer(0, 100),
    "rwmixwrite": _integer(0, 100),
    "fsync": _integer(0, _MAX_INT),
    "fdatasync": _integer(0, _MAX_INT),
    "end_fsync": _flag,
    "fsync_on_close": _flag,
    "invalidate": _flag,
    "randrepeat": _flag,
    "norandommap": _flag,
    "refill_buffers": _flag,
    "buffer_compress_percentage": _integer(0, 100),
    "rate": _sizes("bytes per second such as 10m, or read,write[,trim] rates"),
    "rate_iops": _integer(1, _MAX_INT),
    "thread": _flag,
    "kb_base": _job_value(parameters.choice("1000", "1024")),
    "create_serialize": _flag,
    "sync": _flag,
    "unlink": _flag,
    "fallocate": _job_value(parameters.choice("none", "native", "posix", "keep", "truncate", "0", "1")),
}
# Parameters that are not job options: they name the job and place its data.
CONTROL_PARAMS: dict[str, parameters.Check] = {"name": _job_name, "directory": _directory, "filename": _filename}


@dataclass(frozen=True)
class _Job:
    name: str
    placement: list[str]  # the [global] lines saying where the data files go
    options: dict[str, str]  # the campaign's fio options, as written in the job section
    shared: dict[str, str] = field(default_factory=dict)  # options written in [global] (global_options)
    named: bool = False  # the campaign named the job: name= is written in [global] too, as the seeds' job files do

    @property
    def directories(self) -> list[str]:
        """Where fio puts the job's files: its ``directory`` (a list separated by ':')."""
        return self.placement[0].removeprefix("directory=").split(":")


def _checked(key: Any, value: Any) -> str:
    if not isinstance(key, str):
        raise ParamError(str(key), "parameter names must be strings")
    if key in REFUSED:
        raise ParamError(key, f"not allowed: {REFUSED[key]}")
    check = FIO_OPTIONS.get(key) or CONTROL_PARAMS.get(key)
    if check is None:
        raise ParamError(key, "unknown or unsupported fio option")
    try:
        return check(value)
    except ValueError as exc:
        raise ParamError(key, str(exc)) from None


def _global_options(value: Any, values: dict[str, str]) -> list[str]:
    """``global_options``: which of the campaign's fio options go into [global] (comma-separated names), as a
    paper's job file places them; fio reads an option the same in either section of a one-job file."""
    names = [n.strip() for n in str(parameters.text(value)).split(",") if n.strip()]
    for name in names:
        if name not in FIO_OPTIONS:
            raise ParamError("global_options", f"{name!r} is not a fio option rackbench writes")
        if name not in values:
            raise ParamError("global_options", f"{name!r} is not set in this campaign")
    return names


def _job(params: dict[str, Any], data_dirs: list[str]) -> _Job:
    shared_names = params.get("global_options")
    params = {k: v for k, v in params.items() if k != "global_options"}
    values = {key: _checked(key, value) for key, value in params.items()}
    if "rw" not in values:
        raise ParamError("rw", f"is required (one of {', '.join(RW_MODES)})")
    if values.get("time_based") == "1" and "runtime" not in values:
        raise ParamError("runtime", "is required when time_based is set, or fio never stops")
    placement = [f"directory={values.pop('directory', None) or ':'.join(_data_dir(d) for d in data_dirs)}"]
    if "filename" in values:
        placement.append(f"filename={values.pop('filename')}")
    named = "name" in values
    name = values.pop("name", DEFAULT_JOB_NAME)
    shared = _global_options(shared_names, values) if shared_names is not None else []
    return _Job(
        name=name,
        placement=placement,
        options={k: v for k, v in values.items() if k not in shared},
        shared={k: values[k] for k in shared},
        named=named,
    )


def _data_dir(data_dir: str) -> str:
    """The node's scratch directory goes into the job file as well, so it passes the same checks as a parameter."""
    try:
        return _directory(data_dir)
    except ValueError as exc:
        raise ParamError("directory", f"the node's data_dir {data_dir!r} cannot be used: {exc}") from None


def _job_file(job: _Job) -> str:
    has_size = "size" in job.options or "size" in job.shared
    lines = [
        "; written by rackbench: [global] holds where the data goes and the options named in global_options, the job"
        " section the campaign's other fio options",
        "[global]",
        *([f"name={job.name}"] if job.named else []),
        *([] if has_size else [f"size={DEFAULT_SIZE}"]),
        *job.placement,
        *(f"{key}={value}" for key, value in job.shared.items()),
        "",
        f"[{job.name}]",
        *(f"{key}={value}" for key, value in job.options.items()),
        "",
    ]
    return "\n".join(lines)


# --- output parsing -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Direction:
    """One direction's (read or write) results, for one job or combined over several."""

    bw_bytes: float
    iops: float
    weight: float  # how much this part counts in a combined latency mean: its I/O count, or its IOPS
    lat_mean_ns: float | None
    percentiles_ns: dict[str, float]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _did_io(d: dict[str, Any]) -> bool:
    # io_bytes was in KiB before fio 2.21 and bw_bytes is new in 3.2: any of them being positive is enough
    return any((_number(d.get(k)) or 0) > 0 for k in ("total_ios", "io_bytes", "io_kbytes", "bw_bytes", "bw", "iops"))


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _latencies(d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], float]:
    """(total latency, completion latency, factor to ns): fio 3.x reports *_ns in ns, fio 2.x plain keys in usec."""
    if "lat_ns" in d or "clat_ns" in d:
        return _object(d.get("lat_ns")), _object(d.get("clat_ns")), 1.0
    return _object(d.get("lat")), _object(d.get("clat")), 1000.0


def _percentiles(table: Any, factor: float) -> dict[str, float]:
    found: dict[str, float] = {}
    if not isinstance(table, dict):
        return found
    for key, value in table.items():
        p, v = _number(key), _number(value)
        for suffix, wanted in PERCENTILES.items():
            if p is not None and v is not None and abs(p - wanted) < 1e-6:
                found[suffix] = v * factor
    return found


def _direction(d: Any) -> _Direction | None:
    """A direction of one fio job entry; None when it did no I/O (a read-only job has no write results)."""
    if not isinstance(d, dict) or not _did_io(d):
        return None
    bw_bytes = _number(d.get("bw_bytes"))
    if bw_bytes is None:
        bw_bytes = (_number(d.get("bw")) or 0.0) * 1024  # KiB/s before fio 3.2
    iops = _number(d.get("iops")) or 0.0
    lat, clat, factor = _latencies(d)
    mean = _number(lat.get("mean")) if lat.get("N", 1) else None
    # Percentiles are fio's default completion-latency ones, or total-latency ones where only those exist.
    percentiles = _percentiles(clat.get("percentile"), factor) or _percentiles(lat.get("percentile"), factor)
    return _Direction(
        bw_bytes=bw_bytes,
        iops=iops,
        weight=_number(d.get("total_ios")) or iops,
        lat_mean_ns=None if mean is None else mean * factor,
        percentiles_ns=percentiles,
    )


def _combine(parts: list[_Direction]) -> _Direction:
    """Sums of bandwidth and IOPS, the latency mean weighted by each part's weight, and each percentile's maximum:
    percentiles cannot be merged from percentiles, the maximum is a bound that never flatters the result."""
    timed = [p for p in parts if p.lat_mean_ns is not None and p.weight > 0]
    weight = sum(p.weight for p in timed)
    mean = sum((p.lat_mean_ns or 0.0) * p.weight for p in timed) / weight if weight else None
    percentiles: dict[str, float] = {}
    for part in parts:
        for suffix, value in part.percentiles_ns.items():
            percentiles[suffix] = max(value, percentiles.get(suffix, value))
    return _Direction(
        bw_bytes=sum(p.bw_bytes for p in parts),
        iops=sum(p.iops for p in parts),
        weight=sum(p.weight for p in parts),
        lat_mean_ns=mean,
        percentiles_ns=percentiles,
    )


def _metric(name: str, value: float, host: str, labels: dict[str, Any]) -> Metric:
    return Metric(name=name, value=value, unit=_UNITS[name], host=host, labels=dict(labels))


def _metrics(
    results: dict[str, _Direction], host: str, labels: dict[str, Any], percentile_labels: dict[str, Any] | None = None
) -> list[Metric]:
    """Metrics of one job, host or run; bw_bytes and iops only when some direction did I/O."""
    percentile_labels = labels if percentile_labels is None else percentile_labels
    out: list[Metric] = []
    for d, r in results.items():
        out += [_metric(f"{d}_bw_bytes", r.bw_bytes, host, labels), _metric(f"{d}_iops", r.iops, host, labels)]
        if r.lat_mean_ns is not None:
            out.append(_metric(f"{d}_lat_mean_ns", r.lat_mean_ns, host, labels))
        out += [_metric(f"{d}_lat_{s}_ns", v, host, percentile_labels) for s, v in r.percentiles_ns.items()]
    if results:
        out.append(_metric("bw_bytes", sum(r.bw_bytes for r in results.values()), host, labels))
        out.append(_metric("iops", sum(r.iops for r in results.values()), host, labels))
    return out


def _job_results(job: dict[str, Any]) -> dict[str, _Direction]:
    found = {d: _direction(job.get(d)) for d in DIRECTIONS}
    return {d: r for d, r in found.items() if r is not None}


def _host_metrics(jobs: list[dict[str, Any]], host: str) -> list[Metric]:
    """Per-job metrics, labelled {"job": name, "jobnum": n} (fio repeats the name for each of numjobs processes;
    n counts them as fio's $jobnum does), then the host's totals over all jobs, labelled {}."""
    out: list[Metric] = []
    seen: Counter[str] = Counter()
    per_direction: dict[str, list[_Direction]] = defaultdict(list)
    for job in jobs:
        name = str(job.get("jobname", ""))
        results = _job_results(job)
        out += _metrics(results, host, {"job": name, "jobnum": seen[name]})
        seen[name] += 1
        for d, r in results.items():
            per_direction[d].append(r)
    return out + _metrics({d: _combine(parts) for d, parts in per_direction.items()}, host, {})


def _client_host(entry: dict[str, Any]) -> str:
    host = str(entry.get("hostname", ""))
    port = entry.get("port")
    return host if port in (None, FIO_DEFAULT_PORT) else f"{host}:{port}"


def _client_metrics(entries: list[dict[str, Any]]) -> list[Metric]:
    """fio --client output: each server's jobs under the host name given to --client (with ":port" when not fio's
    default port); the "All clients" entries are fio's own aggregate and become host="" metrics (labels {}).
    fio prints no percentiles for "All clients"; Fio.aggregate adds them from the per-client totals."""
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    totals: list[dict[str, Any]] = []
    for entry in entries:
        if entry.get("jobname") == ALL_CLIENTS:
            totals.append(entry)
        else:
            by_host[_client_host(entry)].append(entry)
    out = [m for host, jobs in by_host.items() for m in _host_metrics(jobs, host)]
    parts: dict[str, list[_Direction]] = defaultdict(list)
    for entry in totals:
        for d, r in _job_results(entry).items():
            parts[d].append(r)
    return out + _metrics({d: _combine(p) for d, p in parts.items()}, "", {})


_DOCUMENT_START = re.compile(r"^\{", re.MULTILINE)


def _document(text: str) -> dict[str, Any]:
    """The last fio JSON document in text. fio prints it at the start of a line, after any notes and warnings and
    possibly followed by more text; only top-level braces are tried, which keeps truncated output cheap to scan."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    end = 0
    for match in _DOCUMENT_START.finditer(text):
        if match.start() < end:
            continue
        try:
            doc, stop = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(doc, dict) and ("jobs" in doc or "client_stats" in doc):
            found, end = doc, stop
    if found is None:
        raise ParseError("no fio JSON output found (was fio run with --output-format=json?)")
    return found


def _entries(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    entries = doc.get(key)
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ParseError(f"fio JSON output has no {key!r} entries")
    return entries


# --- client/server mode -------------------------------------------------------------------------------------
# ``client_mode: true``: every host runs ``fio --server`` (a service of the run), and the primary host runs one
# ``fio --client`` for all of them, each server with its own job file (its own data directory). fio names each
# client by the address it was given, so the primary's command first prints which node each address is.
CLIENT_HEADER = "rackbench-fio-clients:"
_CLIENT_HEADER_SCRIPT = 'printf "%s %s\\n" "$1" "$2"; shift 2; exec "$@"'
_READY_SCRIPT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2).close()"


def _client_options(params: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The fio job options, and the fio server port when the run uses client/server mode."""
    fio_params = {k: v for k, v in params.items() if k not in ("client_mode", "client_port")}
    mode = parameters.checked("client_mode", parameters.boolean, params.get("client_mode", False))
    port = parameters.checked(
        "client_port", parameters.integer(1024, 65535), params.get("client_port", FIO_DEFAULT_PORT)
    )
    return fio_params, (port if mode else None)


def _data_dirs(host: HostContext, node: str) -> list[str]:
    """A node's data directories: one per campaign mount point (seed 000's directory=a:b:...), else its data_dir.

    Every node's data_dir is the same base followed by its name, so the primary can name the other nodes' too.
    """
    if host.mounts:
        return [f"{mount}/{node}" for mount in host.mounts]
    base = host.data_dir[: -len(host.node)] if host.data_dir.endswith(host.node) else host.data_dir.rstrip("/") + "/"
    return [base + node]


def _client_mode(params: dict[str, Any], host: HostContext, port: int) -> list[HostCommand]:
    me = host.hosts[host.index] if host.hosts else None
    if me is None:
        raise ParamError("client_mode", "needs the run's host list")
    service = HostCommand(
        argv=["fio", f"--server=ip:{me.address},{port}"],
        service=True,
        ready_argv=["python3", "-c", _READY_SCRIPT, me.address, str(port)],
    )
    if not host.is_primary:
        return [service]
    files: dict[str, str] = {}
    clients: list[str] = []
    names: dict[str, str] = {}
    for other in host.hosts:
        job_file = f"job-{other.name}.fio"
        files[job_file] = _job_file(_job(params, data_dirs=_data_dirs(host, other.name)))
        clients += [f"--client=ip:{other.address},{port}", job_file]
        names[other.address if port == FIO_DEFAULT_PORT else f"{other.address}:{port}"] = other.name
    argv = ["sh", "-c", _CLIENT_HEADER_SCRIPT, "sh", CLIENT_HEADER, json.dumps(names, sort_keys=True)]
    argv += ["fio", "--eta=never", "--output-format=json", *clients]
    return [HostCommand(argv=argv, files=files), service]


def _client_names(text: str) -> dict[str, str]:
    match = re.search(rf"^{re.escape(CLIENT_HEADER)} (\{{.*\}})\s*$", text, re.MULTILINE)
    if not match:
        return {}
    try:
        names = json.loads(match.group(1))
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}


def _rename_clients(metrics: list[Metric], names: dict[str, str]) -> list[Metric]:
    """Client addresses back to node names (metrics of output made by hand keep the addresses)."""
    return [Metric(m.name, m.value, m.unit, names.get(m.host, m.host), m.labels) if m.host else m for m in metrics]


@register
class Fio(Benchmark):
    kind = "fio"
    description = "Flexible I/O tester: file-system bandwidth, IOPS and latency"
    metrics = METRICS
    # Present whenever a job did read or write I/O, whether read-only, write-only or mixed; absent when fio failed
    # or moved no data.
    required_metrics = ("bw_bytes", "iops")
    headline = ("read_bw_bytes", "write_bw_bytes", "bw_bytes", "read_iops", "write_iops", "iops", "read_lat_mean_ns",
                "write_lat_mean_ns")  # fmt: skip
    totals = {"bw_bytes": ("read_bw_bytes", "write_bw_bytes"), "iops": ("read_iops", "write_iops")}  # noqa: RUF012
    version_argv = ["fio", "--version"]

    def validate(self, params: dict[str, Any]) -> None:
        fio_params, _ = _client_options(params)
        _job(fio_params, data_dirs=["/"])

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | list[HostCommand]:
        fio_params, client_port = _client_options(params)
        if client_port:
            return _client_mode(fio_params, host, client_port)
        job = _job(fio_params, data_dirs=_data_dirs(host, host.node))
        return HostCommand(
            argv=["fio", "--eta=never", "--output-format=json", JOB_FILE],
            files={JOB_FILE: _job_file(job)},
        )

    def layout(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        """For a job that reads: ``fio --create_only=1`` on the host's own job file (the one its fio, or the primary's
        fio --client, runs), which lays out the same files and does no I/O on them. fio keeps a file of the right
        size as it is, so a second layout does nothing: its files are in the job's directories (``data_dirs``), and
        the runner skips the layout where they are as the same layout left them (fio takes a few tenths of a second
        to start)."""
        fio_params, _ = _client_options(params)
        job = _job(fio_params, data_dirs=_data_dirs(host, host.node))
        if job.options.get("rw", job.shared.get("rw")) not in READING_MODES:
            return None
        return HostCommand(
            argv=["fio", "--create_only=1", "--eta=never", LAYOUT_FILE],
            files={LAYOUT_FILE: _job_file(job)},
            data_dirs=job.directories,
        )

    def bytes_read(self, metrics: list[Metric], outputs: dict[str, str]) -> float | None:
        """fio's ``io_bytes`` of every job's reads, on every host (fio --client output: of every client)."""
        total = 0.0
        for text in outputs.values():
            try:
                doc = _document(text)
            except ParseError:
                return None
            key = "client_stats" if "client_stats" in doc else "jobs"
            for entry in _entries(doc, key):
                if entry.get("jobname") != ALL_CLIENTS:
                    total += _read_bytes(_object(entry.get("read")))
        return total

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """Per-job and per-host metrics for fio's normal JSON output; for --client output, see _client_metrics."""
        doc = _document(text)
        if "client_stats" in doc:
            return _rename_clients(_client_metrics(_entries(doc, "client_stats")), _client_names(text))
        return _host_metrics(_entries(doc, "jobs"), host)

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Across hosts, from each host's totals (labels {}): sums of bandwidth and IOPS, latency means weighted by
        IOPS, percentiles as their maximum (labels {"across_hosts": "max"}).

        Metrics that per_host already holds at host="" are left out: fio --client output carries fio's own
        aggregate ("All clients"), which has no percentiles, so only those are added to it."""
        present = {m.name for m in per_host if m.host == ""}
        totals: dict[str, dict[str, float]] = defaultdict(dict)
        for m in per_host:
            if m.host and not m.labels:
                totals[m.host][m.name] = m.value
        parts: dict[str, list[_Direction]] = defaultdict(list)
        for values in totals.values():
            for d in DIRECTIONS:
                if f"{d}_bw_bytes" in values:
                    parts[d].append(_from_totals(values, d))
        combined = {d: _combine(p) for d, p in parts.items()}
        metrics = _metrics(combined, "", {}, percentile_labels={"across_hosts": "max"})
        return [m for m in metrics if m.name not in present]


def _read_bytes(d: dict[str, Any]) -> float:
    """Bytes a direction moved: io_bytes, which was in KiB before fio 2.21 (when io_kbytes came)."""
    io_bytes = _number(d.get("io_bytes")) or 0.0
    return io_bytes if "io_kbytes" in d else io_bytes * 1024


def _from_totals(values: dict[str, float], d: str) -> _Direction:
    iops = values.get(f"{d}_iops", 0.0)
    return _Direction(
        bw_bytes=values[f"{d}_bw_bytes"],
        iops=iops,
        weight=iops,
        lat_mean_ns=values.get(f"{d}_lat_mean_ns"),
        percentiles_ns={s: values[f"{d}_lat_{s}_ns"] for s in PERCENTILES if f"{d}_lat_{s}_ns" in values},
    )
