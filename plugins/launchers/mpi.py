"""mpirun command lines in the shape of the reference papers (seeds 000 and 001)::

    mpirun -n 48 --allow-run-as-root --host dgx2-1:16,dgx2-2:16,dgx2-3:16 --report-bindings
      --bind-to none --map-by slot -x LD_LIBRARY_PATH -x PATH -mca plm_rsh_agent ssh
      -mca plm_rsh_args "-p 2222" -mca pml ob1 -mca btl ^openib -mca btl_tcp_if_include enp53s0
      -x NCCL_DEBUG=INFO -x NCCL_IB_HCA=mlx5 ... ./round_robin_mpi.py python -u tf_cnn_benchmarks.py ...

Built as an argv list: nothing here goes through a shell.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common import parameters
from plugins.benchmarks.base import Benchmark, HostCommand, HostContext, HostInfo, Metric, ParamError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The campaign parameters options_from_params reads: every MPI plug-in accepts them besides its own.
MPI_PARAMS = frozenset(
    {
        "mpi_slots",
        "mpi_ssh_port",
        "mpi_pml",
        "mpi_btl",
        "mpi_btl_tcp_if_include",
        "mpi_map_by",
        "mpi_bind_to",
        "mpi_tag_output",
    }
)
FORWARDED = ("LD_LIBRARY_PATH", "PATH")  # passed through from the launching shell, in the seeds' order
MCA_VALUE = re.compile(r"^[A-Za-z0-9_.,^/:=+-]+$")


@dataclass(frozen=True)
class MpiOptions:
    """What a campaign may set about the launch (parameters prefixed ``mpi_``)."""

    slots: int | None = None  # ranks per host; default: each host's GPU count (HostInfo.slots)
    ssh_port: int | None = None  # the sshd port MPI hops over (a container's sshd, e.g. 2222)
    pml: str = ""  # e.g. ob1
    btl: str = ""  # e.g. ^openib
    btl_tcp_if_include: str = ""  # e.g. enp53s0
    map_by: str = "slot"
    bind_to: str = "none"
    tag_output: bool = False
    allow_run_as_root: bool = True
    report_bindings: bool = True
    env: dict[str, str] = field(default_factory=dict)  # -x NAME=value (NCCL_* and anything the campaign sets)


def options_from_params(params: dict[str, Any], env: dict[str, str] | None = None) -> MpiOptions:
    """Read ``mpi_*`` parameters; ParamError names the bad one."""

    def text(name: str, default: str = "") -> str:
        value = str(params.get(name, default))
        if value and not MCA_VALUE.match(value):
            raise ParamError(name, f"{value!r} has characters mpirun options never need")
        return value

    def number(name: str) -> int | None:
        value = params.get(name)
        return None if value is None else parameters.checked(name, parameters.integer(1, 65535), value)

    env = dict(env or {})
    for name in env:
        if not ENV_NAME.match(name):
            raise ParamError("env", f"{name!r} is not an environment variable name")
        if "\n" in env[name] or "\0" in env[name]:
            raise ParamError(f"env.{name}", "must be a single line")
    return MpiOptions(
        slots=number("mpi_slots"),
        ssh_port=number("mpi_ssh_port"),
        pml=text("mpi_pml"),
        btl=text("mpi_btl"),
        btl_tcp_if_include=text("mpi_btl_tcp_if_include"),
        map_by=text("mpi_map_by", "slot"),
        bind_to=text("mpi_bind_to", "none"),
        tag_output=parameters.checked("mpi_tag_output", parameters.boolean, params.get("mpi_tag_output", False)),
        env=env,
    )


def host_list(hosts: Sequence[HostInfo], slots: int | None = None) -> str:
    return ",".join(f"{h.address}:{slots or h.slots}" for h in hosts)


def rank_count(hosts: Sequence[HostInfo], slots: int | None = None) -> int:
    return sum(slots or h.slots for h in hosts)


def mpirun_argv(hosts: Sequence[HostInfo], rank_argv: list[str], options: MpiOptions) -> list[str]:
    """``mpirun`` starting ``rank_argv`` once per slot on every host, from the first host."""
    if not hosts:
        raise ParamError("nodes", "an MPI launch needs at least one host")
    argv = ["mpirun", "-n", str(rank_count(hosts, options.slots))]
    if options.allow_run_as_root:
        argv.append("--allow-run-as-root")
    argv += ["--host", host_list(hosts, options.slots)]
    if options.report_bindings:
        argv.append("--report-bindings")
    if options.tag_output:
        argv.append("--tag-output")
    argv += ["--bind-to", options.bind_to, "--map-by", options.map_by]
    for name in FORWARDED:
        argv += ["-x", name]
    ssh_port = options.ssh_port or (hosts[0].ssh_port if hosts[0].ssh_port != 22 else None)
    if ssh_port:  # a container's sshd (seed 000: 2222), or the nodes' own sshd on a custom port
        argv += ["-mca", "plm_rsh_agent", "ssh", "-mca", "plm_rsh_args", f"-p {ssh_port}"]
    for key in ("pml", "btl", "btl_tcp_if_include"):
        value = getattr(options, key)
        if value:
            argv += ["-mca", key, value]
    for name, value in sorted(options.env.items()):
        argv += ["-x", f"{name}={value}"]
    return argv + rank_argv


class MpiToolBenchmark(Benchmark):
    """A tool that mpirun starts once per rank from the primary host (mdtest, IOR): subclasses give its argv.

    Such a tool prints the whole run's figures once, from whichever rank, so they are stored on host "". Every
    one is named ``<operation><metric_suffix>``; subclasses say which operations a run must report
    (``operations``), how the summary reads (``summary``) and what it is called in messages.
    """

    uses_mpi = True
    metric_suffix = ""
    summary_name = ""  # "IOR's mean write or read bandwidth"

    def rank_argv(self, params: dict[str, Any], data_dir: str) -> list[str]:
        """One rank's command; raises ParamError for bad parameters."""
        raise NotImplementedError

    def summary(self, text: str) -> list[Metric]:
        raise NotImplementedError

    def operations(self, params: dict[str, Any]) -> list[str]:
        """The operations a run with these parameters must report."""
        raise NotImplementedError

    def not_printed(self, operation: str) -> str:
        """Why an operation's metric is missing, in the tool's words."""
        raise NotImplementedError

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """Figures for the whole run (host ""), whichever host's output holds the summary."""
        return self.summary(text)

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        if any(m.host == "" and m.name.endswith(self.metric_suffix) for m in metrics):
            return []
        return [f"expected {self.summary_name} for the run; found none"]

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        found = {m.name for m in metrics if m.host == ""}
        return [
            f"expected metric {op}{self.metric_suffix} is missing: {self.not_printed(op)}"
            for op in self.operations(params)
            if f"{op}{self.metric_suffix}" not in found
        ]

    def validate(self, params: dict[str, Any]) -> None:
        self.rank_argv(params, "/")
        options_from_params(params, {})

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | None:
        argv = self.rank_argv(params, host.data_dir)
        if not host.is_primary:
            return None
        return HostCommand(argv=mpirun_argv(host.hosts, argv, options_from_params(params, host.env)))
