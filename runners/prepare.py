"""Preparing a run on its hosts: containers, mounts, files, the MPI reachability check, Slurm's batch script, the
benchmark's data laid out, and the cache flushes (storage, then every client's page cache) with what they found
recorded in provenance: each host's page cache before and after its flush, and its counters as the job starts
(plugins/cache.py judges them when the run is collected)."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Any

from django.utils import timezone

from campaigns.models import Run, RunHost
from campaigns.plan import (
    campaign_mounts,
    container_name,
    container_of,
    display_command,
)
from campaigns.planning import benchmark_params
from common.timing import Stopwatch
from inventory.crypto import decrypt
from plugins import cache
from plugins.benchmarks.base import (
    Benchmark,
    ParamError,
    get_benchmark,
)
from plugins.containers import get_runtime, spec_from_dict
from plugins.launchers import slurm
from plugins.launchers.mpi import mpirun_argv, options_from_params
from plugins.mounts import mount_command, plan_mounts, unmount_command
from runners import remote, samplers, ssh
from runners.hosts import HostJob, host_jobs, last_lines, slurm_login, slurm_options


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


def run_prepare(run: Run, *, watch: Stopwatch | None = None, fold: Fold | None = None) -> list[HostJob]:
    """Write the run's files on every host, flush caches per the policy, record provenance (with how long each part
    took, in ``provenance["timing"]["prepare"]``; ``watch``: the step's stopwatch, else one of its own).

    ``fold``: the start to send in the round trip that writes each host's files, where nothing else has to happen
    between preparing and starting (see ``Fold``); it is sent (``fold.jobs``) or not (the caller submits)."""
    watch = watch or Stopwatch()
    benchmark = get_benchmark(run.campaign.kind)
    with watch.lap("hosts"):
        jobs = host_jobs(run, benchmark)
    if not any(job.main for job in jobs):
        raise ParamError("kind", f"{benchmark.kind} built no command for any host of this run")
    options = slurm_options(run)
    if options:
        _check_slurm_jobs(benchmark, jobs)  # before anything is mounted, started or written
    provenance = dict(run.provenance)
    with watch.lap("mounts"):
        provenance["mounts"] = mount_storage(run, jobs)  # first: the data directories live on the mounts
    with watch.lap("containers"):
        provenance["container"] = start_containers(run, jobs)
    # A run whose preparation is only files, layout and flushes has each host's layout run in the round trip that
    # writes its files, and, where no flush follows, the cache counters read there too.
    # The snapshot is taken apart (and timed: ``probe_s``) where the campaign has no submit wave for the start
    # margin to be reckoned from.
    plain = not options and not run.campaign.telemetry and not (benchmark.uses_mpi and len(jobs) > 1)
    flushes = run.campaign.flush_clients or (run.campaign.flush_storage and run.campaign.storage is not None)
    waved = plain and not flushes and earlier_wave(run, sum(1 for j in jobs if j.main))[1] is not None
    versions = known_versions(run, jobs)
    # The start goes with the files only where nothing is left to do on another host before it (no service to
    # start first, no version to read), and the start margin has a measured wave to go by (``waved``).
    fold = fold if waved and not any(j.service for j in jobs) and len(versions) == len(jobs) else None
    folded = _Folded(run, layout=plain, snapshot=waved, fold=fold)
    if fold is not None:
        _record_commands(jobs)  # before any host can start: a resumed start or a kill finds every host
        fold.send(jobs)
    with watch.lap("files"):
        written = remote.fan_out(jobs, folded.prepare_host)
        if fold is None:
            _record_commands(
                [job for job, result in zip(jobs, written, strict=True) if not isinstance(result, BaseException)]
            )
        else:
            fold.answered(jobs, written)
    ssh.raise_first(written)
    if folded.layout:
        provenance["layout"] = folded.layouts(jobs, written)
    if run.campaign.telemetry:
        with watch.lap("telemetry"):
            provenance["telemetry"] = samplers.prepare(run, jobs)
    if benchmark.uses_mpi and len(jobs) > 1:
        with watch.lap("mpi"):
            _mirror_primary_files(jobs)
            if not options:  # in a Slurm allocation mpirun reaches its hosts through Slurm, not over SSH
                mpi_reachability(run, jobs)
    if options:
        provenance["slurm"] = _prepare_slurm(run, jobs[0], options)
    with watch.lap("versions"):
        provenance["hosts"] = hosts_provenance(run, benchmark, jobs, versions)
    provenance["params"] = run.params
    if not folded.layout:
        with watch.lap("layout"):
            provenance["layout"] = lay_out_data(run, jobs)  # before the flush: the run reads data no cache just had
    with watch.lap("flush"):
        provenance["flush"] = flush_caches(run, jobs)
    if folded.snapshot:
        start: list[Any] = [snapshot_record(p.after or "") for p in written]
    else:
        began = time.monotonic()
        with watch.lap("snapshot"):
            start = remote.fan_out(jobs, lambda j: snapshot(j.target))  # the counters as the measured job starts
        ssh.raise_first(start)
        # One command on every host at once, timed: what the start barrier's margin is reckoned from where the
        # campaign has no submit wave to as many hosts yet (lifecycle).
        provenance["start"] = {**(provenance.get("start") or {}), "probe_s": round(time.monotonic() - began, 4)}
    provenance["cache"] = {
        "expect": cache.expectation(
            flush_clients=run.campaign.flush_clients, warmup_runs=run.campaign.warmup_runs, is_warmup=run.is_warmup
        ),
        "start": {j.row.host: s for j, s in zip(jobs, start, strict=True)},
        "flags": [f for record in provenance["flush"] for f in record.get("flags", [])],
    }
    provenance["timing"] = {**(provenance.get("timing") or {}), "prepare": dict(watch.laps)}
    Run.objects.filter(pk=run.pk).update(provenance=provenance, heartbeat_at=timezone.now())
    return jobs


def _main_env(job: HostJob) -> dict[str, str]:
    return {**job.context.env, **(job.main.env if job.main else {})}  # the campaign's, then the plug-in's


def _main_files(job: HostJob) -> dict[str, str]:
    """The main command's files and its command.sh (empty when the host runs no main command)."""
    if job.main is None:
        return {}
    return {**job.main.files, "command.sh": remote.command_script(job.main.argv, _main_env(job))}


