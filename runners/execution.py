"""What a run does on its hosts: flush caches, write its files, start it detached, poll, collect, kill.

Under a Slurm launcher (plugins/launchers/slurm.py) the primary's main command is submitted with sbatch on the
campaign's login node instead of started detached, and polled, collected and cancelled there.

Called by the tasks in runners.tasks; every state change goes through campaigns.services.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django.utils import timezone

from campaigns import services
from campaigns.models import Run, RunHost, RunStatus
from campaigns.plan import (
    SERVICE_DIR,
    build_commands,
    campaign_mounts,
    container_name,
    container_of,
    display_command,
    host_context,
    run_host_infos,
)
from campaigns.planning import benchmark_params
from inventory.crypto import decrypt
from inventory.models import Node
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    Metric,
    ParamError,
    ParseError,
    get_benchmark,
)
from plugins.containers import get_runtime, spec_from_dict
from plugins.launchers import slurm
from plugins.launchers.mpi import mpirun_argv, options_from_params
from plugins.mounts import mount_command, plan_mounts, unmount_command
from runners import remote, samplers, ssh
from runners import slurm as slurm_jobs

TAIL = 4000
SERVICE_READY_TIMEOUT = 30.0


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
    roots = remote.fan_out([h.target for h in hosts], remote.remote_root)
    ssh.raise_first(roots)
    infos = run_host_infos(run, [h.row.node for h in hosts])
    jobs = []
    for i, (host, root) in enumerate(zip(hosts, roots, strict=True)):
        context = host_context(run, node_name=host.row.host, index=i, root=root, hosts=infos)
        main, service = build_commands(run, benchmark, context)
        jobs.append(HostJob(host.row, host.target, context, main, service, root))
    return jobs


def start_containers(run: Run, jobs: list[HostJob]) -> dict[str, Any]:
    """Start the campaign's container on every host where it is not running yet; returns what ran where.

    The container gets rackbench's directory and the campaign's mounts at the same paths, and the launch's
    key pair in a 0700 directory (mounted read-only at /rackbench-keys) so MPI can hop between containers.
    """
    found = container_of(run)
    if found is None:
        return {}
    runtime, spec = found
    name = container_name(run.campaign)
    private_key = decrypt(run.campaign.ssh_private_key_encrypted)
    # MPI hops between containers accept a first contact only from the campaign's own hosts.
    addresses = sorted(set(RunHost.objects.filter(run__campaign=run.campaign).values_list("address", flat=True)))

    def start(job: HostJob) -> str:
        if job.target.run(shlex.join(runtime.running_argv(name))).ok:
            return "already running"
        key_dir = f"{job.root}/keys/{name}"
        job.target.check(
            shlex.join(["mkdir", "-p", "-m", "700", key_dir]), what="creating the container's key directory"
        )
        job.target.put(
            {
                f"{key_dir}/authorized_keys": run.campaign.ssh_public_key + "\n",
                f"{key_dir}/id_ed25519": private_key,
                f"{key_dir}/hosts": "\n".join(addresses) + "\n",
            },
            mode=0o600,
        )
        volumes = [*spec.volumes, f"{job.root}:{job.root}", *(f"{m}:{m}" for m in job.context.mounts)]
        for argv in runtime.start_argv(replace(spec, volumes=volumes), name=name, key_dir=key_dir):
            job.target.check(shlex.join(argv), what=f"starting the {runtime.name} container")
        return "started"

    started = remote.fan_out(jobs, start)
    ssh.raise_first(started)
    digest_argv = runtime.digest_argv(spec)
    digests = (
        remote.fan_out(jobs, lambda j: j.target.run(shlex.join(digest_argv)).stdout.strip()) if digest_argv else []
    )
    return {
        "runtime": runtime.name,
        "image": spec.image,
        "name": name,
        "hosts": {j.row.host: state for j, state in zip(jobs, started, strict=True)},
        "digests": {j.row.host: d for j, d in zip(jobs, digests, strict=True) if isinstance(d, str)},
    }


def stop_containers(campaign: Any, nodes: list[Any]) -> list[str]:
    """Stop and remove the campaign's containers and their keys; returns the errors, one per failing node."""
    if not campaign.container:
        return []
    spec = spec_from_dict(campaign.container)
    runtime = get_runtime(spec.runtime)
    name = container_name(campaign)

    def stop(target: remote.Target) -> None:
        for argv in runtime.stop_argv(name):
            target.run(shlex.join(argv))
        key_dir = f"{remote.remote_root(target)}/keys/{name}"
        target.check(shlex.join(["rm", "-rf", key_dir]), what="removing the container's keys")

    results = remote.fan_out([remote.node_target(n) for n in nodes], stop)
    return [str(r) for r in results if isinstance(r, BaseException)]


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


