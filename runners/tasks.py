"""Thin Celery tasks for everything that touches a remote host (the "ssh" queue).

A run goes: run_start (flush, write files, submit detached) -> run_poll, re-scheduling itself every
RACKBENCH_POLL_INTERVAL seconds -> run_collect (fetch output, parse, store) -> the campaign advances.
Transient SSH errors are retried with backoff and jitter a bounded number of times; permanent ones
fail the run at once with the reason.
"""

from __future__ import annotations

import logging
import random

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.utils import timezone

from campaigns import services
from campaigns.models import Run, RunStatus
from inventory.models import Node
from plugins.benchmarks.base import ParamError
from runners import execution, facts, remote, ssh
from telemetry.tasks import enqueue_prometheus_pull

log = logging.getLogger(__name__)


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, SoftTimeLimitExceeded) or getattr(exc, "transient", False)


def _retry_or_fail(task: Task, run_id: int, exc: BaseException, *, kill: bool = False) -> None:
    """Retry a transient failure with backoff and jitter; otherwise fail the run with a clear reason."""
    retries = task.request.retries
    cfg = settings.RACKBENCH
    if _is_transient(exc) and retries < cfg["RETRY_MAX"]:
        services.run_heartbeat(run_id=run_id)
        countdown = cfg["RETRY_BACKOFF"] * (2**retries) * (1 + random.random() / 2)
        log.warning("run %s: transient failure, retry %s in %.1f s: %s", run_id, retries + 1, countdown, exc)
        raise task.retry(countdown=countdown, exc=exc if isinstance(exc, Exception) else None)
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


def _schedule_poll(run_id: int, token: str) -> None:
    run_poll_task.apply_async((run_id, token), countdown=settings.RACKBENCH["POLL_INTERVAL"])


@shared_task(bind=True, max_retries=None, soft_time_limit=600, time_limit=660)
def run_start_task(self: Task, run_id: int) -> None:
    run = _load(run_id)
    if run is None:
        return
    if run.status == RunStatus.QUEUED:
        if not services.run_transition(
            run_id=run_id, old=[RunStatus.QUEUED], new=RunStatus.PREPARING, started_at=timezone.now()
        ):
            return
    elif run.status != RunStatus.PREPARING:
        return  # already past this step (a redelivered message)
    try:
        if self.request.retries == 0 and run.resumes and _already_submitted(run):
            _mark_running(run)
            return
        jobs = execution.run_prepare(run)
        if not Run.objects.filter(pk=run_id, status=RunStatus.PREPARING).exists():
            return  # cancelled while it was being prepared: nothing is started
        execution.run_submit(jobs)
    except Exception as exc:
        _retry_or_fail(self, run_id, exc)
        return
    _mark_running(run)


def _already_submitted(run: Run) -> bool:
    """A resumed run may have been started before its worker died: never start it twice."""
    hosts = execution.run_targets(run, started=True)
    return any(remote.job_state(h.target, h.row.remote_dir).submitted for h in hosts)


def _mark_running(run: Run) -> None:
    if not services.run_transition(run_id=run.pk, old=[RunStatus.PREPARING], new=RunStatus.RUNNING):
        services.run_kill_request(run_id=run.pk)  # cancelled while it was being started
        return
    _schedule_poll(run.pk, services.run_new_poll_token(run_id=run.pk))


@shared_task(bind=True, max_retries=None, soft_time_limit=120, time_limit=150)
def run_poll_task(self: Task, run_id: int, token: str) -> None:
    run = _load(run_id)
    if run is None or run.status != RunStatus.RUNNING or run.poll_token != token:
        return  # finished, cancelled, or a newer poll chain took over
    try:
        outcome = execution.run_poll(run)
    except Exception as exc:
        _retry_or_fail(self, run_id, exc, kill=True)
        return
    if outcome.vanished:
        services.run_mark_failed(
            run_id=run_id,
            error=f"the benchmark process disappeared without an exit code on {', '.join(outcome.vanished)} "
            "(killed outside rackbench, or the host rebooted)",
            kill=True,  # the other hosts' commands and the services
        )
        return
    if outcome.finished:
        if services.run_transition(run_id=run_id, old=[RunStatus.RUNNING], new=RunStatus.COLLECTING):
            run_collect_task.delay(run_id)
        return
    timeout = run.campaign.run_timeout_s
    if run.started_at and (timezone.now() - run.started_at).total_seconds() > timeout:
        services.run_finish(
            run_id=run_id, status=RunStatus.TIMED_OUT, error=f"exceeded the run timeout of {timeout} s", kill=True
        )
        return
    services.run_heartbeat(run_id=run_id)
    _schedule_poll(run_id, token)


@shared_task(bind=True, max_retries=None, soft_time_limit=300, time_limit=360)
def run_collect_task(self: Task, run_id: int) -> None:
    run = _load(run_id)
    if run is None or run.status != RunStatus.COLLECTING:
        return
    try:
        status, error = execution.run_collect(run)
    except Exception as exc:
        _retry_or_fail(self, run_id, exc, kill=True)  # services may still run
        return
    if services.run_finish(run_id=run_id, status=status, error=error):
        enqueue_prometheus_pull(run_id)


@shared_task(bind=True, max_retries=3, soft_time_limit=120, time_limit=150)
def run_kill_task(self: Task, run_id: int) -> None:
    """Kill the run's remote process groups and keep whatever output they left; then its campaign goes on (or
    gives its nodes back). A kill that cannot be done after the retries is logged and given up."""
    run = _load(run_id)
    if run is None:
        return
    try:
        execution.run_kill(run)
        execution.run_keep_output(run)
        enqueue_prometheus_pull(run_id)  # a failed or cancelled run's window is evidence too
    except Exception as exc:
        if _is_transient(exc) and self.request.retries < (self.max_retries or 0):
            raise self.retry(
                countdown=settings.RACKBENCH["RETRY_BACKOFF"] * (2**self.request.retries), exc=exc
            ) from None
        log.warning("run %s: could not kill the remote job: %s", run_id, exc)
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
            countdown = settings.RACKBENCH["RETRY_BACKOFF"] * 2**self.request.retries * (1 + random.random() / 2)
            log.warning("facts of %s: transient failure, retry in %.1f s: %s", node.name, countdown, exc)
            raise self.retry(exc=exc, countdown=countdown) from exc
        log.error("facts of %s not collected: %s", node.name, exc)