@dataclass
class Fold:
    """A start sent in the round trip that prepares each host (files, layout, cache counters, then the submit), for a
    run with nothing to do between preparing and starting: no flush, service, sampler, MPI check or Slurm script.
    Its instant is taken as the round trip is sent: now + ``margin_s`` (runners/lifecycle.py reckons the margin from
    the campaign's earlier preparations), and a host whose preparation ends more than ``tolerance_s`` after it
    starts nothing, as a late submit does. ``jobs``: the hosts it was sent to (empty: not sent); ``answers``: each
    main host's, as ``remote.job_submit`` returns it (None: started; an int: late by so many ns) or the error;
    ``needed_s``: how long after it was sent the last host checked the instant (what the margin had to cover, on the
    nodes' clocks), where every host said."""

    attempt: str
    margin_s: float
    tolerance_s: float
    source: str = ""  # what the margin was reckoned from
    start_at_ns: int = 0
    wave_s: float = 0.0
    needed_s: float | None = None
    jobs: list[HostJob] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    _sent: float = 0.0

    def send(self, jobs: list[HostJob]) -> None:
        self.jobs = jobs
        self._sent = time.monotonic()
        self.start_at_ns = time.time_ns() + int(self.margin_s * 1e9)

    def line(self, job: HostJob) -> str:
        if job.main is None:
            return ""
        return remote.submit_line(job.context.run_dir, attempt=self.attempt, start_at_ns=self.start_at_ns,
                                  tolerance_ns=int(self.tolerance_s * 1e9))  # fmt: skip

    def answered(self, jobs: list[HostJob], written: list[Any]) -> None:
        self.wave_s = time.monotonic() - self._sent
        self.answers = [_answer(job, result) for job, result in zip(jobs, written, strict=True) if job.main]
        checked = [_checked_ns(result) for job, result in zip(jobs, written, strict=True) if job.main]
        if checked and all(isinstance(ns, int) for ns in checked):
            self.needed_s = self.margin_s + max(ns for ns in checked if ns is not None) / 1e9