# --- prepare ----------------------------------------------------------------------------------------


def run_prepare(run: Run) -> list[HostJob]:
    """Write the run's files on every host, flush caches per the policy, record provenance."""
    benchmark = get_benchmark(run.campaign.kind)
    jobs = host_jobs(run, benchmark)
    if not any(job.main for job in jobs):
        raise ParamError("kind", f"{benchmark.kind} built no command for any host of this run")
    options = slurm_options(run)
    if options:
        _check_slurm_jobs(benchmark, jobs)  # before anything is mounted, started or written
    provenance = dict(run.provenance)
    provenance["mounts"] = mount_storage(run, jobs)  # first: the data directories live on the mounts
    provenance["container"] = start_containers(run, jobs)
    ssh.raise_first(remote.fan_out(jobs, _prepare_host))
    if run.campaign.telemetry:
        provenance["telemetry"] = samplers.prepare(run, jobs)
    if benchmark.uses_mpi and len(jobs) > 1:
        _mirror_primary_files(jobs)
        if not options:  # in a Slurm allocation mpirun reaches its hosts through Slurm, not over SSH
            mpi_reachability(run, jobs)
    if options:
        provenance["slurm"] = _prepare_slurm(run, jobs[0], options)
    provenance["hosts"] = dict(
        zip([j.row.host for j in jobs], remote.fan_out(jobs, lambda j: _host_info(benchmark, j)), strict=True)
    )
    provenance["params"] = run.params
    provenance["flush"] = flush_caches(run, jobs)
    Run.objects.filter(pk=run.pk).update(provenance=provenance, heartbeat_at=timezone.now())
    return jobs


def _main_env(job: HostJob) -> dict[str, str]:
    return {**job.context.env, **(job.main.env if job.main else {})}  # the campaign's, then the plug-in's


def _main_files(job: HostJob) -> dict[str, str]:
    """The main command's files and its command.sh (empty when the host runs no main command)."""
    if job.main is None:
        return {}
    return {**job.main.files, "command.sh": remote.command_script(job.main.argv, _main_env(job))}


def _prepare_host(job: HostJob) -> None:
    run_dir = job.context.run_dir
    data_dirs = [job.context.data_dir] + [f"{mount}/{job.context.node}" for mount in job.context.mounts]
    dirs = data_dirs + ([job.service_dir] if job.service else [])
    env = _main_env(job)
    remote.job_prepare(job.target, run_dir, extra_dirs=dirs, files=_main_files(job))
    if job.service:
        service_files = dict(job.service.files)
        service_files["command.sh"] = remote.command_script(job.service.argv, job.service.env)
        remote.job_prepare(job.target, job.service_dir, extra_dirs=[], files=service_files)
    RunHost.objects.filter(pk=job.row.pk).update(
        command=display_command(run_dir, job.main.argv, env) if job.main else "",
        service_command=display_command(job.service_dir, job.service.argv, job.service.env) if job.service else "",
        remote_dir=run_dir,
    )


def _check_slurm_jobs(benchmark: Benchmark, jobs: list[HostJob]) -> None:
    """Under Slurm only the primary's main command is submitted: refuse what this version cannot run."""
    if any(j.service for j in jobs):
        raise ParamError(
            "launcher",
            f"{benchmark.kind} starts a service on the hosts of this run (a server the main command talks to); "
            "services are not supported under Slurm yet: use launcher: {kind: direct} for this campaign",
        )
    others = [j.row.host for j in jobs[1:] if j.main]
    if others or jobs[0].main is None:
        raise ParamError(
            "launcher",
            f"under Slurm only the first host's command is submitted, but {benchmark.kind} runs a command on "
            f"{', '.join([j.row.host for j in jobs if j.main])}: run it on one node, with an MPI benchmark, "
            "or with launcher: {kind: direct}",
        )


