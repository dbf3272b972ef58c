"""Telemetry during runs: samplers on every host of a run, their samples stored as series of the run.

A campaign's ``telemetry:`` section (validated here, stored in ``Campaign.telemetry``)::

    telemetry: {enabled: true, interval: 1s, fast_interval: 1ms, fast: [net, rdma],
                groups: [cpu, mem, net, rdma, nfs, disk, gpu]}

On each host the sampler (plugins/tools/sampler.py, shipped into ``<run dir>/telemetry/``) is a detached job of
its own, like a service: probed while the run is prepared (a node without ``python3`` fails the run there, with
the reason), started right before the main commands once it has taken its first samples, stopped with SIGTERM
when they have ended (and killed with the run's other leftovers when the run is cancelled, times out or fails).
Its files are then fetched, decoded with numpy and appended as series (telemetry.services.series_append, in
batches of whole chunks), clipped to the end of the host's main command; each series' mean, p99 and max become
results of the run (host and labels of the series, e.g. ``net.rx_bytes.max`` in B/s: the peak link throughput
over one sampling interval; per-core CPU series are stored but not summarised: ``cpu.busiest_util`` is).

An MPI job's other hosts (no main command of their own) are sampled until the run is collected and clipped to
the latest end of the main commands. When the campaign's storage system has a statistics command
(``StorageSystem.stats_command``), a loop on its admin endpoint runs it every ``stats_interval_s`` from the start
of the main commands until the samplers stop; its output is parsed (plugins/tools/isi_statistics.py) into series
of the storage system (source "storage"). ``telemetry: {prometheus: [...]}`` is pulled after the run ends
(telemetry.prometheus); ``groups: []`` with it pulls Prometheus without samplers.

Telemetry never decides a run's outcome after it started: what cannot be fetched or decoded is recorded in the
run's provenance (``telemetry.errors``) and the run's own results stand.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings

from campaigns.models import Run
from common.durations import duration_ns
from plugins.tools import isi_statistics
from plugins.tools import sampler as tool
from runners import database, remote, ssh
from telemetry import ingest
from telemetry.models import DETAIL_SERIES
from telemetry.services import CHUNK_SAMPLES, run_telemetry_note, run_telemetry_summarize

if TYPE_CHECKING:
    from inventory.models import StorageSystem
    from runners.execution import HostJob, RunTarget

log = logging.getLogger(__name__)

DIR = "telemetry"
STORAGE_DIR = "storage-stats"
SAMPLER = Path(tool.__file__).resolve()
FASTLOOP = Path(tool.FASTLOOP_SOURCE)
GROUPS = tool.GROUPS
FAST_GROUPS = tool.FAST_GROUPS
READY_TIMEOUT = 10.0  # seconds for a sampler to take its first samples
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL: the sampler flushes its last frames
FETCH_WINDOW = 4  # hosts whose files are held in memory at once
BATCH_ROWS = 16 * CHUNK_SAMPLES  # rows per series_append: whole chunks


def samples(run: Run) -> bool:
    """Whether the run's hosts run samplers (a campaign may only pull Prometheus: ``groups: []``)."""
    return bool(run.campaign.telemetry.get("groups"))


def sampler_argv(config: dict[str, Any], *, end_marker: str | None, max_seconds: float) -> list[str]:
    """The sampler's command line, run in its own directory on the host."""
    argv = ["python3", SAMPLER.name, "--dir", ".", "--groups", ",".join(config["groups"])]
    argv += ["--interval", str(duration_ns(config["interval"], "telemetry.interval"))]
    if config.get("fast"):
        argv += ["--fast", ",".join(config["fast"])]
        argv += ["--fast-interval", str(duration_ns(config["fast_interval"], "telemetry.fast_interval"))]
    if end_marker:
        argv += ["--end-marker", end_marker]
    return [*argv, "--max-seconds", str(int(max_seconds))]