def _checked_ns(result: remote.Prepared | BaseException) -> int | None:
    """How late (ns; negative: early) the host's submit checked the instant, as it printed it; None where unknown."""
    if isinstance(result, BaseException) or result.submitted is None:
        return None
    text = result.submitted.stdout.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _answer(job: HostJob, result: remote.Prepared | BaseException) -> int | BaseException | None:
    if isinstance(result, BaseException):
        return result
    if result.submitted is None:  # its layout failed: nothing was started there (the layout's error is raised)
        return ssh.PermanentSSHError(job.target.endpoint, "laying out the benchmark's data failed")
    try:
        return remote.submit_answer(job.target, job.context.run_dir, result.submitted)
    except ssh.SSHError as exc:
        return exc


class _Folded:
    """What each host's files round trip also does: its layout (``layout``), the cache snapshot after it
    (``snapshot``), and the start (``fold``)."""

    def __init__(self, run: Run, *, layout: bool, snapshot: bool, fold: Fold | None = None) -> None:
        self.run, self.layout, self.snapshot, self.fold = run, layout, snapshot, fold
        self.at = timezone.now()

    def prepare_host(self, job: HostJob) -> remote.Prepared:
        line = layout_lines(self.run, job)[1] if self.layout and job.layout else ""
        after = cache.SNAPSHOT_COMMAND if self.snapshot else ""
        submit = self.fold.line(job) if self.fold else ""
        timeout = self.run.campaign.run_timeout_s if line else None  # a layout may take as long as a run
        return _prepare_host(job, lay_out=line, after=after, submit=submit, timeout=timeout)

    def layouts(self, jobs: list[HostJob], written: list[Any]) -> dict[str, dict[str, Any]]:
        """The layouts' records, as ``lay_out_data`` keeps them; the first that failed is raised."""
        ended = timezone.now()
        records: dict[str, dict[str, Any]] = {}
        for job, prepared in zip(jobs, written, strict=True):
            result = prepared.layout
            if job.layout is None or result is None:
                continue
            if not result.ok:
                detail = (result.stderr or result.stdout).strip()[-500:]
                raise ssh.PermanentSSHError(
                    job.target.endpoint, f"laying out the benchmark's data failed (exit {result.exit_code}): {detail}"
                )
            records[job.row.host] = _layout_record(layout_lines(self.run, job)[0], self.at, ended, result)
        return records


def _prepare_host(
    job: HostJob, *, lay_out: str = "", after: str = "", submit: str = "", timeout: float | None = None
) -> remote.Prepared:
    """Write the host's files (the layout's included: run before the flush), then run ``lay_out`` (its layout
    command, when it goes with them), ``after`` and ``submit``, in one round trip."""
    run_dir = job.context.run_dir
    data_dirs = [job.context.data_dir] + [f"{mount}/{job.context.node}" for mount in job.context.mounts]
    dirs = data_dirs + ([job.service_dir] if job.service else [])
    layout = job.layout.files if job.layout else {}
    files = {run_dir: {**layout, **_main_files(job)}}
    if job.service:
        service_files = dict(job.service.files)
        service_files["command.sh"] = remote.command_script(job.service.argv, job.service.env)
        files[job.service_dir] = service_files
    return remote.jobs_prepare(
        job.target, files, extra_dirs=dirs, layout=lay_out, after=after, submit=submit, timeout=timeout
    )