def _prepare_slurm(run: Run, primary: HostJob, options: slurm.SlurmOptions) -> dict[str, Any]:
    """Write the primary's command and the batch script into its run directory on the login node."""
    hosts = primary.context.hosts
    mpi_slots = options_from_params(benchmark_params(run.params), {}).slots
    counts = sorted({mpi_slots or h.slots for h in hosts})
    if len(counts) > 1:
        raise ParamError(
            "mpi_slots",
            f"the run's nodes have different slot (GPU) counts {counts}; Slurm's --ntasks-per-node needs one: "
            "set mpi_slots",
        )
    run_dir = primary.context.run_dir
    script = slurm.batch_script(
        job_name=f"rackbench-{run.pk}",
        nodes=[h.name for h in hosts],
        tasks_per_node=counts[0],
        run_dir=run_dir,
        options=options,
    )
    login = slurm_login(run)
    assert login is not None
    remote.job_prepare(login, run_dir, extra_dirs=[], files={**_main_files(primary), slurm.SCRIPT: script})
    primary.login = login
    return {
        "login_node": options.login_node,
        "script": script,
        "submit": f"cd {shlex.quote(run_dir)} && {shlex.join(slurm.sbatch_argv(slurm.SCRIPT))}",
    }


def _mirror_primary_files(jobs: list[HostJob]) -> None:
    """Open MPI starts remote ranks in mpirun's working directory: give every host the primary's run
    directory (same path) with the files the ranks use, e.g. the round-robin wrapper."""
    primary = jobs[0]
    if primary.main is None or not primary.main.files:
        return
    run_dir = primary.context.run_dir
    files = {f"{run_dir}/{name}": content for name, content in primary.main.files.items()}

    def mirror(job: HostJob) -> None:
        job.target.check(shlex.join(["mkdir", "-p", run_dir]), what="creating the MPI working directory")
        job.target.put(files)

    ssh.raise_first(remote.fan_out(jobs[1:], mirror))


def mpi_reachability(run: Run, jobs: list[HostJob]) -> None:
    """``mpirun ... hostname`` from the primary across every host; on failure, name the hosts it cannot reach."""
    primary = jobs[0]
    hosts = primary.context.hosts
    options = options_from_params(benchmark_params(run.params), {})
    argv = mpirun_argv(hosts, ["hostname"], replace(options, slots=1, report_bindings=False, env={}))
    result = primary.target.run(f"cd {shlex.quote(primary.context.run_dir)} && {shlex.join(argv)}", timeout=60)
    if result.ok:
        return
    port = options.ssh_port or hosts[0].ssh_port
    probes = remote.fan_out(
        list(hosts[1:]),
        lambda h: primary.target.run(shlex.join(["ssh", "-p", str(port), "-o", "BatchMode=yes", h.address, "true"])),
    )
    failed = [
        f"{h.name} ({h.address}:{port})" for h, r in zip(hosts[1:], probes, strict=True) if not getattr(r, "ok", False)
    ]
    detail = _last_lines(result.stderr or result.stdout)
    if not failed:  # every host answers over SSH: mpirun's own daemons failed to call back, which a retry may mend
        raise ssh.TransientSSHError(
            primary.target.endpoint, f"MPI reachability check: mpirun from {primary.row.host} failed: {detail}"
        )
    raise ssh.PermanentSSHError(
        primary.target.endpoint,
        f"MPI reachability check: mpirun from {primary.row.host} cannot reach {', '.join(failed)} over SSH: {detail}",
    )


