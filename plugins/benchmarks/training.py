"""What the training plug-ins share: parameter checks, the mpirun launch, reading mpirun output, derived metrics.

The four training kinds (tf_cnn_benchmarks, horovod_synthetic, pytorch_resnet, mlperf_resnet) start one ``mpirun`` on
the run's primary host, one rank per GPU, as the reference papers do (seeds 000, 001, 004); every other host runs
nothing. Their metrics describe the whole run, so they carry host="" and ``missing()`` checks that aggregate.

Launch contract
---------------
The primary host's command is::

    sh -c 'printf "rackbench-training: %s\\n" "$1"; shift; exec "$@"' rackbench-training '<header JSON>' mpirun ...

The fixed ``sh`` script prints one header line, then replaces itself with ``mpirun``. Every campaign value stays a
separate argv element (``"$1"`` and ``"$@"`` are expanded by the shell, never parsed by it). The header carries what a
parser cannot read from the tool's output and the plug-in interface does not hand it (``parse()`` gets no parameters):
the number of ranks and GPUs and the mean record size of the data set, e.g.
``rackbench-training: {"kind": "tf_cnn_benchmarks", "ranks": 48, "gpus": 48, "record_size_bytes": 115000}``.
Output without the header (a log imported from elsewhere) still parses; the derived metrics that need it are left out.

Round-robin data directories (``data_dirs_round_robin: true``)
--------------------------------------------------------------
Seed 000 spreads the ranks over 16 NFS mount points with a ``round_robin_mpi.py`` wrapper. rackbench's wrapper
(``plugins/tools/round_robin_mpi.py``) is shipped as ``./round_robin_mpi.py`` in the run directory
and is started per rank as::

    python3 ./round_robin_mpi.py --dirs DIR1 DIR2 ... -- PROGRAM ARG ...

It picks one of the DIRs from the rank's MPI rank (rank modulo the number of DIRs), replaces the literal text
``{data_dir}`` wherever it occurs in the ARGs (a whole argument or part of one: ``--data_dir={data_dir}``) with that
directory, and execs PROGRAM. The DIRs are the primary host's mount points (``HostContext.mounts``, which the papers
mount identically on every node), each joined with the optional ``data_subdir`` parameter. Open MPI starts remote
ranks in the launching directory's path, so the runner must place the wrapper at that same path on every host.

Reading mpirun output
---------------------
With ``--tag-output`` every chunk a rank writes is prefixed ``[job,rank]<stdout>:``; ranks writing at once interleave
chunks inside one line, and a line's newline may arrive in another rank's chunk. ``rank_lines()`` rebuilds each rank's
own lines from the chunks. Output without tags is one stream (rank None). CR/LF line ends (a pseudo-terminal), ANSI
escapes and other control bytes are dropped first.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from common import parameters
from plugins.benchmarks.base import Benchmark, HostCommand, HostContext, Metric, MetricSpec, ParamError
from plugins.benchmarks.nccl import transport_env, transport_problem
from plugins.launchers.mpi import MPI_PARAMS, mpirun_argv, options_from_params, rank_count

HEADER_TAG = "rackbench-training"
HEADER_SCRIPT = f'printf "{HEADER_TAG}: %s\\n" "$1"; shift; exec "$@"'
ROUND_ROBIN_WRAPPER = "./round_robin_mpi.py"
WRAPPER_SOURCE = Path(__file__).resolve().parent.parent / "tools" / "round_robin_mpi.py"
DATA_DIR_TOKEN = "{data_dir}"
DATA_SOURCES = ("synthetic", "storage")
MAX_INT = 2**31 - 1

# --- metrics -------------------------------------------------------------------------------------------------

THROUGHPUT = MetricSpec(
    "images_per_sec",
    "img/s",
    True,
    "training throughput of the whole run; labelled {rank} or {epoch} for a rank's or an epoch's part",
)
PER_GPU = MetricSpec("images_per_sec_per_gpu", "img/s", True, "images_per_sec divided by the run's GPU count")
STORAGE = MetricSpec(
    "storage_mb_per_sec", "MB/s", True, "read rate the run demands of storage: images_per_sec x mean record size / 1e6"
)
TRAINING_METRICS = (THROUGHPUT, PER_GPU, STORAGE)


def metric(spec: MetricSpec, value: float, **labels: Any) -> Metric:
    return Metric(name=spec.name, value=value, unit=spec.unit, host="", labels=labels)


def derived(total: float | None, gpus: int | None, record_size_bytes: float | None) -> list[Metric]:
    """Per-GPU throughput and storage demand from the whole run's images/s, where what they need is known."""
    if total is None:
        return []
    out = []
    if gpus:
        out.append(metric(PER_GPU, total / gpus))
    if record_size_bytes:
        out.append(metric(STORAGE, total * record_size_bytes / 1e6))
    return out


