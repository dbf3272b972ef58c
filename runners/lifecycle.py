"""A run's job on its hosts once prepared: submitted detached (or with sbatch under Slurm), polled, collected,
killed."""

from __future__ import annotations

import logging
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from campaigns import services
from campaigns.models import Run, RunHost, RunStatus
from campaigns.plan import (
    SERVICE_DIR,
)
from campaigns.planning import benchmark_params
from common import numbers
from common.timing import Stopwatch
from plugins import cache
from plugins.benchmarks.base import (
    Benchmark,
    Metric,
    ParseError,
    get_benchmark,
)
from plugins.launchers import slurm
from runners import remote, samplers, ssh
from runners import slurm as slurm_jobs
from runners.hosts import TAIL, HostJob, RunTarget, last_lines, main_targets, run_targets, slurm_login
from runners.prepare import EARLIER_RUNS, Fold, earlier_wave, run_prepare, snapshot_record

log = logging.getLogger(__name__)

SERVICE_READY_TIMEOUT = 30.0


def run_start(run: Run, *, fold: bool, wanted: Callable[[], bool]) -> tuple[int, float] | None:
    """Prepare the run and start its main commands on every host at one instant (``run_prepare``, ``run_submit``);
    returns that instant (``run_submit``) and the seconds its submit took to reach every host, or None where the run
    is no longer ``wanted`` (cancelled while it was being prepared: nothing is started).

    ``fold`` (a start made fresh, not a retry): where the campaign has measured its preparations and the run needs
    nothing between preparing and starting, the start instant is chosen first and the submit goes in each host's
    preparing round trip (``prepare.Fold``). Should a host come late or fail, everything started is undone and the
    run is prepared and started again at once the usual way: prepared first, then submitted with a margin reckoned
    from the late attempt."""
    folding = _fold(run) if fold and settings.RACKBENCH["START_FOLD"] else None
    if folding is not None and not wanted():
        return None
    try:
        jobs = run_prepare(run, fold=folding)
    except Exception:
        if folding is not None and folding.jobs:
            _undo_mains(folding.jobs)
        raise
    if folding is not None and folding.jobs:
        try:
            return _folded_start(run, folding), folding.wave_s
        except LateStart as exc:
            log.warning("run %s: %s; started again in two steps", run.pk, exc)
        run.refresh_from_db(fields=["provenance"])  # the late attempt is recorded: the margin is reckoned from it
        jobs = run_prepare(run)
    if not wanted():
        return None
    submitting = time.monotonic()
    instant = run_submit(jobs)
    return instant, time.monotonic() - submitting


FOLD_SOURCE = "the preparing round trip of run"


def _fold(run: Run) -> Fold | None:
    """The start to fold into the run's preparation, its margin reckoned from what the campaign's latest folded start
    to as many hosts had to cover (``Fold.needed_s``: from sending its round trip to its last host's check of the
    instant), else from its latest run's files round trip plus submit wave (at least RACKBENCH_START_MARGIN, and
    RACKBENCH_START_MARGIN_FACTOR times that, as ``start_margin``); None when there is none, or the run has an attempt
    of its own already (a retry starts the usual way). Two queries."""
    hosts = run.hosts.exclude(node=None).count()
    rows = (
        Run.objects.filter(campaign_id=run.campaign_id, pk__lte=run.pk)
        .order_by("-pk")
        .values_list("pk", "provenance__start", "provenance__timing__prepare__files")[: EARLIER_RUNS + 1]
    )
    measured: tuple[str, float] | None = None
    for pk, start, files in rows:
        attempts = (start or {}).get("attempts") or []
        if pk == run.pk:
            if attempts:
                return None
            continue
        for attempt in reversed(attempts):
            if attempt.get("hosts") != hosts or attempt.get("late") or "wave_s" not in attempt:
                continue
            if attempt.get("folded"):
                measured = (f"{FOLD_SOURCE} {pk}", attempt.get("needed_s", attempt["wave_s"]))
            elif isinstance(files, int | float):
                measured = (f"the files round trip and the submit wave of run {pk}", files + attempt["wave_s"])
            break
        if measured is not None:
            break
    if measured is None:
        return None
    source, seconds = measured
    margin = start_margin(hosts=hosts, measured_s=seconds, previous=None)
    tolerance = settings.RACKBENCH["START_TOLERANCE"]
    return Fold(attempt=uuid.uuid4().hex[:12], margin_s=margin, tolerance_s=tolerance, source=source)


