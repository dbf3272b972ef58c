"""A run's plan on its hosts, without I/O: each host's context (run and data directories, the hosts of the run),
its commands as the plug-in builds them (inside the campaign's container when it has one) and how they read.

The preview shows exactly what execution (runners/execution.py) runs: both call these functions.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from django.conf import settings

from campaigns.models import Run
from campaigns.planning import benchmark_params, run_env
from common.errors import FieldError
from common.names import path_under
from plugins.benchmarks.base import Benchmark, HostCommand, HostContext, HostInfo, ParamError
from plugins.containers import ContainerRuntime, ContainerSpec, get_runtime, spec_from_dict
from plugins.launchers import slurm
from plugins.mounts import MountPlan, plan_mounts

SERVICE_DIR = "service"


def remote_root(home: str) -> str:
    """rackbench's directory on a node whose login directory is ``home``: RACKBENCH_REMOTE_ROOT, under that home
    unless it is absolute. Runs (runners.remote.remote_root) and previews both take it from here."""
    root = settings.RACKBENCH["REMOTE_ROOT"]
    return root if root.startswith("/") else f"{home.rstrip('/')}/{root}"


def run_dir_name(run: Run) -> str:
    return f"run-{run.pk}-{run.uid.hex[:12]}"


def display_command(run_dir: str, argv: list[str], env: dict[str, str]) -> str:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"cd {shlex.quote(run_dir)} && {exports + ' ' if exports else ''}{shlex.join(argv)}"


def split_commands(built: HostCommand | list[HostCommand] | None) -> tuple[HostCommand | None, HostCommand | None]:
    """(main, service) from what a plug-in's build() returned; at most one of each per host."""
    commands = [] if built is None else [built] if isinstance(built, HostCommand) else list(built)
    mains = [c for c in commands if not c.service]
    services = [c for c in commands if c.service]
    if len(mains) > 1 or len(services) > 1:
        raise ParamError("kind", "a benchmark may run at most one main command and one service per host")
    return (mains[0] if mains else None), (services[0] if services else None)


def data_dir_for(run: Run, node_name: str, root: str, mounts: tuple[str, ...] = ()) -> str:
    """Where a host's test data goes: on the campaign's first mount point, else the storage's export path
    (as seen from the node), else under rackbench's directory; always in a directory named after the node.
    """
    storage = run.campaign.storage
    if mounts:
        base = mounts[0]
    elif storage and storage.export_path:
        base = storage.export_path.rstrip("/")
    else:
        base = f"{root}/data"
    return _under(base, node_name)


def _under(root: str, *parts: str) -> str:
    """A remote path under ``root`` (common.names.path_under); a name that would leave it (a node renamed through
    the database, ``../x``) fails the run for good instead of writing elsewhere on the node."""
    try:
        return path_under(root, *parts)
    except FieldError as exc:
        raise ParamError(exc.field or "name", f"unsafe remote path: {exc.message}") from None


def host_infos(nodes: list[Any]) -> tuple[HostInfo, ...]:
    return tuple(HostInfo(name=n.name, address=n.address, slots=n.gpu_count or 1, ssh_port=n.ssh_port) for n in nodes)


def host_context(
    run: Run, *, node_name: str, index: int, root: str, hosts: tuple[HostInfo, ...], dir_name: str = ""
) -> HostContext:
    storage = run.campaign.storage
    mounts = tuple(p.point for p in campaign_mounts(run, index))
    return HostContext(
        node=node_name,
        index=index,
        run_dir=_under(root, node_name, dir_name or run_dir_name(run)),
        data_dir=data_dir_for(run, node_name, root, mounts),
        hosts=hosts,
        storage_addresses=tuple(storage.data_addresses) if storage else (),
        env=run_env(run.campaign.env, run.params),
        mounts=mounts,
    )


def campaign_mounts(run: Run, node_index: int) -> list[MountPlan]:
    campaign = run.campaign
    if not campaign.mounts or campaign.storage is None:
        return []
    return plan_mounts(campaign.mounts, storage=campaign.storage, node_index=node_index)


def run_host_infos(run: Run, nodes: list[Any]) -> tuple[HostInfo, ...]:
    """The run's hosts as plug-ins see them; in containers, MPI hops over the containers' sshd.

    Under Slurm a host's address is its Slurm node name: inside an allocation, Open MPI checks ``--host``
    against the allocation's node names and starts its daemons with srun, not over SSH.
    """
    infos = host_infos(nodes)
    if slurm.is_slurm(run.campaign.launcher):
        infos = tuple(replace(i, address=i.name) for i in infos)
    found = container_of(run)
    return tuple(replace(i, ssh_port=found[1].ssh_port) for i in infos) if found else infos


def container_of(run: Run) -> tuple[ContainerRuntime, ContainerSpec] | None:
    if not run.campaign.container:
        return None
    spec = spec_from_dict(run.campaign.container)
    return get_runtime(spec.runtime), spec


def container_name(campaign: Any) -> str:
    return f"rackbench-c{campaign.pk if campaign.pk is not None else 'ID'}"  # ID: a definition not saved yet


def build_commands(
    run: Run, benchmark: Benchmark, context: HostContext
) -> tuple[HostCommand | None, HostCommand | None]:
    """A host's (main, service) commands, run inside the campaign's container when it has one."""
    main, service = split_commands(benchmark.build(benchmark_params(run.params), context))
    service_dir = f"{context.run_dir}/{SERVICE_DIR}"
    return _inside(run, context, main, context.run_dir), _inside(run, context, service, service_dir)


def build_layout(run: Run, benchmark: Benchmark, context: HostContext) -> HostCommand | None:
    """A host's data layout command (run in its run directory before the cache flush), or None."""
    return _inside(run, context, benchmark.layout(benchmark_params(run.params), context), context.run_dir)


def _inside(run: Run, context: HostContext, command: HostCommand | None, workdir: str) -> HostCommand | None:
    """``command`` as it runs inside the campaign's container (unchanged without one)."""
    found = container_of(run)
    if command is None or found is None:
        return command
    runtime, _ = found
    env = {**context.env, **command.env}
    argv = runtime.exec_argv(container_name(run.campaign), command.argv, env=env, workdir=workdir)
    return replace(command, argv=argv)