# --- on the hosts ---------------------------------------------------------------------------------------------


def sampler_dir(run_dir: str) -> str:
    return f"{run_dir}/{DIR}"


def prepare(run: Run, jobs: list[HostJob]) -> dict[str, Any]:
    """Write the sampler into every host's run directory and probe it there; returns what each host samples.

    Sets ``job.telemetry_dir`` on each job. A host that cannot run the sampler fails the run now, with the reason.
    """
    config = run.campaign.telemetry
    outcome: dict[str, Any] = {"settings": config}
    stats = storage_prepare(run)
    if stats:
        outcome["storage"] = stats
        if stats.get("error"):
            outcome["warnings"] = [f"storage: {stats['error']}"]
    if not samples(run):
        return outcome
    max_seconds = run.campaign.run_timeout_s + 600  # the sampler's own safety net, should nothing stop it

    def prepare_host(job: HostJob) -> dict[str, Any]:
        directory = sampler_dir(job.context.run_dir)
        argv = sampler_argv(config, end_marker="../exit_code" if job.main else None, max_seconds=max_seconds)
        files = {
            SAMPLER.name: SAMPLER.read_text(),
            FASTLOOP.name: FASTLOOP.read_text(),  # built by the probe where the node has a C compiler
            "command.sh": remote.command_script(argv, {}),
        }
        remote.job_prepare(job.target, directory, extra_dirs=[], files=files)
        probe = job.target.run(f"cd {shlex.quote(directory)} && {shlex.join([*argv, '--probe'])}")
        if not probe.ok:
            detail = (probe.stderr or probe.stdout).strip()[-500:]
            raise ssh.PermanentSSHError(
                job.target.endpoint, f"telemetry: the sampler cannot run on this node (it needs python3 3.8+): {detail}"
            )
        job.telemetry_dir = directory
        return {"command": f"cd {shlex.quote(directory)} && {shlex.join(argv)}", "sources": json.loads(probe.stdout)}

    results = remote.fan_out(jobs, prepare_host)
    ssh.raise_first(results)
    return {**outcome, "hosts": {j.row.host: r for j, r in zip(jobs, results, strict=True)}}


def start(jobs: list[HostJob]) -> None:
    """Start the samplers and wait until each has taken its first samples (then the main commands may start)."""
    samplers = [j for j in jobs if j.telemetry_dir]
    ssh.raise_first(remote.fan_out(samplers, lambda j: remote.job_submit(j.target, j.telemetry_dir)))
    ssh.raise_first(remote.fan_out(samplers, _wait_ready))
    if jobs:
        storage_start(jobs[0].row.run)  # the rows came from run.hosts: their run is loaded already


def _wait_ready(job: HostJob) -> None:
    steps = int(READY_TIMEOUT / 0.01)
    line = (
        f"cd {shlex.quote(job.telemetry_dir)} && i=0; while [ ! -e {tool.READY} ]; do "
        f"[ -e exit_code ] && exit 3; i=$((i+1)); [ $i -gt {steps} ] && exit 4; sleep 0.01; done"
    )
    result = job.target.run(line, timeout=READY_TIMEOUT + 30)
    if result.ok:
        return
    stdout, stderr = remote.job_output(job.target, job.telemetry_dir)
    why = "exited" if result.exit_code == 3 else f"took no sample within {READY_TIMEOUT:g} s"
    detail = (stderr or stdout or result.stderr).strip()[-500:]
    raise ssh.PermanentSSHError(job.target.endpoint, f"telemetry: the sampler {why}: {detail or '(no output)'}")


def stop(run: Run, hosts: list[RunTarget]) -> None:
    """SIGTERM every sampler of the run (each flushes its files) and the storage statistics loop, SIGKILL what is
    left after a grace period."""
    jobs = kill_jobs(run, hosts)
    remote.fan_out(jobs, lambda job: remote.job_kill(*job, grace=STOP_GRACE))