def _folded_start(run: Run, fold: Fold) -> int:
    """Record the folded attempt (as ``submit_mains`` records its own, ``folded``: true); where a host failed or came
    late, undo it on every host and raise."""
    mains = [j for j in fold.jobs if j.main]
    late = {j.row.host: round(a / 1e9, 4) for j, a in zip(mains, fold.answers, strict=True) if isinstance(a, int)}
    entry = {"id": fold.attempt, "start_at_ns": fold.start_at_ns, "margin_s": round(fold.margin_s, 4),
             "reckoned_from": fold.source, "hosts": len(mains), "wave_s": round(fold.wave_s, 4), "late": late,
             "folded": True}  # fmt: skip
    if fold.needed_s is not None:
        entry["needed_s"] = round(fold.needed_s, 4)
    _record_attempt(run.pk, entry, fold.tolerance_s)
    failed = [a for a in fold.answers if isinstance(a, BaseException)]
    if failed or late:
        _undo_mains(fold.jobs)
    ssh.raise_first(failed)
    if late:
        raise _late_start(late, margin=fold.margin_s, hosts=len(mains), wave=fold.wave_s, tolerance=fold.tolerance_s,
                          attempt=fold.attempt)  # fmt: skip
    return fold.start_at_ns


def _undo_mains(jobs: list[HostJob]) -> None:
    """Undo a start on every main host; raises the first host where that failed (its job may be left)."""
    ssh.raise_first(remote.fan_out([j for j in jobs if j.main], lambda j: remote.job_undo(j.target, j.context.run_dir)))


def run_submit(jobs: list[HostJob]) -> int:
    """Start the services, wait until they accept work, start the telemetry samplers, then every main command, all
    at one instant (``submit_mains``). Returns that instant (ns since the epoch; 0 under Slurm: sbatch decides).

    If any host refuses, or comes late, everything already started is stopped and reset again.
    """
    primary = jobs[0] if jobs else None
    if primary is not None and primary.login is not None:  # Slurm: no services, one main (run_prepare checked)
        job_id = slurm_jobs.submit(primary.login, primary.context.run_dir)
        RunHost.objects.filter(pk=primary.row.pk).update(slurm_job_id=job_id)
        return 0
    services = [j for j in jobs if j.service]
    mains = [j for j in jobs if j.main]
    try:
        ssh.raise_first(remote.fan_out(services, lambda j: remote.job_submit(j.target, j.service_dir)))
        ssh.raise_first(remote.fan_out(services, _wait_ready))
        samplers.start(jobs)
        return submit_mains(mains)
    except Exception:  # undone, so that a retry starts every host again, in one attempt
        remote.fan_out(mains, lambda j: remote.job_undo(j.target, j.context.run_dir))
        remote.fan_out(services, lambda j: remote.job_undo(j.target, j.service_dir))
        remote.fan_out([j for j in jobs if j.telemetry_dir], lambda j: remote.job_kill(j.target, j.telemetry_dir))
        raise


class LateStart(ssh.TransientSSHError):
    """The start instant passed before some hosts had their submit: the attempt is undone on every host (transient:
    the start step is then made again as a whole, flush included, with a larger margin)."""


FALLBACK_PER_HOST_S = 0.01  # seconds per host a submit wave is reckoned to take where none was measured


