"""Exactly-once runs under duplicated tasks, slow steps, dead nodes and processes that ignore TERM.

Drills on the real lab: a real worker, real Redis, real sshd nodes and real fio. Duplicates are delivered by
sending each task a second time while its step is under way, as a broker redelivery or a resume would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from inventory.services import node_upsert
from runners import tasks as run_tasks
from tests.conftest import finished, group_alive, wait_for
from tests.test_campaign_e2e import fio_campaign


def launched(name: str, nodes: list[str], **overrides: Any) -> Campaign:
    return services.campaign_launch(campaign=services.campaign_apply(data=fio_campaign(name, nodes, **overrides)))


@pytest.fixture
def offline_nodes(transactional_db: None) -> list[Any]:
    """Nodes nobody dials: for services that touch only the database."""
    return [node_upsert(name=f"off{i}", address=f"10.9.9.{i}") for i in (1, 2)]


def a_run(status: str) -> Run:
    run = launched("offline", ["off1"]).runs.get()
    Run.objects.filter(pk=run.pk).update(status=status, heartbeat_at=timezone.now())
    run.refresh_from_db()
    return run


# --- the start step and its lease ------------------------------------------------------------------------


def test_a_start_whose_twin_moved_the_run_on_kills_nothing(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.RUNNING)  # the twin made preparing -> running and polls it

    run_tasks._mark_running(run)

    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and not run.kill_pending


def test_a_start_of_a_run_cancelled_meanwhile_kills_what_it_started(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.CANCELLED)

    run_tasks._mark_running(run)

    assert Run.objects.get(pk=run.pk).kill_pending


def test_a_step_holding_its_lease_is_never_taken_for_lost(offline_nodes: list[Any], settings: Any) -> None:
    run = a_run(RunStatus.PREPARING)
    long_ago = timezone.now() - timedelta(seconds=3600)
    Run.objects.filter(pk=run.pk).update(
        heartbeat_at=long_ago, lease_owner="x", lease_until=timezone.now() + timedelta(seconds=10)
    )
    assert not services.stale_runs(older_than=settings.RACKBENCH["STALE_AFTER"]).filter(pk=run.pk).exists()

    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert services.stale_runs(older_than=settings.RACKBENCH["STALE_AFTER"]).filter(pk=run.pk).exists()


def test_a_slow_step_keeps_its_lease_and_a_duplicate_backs_off(
    offline_nodes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = a_run(RunStatus.PREPARING)
    monkeypatch.setattr(run_tasks, "STEP_LEASE", 1.0)
    monkeypatch.setattr(run_tasks, "STEP_LEASE_RENEW", 0.2)

    with run_tasks._step_lease(run.pk, [RunStatus.PREPARING]) as held:
        assert held
        time.sleep(2.5)  # far past the lease's first expiry: renewed meanwhile
        run.refresh_from_db()
        assert run.lease_until and run.lease_until > timezone.now()
        assert not services.stale_runs(older_than=0.5).filter(pk=run.pk).exists()
        with run_tasks._step_lease(run.pk, [RunStatus.PREPARING]) as twin:
            assert not twin
    run.refresh_from_db()
    assert run.lease_owner == "" and run.lease_until is None


def test_a_duplicated_poll_stops_and_only_one_chain_goes_on(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.RUNNING)
    token = services.run_new_poll_token(run_id=run.pk)

    first = services.run_poll_claim(run_id=run.pk, token=token)
    second = services.run_poll_claim(run_id=run.pk, token=token)

    assert first and second is None
    assert Run.objects.get(pk=run.pk).poll_token == first


# --- drills on the lab -----------------------------------------------------------------------------------


def deliver_every_task_twice(campaign: Campaign, *, timeout: float = 240) -> dict[str, int]:
    """Send a second copy of each step's task while the step is under way (start, poll, collect), and of each
    run's kill and the campaign's teardown once they are due. Returns how many copies were sent per kind."""
    sent = {"start": 0, "poll": 0, "collect": 0, "kill": 0, "teardown": 0}
    seen: set[tuple[int, str]] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        campaign.refresh_from_db()
        for run in campaign.runs.all():
            key = (run.pk, run.status)
            if key in seen:
                continue
            if run.status in (RunStatus.QUEUED, RunStatus.PREPARING):
                run_tasks.run_start_task.delay(run.pk)
                sent["start"] += 1
            elif run.status == RunStatus.RUNNING and run.poll_token:
                run_tasks.run_poll_task.delay(run.pk, run.poll_token)
                sent["poll"] += 1
            elif run.status == RunStatus.COLLECTING:
                run_tasks.run_collect_task.delay(run.pk)
                sent["collect"] += 1
            elif run.is_terminal:
                run_tasks.run_kill_task.delay(run.pk)
                sent["kill"] += 1
            else:
                continue
            seen.add(key)
        if campaign.is_terminal:
            run_tasks.campaign_teardown_task.delay(campaign.pk)
            sent["teardown"] += 1
            return sent
        time.sleep(0.05)
    pytest.fail(f"campaign {campaign.name} did not end within {timeout:g} s")


def assert_one_set_of_results(campaign: Campaign) -> None:
    doubled = (
        Result.objects.filter(run__campaign=campaign)
        .values("run", "name", "host", "labels")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not doubled.exists(), list(doubled[:5])
    counts = {r.pk: r.results.count() for r in campaign.runs.all()}
    assert len(set(counts.values())) == 1 and min(counts.values()) > 0, counts


@pytest.mark.lab
@pytest.mark.worker
def test_every_task_delivered_twice_still_runs_each_run_once(lab: dict[str, Any], worker: Any) -> None:
    campaign = launched(
        "twice",
        ["lab1", "lab2"],
        repetitions=3,
        fixed={"bs": "64k", "size": "8M", "runtime": 2, "time_based": 1},
    )

    sent = deliver_every_task_twice(campaign)
    finished(campaign, timeout=120)

    errors = list(campaign.runs.exclude(status=RunStatus.SUCCEEDED).values_list("error", flat=True))
    assert campaign.status == CampaignStatus.SUCCEEDED, errors
    assert all(sent[kind] for kind in ("start", "poll", "collect", "kill", "teardown")), sent
    assert campaign.runs.count() == 3 and not campaign.runs.filter(resumes__gt=0).exists()
    assert_one_set_of_results(campaign)
    assert not campaign.leases.exists()


def _concurrently(count: int, fn: Any) -> list[Any]:
    barrier = threading.Barrier(count)
    out: list[Any] = [None] * count

    def call(i: int) -> None:
        try:
            barrier.wait()
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            out[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.lab
def test_a_start_cut_off_half_way_is_undone_and_every_host_starts_in_one_attempt(lab: dict[str, Any]) -> None:
    from runners import execution, remote

    fixed = {"bs": "64k", "size": "8M", "runtime": 3, "time_based": 1}
    run = launched("halfway", ["lab1", "lab2"], fixed=fixed).runs.get()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.PREPARING, resumes=1)  # a resumed start
    run = Run.objects.select_related("campaign").get(pk=run.pk)
    jobs = execution.run_prepare(run)
    remote.job_submit(jobs[0].target, jobs[0].context.run_dir)  # the worker died after the first host
    first = wait_for_pid(jobs[0])

    run_tasks.run_start_task.apply(args=(run.pk,))

    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING, run.error
    pids = [wait_for_pid(job) for job in jobs]
    assert all(remote.job_state(j.target, j.context.run_dir).submitted for j in jobs)
    assert pids[0] != first  # the half-started attempt was undone, not mixed into this one
    assert not group_alive(first)
    services.run_finish(run_id=run.pk, status=RunStatus.CANCELLED, kill=False)
    for job in jobs:
        remote.job_kill(job.target, job.context.run_dir)


def wait_for_pid(job: Any) -> int:
    from runners import remote

    return wait_for(lambda: remote.job_state(job.target, job.context.run_dir).pid, timeout=20, what="the job's pid")


# --- results, once --------------------------------------------------------------------------------------


def some_metrics(value: float) -> list[Any]:
    from plugins.benchmarks.base import Metric

    return [Metric(name=f"m{i}", value=value, unit="B/s", host=h) for i in range(20) for h in ("off1", "")]


def test_concurrent_collects_store_a_run_s_results_once(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.COLLECTING)
    for attempt in range(5):  # each round: four collects at once
        metrics = some_metrics(attempt)
        stored = _concurrently(4, lambda: services.run_store_results(run=run, metrics=metrics))  # noqa: B023
        assert all(n == 40 for n in stored), stored
        assert Result.objects.filter(run=run).count() == 40
        assert set(Result.objects.filter(run=run).values_list("value", flat=True)) == {attempt}


def test_the_database_refuses_a_result_stored_twice(offline_nodes: list[Any]) -> None:
    from django.db import IntegrityError, transaction

    run = a_run(RunStatus.COLLECTING)
    Result.objects.create(run=run, name="bw", value=1, unit="B/s", host="off1", labels={"op": "read"})
    with pytest.raises(IntegrityError), transaction.atomic():
        Result.objects.create(run=run, name="bw", value=2, unit="B/s", host="off1", labels={"op": "read"})
    Result.objects.create(run=run, name="bw", value=2, unit="B/s", host="off1", labels={"op": "write"})


def test_a_run_no_longer_collecting_stores_nothing(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.CANCELLED)

    assert services.run_store_results(run=run, metrics=some_metrics(1)) == 0
    assert not Result.objects.filter(run=run).exists()


# --- a kill that gets everything -------------------------------------------------------------------------


def process_alive(pid: int) -> bool:
    """A live (not zombie) process on this machine, where the lab nodes run."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.lab
