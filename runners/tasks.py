"""Thin Celery tasks for everything that touches a remote host (the "ssh" queue).

A run goes: run_start (flush, write files, submit detached) -> run_poll, re-scheduling itself every
RACKBENCH_POLL_INTERVAL seconds and collecting (fetch output, parse, store) in the same task as it sees the end
-> the campaign advances. run_collect takes the collect over where that attempt failed for a transient reason,
and where a resumed run was collecting.
Transient SSH errors are retried with backoff and jitter a bounded number of times; permanent ones
fail the run at once with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone

from campaigns import services
from campaigns.models import RUN_TERMINAL, Run, RunStatus
from common.retry import Backoff
from inventory.models import Node
from inventory.services import node_clear_suspect, node_mark_suspect
from plugins.benchmarks.base import ParamError
from runners import database, execution, facts, remote, ssh
from telemetry.tasks import enqueue_prometheus_pull

log = logging.getLogger(__name__)


def _backoff() -> Backoff:
    """SSH steps retry after RACKBENCH_RETRY_BACKOFF x 2^attempt seconds, plus up to half again of jitter."""
    return Backoff(base=settings.RACKBENCH["RETRY_BACKOFF"])


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, SoftTimeLimitExceeded) or getattr(exc, "transient", False)


PROBE_TIMEOUT = 2.0  # seconds the circuit breaker's probe waits for a node's SSH banner


def _node_down(exc: BaseException) -> str:
    """After a transient failure on a node: probe it, and when it does not answer mark it suspect (its other runs
    then fail at once instead of each going through its retries) and say so; "" when it answers."""
    endpoint = getattr(exc, "endpoint", None)
    if not _is_transient(exc) or endpoint is None or not endpoint.name:
        return ""
    why = ssh.probe(endpoint.address, endpoint.port, timeout=PROBE_TIMEOUT)
    node = Node.objects.filter(name=endpoint.name, address=endpoint.address, ssh_port=endpoint.port).first()
    if not why or node is None:
        return ""
    node_mark_suspect(node=node, reason=f"{exc} (probe: {why})")
    return f"node {node.name} does not answer ({why}): marked suspect, its other runs fail at once until it answers"


def _retry_or_fail(
    task: Task, run_id: int, exc: BaseException, *, kill: bool = False, args: tuple[Any, ...] | None = None
) -> None:
    """Retry a transient failure with backoff and jitter, unless its node does not answer at all (the circuit
    breaker); otherwise fail the run with a clear reason."""
    retries = task.request.retries
    cfg = settings.RACKBENCH
    down = _node_down(exc)
    if down:
        services.run_mark_failed(run_id=run_id, error=f"{exc}; {down}", kill=kill)
        return
    if _is_transient(exc) and retries < cfg["RETRY_MAX"]:
        services.run_heartbeat(run_id=run_id)
        countdown = _backoff().delay(retries)
        log.warning("run %s: transient failure, retry %s in %.1f s: %s", run_id, retries + 1, countdown, exc)
        raise task.retry(args=args, countdown=countdown, exc=exc if isinstance(exc, Exception) else None)
    if isinstance(exc, ssh.SSHError | ParamError):
        message = str(exc)
    else:
        log.exception("run %s: unexpected error", run_id, exc_info=exc)
        message = f"internal error: {type(exc).__name__}: {exc}"
    if _is_transient(exc):
        message = f"gave up after {retries + 1} attempts: {message}"
    services.run_mark_failed(run_id=run_id, error=message, kill=kill)


def _load(run_id: int) -> Run | None:
    return Run.objects.select_related("campaign__storage").filter(pk=run_id).first()


def _schedule_poll(run_id: int, token: str, *, now: bool = False, countdown: float | None = None) -> None:
    if countdown is None:
        countdown = 0 if now else settings.RACKBENCH["POLL_INTERVAL"]
    run_poll_task.apply_async((run_id, token), countdown=countdown)


# A step that moves the run on gives up its lease in the same update, so the next step's task, sent at once, can
# take it (the first poll comes with no delay).
HAND_ON = {"lease_owner": "", "lease_until": None}


def _end_watch(run: Run) -> float:
    """How long this poll waits on the hosts for the job's end: the rest of the run's first RACKBENCH_POLL_WAIT
    seconds (the first poll comes at once), so a short benchmark's end is noticed as it happens; then none, and
    polls come every RACKBENCH_POLL_INTERVAL seconds without holding a worker."""
    if run.started_at is None:
        return 0.0
    elapsed = (timezone.now() - run.started_at).total_seconds()
    return max(0.0, settings.RACKBENCH["POLL_WAIT"] - elapsed)


@contextmanager
def _step_lease(run_id: int, status: list[str]) -> Iterator[str]:
    """Hold the run's step lease while the block runs: yields its owner, or "" (holding nothing) when another task
    holds it.

    A thread renews the lease every third of RACKBENCH_STEP_LEASE seconds, so a step that is merely slow (an image
    pull, a long flush, a node that answers slowly) keeps it; a worker that dies stops renewing, and the lease runs
    out within RACKBENCH_STEP_LEASE seconds, after which the reconciler resumes the step.
    """
    owner = uuid.uuid4().hex
    seconds = settings.RACKBENCH["STEP_LEASE"]
    if not services.run_lease_take(run_id=run_id, owner=owner, status=status, seconds=seconds):
        yield ""
        return
    stop = threading.Event()
    renewer = threading.Thread(
        target=_renew_lease, args=(run_id, owner, seconds, stop), daemon=True, name=f"lease-{run_id}"
    )
    renewer.start()
    try:
        yield owner
    finally:
        stop.set()
        renewer.join()
        services.run_lease_release(run_id=run_id, owner=owner)


def _renew_lease(run_id: int, owner: str, seconds: float, stop: threading.Event) -> None:
    database.refuse_connections()  # it renews on the process's bounded pool, holding no connection of its own
    try:
        while not stop.wait(seconds / 3):
            if not database.call(services.run_lease_renew, run_id=run_id, owner=owner, seconds=seconds):
                return
    except Exception:  # noqa: BLE001 - a renewal that fails lets the lease run out; the step itself goes on
        log.warning("run %s: could not renew the step lease", run_id, exc_info=True)


@shared_task(bind=True, max_retries=None, soft_time_limit=600, time_limit=660)
def run_start_task(self: Task, run_id: int) -> None:
    run = _load(run_id)
    if run is None or run.status not in (RunStatus.QUEUED, RunStatus.PREPARING):
        return  # already past this step (a redelivered message)
    with _step_lease(run_id, [RunStatus.QUEUED, RunStatus.PREPARING]) as held:
        if held:
            _start(self, run)


def _start(task: Task, run: Run) -> None:
    """The start step, holding its lease: flush, write the files and submit on every host, all in one attempt.

    A run this step takes from queued was never started anywhere (nothing else starts a run): it is prepared at
    once. One that was preparing already (a worker died meanwhile, or a retry) is looked at on its hosts first."""
    run_id = run.pk
    now = timezone.now()
    fresh = services.run_transition(run_id=run_id, old=[RunStatus.QUEUED], new=RunStatus.PREPARING, started_at=now)
    if fresh:
        run.status, run.started_at = RunStatus.PREPARING, now
    else:
        found = _load(run_id)
        if found is None or found.status != RunStatus.PREPARING:
            return  # cancelled, or a twin of this task started it already
        run = found
    try:
        if not fresh and _resume_submitted(run):
            _mark_running(run)
            return
        started = execution.run_start(
            run, fold=fresh, wanted=lambda: Run.objects.filter(pk=run_id, status=RunStatus.PREPARING).exists()
        )
    except Exception as exc:
        _retry_or_fail(task, run_id, exc)
        return
    if started is None:
        return  # cancelled while it was being prepared: nothing is started
    start_at_ns, reach_s = started
    _mark_running(run, start_at_ns=start_at_ns, settle_s=reach_s)


def _resume_submitted(run: Run) -> bool:
    """Whether every main command of the run was started already, all by one start attempt (a worker died after
    submitting): never start a run twice. A start cut off half way (some hosts started), or hosts started by
    different attempts, are undone, so that all hosts start in one attempt."""
    hosts = execution.main_targets(run, execution.run_targets(run, started=True))
    if not hosts:
        return False
    states = remote.fan_out(hosts, lambda h: remote.job_state(h.target, h.row.remote_dir))
    ssh.raise_first(states)
    submitted = [h for h, state in zip(hosts, states, strict=True) if state.submitted]
    attempts = {state.attempt for state in states if not isinstance(state, BaseException) and state.submitted}
    if len(submitted) == len(hosts) and len(attempts) == 1:
        return True
    if submitted:
        log.warning(
            "run %s: started on %d of %d hosts by %d attempts; undoing it",
            run.pk,
            len(submitted),
            len(hosts),
            len(attempts),
        )
        ssh.raise_first(remote.fan_out(submitted, lambda h: remote.job_undo(h.target, h.row.remote_dir)))
    return False


def _mark_running(run: Run, *, start_at_ns: int = 0, settle_s: float = 0.0) -> None:
    """Running; its first poll comes after the hosts' start instant (``start_at_ns``), at once when there is none:
    before it, a watching poll's sessions on every host would only compete for their CPUs with the launchers waking
    up. ``settle_s`` later still (what reaching every host took, at most RACKBENCH_POLL_INTERVAL): the poll may land
    in a pool process with no connections to the hosts yet, whose key exchanges with a thousand hosts at the
    instant held the lab's launchers back by seconds (they share its cores)."""
    token = uuid.uuid4().hex  # the poll chain's, set with the move to running
    if services.run_transition(
        run_id=run.pk, old=[RunStatus.PREPARING], new=RunStatus.RUNNING, poll_token=token, **HAND_ON
    ):
        until_start = max(0.0, (start_at_ns - time.time_ns()) / 1e9) if start_at_ns else 0.0
        if start_at_ns:
            until_start += min(settle_s, settings.RACKBENCH["POLL_INTERVAL"])
        _schedule_poll(run.pk, token, countdown=until_start)
        return
    status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).first()
    if status in RUN_TERMINAL and status != RunStatus.SUCCEEDED:
        services.run_kill_request(run_id=run.pk)  # it ended (cancelled) while it was being started
    # else a twin of this task moved it on already: what it started is the run's, never killed