def start_margin(*, hosts: int, measured_s: float | None, previous: dict[str, Any] | None) -> float:
    """Seconds between issuing the submit wave and the start instant: at least RACKBENCH_START_MARGIN, and
    RACKBENCH_START_MARGIN_FACTOR times ``measured_s``, what reaching all the run's hosts at once is measured to take
    (``reckoned_from``: the campaign's last submit wave to as many hosts, else the cache snapshot just taken on
    them); after an attempt with late hosts, at least twice what that one needed (its margin plus its worst
    lateness, and its whole wave)."""
    cfg = settings.RACKBENCH
    measured = measured_s if measured_s is not None else hosts * FALLBACK_PER_HOST_S
    margin = max(cfg["START_MARGIN"], cfg["START_MARGIN_FACTOR"] * measured)
    if previous and previous.get("late"):
        needed = previous["margin_s"] + max(previous["late"].values())
        margin = max(margin, 2 * needed, 2 * previous.get("wave_s", 0.0))
    return margin


def reckoned_from(run: Run, hosts: int) -> tuple[dict[str, Any], str, float | None]:
    """The run's start record, and what its margin is reckoned from: the campaign's last submit wave to as many hosts
    that reached them all in time (``earlier_wave``), else the cache snapshot its preparation timed on all its hosts
    at once (``probe_s``), else nothing."""
    record, earlier = earlier_wave(run, hosts)
    if earlier is not None:
        return record, *earlier
    probe = record.get("probe_s")
    return record, "the cache snapshot on every host" if probe is not None else "none measured", probe


def submit_mains(mains: list[HostJob]) -> int:
    """Start every main command at one instant: the submit wave carries ``start_at_ns`` = now + a margin (see
    ``start_margin``), each launcher waits for it on its node's clock (the nodes' clocks are taken to agree: one
    machine in the lab, NTP/PTP on a cluster) and records when it really started. A host whose submit arrives more
    than RACKBENCH_START_TOLERANCE seconds after the instant starts nothing and LateStart is raised (the caller
    undoes the hosts that did start). Every attempt has an id of its own, kept in the hosts' ``submitted`` markers:
    a copy of this submit delivered twice starts nothing more, and no host keeps a job of an earlier attempt.
    The attempt (id, instant, margin and what it was reckoned from, how long its wave took, late hosts) is kept in
    provenance["start"]. Returns the instant (ns since the epoch)."""
    if not mains:
        return 0
    run = mains[0].row.run  # the rows came from run.hosts: their run is loaded already
    run_id = run.pk
    record, source, measured = reckoned_from(run, len(mains))
    earlier = list(record.get("attempts") or [])
    margin = start_margin(hosts=len(mains), measured_s=measured, previous=earlier[-1] if earlier else None)
    tolerance = settings.RACKBENCH["START_TOLERANCE"]
    attempt = uuid.uuid4().hex[:12]
    began = time.monotonic()
    start_at_ns = time.time_ns() + int(margin * 1e9)

    def submit(job: HostJob) -> int | None:
        return remote.job_submit(
            job.target, job.context.run_dir, attempt=attempt, start_at_ns=start_at_ns, tolerance_ns=int(tolerance * 1e9)
        )

    answers = remote.fan_out(mains, submit)
    wave = time.monotonic() - began
    late = {j.row.host: round(a / 1e9, 4) for j, a in zip(mains, answers, strict=True) if isinstance(a, int)}
    entry = {"id": attempt, "start_at_ns": start_at_ns, "margin_s": round(margin, 4), "reckoned_from": source,
             "hosts": len(mains), "wave_s": round(wave, 4), "late": late}  # fmt: skip
    _record_attempt(run_id, entry, tolerance)
    ssh.raise_first(answers)
    if late:
        raise _late_start(late, margin=margin, hosts=len(mains), wave=wave, tolerance=tolerance, attempt=attempt)
    return start_at_ns


def _record_attempt(run_id: int, entry: dict[str, Any], tolerance: float) -> None:
    """Add a start attempt to the run's provenance["start"], and make it the run's."""

    def update(provenance: dict[str, Any]) -> None:
        found = provenance.get("start") or {}
        attempts = [*(found.get("attempts") or []), entry]
        provenance["start"] = {**found, "attempt": entry["id"], "start_at_ns": entry["start_at_ns"],
                               "margin_s": entry["margin_s"], "tolerance_s": tolerance,
                               "attempts": attempts}  # fmt: skip

    services.run_provenance_merge(run_id=run_id, update=update)