def test_a_kill_gets_a_term_ignoring_child_that_left_for_its_own_session(lab: dict[str, Any]) -> None:
    from runners import remote

    remote.reset_pool()
    target = remote.node_target(lab["nodes"]["lab1"])
    job_dir = f"{remote.remote_root(target)}/test/escape-{time.monotonic_ns()}"
    # Like fio on hung storage: the main process does not exit on TERM, and a child runs in its own session.
    tree = "trap '' TERM; setsid sh -c 'echo $$ > child.pid; exec sleep 300' & exec sleep 301"
    remote.job_prepare(
        target, job_dir, extra_dirs=[], files={"command.sh": remote.command_script(["sh", "-c", tree], {})}
    )
    remote.job_submit(target, job_dir)
    main = wait_for(lambda: remote.job_state(target, job_dir).pid, timeout=20, what="the job's pid")
    child = int(wait_for(lambda: target.get(f"{job_dir}/child.pid"), timeout=20, what="the child's pid"))
    assert os.getsid(child) == child != os.getsid(main)

    try:
        left = remote.job_kill(target, job_dir, grace=0.5)

        assert not process_alive(child), "the child in its own session outlived the kill"
        assert not group_alive(main)
        assert left == []  # confirmed
    finally:
        if process_alive(child):
            os.kill(child, signal.SIGKILL)
        remote.reset_pool()