# --- parameter checks ----------------------------------------------------------------------------------------

_PATH_CHARS = r"[A-Za-z0-9._+=,@:/-]"


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be text, got {value!r}")
    return parameters.text(value)


def absolute_path(value: Any) -> str:
    text = _string(value)
    if not re.fullmatch(rf"/{_PATH_CHARS}*", text):
        raise ValueError(f"must be an absolute path of letters, digits and ._+=,@:/- only, got {text!r}")
    if ".." in text.split("/"):
        raise ValueError("must not contain '..'")
    return text


def relative_path(value: Any) -> str:
    text = _string(value)
    if not re.fullmatch(rf"[A-Za-z0-9._+=,@-]{_PATH_CHARS}*", text):
        raise ValueError(f"must be a relative path of letters, digits and ._+=,@:/- only, got {text!r}")
    if ".." in text.split("/"):
        raise ValueError("must not contain '..'")
    return text


def interpreter(value: Any) -> str:
    if value in ("python", "python3"):
        return str(value)
    try:
        return absolute_path(value)
    except ValueError:
        raise ValueError(f"must be python, python3 or an absolute path, got {value!r}") from None


# --- options: a parameter, its check and how it becomes arguments ----------------------------------------------


@dataclass(frozen=True)
class Option:
    """A tool option a campaign may set. ``style``: "eq" (``--flag=value``, booleans True/False, as absl flags and
    the seeds write them), "space" (``--flag value``, argparse), "switch" (``--flag`` when true, nothing when false)."""

    flag: str
    check: parameters.Check
    style: str = "eq"

    def argv(self, value: Any) -> list[str]:
        if self.style == "switch":
            return [self.flag] if value else []
        text = str(value) if not isinstance(value, bool) else ("True" if value else "False")
        return [f"{self.flag}={text}"] if self.style == "eq" else [self.flag, text]


def option_argv(options: dict[str, Option], values: dict[str, Any]) -> list[str]:
    """The arguments for the options set, in the order ``options`` lists them."""
    return [arg for name, option in options.items() if name in values for arg in option.argv(values[name])]


# Parameters every training kind takes besides its tool's options.
COMMON: dict[str, parameters.Check] = {
    "script": absolute_path,
    "python": interpreter,
    "data_source": parameters.choice(*DATA_SOURCES),
    "data_dir": absolute_path,
    "data_dirs_round_robin": parameters.boolean,
    "data_subdir": relative_path,
    "record_size_bytes": parameters.number(1, 1e9),
}


def checked(
    params: dict[str, Any], checks: dict[str, parameters.Check], required: Sequence[str] = ()
) -> dict[str, Any]:
    """Every parameter checked against ``checks`` (the ``mpi_*`` ones are left to options_from_params)."""
    values: dict[str, Any] = {}
    for key, value in params.items():
        if not isinstance(key, str):
            raise ParamError(str(key), "parameter names must be strings")
        if key in MPI_PARAMS:
            continue
        if key == "expect_transport":  # NCCL's transport, checked in the training log as seed 000 does
            transport_env(value, {})
            continue
        check = checks.get(key)
        if check is None:
            known = ", ".join(sorted([*checks, *MPI_PARAMS]))
            raise ParamError(key, f"unknown parameter (known: {known})")
        values[key] = parameters.checked(key, check, value)
    for key in required:
        if key not in values:
            raise ParamError(key, "is required")
    _check_data(values)
    options_from_params(params)  # the mpi_* parameters
    return values