def _late_start(
    late: dict[str, float], *, margin: float, hosts: int, wave: float, tolerance: float, attempt: str
) -> LateStart:
    return LateStart(
        None,
        f"the start instant passed before the submit reached {_some(sorted(late))} (late by up to "
        f"{numbers.quantity(max(late.values()), 's')}; margin {numbers.quantity(margin, 's')} for {hosts} hosts, "
        f"whose submit took {numbers.quantity(wave, 's')}; tolerance {numbers.quantity(tolerance, 's')}): start "
        f"attempt {attempt} was undone on every host, none keeps it",
    )


def _some(names: list[str], shown: int = 10) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


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


@dataclass
class PollOutcome:
    finished: bool
    vanished: list[str]
    killed: list[str] = field(default_factory=list)  # of ``vanished``: where rackbench killed it
    targets: list[RunTarget] | None = None  # the run's started hosts as the poll read them (None under Slurm)


def run_poll(run: Run, *, wait: float = 0.0) -> PollOutcome:
    """Every host's job state; ``wait``: each host's read waits up to that long for its job's end (not under Slurm)."""
    login = slurm_login(run)
    if login is not None:
        host, job_id = _slurm_job(run, login)
        state = slurm_jobs.job_state(login, job_id, host.row.remote_dir)
        store_live_log(run, login, host)
        return PollOutcome(finished=state.finished, vanished=[])
    targets = run_targets(run, started=True)
    hosts = main_targets(run, targets)
    states = remote.fan_out(hosts, lambda h: remote.job_state(h.target, h.row.remote_dir, wait=wait))
    ssh.raise_first(states)
    changed = []
    for host, state in zip(hosts, states, strict=True):
        if state.pid and host.row.pid != state.pid:
            host.row.pid = state.pid
            changed.append(host.row)
    RunHost.objects.bulk_update(changed, ["pid"], batch_size=BATCH)
    if hosts:
        store_live_log(run, hosts[0].target, hosts[0])
    vanished = [h.row.host for h, state in zip(hosts, states, strict=True) if state.vanished]
    killed = [h.row.host for h, state in zip(hosts, states, strict=True) if state.vanished and state.killed]
    finished = all(s.finished for s in states)
    return PollOutcome(finished=finished, vanished=vanished, killed=killed, targets=targets)


BATCH = 200  # rows per bulk UPDATE of a run's hosts (each may carry a host's whole output)


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


OUTPUT_FILES = ["exit_code", "stdout", "stderr", "started"]  # the exit code first: the outputs are then read whole


def _host_outcome(found: remote.Collected | BaseException) -> HostOutcome | BaseException:
    if isinstance(found, BaseException):
        return found
    return HostOutcome(found.text("stdout"), found.text("stderr"), found.exit_code)


def _snapshot(found: remote.Collected | BaseException) -> dict[str, Any] | BaseException:
    """The cache counters read before the host's files (a failed read is left for _judge_cache to skip)."""
    return found if isinstance(found, BaseException) else snapshot_record(found.before)


def _slurm_outcome(run: Run, login: remote.Target) -> HostOutcome:
    host, job_id = _slurm_job(run, login)
    state = slurm_jobs.job_state(login, job_id, host.row.remote_dir)
    ended = {"job_id": job_id, "state": state.state, "exit_code": state.exit_code, "source": state.source}
    services.run_provenance_merge(
        run_id=run.pk, update=lambda provenance: provenance.update(slurm={**provenance.get("slurm", {}), **ended})
    )
    stdout, stderr = remote.job_output(login, host.row.remote_dir)
    return HostOutcome(stdout, stderr, state.exit_code, state)