@shared_task(bind=True, max_retries=None, soft_time_limit=420, time_limit=480)  # a poll may collect (300 s)
def run_poll_task(self: Task, run_id: int, token: str) -> None:
    run = _load(run_id)
    if run is None or run.status != RunStatus.RUNNING or run.poll_token != token:
        return  # finished, cancelled, or a newer poll chain took over
    with _step_lease(run_id, [RunStatus.RUNNING]) as lease:
        if not lease:
            return  # a twin is polling (and carries the chain on): this copy claims nothing
        next_token = services.run_poll_claim(run_id=run_id, token=token)
        if next_token is None:
            return  # a duplicate of this poll took the chain on
        _poll(self, run, next_token, lease)


def _poll(task: Task, run: Run, token: str, lease: str) -> None:
    run_id = run.pk
    try:
        outcome = execution.run_poll(run, wait=_end_watch(run))
    except Exception as exc:
        _retry_or_fail(task, run_id, exc, kill=True, args=(run_id, token))  # the retry carries the chain on
        return
    if outcome.vanished:
        services.run_mark_failed(run_id=run_id, error=vanished_error(outcome), kill=True)  # the other hosts' too
        return
    if outcome.finished:
        noticed_at = time.time()
        # Collected here, under this poll's lease (no Celery hand-off): the run is collecting now, so no other
        # poll or collect task takes it while the lease is renewed.
        if services.run_transition(run_id=run_id, old=[RunStatus.RUNNING], new=RunStatus.COLLECTING):
            run.status = RunStatus.COLLECTING
            _collect(task, run_id, lease=lease, run=run, targets=outcome.targets, noticed_at=noticed_at)
        return
    timeout = run.campaign.run_timeout_s
    if run.started_at and (timezone.now() - run.started_at).total_seconds() > timeout:
        services.run_finish(
            run_id=run_id, status=RunStatus.TIMED_OUT, error=f"exceeded the run timeout of {timeout} s", kill=True
        )
        return
    services.run_heartbeat(run_id=run_id)
    _schedule_poll(run_id, token)