def kill_jobs(run: Run, hosts: list[RunTarget]) -> list[tuple[remote.Target, str]]:
    """The (target, job directory) of every sampler of the run and of its storage statistics loop."""
    jobs = [(h.target, sampler_dir(h.row.remote_dir)) for h in hosts] if samples(run) else []
    storage = stats_storage(run)
    if storage is not None:
        try:
            jobs.append((remote.storage_target(storage), storage_dir(run)))
        except ssh.SSHError as exc:  # no admin endpoint (any more): nothing was started there
            log.warning("run %s: storage statistics not stopped: %s", run.pk, exc)
    return jobs


# --- the storage system's statistics -------------------------------------------------------------------------


def stats_storage(run: Run) -> StorageSystem | None:
    """The run's storage system when the campaign samples telemetry and the storage has a statistics command."""
    storage = run.campaign.storage
    if run.campaign.telemetry and storage is not None and storage.stats_command.strip():
        return storage
    return None


def storage_dir(run: Run) -> str:
    """The loop's job directory on the storage's admin endpoint (under rackbench's remote root there)."""
    return f"{settings.RACKBENCH['REMOTE_ROOT']}/{STORAGE_DIR}/run-{run.pk}-{run.uid.hex[:12]}"


def storage_script(command: str, interval_s: float, max_seconds: float) -> str:
    """A POSIX sh loop (OneFS is FreeBSD: no bash, no ``date +%N``) that runs the command every ``interval_s``,
    each output preceded by a line with the time it started, and ends by itself after ``max_seconds``."""
    argv = shlex.join(shlex.split(command))
    return (
        "#!/bin/sh\n"
        "# Written by rackbench: the storage system's statistics during one run.\n"
        f"end=$(( $(date +%s) + {int(max_seconds)} ))\n"
        'while [ "$(date +%s)" -lt "$end" ]; do\n'
        f'  echo "{isi_statistics.MARKER} $(date +%s)"\n'
        f"  {argv}\n"
        f"  sleep {interval_s:g}\n"
        "done\n"
    )


def storage_prepare(run: Run) -> dict[str, Any] | None:
    """Write the statistics loop on the storage's admin endpoint; what cannot be written is a warning, not a
    failure of the run (the benchmark does not need it)."""
    storage = stats_storage(run)
    if storage is None:
        return None
    record: dict[str, Any] = {
        "storage": storage.name,
        "command": storage.stats_command,
        "interval_s": storage.stats_interval_s,
        "dir": storage_dir(run),
    }
    script = storage_script(storage.stats_command, storage.stats_interval_s, run.campaign.run_timeout_s + 600)
    try:
        remote.job_prepare(remote.storage_target(storage), record["dir"], extra_dirs=[], files={"command.sh": script})
    except ssh.SSHError as exc:
        record["error"] = f"the statistics command cannot be set up on {storage.name}: {exc}"
    return record


def storage_start(run: Run) -> None:
    storage = stats_storage(run)
    if storage is None:
        return
    try:
        remote.job_submit(remote.storage_target(storage), storage_dir(run))
    except ssh.SSHError as exc:  # the storage's endpoint is not the benchmark's: the run goes on without it
        log.warning("run %s: storage statistics not started: %s", run.pk, exc)


def storage_collect(run: Run, storage: StorageSystem) -> dict[str, Any]:
    """Fetch the loop's output, store each column of each node as a series of the storage system (replacing an
    earlier collection's). Returns what was stored and the errors, never raises for the storage's sake."""
    outcome: dict[str, Any] = {"storage": storage.name, "series": 0, "samples": 0, "errors": []}
    where = f"{storage.stats_command!r} on {storage.name}"
    try:
        stdout, stderr = remote.job_output(remote.storage_target(storage), storage_dir(run))
    except ssh.SSHError as exc:
        outcome["errors"].append(f"{where}: its output cannot be fetched: {exc}")
        return outcome
    try:
        parsed = isi_statistics.parse_stream(stdout)
    except isi_statistics.StatsParseError as exc:
        detail = f" (stderr: {stderr.strip()[-300:]})" if stderr.strip() else ""
        outcome["errors"].append(f"{where}: {exc}{detail}")
        return outcome
    outcome.update(ingest.storage_ingest(run=run, storage=storage.name, parsed=parsed,
                                         interval_ns=round(storage.stats_interval_s * 1e9)))  # fmt: skip
    return outcome