def run_collect(
    run: Run, *, targets: list[RunTarget] | None = None, noticed_at: float | None = None
) -> tuple[str, str]:
    """Fetch every main command's output, store it and the parsed metrics, stop the services.

    Each started host is read in one round trip (``remote.job_collect``): its cache counters as the benchmark left
    them, and on a main host its exit code, stdout, stderr and, where it covers the run's reads, its I/O accounting.
    What it finds for the run's provenance (the start spread, the cache judgement, how long each part took, and
    ``noticed_at``: when the end was seen, seconds since the epoch) is merged into it, and the outputs and results
    stored, in one transaction. ``targets``: the run's started hosts, where the caller has just read them.

    Returns (status, error): a non-zero exit (or a Slurm job that did not complete), unparsable output, a
    missing metric or a failed plug-in check (e.g. the wrong NCCL transport) fails the run even when every
    command exited 0.
    """
    watch = Stopwatch()
    benchmark = get_benchmark(run.campaign.kind)
    targets = run_targets(run, started=True) if targets is None else targets
    hosts = main_targets(run, targets)
    login = slurm_login(run)
    accounted = _job_io_covers(run, benchmark, targets)
    files = OUTPUT_FILES + ["io"] if accounted else OUTPUT_FILES
    read = {h.row.pk: files for h in hosts} if login is None else {}  # under Slurm: the output is the login's
    with watch.lap("read"):
        found = remote.fan_out(
            targets,
            lambda t: remote.job_collect(
                t.target, t.row.remote_dir, read.get(t.row.pk, []), before=cache.SNAPSHOT_COMMAND
            ),
        )
    by_pk = {t.row.pk: f for t, f in zip(targets, found, strict=True)}
    snapshots = {t.row.host: _snapshot(f) for t, f in zip(targets, found, strict=True)}
    with watch.lap("samplers"):
        samplers.stop(run, targets)  # as soon as the hosts are read: the samplers record the benchmark
    if login is not None:
        outputs: list[Any] = [_slurm_outcome(run, login)]
        hosts = hosts[:1]
    else:
        outputs = [_host_outcome(by_pk[h.row.pk]) for h in hosts]
    ssh.raise_first(outputs)
    updates = [start_spread_update({h.row.host: by_pk[h.row.pk] for h in hosts})] if login is None else []
    errors: list[str] = []
    per_host: list[Metric] = []
    logs: dict[str, str] = {}
    with watch.lap("parse"):
        for row, outcome in zip([h.row for h in hosts], outputs, strict=True):
            stdout, stderr = outcome.stdout, outcome.stderr
            logs[row.host] = f"{stdout}\n{stderr}"
            if outcome.slurm_state is not None and outcome.slurm_state.error:
                errors.append(f"{row.host}: {outcome.slurm_state.error}: {last_lines(stderr or stdout)}")
                continue
            if outcome.exit_code != 0:
                errors.append(f"{row.host}: exited with code {outcome.exit_code}: {last_lines(stderr or stdout)}")
                continue
            try:
                per_host += benchmark.parse(stdout, host=row.host)
            except ParseError as exc:
                errors.append(f"{row.host}: output could not be parsed: {exc}")
    with watch.lap("services"):
        stop_services(run, targets)
    metrics = per_host + benchmark.aggregate(per_host) if per_host else []
    outputs_by_host = {h.row.host: o.stdout for h, o in zip(hosts, outputs, strict=True)}
    processes = _job_io(hosts, by_pk) if accounted else None
    updates.append(_cache_update(benchmark, metrics, outputs_by_host, snapshots, processes))
    collected = dict(watch.laps)
    updates.append(lambda provenance: _timing_update(provenance, noticed_at=noticed_at, collect=collected))

    def merge(provenance: dict[str, Any]) -> None:
        for update in updates:
            update(provenance)

    for host, outcome in zip(hosts, outputs, strict=True):
        host.row.stdout, host.row.stderr, host.row.exit_code = outcome.stdout, outcome.stderr, outcome.exit_code
    services.run_store_collected(
        run=run,
        hosts=[h.row for h in hosts],
        tails=(
            _tails([(h.row.host, o.stdout) for h, o in zip(hosts, outputs, strict=True)]),
            _tails([(h.row.host, o.stderr) for h, o in zip(hosts, outputs, strict=True)]),
        ),
        metrics=metrics,
        update=merge,
    )
    samplers.collect(run, targets)  # after the results: it adds its summaries to them
    if not errors:
        errors += benchmark.missing(metrics, [h.row.host for h in hosts])
        errors += benchmark.check(benchmark_params(run.params), metrics, logs)
    return (RunStatus.FAILED, "\n".join(errors)) if errors else (RunStatus.SUCCEEDED, "")