def _record_commands(jobs: list[HostJob]) -> None:
    """Store what each host (whose files are written) runs where, in one query from this thread: a fan-out thread
    would open a database connection of its own for it."""
    for job in jobs:
        job.row.command = display_command(job.context.run_dir, job.main.argv, _main_env(job)) if job.main else ""
        service = job.service
        job.row.service_command = display_command(job.service_dir, service.argv, service.env) if service else ""
        job.row.remote_dir = job.context.run_dir
    RunHost.objects.bulk_update([job.row for job in jobs], ["command", "service_command", "remote_dir"])


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
    detail = last_lines(result.stderr or result.stdout)
    if not failed:  # every host answers over SSH: mpirun's own daemons failed to call back, which a retry may mend
        raise ssh.TransientSSHError(
            primary.target.endpoint, f"MPI reachability check: mpirun from {primary.row.host} failed: {detail}"
        )
    raise ssh.PermanentSSHError(
        primary.target.endpoint,
        f"MPI reachability check: mpirun from {primary.row.host} cannot reach {', '.join(failed)} over SSH: {detail}",
    )


def hosts_provenance(
    run: Run, benchmark: Benchmark, jobs: list[HostJob], known: dict[str, dict[str, str]] | None = None
) -> dict[str, dict[str, Any]]:
    """Each host's kernel, benchmark tool version and hardware, for the run's provenance. The versions are read on a
    host once per campaign (``uname; fio --version`` costs a tenth of a second or more): later runs reuse what an
    earlier run of the campaign recorded for the same node (``known``, where the caller has looked them up)."""
    versions = dict(known_versions(run, jobs) if known is None else known)
    unknown = [j for j in jobs if j.row.host not in versions]
    read = remote.fan_out(unknown, lambda j: _read_versions(benchmark, j.target))
    ssh.raise_first(read)
    versions.update(zip([j.row.host for j in unknown], read, strict=True))
    return {j.row.host: {**versions[j.row.host], "node": _node_info(j)} for j in jobs}


VERSIONS_LOOKBACK = 8  # earlier runs of the campaign searched for a host's versions, newest first
VERSION_KEYS = ("kernel", "tool_version")


def known_versions(run: Run, jobs: list[HostJob]) -> dict[str, dict[str, str]]:
    """The versions recorded for the run's hosts by the latest earlier runs of its campaign, for each host only
    where it was the same node (name and address) then."""
    addresses = {j.row.host: j.row.node.address for j in jobs if j.row.node is not None}
    earlier = (
        Run.objects.filter(campaign_id=run.campaign_id, provenance__has_key="hosts")
        .exclude(pk=run.pk)
        .order_by("-pk")
        .values_list("pk", flat=True)[:VERSIONS_LOOKBACK]
    )
    found: dict[str, dict[str, str]] = {}
    for pk in earlier:
        if len(found) == len(addresses):
            break
        recorded = Run.objects.filter(pk=pk).values_list("provenance__hosts", flat=True).first() or {}
        for host, info in recorded.items():
            same_node = isinstance(info, dict) and (info.get("node") or {}).get("address") == addresses.get(host)
            if same_node and host not in found and all(key in info for key in VERSION_KEYS):
                found[host] = {key: info[key] for key in VERSION_KEYS}
    return found


def _read_versions(benchmark: Benchmark, target: remote.Target) -> dict[str, str]:
    version = shlex.join(benchmark.version_argv) if benchmark.version_argv else "true"
    result = target.run(f"uname -srm; {version} 2>&1 | head -n 3")
    kernel, _, tool = result.stdout.partition("\n")
    return {"kernel": kernel.strip(), "tool_version": tool.strip()}