def _host_info(benchmark: Benchmark, job: HostJob) -> dict[str, Any]:
    node = job.row.node
    assert node is not None
    version = shlex.join(benchmark.version_argv) if benchmark.version_argv else "true"
    result = job.target.run(f"uname -srm; {version} 2>&1 | head -n 3")
    kernel, _, tool = result.stdout.partition("\n")
    return {
        "kernel": kernel.strip(),
        "tool_version": tool.strip(),
        "node": {
            "address": node.address,
            "cpu_model": node.cpu_model,
            "cpu_cores": node.cpu_cores,
            "ram_mb": node.ram_mb,
            "gpu_model": node.gpu_model,
            "gpu_count": node.gpu_count,
            "facts": node.facts,
            "facts_collected_at": node.facts_collected_at.isoformat() if node.facts_collected_at else None,
        },
    }


def mount_storage(run: Run, jobs: list[HostJob]) -> dict[str, list[dict[str, str]]]:
    """Mount the campaign's mount points on every host where they are not mounted yet."""
    plans = {job.row.host: campaign_mounts(run, job.context.index) for job in jobs}
    if not any(plans.values()):
        return {}
    ssh.raise_first(
        remote.fan_out(
            jobs,
            lambda j: j.target.check(
                mount_command(plans[j.row.host], j.target.endpoint.username), what="mounting the storage"
            ),
        )
    )
    return {host: [vars(p) for p in host_plans] for host, host_plans in plans.items()}


def unmount_storage(campaign: Any, nodes: list[Any]) -> list[str]:
    """Unmount the campaign's mount points from its nodes; returns the errors, one per node that failed."""
    if not campaign.mounts or campaign.storage is None:
        return []
    targets = [remote.node_target(n) for n in nodes]

    def unmount(item: tuple[int, remote.Target]) -> None:
        index, target = item
        plans = plan_mounts(campaign.mounts, storage=campaign.storage, node_index=index)
        target.check(unmount_command(plans, target.endpoint.username), what="unmounting the storage")

    results = remote.fan_out(list(enumerate(targets)), unmount)
    return [str(r) for r in results if isinstance(r, BaseException)]


def client_flush_command(user: str) -> str:
    if user == "root":
        return "sync && echo 3 > /proc/sys/vm/drop_caches"
    return "sync && echo 3 | sudo -n tee /proc/sys/vm/drop_caches > /dev/null"


def flush_caches(run: Run, jobs: list[HostJob]) -> list[dict[str, Any]]:
    """Flush the storage system's caches, then every client's page cache, per the campaign's policy."""
    campaign = run.campaign
    records: list[dict[str, Any]] = []
    if campaign.flush_storage and campaign.storage:
        target = remote.storage_target(campaign.storage)
        command = shlex.join(shlex.split(campaign.storage.flush_command)) if campaign.storage.flush_command else ""
        if not command:
            raise ssh.PermanentSSHError(None, f"storage system {campaign.storage.name} has no flush command")
        records.append(_flush(target, command, f"storage {campaign.storage.name}", "flushing the storage caches"))
    if campaign.flush_clients:
        results = remote.fan_out(
            jobs,
            lambda j: _flush(
                j.target, client_flush_command(j.target.endpoint.username), j.row.host, "flushing the page cache"
            ),
        )
        ssh.raise_first(results)
        records += results
    return records


def _flush(target: remote.Target, command: str, label: str, what: str) -> dict[str, Any]:
    at = timezone.now()
    result = target.check(command, what=f"{what} on {label} ({command})")
    return {
        "target": label,
        "command": command,
        "at": at.isoformat(),
        "seconds": round(result.seconds, 3),
        "exit_code": 0,
    }