# --- storing --------------------------------------------------------------------------------------------------


@dataclass
class HostFiles:
    host: str
    blobs: list[bytes]
    bytes: int
    seconds: float


def collect(run: Run, hosts: list[RunTarget]) -> dict[str, Any]:
    """Fetch every host's sampler files, store them as series of the run, summarise them into results.

    Idempotent: a host's series are replaced. Errors are recorded per host in the run's provenance, not raised.
    """
    storage = stats_storage(run)
    if not samples(run) and storage is None:
        return {}
    outcome: dict[str, Any] = {"hosts": {}, "errors": []}
    # Main hosts first: a host that only takes part in an MPI job has no end of its own; its samples are clipped
    # to the latest end of the main commands.
    hosts = sorted(hosts, key=lambda h: not h.row.command) if samples(run) else []
    ends: list[int] = []
    for host, future in _fetched(hosts):
        try:
            files = future.result()
            started = time.monotonic()
            stored = ingest.sampler_ingest(
                run=run, host=host.row.host, blobs=files.blobs, end_ns=max(ends, default=None)
            )
            if stored.get("ended_ns"):
                ends.append(stored["ended_ns"])
            outcome["hosts"][host.row.host] = {
                "bytes": files.bytes,
                "fetch_seconds": round(files.seconds, 3),
                "ingest_seconds": round(time.monotonic() - started, 3),
                **stored,
            }
        except Exception as exc:  # noqa: BLE001 - one host's telemetry must not cost the others theirs
            log.warning("run %s: telemetry of %s not stored: %s", run.pk, host.row.host, exc)
            outcome["errors"].append(f"{host.row.host}: {exc}")
    storage_errors: list[str] = []  # the run's storage warnings: they replace what preparing it said
    if storage is not None:
        outcome["storage"] = storage_collect(run, storage)
        storage_errors = outcome["storage"]["errors"]
    run_telemetry_summarize(run=run, skip=DETAIL_SERIES)
    run_telemetry_note(run_id=run.pk, key="collected", outcome=outcome, topic="storage", warnings=storage_errors)
    return outcome


def _fetched(hosts: list[RunTarget]) -> Iterator[tuple[RunTarget, Future[HostFiles]]]:
    """Each host with its files being fetched, a few hosts ahead of the caller (which stores one at a time)."""
    # The fetch threads do SSH only: a reconnect's host key lookup goes through the bounded database pool.
    with ThreadPoolExecutor(
        max_workers=FETCH_WINDOW, thread_name_prefix="telemetry", initializer=database.refuse_connections
    ) as pool:
        pending: deque[tuple[RunTarget, Future[HostFiles]]] = deque()
        for host in hosts:
            pending.append((host, pool.submit(_fetch, host)))
            if len(pending) >= FETCH_WINDOW:
                yield pending.popleft()
        while pending:
            yield pending.popleft()


def _fetch(host: RunTarget) -> HostFiles:
    started = time.monotonic()
    directory = sampler_dir(host.row.remote_dir)
    blobs = []
    for name in tool.FILES.values():
        try:
            data = host.target.get(f"{directory}/{name}")
        except ssh.SSHError as exc:
            if not exc.transient:
                raise
            data = host.target.get(f"{directory}/{name}")  # one more try: the run itself is over and done
        if data:
            blobs.append(data)
    return HostFiles(host.row.host, blobs, sum(len(b) for b in blobs), time.monotonic() - started)
