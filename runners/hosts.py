"""A run's hosts as execution sees them: their SSH targets, their contexts and commands, the Slurm login node."""

from __future__ import annotations

from dataclasses import dataclass

from campaigns.models import Run, RunHost
from campaigns.plan import (
    SERVICE_DIR,
    build_commands,
    build_layout,
    host_context,
    remote_root,
    run_host_infos,
)
from inventory.models import Node
from inventory.services import node_note_home
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
)
from plugins.launchers import slurm
from runners import remote, ssh

TAIL = 4000


@dataclass
class RunTarget:
    """One host of a run, with the SSH target to reach it."""

    row: RunHost
    target: remote.Target


@dataclass
class HostJob(RunTarget):
    context: HostContext
    main: HostCommand | None = None
    service: HostCommand | None = None
    root: str = ""  # rackbench's directory on the host (run directories, data, container keys)
    login: remote.Target | None = None  # on the primary under Slurm: the login node its main is submitted on
    telemetry_dir: str = ""  # the sampler's job directory, when the campaign samples telemetry (runners.samplers)
    layout: HostCommand | None = None  # lays out the data the main command reads, before the cache flush

    @property
    def service_dir(self) -> str:
        return f"{self.context.run_dir}/{SERVICE_DIR}"


def run_targets(run: Run, *, started: bool = False) -> list[RunTarget]:
    """The run's hosts in name order (only those with a run directory when ``started``)."""
    rows = list(run.hosts.select_related("node__credential").order_by("host"))
    missing = [r.host for r in rows if r.node is None]
    if missing:
        raise ssh.PermanentSSHError(None, f"nodes removed from the inventory: {', '.join(missing)}")
    return [RunTarget(r, remote.node_target(r.node)) for r in rows if r.node and (r.remote_dir or not started)]


def main_targets(run: Run, targets: list[RunTarget] | None = None) -> list[RunTarget]:
    """The hosts that run a main command (an MPI job's other hosts only take part), of ``targets`` when the run's
    started hosts are loaded already."""
    return [h for h in (targets if targets is not None else run_targets(run, started=True)) if h.row.command]


def host_jobs(run: Run, benchmark: Benchmark) -> list[HostJob]:
    """Targets, contexts and commands for every host of the run (asks each host for its home directory once)."""
    hosts = run_targets(run)
    homes = remote.fan_out([h.target for h in hosts], lambda target: target.home())
    ssh.raise_first(homes)
    infos = run_host_infos(run, [h.row.node for h in hosts])
    jobs = []
    for i, (host, home) in enumerate(zip(hosts, homes, strict=True)):
        if host.row.node is not None:  # run_targets keeps only hosts with a node
            node_note_home(node=host.row.node, home=home)  # so that the next preview shows the paths runs use
        root = remote_root(home)
        context = host_context(run, node_name=host.row.host, index=i, root=root, hosts=infos)
        main, service = build_commands(run, benchmark, context)
        layout = build_layout(run, benchmark, context)
        jobs.append(HostJob(host.row, host.target, context, main, service, root, layout=layout))
    return jobs


def slurm_options(run: Run) -> slurm.SlurmOptions | None:
    launcher = run.campaign.launcher
    return slurm.options_from_launcher(launcher) if slurm.is_slurm(launcher) else None


def slurm_login(run: Run) -> remote.Target | None:
    """The SSH target of the campaign's Slurm login node; None when runs start detached."""
    options = slurm_options(run)
    if options is None:
        return None
    node = Node.objects.select_related("credential").filter(name=options.login_node).first()
    if node is None:
        raise ssh.PermanentSSHError(None, f"the Slurm login node {options.login_node} is no longer in the inventory")
    return remote.node_target(node)


def last_lines(text: str, count: int = 3) -> str:
    """The end of a tool's complaint: the cause often comes a line or two before the last one."""
    lines = [line.strip()[:300] for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "(no output)"