def run_submit(jobs: list[HostJob]) -> None:
    """Start the services, wait until they accept work, start the telemetry samplers, then every main command.

    If any host refuses, everything already started is stopped and reset again.
    """
    primary = jobs[0] if jobs else None
    if primary is not None and primary.login is not None:  # Slurm: no services, one main (run_prepare checked)
        job_id = slurm_jobs.submit(primary.login, primary.context.run_dir)
        RunHost.objects.filter(pk=primary.row.pk).update(slurm_job_id=job_id)
        return
    services = [j for j in jobs if j.service]
    mains = [j for j in jobs if j.main]
    try:
        ssh.raise_first(remote.fan_out(services, lambda j: remote.job_submit(j.target, j.service_dir)))
        ssh.raise_first(remote.fan_out(services, _wait_ready))
        samplers.start(jobs)
        ssh.raise_first(remote.fan_out(mains, lambda j: remote.job_submit(j.target, j.context.run_dir)))
    except Exception:  # undone, so that a retry starts every host again, in one attempt
        remote.fan_out(mains, lambda j: remote.job_undo(j.target, j.context.run_dir))
        remote.fan_out(services, lambda j: remote.job_undo(j.target, j.service_dir))
        remote.fan_out([j for j in jobs if j.telemetry_dir], lambda j: remote.job_kill(j.target, j.telemetry_dir))
        raise


def _wait_ready(job: HostJob) -> None:
    assert job.service is not None
    if not job.service.ready_argv:
        return
    line = f"cd {shlex.quote(job.service_dir)} && {shlex.join(job.service.ready_argv)}"
    deadline = time.monotonic() + SERVICE_READY_TIMEOUT
    while True:
        result = job.target.run(line)
        if result.ok:
            return
        state = remote.job_state(job.target, job.service_dir)
        if state.finished or state.vanished or time.monotonic() > deadline:
            stdout, stderr = remote.job_output(job.target, job.service_dir)
            detail = (stderr or stdout or result.stderr).strip()[-500:]
            raise ssh.PermanentSSHError(job.target.endpoint, f"the service did not become ready: {detail}")
        time.sleep(0.2)


# --- poll, collect, kill --------------------------------------------------------------------------


@dataclass
class PollOutcome:
    finished: bool
    vanished: list[str]
    killed: list[str] = field(default_factory=list)  # of ``vanished``: where rackbench killed it


def run_poll(run: Run) -> PollOutcome:
    login = slurm_login(run)
    if login is not None:
        host, job_id = _slurm_job(run, login)
        state = slurm_jobs.job_state(login, job_id, host.row.remote_dir)
        store_live_log(run, login, host)
        return PollOutcome(finished=state.finished, vanished=[])
    hosts = main_targets(run)
    states = remote.fan_out(hosts, lambda h: remote.job_state(h.target, h.row.remote_dir))
    ssh.raise_first(states)
    for host, state in zip(hosts, states, strict=True):
        if state.pid and host.row.pid != state.pid:
            RunHost.objects.filter(pk=host.row.pk).update(pid=state.pid)
    if hosts:
        store_live_log(run, hosts[0].target, hosts[0])
    vanished = [h.row.host for h, state in zip(hosts, states, strict=True) if state.vanished]
    killed = [h.row.host for h, state in zip(hosts, states, strict=True) if state.vanished and state.killed]
    return PollOutcome(finished=all(s.finished for s in states), vanished=vanished, killed=killed)


LIVE_LOG_WANTED_FOR = 10.0  # seconds since a campaign page last asked (it asks every 2 s while open)
LIVE_LOG_BYTES = 16_384  # of stdout and of stderr: enough for the 40 lines the page shows


def store_live_log(run: Run, target: remote.Target, host: RunTarget) -> None:
    """While the run's campaign page is open, store the end of ``host``'s output (read from ``target``: the host,
    or the Slurm login node) for it: the page reads the database, never the host. A read that fails keeps the
    last text and says why; the poll goes on."""
    wanted = run.live_log_wanted_at
    if wanted is None or (timezone.now() - wanted).total_seconds() > LIVE_LOG_WANTED_FOR:
        return
    log: dict[str, Any] = {"host": host.row.host, "at": timezone.now().isoformat(), "error": ""}
    try:
        log["stdout"], log["stderr"] = remote.job_output(target, host.row.remote_dir, limit=LIVE_LOG_BYTES)
    except ssh.SSHError as exc:
        log = {**run.live_log, "host": host.row.host, "error": f"the log could not be read at {log['at']}: {exc}"}
    Run.objects.filter(pk=run.pk).update(live_log=log)


@dataclass
class HostOutcome:
    """How one host's main command ended: its output, its exit code, and for a Slurm job, Slurm's word."""

    stdout: str
    stderr: str
    exit_code: int | None
    slurm_state: slurm.SlurmState | None = None