def _check_data(values: dict[str, Any]) -> None:
    source = values.get("data_source", "synthetic")
    round_robin = values.get("data_dirs_round_robin", False)
    if source == "synthetic":
        for key in ("data_dir", "data_subdir"):
            if key in values:
                raise ParamError(key, "only applies when data_source is storage")
        if round_robin:
            raise ParamError("data_dirs_round_robin", "only applies when data_source is storage")
    elif round_robin:
        if "data_dir" in values:
            raise ParamError("data_dir", "not used with data_dirs_round_robin (give data_subdir under the mounts)")
    elif "data_dir" not in values:
        raise ParamError("data_dir", "is required when data_source is storage (or set data_dirs_round_robin)")
    elif "data_subdir" in values:
        raise ParamError("data_subdir", "only applies with data_dirs_round_robin")


@dataclass(frozen=True)
class DataLocation:
    """Where the ranks read data: ``prefix`` goes before the rank's program (the round-robin wrapper, or nothing);
    ``directory`` is the path to give the tool, or the ``{data_dir}`` token the wrapper fills in (None: synthetic)."""

    prefix: list[str]
    directory: str | None


def data_location(values: dict[str, Any], host: HostContext) -> DataLocation:
    if values.get("data_source", "synthetic") == "synthetic":
        return DataLocation([], None)
    if not values.get("data_dirs_round_robin"):
        return DataLocation([], values["data_dir"])
    if not host.mounts:
        raise ParamError("data_dirs_round_robin", "the campaign has no mount points on this host to spread ranks over")
    subdir = values.get("data_subdir", "")
    dirs = []
    for mount in host.mounts:
        try:
            base = absolute_path(mount).rstrip("/")
        except ValueError as exc:
            raise ParamError("data_dirs_round_robin", f"mount point {mount!r} cannot be used: {exc}") from None
        dirs.append(f"{base}/{subdir}" if subdir else base or "/")
    return DataLocation(["python3", ROUND_ROBIN_WRAPPER, "--dirs", *dirs, "--"], DATA_DIR_TOKEN)


def launch(
    kind: str,
    params: dict[str, Any],
    values: dict[str, Any],
    host: HostContext,
    rank_argv: list[str],
    gpus_per_rank: int = 1,
    env: dict[str, str] | None = None,
) -> HostCommand:
    """The primary host's command: the header line, then mpirun starting ``rank_argv`` once per slot."""
    run_env = {**host.env, **(env or {})}
    options = options_from_params(params, transport_env(params.get("expect_transport"), run_env))
    ranks = rank_count(host.hosts, options.slots)
    header: dict[str, Any] = {"kind": kind, "ranks": ranks, "gpus": ranks * gpus_per_rank}
    if "record_size_bytes" in values:
        header["record_size_bytes"] = values["record_size_bytes"]
    mpirun = mpirun_argv(host.hosts, rank_argv, options)
    # The rank wrapper travels with the run (the runner mirrors the primary's files to every host).
    files = {"round_robin_mpi.py": WRAPPER_SOURCE.read_text()} if ROUND_ROBIN_WRAPPER in rank_argv else {}
    argv = ["sh", "-c", HEADER_SCRIPT, HEADER_TAG, json.dumps(header, sort_keys=True), *mpirun]
    return HostCommand(argv=argv, files=files)


def ranks_of(params: dict[str, Any], host: HostContext) -> int:
    return rank_count(host.hosts, options_from_params(params).slots)


# --- reading output ------------------------------------------------------------------------------------------