def _timing_update(provenance: dict[str, Any], *, noticed_at: float | None, collect: dict[str, float]) -> None:
    timing = dict(provenance.get("timing") or {})
    if noticed_at is not None:
        timing["noticed_at"] = round(noticed_at, 3)
    timing["collect"] = collect
    provenance["timing"] = timing


def start_spread_update(found: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """What keeps in provenance["start"] the instants the hosts' launchers really started (their ``started``
    files): the spread (max - min, seconds), the first and last host, how long after the start instant the last one
    started, and each host's offset from the instant (ms)."""
    started: dict[str, int] = {}
    for host, collected in found.items():
        text = collected.text("started").strip() if isinstance(collected, remote.Collected) else ""
        if text.isdigit():
            started[host] = int(text)

    def update(provenance: dict[str, Any]) -> None:
        if not started:
            return
        first, last = min(started, key=started.__getitem__), max(started, key=started.__getitem__)
        record = dict(provenance.get("start") or {})
        at = record.get("start_at_ns") or started[first]
        record.update(
            spread_s=round((started[last] - started[first]) / 1e9, 6),
            after_instant_s=round(max(0, started[last] - at) / 1e9, 6),  # the last host's start after the instant
            first_host=first,
            last_host=last,
            recorded=len(started),
            offsets_ms={host: round((ns - at) / 1e6, 3) for host, ns in sorted(started.items())},
        )
        provenance["start"] = record

    return update


def _job_io_covers(run: Run, benchmark: Benchmark, targets: list[RunTarget]) -> bool:
    """Whether each main command's own I/O accounting (its launcher's /proc/<pid>/io) covers all the run's reads:
    not for a Slurm job (no launcher of rackbench's), a container (its processes are the runtime's children, not
    the launcher's), a run with services (fio --client: the servers read) nor MPI ranks started on other hosts."""
    elsewhere = (
        slurm_login(run) is not None
        or bool(run.campaign.container)
        or any(t.row.service_command for t in targets)
        or (benchmark.uses_mpi and len(targets) > 1)
    )
    return bool(main_targets(run, targets)) and not elsewhere


def _job_io(hosts: list[RunTarget], found: dict[int, Any]) -> dict[str, dict[str, int]] | None:
    """{host: its main command's /proc/<pid>/io}, read with its output; None unless every host recorded it."""
    io = {h.row.host: cache.parse_proc_io(found[h.row.pk].text("io")) for h in hosts}
    return io if io and all(io.values()) else None


def _cache_update(
    benchmark: Benchmark,
    metrics: list[Metric],
    outputs: dict[str, str],
    ended: dict[str, Any],
    processes: dict[str, dict[str, int]] | None,
) -> Callable[[dict[str, Any]], None]:
    """What compares what the benchmark read with what was read from storage meanwhile (plugins/cache.py), and keeps
    the evidence and its flags in the run's provenance. Counters that could not be read leave the run unjudged."""
    read = benchmark.bytes_read(metrics, outputs) if metrics else None
    end = {host: s for host, s in ended.items() if isinstance(s, dict) and "error" not in s}

    def update(provenance: dict[str, Any]) -> None:
        found = dict(provenance.get("cache") or {})
        start = {h: s for h, s in (found.get("start") or {}).items() if "error" not in s}
        usable = set(start) == set(end) and bool(start)
        storage_read, source = cache.storage_reads(
            {h: cache.Snapshot.from_dict(s) for h, s in start.items()} if usable else {},
            {h: cache.Snapshot.from_dict(s) for h, s in end.items()} if usable else {},
            processes,
        )
        reads = cache.judge_reads(found.get("expect", ""), read, storage_read)
        flushes = [f for record in provenance.get("flush") or [] for f in record.get("flags", [])]
        found.update(
            end=end,
            processes=processes or {},
            reads={**{k: v for k, v in reads.items() if k != "flags"}, "source": source},
            flags=flushes + reads["flags"],
        )
        provenance["cache"] = found

    return update


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