def _slurm_job(run: Run, login: remote.Target) -> tuple[RunTarget, str]:
    """The host whose main command is the run's Slurm job, and the job's id (from the database, else from
    the run directory: a worker may have died between sbatch and recording its answer)."""
    hosts = main_targets(run)
    if not hosts:
        raise ssh.PermanentSSHError(login.endpoint, "the run has no main command, so no Slurm job to follow")
    host = hosts[0]
    job_id = host.row.slurm_job_id or slurm_jobs.recorded_job_id(login, host.row.remote_dir)
    if not job_id:
        raise ssh.PermanentSSHError(
            login.endpoint, f"the run's Slurm job id is not recorded (look for the job rackbench-{run.pk} in squeue)"
        )
    if not host.row.slurm_job_id:
        RunHost.objects.filter(pk=host.row.pk).update(slurm_job_id=job_id)
    return host, job_id


def _host_outcome(host: RunTarget) -> HostOutcome:
    stdout, stderr = remote.job_output(host.target, host.row.remote_dir)
    return HostOutcome(stdout, stderr, remote.job_state(host.target, host.row.remote_dir).exit_code)


def _slurm_outcome(run: Run, login: remote.Target) -> HostOutcome:
    host, job_id = _slurm_job(run, login)
    state = slurm_jobs.job_state(login, job_id, host.row.remote_dir)
    ended = {"job_id": job_id, "state": state.state, "exit_code": state.exit_code, "source": state.source}
    services.run_provenance_merge(
        run_id=run.pk, update=lambda provenance: provenance.update(slurm={**provenance.get("slurm", {}), **ended})
    )
    stdout, stderr = remote.job_output(login, host.row.remote_dir)
    return HostOutcome(stdout, stderr, state.exit_code, state)


def run_collect(run: Run) -> tuple[str, str]:
    """Fetch every main command's output, store it and the parsed metrics, stop the services.

    Returns (status, error): a non-zero exit (or a Slurm job that did not complete), unparsable output, a
    missing metric or a failed plug-in check (e.g. the wrong NCCL transport) fails the run even when every
    command exited 0.
    """
    benchmark = get_benchmark(run.campaign.kind)
    targets = run_targets(run, started=True)
    samplers.stop(run, targets)  # first: the samplers record the benchmark, not this
    hosts = main_targets(run, targets)
    login = slurm_login(run)
    if login is not None:
        outputs: list[Any] = [_slurm_outcome(run, login)]
        hosts = hosts[:1]
    else:
        outputs = remote.fan_out(hosts, _host_outcome)
    ssh.raise_first(outputs)
    errors: list[str] = []
    per_host: list[Metric] = []
    logs: dict[str, str] = {}
    for row, outcome in zip([h.row for h in hosts], outputs, strict=True):
        stdout, stderr = outcome.stdout, outcome.stderr
        RunHost.objects.filter(pk=row.pk).update(stdout=stdout, stderr=stderr, exit_code=outcome.exit_code)
        logs[row.host] = f"{stdout}\n{stderr}"
        if outcome.slurm_state is not None and outcome.slurm_state.error:
            errors.append(f"{row.host}: {outcome.slurm_state.error}: {_last_lines(stderr or stdout)}")
            continue
        if outcome.exit_code != 0:
            errors.append(f"{row.host}: exited with code {outcome.exit_code}: {_last_lines(stderr or stdout)}")
            continue
        try:
            per_host += benchmark.parse(stdout, host=row.host)
        except ParseError as exc:
            errors.append(f"{row.host}: output could not be parsed: {exc}")
    Run.objects.filter(pk=run.pk).update(
        stdout_tail=_tails([(h.row.host, o.stdout) for h, o in zip(hosts, outputs, strict=True)]),
        stderr_tail=_tails([(h.row.host, o.stderr) for h, o in zip(hosts, outputs, strict=True)]),
    )
    stop_services(run, targets)
    metrics = per_host + benchmark.aggregate(per_host) if per_host else []
    services.run_store_results(run=run, metrics=metrics)
    samplers.collect(run, targets)  # after the results: it adds its summaries to them
    if not errors:
        errors += benchmark.missing(metrics, [h.row.host for h in hosts])
        errors += benchmark.check(benchmark_params(run.params), metrics, logs)
    return (RunStatus.FAILED, "\n".join(errors)) if errors else (RunStatus.SUCCEEDED, "")