_TAG = re.compile(r"\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_HEADER = re.compile(rf"^{HEADER_TAG}: (\{{.*\}})\s*$")


def clean(text: str) -> str:
    """Text with LF line ends only and without escape sequences or control bytes (tabs kept)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", _ANSI.sub("", text))


def rank_lines(text: str) -> dict[int | None, list[str]]:
    """Each rank's own output lines, rebuilt from mpirun --tag-output chunks; untagged text is rank None."""
    buffers: dict[int | None, list[str]] = {}
    for line in clean(text).split("\n"):
        owner: int | None = None
        start = 0
        for match in _TAG.finditer(line):
            if match.start() > start:
                buffers.setdefault(owner, []).append(line[start : match.start()])
            owner, start = int(match.group(1)), match.end()
        buffers.setdefault(owner, []).append(line[start:] + "\n")
    streams = {}
    for rank, parts in buffers.items():
        lines = "".join(parts).split("\n")
        if lines[-1] == "":
            lines.pop()
        streams[rank] = lines
    return streams


def all_lines(streams: dict[int | None, list[str]]) -> list[str]:
    return [line for lines in streams.values() for line in lines]


def header(streams: dict[int | None, list[str]]) -> dict[str, Any]:
    """The launch header (see the module docstring); empty when the output has none."""
    found: dict[str, Any] = {}
    for line in streams.get(None, []):
        match = _HEADER.match(line)
        if match:
            try:
                value = json.loads(match.group(1))
            except ValueError:
                continue
            if isinstance(value, dict):
                found = value
    return found


def header_number(head: dict[str, Any], key: str) -> float | None:
    value = head.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return value


def to_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None


# --- the base class ------------------------------------------------------------------------------------------


class TrainingBenchmark(Benchmark):
    """An MPI-launched training benchmark: one mpirun from the primary host, metrics for the whole run (host="")."""

    uses_mpi = True

    metrics: ClassVar[tuple[MetricSpec, ...]] = TRAINING_METRICS
    required_metrics: ClassVar[tuple[str, ...]] = ("images_per_sec",)
    headline: ClassVar[tuple[str, ...]] = ("images_per_sec", "images_per_sec_per_gpu", "storage_mb_per_sec")

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The checked parameters (defaults filled in); raises ParamError naming the first bad one."""
        raise NotImplementedError

    def command(self, params: dict[str, Any], values: dict[str, Any], host: HostContext) -> HostCommand:
        """The primary host's mpirun line, from the checked ``values``."""
        raise NotImplementedError

    def output(self, text: str) -> list[Metric]:
        """The run's metrics from its output."""
        raise NotImplementedError

    def validate(self, params: dict[str, Any]) -> None:
        self.values(params)

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        values = self.values(params)
        return self.command(params, values, host) if host.is_primary else None

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        return self.output(text)

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        """The run's aggregate metrics (host "", no labels) must hold every required metric, whichever host ran."""
        found = {m.name for m in metrics if m.host == "" and not m.labels}
        return [
            f"expected metric {name} is missing from the run's output{self.missing_reason(name)}"
            for name in self.required_metrics
            if name not in found
        ]

    def missing_reason(self, name: str) -> str:
        return " (was the run interrupted before it printed its result?)"

    def uses_gpus(self, params: dict[str, Any]) -> bool:
        """Whether the run trains on GPUs (a CPU run has no per-GPU rate to report)."""
        return True

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        """Derived metrics the run should have: per GPU on GPUs, storage demand when record_size_bytes is given."""
        found = {m.name for m in metrics if m.host == "" and not m.labels}
        problems = []
        if "images_per_sec" in found and "images_per_sec_per_gpu" not in found and self.uses_gpus(params):
            problems.append("images_per_sec_per_gpu could not be derived: the output does not tell the GPU count")
        if "images_per_sec" in found and params.get("record_size_bytes") and "storage_mb_per_sec" not in found:
            problems.append("storage_mb_per_sec could not be derived: the output lacks rackbench's launch header")
        if params.get("expect_transport"):
            problem = transport_problem(params["expect_transport"], logs)
            if problem:
                problems.append(problem)
        return problems
