"""The benchmark plug-in interface: one subclass per benchmark kind, registered by ``kind``.

A plug-in turns a run's parameters into the files and command to run on each host, and the
tool's output back into metrics. It never touches SSH or the database.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.errors import ParamError as ParamError
from common.errors import ParseError as ParseError
from plugins import localise


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    higher_is_better: bool
    description: str = ""
    # False for context rather than a measure of the node (a host's CPU use during a network test): shown and
    # exported like the others, never what makes a node an outlier in the fleet view.
    judged: bool = True


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    host: str = ""  # empty: the aggregate across hosts
    labels: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "unit": self.unit, "host": self.host, "labels": self.labels}


@dataclass(frozen=True)
class PairMetric:
    """What the link matrix (node x node) shows of a pairwise run: the stored per-host metric (``name``, labelled
    ``peer``), which of its rows count (``labels``: iperf's sending direction), what one run's value of a pair is in
    words (``statistic``; ``Benchmark.pair_flows`` reads it) and what the matrix's rows and columns are."""

    name: str
    unit: str
    higher_is_better: bool
    statistic: str
    rows: str = "sender"
    columns: str = "receiver"
    labels: dict[str, Any] = field(default_factory=dict)
    symmetric: bool = False  # a pair's one value is on both its nodes: (a, b) and (b, a) are one link


@dataclass(frozen=True)
class HostInfo:
    """One host of a run, as every host's command may need to know it (MPI host lists, iperf pairs)."""

    name: str
    address: str
    slots: int = 1  # MPI slots: the node's GPU count, or 1 without GPUs
    ssh_port: int = 22  # where the node's sshd listens (mpirun hops over it unless told another port)


@dataclass(frozen=True)
class HostContext:
    """Where a run executes on one host."""

    node: str  # node name
    index: int  # position of the host in the run's host list; 0 is the primary (where mpirun starts)
    run_dir: str  # absolute directory of this run on the host; the command starts there
    data_dir: str  # absolute directory the benchmark may read and write test data in
    hosts: tuple[HostInfo, ...] = ()  # every host of the run, in order
    storage_addresses: tuple[str, ...] = ()  # data addresses of the campaign's storage system
    env: dict[str, str] = field(default_factory=dict)  # the campaign's environment (NCCL_*, ...): pass it on
    mounts: tuple[str, ...] = ()  # the campaign's mount points on this host (round-robin data directories)

    @property
    def is_primary(self) -> bool:
        return self.index == 0


@dataclass(frozen=True)
class HostCommand:
    argv: list[str]  # the command, started in ``run_dir``; never passed through a shell unquoted
    files: dict[str, str] = field(default_factory=dict)  # file name (in run_dir) -> content, written first
    env: dict[str, str] = field(default_factory=dict)
    # A service (a server the main commands talk to, e.g. ``iperf3 -s``) starts on every host before any
    # main command, runs in ``run_dir/service``, and is stopped once every main command has ended.
    service: bool = False
    # For a service: argv that exits 0 once the service accepts work (polled before the mains start).
    ready_argv: list[str] = field(default_factory=list)
    # For a layout: the directories it writes its files into (directly, not in subdirectories), where its whole
    # effect is on these files and a second run of it on files it laid out does nothing. The runner then skips a
    # layout whose command and files are those of the last layout on the host and whose directories hold the same
    # files (names, sizes, modification times, inodes) as that layout left; empty: the layout runs every time.
    data_dirs: list[str] = field(default_factory=list)


class Benchmark:
    kind: ClassVar[str]
    description: ClassVar[str] = ""
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()
    # A run whose output lacks any of these fails even when every exit code is 0.
    required_metrics: ClassVar[tuple[str, ...]] = ()
    # argv printing the tool's version; recorded in the run's provenance.
    version_argv: ClassVar[list[str]] = []
    # Launched with mpirun from the primary host: the runner first checks mpirun reaches every host.
    uses_mpi: ClassVar[bool] = False
    # The aggregate numbers a reader looks for first, in this order (the run page's headline); empty: every
    # unlabelled aggregate is one.
    headline: ClassVar[tuple[str, ...]] = ()
    # A total and its parts: pages leave the total out where only one part is present (it then equals that part).
    totals: ClassVar[dict[str, tuple[str, ...]]] = {}

    def validate(self, params: dict[str, Any]) -> None:
        """Raise ParamError for a parameter set this benchmark cannot run."""

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | list[HostCommand] | None:
        """What to run on one host: a main command, a main and a service, or nothing (None).

        MPI benchmarks start everything from the primary host (``host.is_primary``) and run nothing
        elsewhere; client/server benchmarks give some hosts a service.
        """
        raise NotImplementedError

    def layout(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        """A command that lays out the data the main command will read (run on every host before the cache flush,
        so that the measured run reads data the caches no longer hold); None when the benchmark needs none.
        It must be idempotent: a run prepared twice runs it twice."""
        return None

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """Metrics found in one host's output, each tagged with ``host``."""
        raise NotImplementedError

    def bytes_read(self, metrics: list[Metric], outputs: dict[str, str]) -> float | None:
        """How many bytes the run read (all hosts together), from its metrics or its hosts' outputs; None when the
        benchmark does not say. By default its aggregate ``read_bytes`` metric."""
        found = [m.value for m in metrics if m.name == "read_bytes" and m.host == "" and not m.labels]
        return found[0] if found else None

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Aggregate metrics (host="") across hosts from the per-host ones."""
        return []

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        """Why the run's metrics are not enough (empty when they are), given the hosts that ran a main command.

        By default every host must report every required metric; a benchmark whose metrics describe the
        whole run (an MPI job's) overrides this.
        """
        found = {(m.name, m.host) for m in metrics}
        return [
            f"{host}: expected metric {name} is missing from the output"
            for host in hosts
            for name in self.required_metrics
            if (name, host) not in found
        ]

    def follow_up(self, params: dict[str, Any], metrics: list[Metric]) -> dict[str, Any] | None:
        """The parameters of a run the campaign adds after a run of ``params`` succeeded with these per-host
        ``metrics`` (a localisation's second pass), or None; it runs on the same hosts."""
        return None

    def pair_flows(self, metrics: list[Metric]) -> localise.Flows:
        """{(node, peer): value} of a pairwise run's per-host metrics, higher is better (what two-pass localisation
        judges); empty for a benchmark without pairs."""
        return {}

    def pair_metric(self, params: dict[str, Any]) -> PairMetric | None:
        """What the link matrix shows of a run of ``params`` (its ``pair_flows``); None for a run without pairs."""
        return None

    def second_pass_of(self, params: dict[str, Any]) -> localise.SecondPass | None:
        """What a run of a localisation's pass 2 re-tests (from its parameters), to judge with ``localise.judge``;
        None for any other run."""
        return None

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        """Run-level sanity checks beyond missing metrics (e.g. the NCCL transport); empty when all is well."""
        return []

    def spec(self, name: str) -> MetricSpec | None:
        return next((m for m in self.metrics if m.name == name), None)


_REGISTRY: dict[str, type[Benchmark]] = {}


def register(cls: type[Benchmark]) -> type[Benchmark]:
    _REGISTRY[cls.kind] = cls
    return cls


def get_benchmark(kind: str) -> Benchmark:
    from plugins import benchmarks  # noqa: F401  (imports every plug-in module, which registers it)

    try:
        return _REGISTRY[kind]()
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ParamError("kind", f"unknown benchmark kind {kind!r} (known: {known})") from None


def benchmark_kinds() -> list[str]:
    from plugins import benchmarks  # noqa: F401

    return sorted(_REGISTRY)


def header_sections(text: str, prefix: str, *, end: int | None = None) -> list[tuple[dict[str, Any], str]]:
    """The output of a helper shipped to the nodes, split at its header lines (``PREFIX{json object}``): (header,
    what follows it up to the next header, or to ``end`` for the last one), in order; [] when there is none. An
    unreadable header is a ParseError naming it."""
    headers = list(re.finditer(r"^" + re.escape(prefix) + r"(.*)$", text, re.MULTILINE))
    sections = []
    for i, match in enumerate(headers):
        try:
            header = json.loads(match.group(1))
        except ValueError:
            header = None
        if not isinstance(header, dict):
            raise ParseError(f"unreadable {prefix.strip().lstrip('#')} header line: {match.group(0)[:200]!r}")
        stop = headers[i + 1].start() if i + 1 < len(headers) else len(text) if end is None else end
        sections.append((header, text[match.end() : stop]))
    return sections