def stop_services(run: Run, targets: list[RunTarget]) -> None:
    """Stop the run's services (on ``targets``, its started hosts) and keep what they printed in its provenance."""
    hosts = [h for h in targets if h.row.service_command]
    if not hosts:
        return
    remote.fan_out(hosts, lambda h: remote.job_kill(h.target, f"{h.row.remote_dir}/{SERVICE_DIR}", grace=1.0))
    outputs = remote.fan_out(hosts, lambda h: remote.job_output(h.target, f"{h.row.remote_dir}/{SERVICE_DIR}"))
    kept = {
        h.row.host: {"command": h.row.service_command, "stdout_tail": o[0][-TAIL:], "stderr_tail": o[1][-TAIL:]}
        for h, o in zip(hosts, outputs, strict=True)
        if not isinstance(o, BaseException)
    }
    services.run_provenance_merge(run_id=run.pk, update=lambda provenance: provenance.update(services=kept))


def _last_lines(text: str, count: int = 3) -> str:
    """The end of a tool's complaint: the cause often comes a line or two before the last one."""
    lines = [line.strip()[:300] for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "(no output)"


def _tails(pairs: list[tuple[str, str]]) -> str:
    if len(pairs) == 1:
        return pairs[0][1][-TAIL:]
    per = max(TAIL // max(len(pairs), 1), 200)
    return "\n".join(f"==> {host} <==\n{text[-per:]}" for host, text in pairs if text)


def run_kill(run: Run) -> dict[str, str]:
    """Kill everything every main command, service and sampler of the run started on its hosts (scancel a Slurm
    job). Returns the hosts where that is not confirmed, each with why (unreachable, or pids that outlived
    SIGKILL); empty when every kill is confirmed."""
    login = slurm_login(run)
    if login is not None:
        for host in main_targets(run)[:1]:  # not submitted yet when the run has no main command recorded
            job_id = host.row.slurm_job_id or slurm_jobs.recorded_job_id(login, host.row.remote_dir)
            if job_id:
                slurm_jobs.cancel(login, job_id, host.row.remote_dir)
        return {}
    targets = run_targets(run, started=True)
    jobs = [(h.target, h.row.remote_dir) for h in main_targets(run, targets)]
    jobs += [(h.target, f"{h.row.remote_dir}/{SERVICE_DIR}") for h in targets if h.row.service_command]
    jobs += samplers.kill_jobs(run, targets)
    unconfirmed: dict[str, str] = {}
    for (target, _), left in zip(jobs, remote.fan_out(jobs, lambda job: remote.job_kill(*job)), strict=True):
        where = target.endpoint.name or target.endpoint.label
        if isinstance(left, BaseException):
            unconfirmed.setdefault(where, str(left))
        elif left:
            unconfirmed.setdefault(where, f"processes {' '.join(map(str, left))} still alive after SIGKILL")
    return unconfirmed


def run_keep_output(run: Run) -> None:
    """Store what a stopped run printed and sampled (best effort: a host that cannot be reached keeps nothing)."""
    targets = run_targets(run, started=True)
    hosts = main_targets(run, targets)
    login = slurm_login(run)
    outputs = remote.fan_out(hosts, lambda h: remote.job_output(login or h.target, h.row.remote_dir))
    kept = [(h.row, o) for h, o in zip(hosts, outputs, strict=True) if not isinstance(o, BaseException)]
    for row, (stdout, stderr) in kept:
        RunHost.objects.filter(pk=row.pk).update(stdout=stdout, stderr=stderr)
    Run.objects.filter(pk=run.pk).update(
        stdout_tail=_tails([(r.host, o[0]) for r, o in kept]), stderr_tail=_tails([(r.host, o[1]) for r, o in kept])
    )
    samplers.collect(run, targets)