def _node_info(job: HostJob) -> dict[str, Any]:
    node = job.row.node
    assert node is not None
    return {
        "address": node.address,
        "cpu_model": node.cpu_model,
        "cpu_cores": node.cpu_cores,
        "ram_mb": node.ram_mb,
        "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count,
        "facts": node.facts,
        "facts_collected_at": node.facts_collected_at.isoformat() if node.facts_collected_at else None,
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


EARLIER_RUNS = 4  # runs of the campaign searched, newest first, for a submit wave to the same number of hosts


def earlier_wave(run: Run, hosts: int) -> tuple[dict[str, Any], tuple[str, float] | None]:
    """The run's start record (provenance["start"]), and the submit wave of the campaign's latest start to as many
    hosts that reached every one in time (this run's earlier attempts included), as (what it was, seconds), or
    None: what the start margin is reckoned from (a submit wave measures what the margin must cover, the very
    command, on the same hosts). One query."""
    rows = (  # newest first (a follow-up run, added later, may come before runs of lower ids: rarely, and harmless)
        Run.objects.filter(campaign_id=run.campaign_id, pk__lte=run.pk)
        .order_by("-pk")
        .values_list("pk", "provenance__start")[: EARLIER_RUNS + 1]
    )
    record: dict[str, Any] = {}
    for pk, start in rows:
        start = start or {}
        if pk == run.pk:
            record = start
        for attempt in reversed(start.get("attempts") or []):
            if attempt.get("hosts") == hosts and not attempt.get("late") and "wave_s" in attempt:
                return record, (f"the submit wave of run {pk}", attempt["wave_s"])
    return record, None


LAYOUTS_DIR = "layouts"  # under rackbench's directory on a host: what each layout left (remote.layout_once)


def lay_out_data(run: Run, jobs: list[HostJob]) -> dict[str, dict[str, Any]]:
    """Run every host's layout command (the benchmark's data written where it will read it); returns what ran where
    and when. Each may take as long as a run may."""
    hosts = [j for j in jobs if j.layout]

    def lay_out(job: HostJob) -> dict[str, Any]:
        shown, sent = layout_lines(run, job)
        at = timezone.now()
        result = job.target.check(sent, what="laying out the benchmark's data", timeout=run.campaign.run_timeout_s)
        return _layout_record(shown, at, timezone.now(), result)

    results = remote.fan_out(hosts, lay_out)
    ssh.raise_first(results)
    return {j.row.host: r for j, r in zip(hosts, results, strict=True)}


def layout_lines(run: Run, job: HostJob) -> tuple[str, str]:
    """The host's layout command as the run shows it, and as it is sent: a layout that names its data directories
    (``HostCommand.data_dirs``) is skipped where they hold the files as the same layout left them (``kept``: it
    would do nothing), except in a container, whose directories the host may not see as the container does."""
    assert job.layout is not None
    env = {**job.context.env, **job.layout.env}
    line = display_command(job.context.run_dir, job.layout.argv, env)
    if not job.layout.data_dirs or run.campaign.container:
        return line, line
    key = [job.row.host, job.layout.argv, env, job.layout.files, job.layout.data_dirs]
    memo_dir = f"{job.root}/{LAYOUTS_DIR}"
    return line, remote.layout_once(line, key=key, data_dirs=job.layout.data_dirs, memo_dir=memo_dir)


def _layout_record(line: str, at: Any, ended: Any, result: ssh.CommandResult) -> dict[str, Any]:
    record = {"command": line, "at": at.isoformat(), "ended_at": ended.isoformat(), "seconds": round(result.seconds, 3)}
    if remote.LAYOUT_KEPT in result.stdout:
        record["kept"] = True
    return record


def snapshot(target: remote.Target) -> dict[str, Any]:
    """The host's page cache and storage read counters now (plugins/cache.py), or why they cannot be read."""
    return snapshot_record(target.run(cache.SNAPSHOT_COMMAND).stdout)


def snapshot_record(text: str) -> dict[str, Any]:
    """What ``snapshot`` keeps of ``cache.SNAPSHOT_COMMAND``'s output, read now."""
    try:
        return {"at": timezone.now().isoformat(), **cache.parse_snapshot(text).as_dict()}
    except ValueError as exc:
        return {"at": timezone.now().isoformat(), "error": str(exc)}


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
        results = remote.fan_out(jobs, _flush_client)
        ssh.raise_first(results)
        records += results
    return records


def _flush_client(job: HostJob) -> dict[str, Any]:
    """Flush the host's page cache, with its size before and after (flagged when the flush left most of it)."""
    before = snapshot(job.target)
    record = _flush(job.target, client_flush_command(job.target.endpoint.username), job.row.host,
                    "flushing the page cache")  # fmt: skip
    after = snapshot(job.target)
    record["page_cache"] = {"before": before, "after": after}
    if "error" not in before and "error" not in after:
        record["flags"] = cache.flush_flags(
            job.row.host, cache.Snapshot.from_dict(before), cache.Snapshot.from_dict(after)
        )
    return record


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