@pytest.mark.lab
@pytest.mark.worker
def test_a_cancel_kills_fio_s_job_processes_when_fio_does_not_exit_on_term(lab: dict[str, Any], worker: Any) -> None:
    fixed = {"bs": "64k", "size": "8M", "runtime": 60, "time_based": 1, "numjobs": 2}
    campaign = launched("hung", ["lab2"], fixed=fixed)
    run = wait_for(lambda: campaign.runs.filter(status=RunStatus.RUNNING).first(), timeout=60, what="fio running")
    fio = wait_for(lambda: run.hosts.get().pid and fio_processes(run.hosts.get().pid), timeout=20, what="fio's jobs")
    main, jobs = fio[0], fio[1:]
    assert jobs and all(os.getsid(p) == p for p in jobs)  # fio's job processes: each in a session of its own
    os.kill(main, signal.SIGSTOP)  # hung: fio's main process does not act on TERM

    try:
        services.campaign_cancel(campaign=campaign)
        finished(campaign, timeout=60)

        assert [p for p in fio if process_alive(p)] == []
    finally:
        for pid in fio:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def fio_processes(launcher_pid: int) -> list[int]:
    """fio's main process (first) and its job processes, under the job's launcher."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        pid, rest = int(text.split(" ", 1)[0]), text.rsplit(")", 1)
        names[pid] = text[text.index("(") + 1 : text.rindex(")")]
        children.setdefault(int(rest[1].split()[1]), []).append(pid)
    tree, todo = [], [launcher_pid]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo += sorted(children.get(pid, []))
    fio = [p for p in tree if names.get(p) == "fio"]
    return fio if len(fio) >= 3 else []