def vanished_error(outcome: execution.PollOutcome) -> str:
    """Why a running benchmark has no exit code: rackbench killed it, or something else did."""
    parts = []
    if outcome.killed:
        parts.append(f"was killed by rackbench on {', '.join(outcome.killed)} (a kill of this run reached it)")
    others = [host for host in outcome.vanished if host not in outcome.killed]
    if others:
        parts.append(
            f"disappeared without an exit code on {', '.join(others)} (killed outside rackbench, or the host rebooted)"
        )
    return "the benchmark process " + "; it ".join(parts)


@shared_task(bind=True, max_retries=None, soft_time_limit=300, time_limit=360)
def run_collect_task(self: Task, run_id: int) -> None:
    run = _load(run_id)
    if run is None or run.status != RunStatus.COLLECTING:
        return
    with _step_lease(run_id, [RunStatus.COLLECTING]) as lease:
        if lease:
            _collect(self, run_id)


def _collect(
    task: Task,
    run_id: int,
    *,
    lease: str = "",
    run: Run | None = None,
    targets: list[execution.RunTarget] | None = None,
    noticed_at: float | None = None,
) -> None:
    """The collect step, under its lease. ``lease``: collected by the poll that saw the end, under that poll's lease
    (``run``, which it has just moved to collecting, and its started hosts, ``targets``, as it read them); a
    transient failure then gives the lease up and hands the step to run_collect_task, whose retries go on (the
    poll task's own retry would find the run collecting and do nothing)."""
    run = run or _load(run_id)
    if run is None or run.status != RunStatus.COLLECTING:
        return  # a twin of this task collected it already
    try:
        status, error = execution.run_collect(run, targets=targets, noticed_at=noticed_at)
    except Exception as exc:
        if lease and _is_transient(exc):
            services.run_lease_release(run_id=run_id, owner=lease)
            run_collect_task.apply_async((run_id,), countdown=_backoff().delay(0))
            return
        _retry_or_fail(task, run_id, exc, kill=True)  # services may still run
        return
    if services.run_collected(run_id=run_id, status=status, error=error):
        enqueue_prometheus_pull(run_id)


@shared_task(bind=True, max_retries=3, soft_time_limit=120, time_limit=150)
def run_kill_task(self: Task, run_id: int, once: bool = False) -> None:
    """Kill everything the run started on its hosts and keep whatever output they left; then its campaign goes on
    (or gives its nodes back). Where the kill is not confirmed after the retries (``once``: no retry), the node
    stays held with the reason (``run_kill_unconfirmed``) and the reconciler tries again when it answers. A node
    marked suspect (it does not answer at all) is not retried here."""
    run = _load(run_id)
    if run is None:
        return
    try:
        unconfirmed = execution.run_kill(run)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the kill is not confirmed on any host
        unconfirmed = {host: str(exc) for host in run.hosts.values_list("host", flat=True)}
    down = set(Node.objects.filter(name__in=unconfirmed, suspect_since__isnull=False).values_list("name", flat=True))
    if set(unconfirmed) - down and not once and self.request.retries < (self.max_retries or 0):
        raise self.retry(countdown=_backoff().delay(self.request.retries)) from None
    if unconfirmed:
        log.warning("run %s: the kill is not confirmed on %s", run_id, unconfirmed)
        services.run_kill_unconfirmed(run_id=run_id, hosts=unconfirmed)
    else:
        try:
            execution.run_keep_output(run)
            enqueue_prometheus_pull(run_id)  # a failed or cancelled run's window is evidence too
        except Exception as exc:  # noqa: BLE001 - its output is evidence, not a condition of the kill
            log.warning("run %s: could not keep the output of the killed run: %s", run_id, exc)
        services.run_kill_confirmed(run_id=run_id)
    services.run_killed(run_id=run_id)


@shared_task(bind=True, max_retries=3, soft_time_limit=300, time_limit=360)
def campaign_teardown_task(self: Task, campaign_id: int) -> None:
    """When a campaign ends: stop its containers and unmount its storage on every node its runs used, then give
    its nodes back (whatever the teardown's outcome: its errors are logged)."""
    from campaigns.models import Campaign, CampaignStatus
    from inventory.models import Node

    campaign = Campaign.objects.select_related("storage").filter(pk=campaign_id).first()
    if campaign is None:
        return
    try:
        if campaign.status != CampaignStatus.RUNNING:  # else it runs again (a re-run): what it set up stays
            nodes = list(Node.objects.filter(run_hosts__run__campaign=campaign).distinct().order_by("name"))
            errors = execution.stop_containers(campaign, nodes) + execution.unmount_storage(campaign, nodes)
            if errors:
                log.warning("campaign %s: teardown failed on some nodes: %s", campaign.name, "; ".join(errors))
    finally:
        services.campaign_release(campaign_id=campaign_id)


@shared_task(bind=True, acks_late=True, soft_time_limit=150, time_limit=180, max_retries=3)
def collect_facts_task(self: Task, node_id: int) -> None:
    """Discover and store a node's facts. Idempotent: a redelivery just collects them again."""
    node = Node.objects.select_related("credential").filter(pk=node_id).first()
    if node is None:
        return
    try:
        facts.collect_facts(node)
    except (ssh.SSHError, SoftTimeLimitExceeded) as exc:
        transient = isinstance(exc, SoftTimeLimitExceeded) or getattr(exc, "transient", False)
        if transient and self.request.retries < (self.max_retries or 0):
            countdown = _backoff().delay(self.request.retries)
            log.warning("facts of %s: transient failure, retry in %.1f s: %s", node.name, countdown, exc)
            raise self.retry(exc=exc, countdown=countdown) from exc
        log.error("facts of %s not collected: %s", node.name, exc)


@shared_task(soft_time_limit=60, time_limit=90)
def nodes_reprobe_task() -> int:
    """Probe every suspect node (the reconciler sends this); those that answer again are cleared. Returns how many."""
    nodes = list(Node.objects.filter(suspect_since__isnull=False))
    answers = ssh.fan_out(nodes, lambda n: ssh.probe(n.address, n.ssh_port, timeout=PROBE_TIMEOUT))
    return sum(node_clear_suspect(node=n) for n, why in zip(nodes, answers, strict=True) if why == "")
