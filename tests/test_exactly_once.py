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
from unittest import mock

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunHost, RunStatus
from inventory.services import node_upsert
from runners import tasks as run_tasks
from tests.conftest import LAB_NODES, LAB_PORT, finished, group_alive, wait_for
from tests.test_campaign_e2e import fio_campaign


def launched(name: str, nodes: list[str], **overrides: Any) -> Campaign:
    return services.campaign_launch(campaign=services.campaign_apply(data=fio_campaign(name, nodes, **overrides)))


def _offline_nodes() -> list[Any]:
    return [node_upsert(name=f"off{i}", address=f"10.9.9.{i}") for i in (1, 2)]


@pytest.fixture
def offline_nodes(db: None) -> list[Any]:
    """Nodes nobody dials, for services that touch only the database (in the test's transaction: nothing it
    enqueues on commit reaches a worker)."""
    return _offline_nodes()


@pytest.fixture
def offline_nodes_tx(transactional_db: None) -> list[Any]:
    """The same, committed: for tests where threads with connections of their own work on the rows."""
    return _offline_nodes()


def a_run(status: str) -> Run:
    """A run of a campaign on off1 in ``status``, made without launching (no task is enqueued)."""
    campaign = services.campaign_apply(data=fio_campaign(f"offline-{time.monotonic_ns()}", ["off1"]))
    run = Run.objects.create(
        campaign=campaign, sequence=1, point=0, params={}, repetition=1, status=status, heartbeat_at=timezone.now()
    )
    node = offline_node("off1")
    RunHost.objects.create(run=run, node=node, host=node.name, address=node.address, command="", remote_dir="")
    return run


def offline_node(name: str) -> Any:
    from inventory.models import Node

    return Node.objects.get(name=name)


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
    offline_nodes_tx: list[Any], monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    run = a_run(RunStatus.PREPARING)
    monkeypatch.setitem(settings.RACKBENCH, "STEP_LEASE", 0.6)  # renewed every 0.2 s

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


def ended_poll(monkeypatch: pytest.MonkeyPatch, collect: Any) -> tuple[Run, list[Any]]:
    """A running run whose poll sees every exit code, with ``collect`` standing in for run_collect (and taking its
    keyword options); returns the run and the collect tasks sent."""
    run = a_run(RunStatus.RUNNING)
    token = services.run_new_poll_token(run_id=run.pk)
    sent: list[Any] = []
    monkeypatch.setattr(run_tasks.execution, "run_poll", lambda *a, **k: run_tasks.execution.PollOutcome(True, []))
    monkeypatch.setattr(run_tasks.execution, "run_collect", collect)
    monkeypatch.setattr(run_tasks.run_collect_task, "apply_async", lambda *a, **k: sent.append(a))
    monkeypatch.setattr(run_tasks.run_collect_task, "delay", lambda *a, **k: sent.append(a))
    monkeypatch.setattr(run_tasks, "enqueue_prometheus_pull", lambda run_id: None)
    run_tasks.run_poll_task.apply(args=(run.pk, token))
    return Run.objects.get(pk=run.pk), sent


def test_the_poll_that_sees_the_end_collects_in_its_own_task_under_its_lease(
    offline_nodes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, str]] = []

    def collect(run: Run, **_: Any) -> tuple[str, str]:
        row = Run.objects.get(pk=run.pk)
        seen.append((row.status, row.lease_owner))
        return RunStatus.SUCCEEDED, ""

    run, sent = ended_poll(monkeypatch, collect)

    assert len(seen) == 1 and seen[0][0] == RunStatus.COLLECTING and seen[0][1]  # held by the poll throughout
    assert sent == []  # no collect task: nothing for a twin to take over
    assert run.status == RunStatus.SUCCEEDED and run.lease_owner == ""


def test_a_collect_in_the_poll_that_fails_for_a_transient_reason_goes_to_the_collect_task(
    offline_nodes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def collect(run: Run, **_: Any) -> tuple[str, str]:
        raise run_tasks.ssh.TransientSSHError(None, "connection reset")

    run, sent = ended_poll(monkeypatch, collect)

    assert run.status == RunStatus.COLLECTING and run.lease_owner == ""  # free for the collect task to take
    assert sent == [((run.pk,),)]


def test_a_collect_in_the_poll_that_fails_for_good_fails_the_run(
    offline_nodes: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def collect(run: Run, **_: Any) -> tuple[str, str]:
        raise run_tasks.ssh.PermanentSSHError(None, "authentication failed")

    run, sent = ended_poll(monkeypatch, collect)

    assert run.status == RunStatus.FAILED and "authentication failed" in run.error and sent == []


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
                # A collect delivered early, as a redelivery may: it must do nothing (the collecting state itself
                # lasts a few tens of ms, between two looks of this loop as often as not).
                run_tasks.run_collect_task.delay(run.pk)
                sent["collect"] += 1
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


@pytest.mark.lab
def test_a_start_resumed_after_its_folded_round_trip_keeps_that_attempt_and_starts_nothing_more(
    lab: dict[str, Any],
) -> None:
    from runners import execution, remote
    from runners.prepare import Fold

    fixed = {"bs": "64k", "size": "8M", "runtime": 3, "time_based": 1}
    data = {"fixed": fixed, "repetitions": 2, "cache": {"flush_clients": False}}
    with mock.patch.object(services, "campaign_advance_soon"):  # started by the test, not by a worker
        first, second = launched("fold-resume", ["lab1", "lab2"], **data).runs.order_by("sequence")
    execution.run_prepare(Run.objects.select_related("campaign").get(pk=first.pk))
    Run.objects.filter(pk=first.pk).update(
        provenance={**Run.objects.get(pk=first.pk).provenance, "start": {"attempts": [{"hosts": 2, "wave_s": 0.02}]}}
    )
    Run.objects.filter(pk=second.pk).update(status=RunStatus.PREPARING, resumes=1)
    fold = Fold(attempt="fold1", margin_s=1.0, tolerance_s=0.05)
    jobs = execution.run_prepare(Run.objects.select_related("campaign").get(pk=second.pk), fold=fold)
    assert fold.jobs and fold.answers == [None, None]  # started in the round trip; then the worker died
    pids = [wait_for_pid(job) for job in jobs]

    run_tasks.run_start_task.apply(args=(second.pk,))  # the resumed (or redelivered) start

    second.refresh_from_db()
    assert second.status == RunStatus.RUNNING, second.error
    for job, pid in zip(jobs, pids, strict=True):
        state = remote.job_state(job.target, job.context.run_dir)
        assert state.attempt == "fold1" and state.pid == pid  # the folded attempt kept, nothing started again
    services.run_finish(run_id=second.pk, status=RunStatus.CANCELLED, kill=False)
    for job in jobs:
        remote.job_kill(job.target, job.context.run_dir)


def wait_for_pid(job: Any) -> int:
    from runners import remote

    return wait_for(lambda: remote.job_state(job.target, job.context.run_dir).pid, timeout=60, what="the job's pid")


# --- results, once --------------------------------------------------------------------------------------


def some_metrics(value: float) -> list[Any]:
    from plugins.benchmarks.base import Metric

    return [Metric(name=f"m{i}", value=value, unit="B/s", host=h) for i in range(20) for h in ("off1", "")]


def test_concurrent_collects_store_a_run_s_results_once(offline_nodes_tx: list[Any]) -> None:
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
    main = wait_for(lambda: remote.job_state(target, job_dir).pid, timeout=60, what="the job's pid")
    child = int(wait_for(lambda: target.get(f"{job_dir}/child.pid"), timeout=60, what="the child's pid"))
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
    fio = wait_for(lambda: run.hosts.get().pid and fio_processes(run.hosts.get().pid), timeout=60, what="fio's jobs")
    main, jobs = fio[0], fio[1:]
    assert jobs and all(os.getsid(p) == p for p in jobs)  # fio's job processes: each in a session of its own
    os.kill(main, signal.SIGSTOP)  # hung: fio's main process does not act on TERM

    try:
        services.campaign_cancel(campaign=campaign)
        finished(campaign, timeout=180)

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


# --- a node that dies mid-run ----------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
def test_a_node_whose_kill_is_not_confirmed_stays_held_and_the_next_campaign_never_overlaps(
    lab: dict[str, Any], worker: Any
) -> None:
    from campaigns.models import NodeLease
    from campaigns.tasks import reconcile_runs
    from runners import lab as lab_module

    first = launched("dies", ["lab3"], fixed={"bs": "64k", "size": "8M", "runtime": 120, "time_based": 1})
    run = wait_for(lambda: first.runs.filter(status=RunStatus.RUNNING).first(), timeout=60, what="fio running")
    pid = wait_for(lambda: Run.objects.get(pk=run.pk).hosts.get().pid, timeout=60, what="fio's pid")
    lab_module.lab_node_down(3, lab_dir=lab["dir"])  # its sshd dies; the fio it started runs on
    try:
        services.campaign_cancel(campaign=first)
        held = wait_for(
            lambda: NodeLease.objects.filter(node__name="lab3", held_for=run).first(), timeout=90, what="lab3 kept"
        )
        wait_for(lambda: not Run.objects.get(pk=run.pk).kill_pending, timeout=60, what="the kill given up")
        run.refresh_from_db()
        assert "may still be running" in run.error and "lab3" in run.error
        assert held.campaign_id == first.pk and held.held_reason and held.held_since
        assert group_alive(pid)  # the old fio does run on
        second = launched("next", ["lab3"], fixed={"bs": "64k", "size": "8M", "runtime": 1, "time_based": 1})
        time.sleep(3)
        assert reconcile_runs()["released"] == 0
        assert second.runs.get().status == RunStatus.PENDING  # it waits for lab3
        assert NodeLease.objects.filter(node__name="lab3", held_for=run).exists()
    finally:
        lab_module.lab_up(LAB_NODES, port=LAB_PORT, lab_dir=lab["dir"])

    overlap = []
    deadline = time.monotonic() + 120
    while not Campaign.objects.get(pk=second.pk).is_terminal and time.monotonic() < deadline:
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        reconcile_runs()  # as celery beat would: the kill is retried now that lab3 answers
        for _ in range(10):
            status = Run.objects.get(campaign=second).status
            if status not in (RunStatus.PENDING, RunStatus.CANCELLED) and group_alive(pid):
                overlap.append(status)
            time.sleep(0.1)
    finished(second, timeout=180)
    assert not overlap, f"the next campaign's run was {overlap[0]} while the old fio still ran"
    assert second.status == CampaignStatus.SUCCEEDED, list(second.runs.values_list("error", flat=True))
    assert not group_alive(pid)
    finished(first, timeout=180)
    assert "The kill was confirmed" in Run.objects.get(pk=run.pk).error


def test_a_kept_node_shows_why_in_the_queue_and_staff_can_release_it_by_hand(
    offline_nodes: list[Any], django_user_model: Any, client: Any
) -> None:
    from accounts.selectors import Scope
    from campaigns.models import NodeLease
    from scheduling.selectors import campaign_queue, timeline

    first = launched("first", ["off1"])
    run = first.runs.get()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    services.run_kill_unconfirmed(run_id=run.pk, hosts={"off1": "off1 (x@10.9.9.1:22): cannot connect: refused"})
    Campaign.objects.filter(pk=first.pk).update(status=CampaignStatus.FAILED)
    assert services.campaign_release(campaign_id=first.pk)
    lease = NodeLease.objects.get(node__name="off1")
    assert lease.campaign_id == first.pk and lease.held_for_id == run.pk  # kept past the campaign's end
    assert "may still be running" in Run.objects.get(pk=run.pk).error
    second = launched("second", ["off1"])

    queue = campaign_queue(campaign=Campaign.objects.get(pk=second.pk))
    assert queue and "the kill of run" in queue["holders"][0].kept[0] and "refused" in queue["holders"][0].kept[0]
    staff = django_user_model.objects.create_superuser("root", password="pw-root-123")
    row = next(r for r in timeline(scope=Scope(user=staff)) if r.node.name == "off1")
    assert row.holder and row.holder.kept

    client.force_login(staff)
    page = client.get("/admin/campaigns/nodelease/")
    assert page.status_code == 200 and "refused" in page.content.decode()
    client.post("/admin/campaigns/nodelease/", {"action": "release_by_hand", "_selected_action": [lease.pk]})

    assert not NodeLease.objects.filter(node__name="off1", campaign=first).exists()
    assert "released by hand by root" in Run.objects.get(pk=run.pk).error
    services.campaign_advance(campaign_id=second.pk)
    assert NodeLease.objects.get(node__name="off1").campaign_id == second.pk


def test_a_run_on_a_kept_node_fails_at_once_with_the_reason(offline_nodes: list[Any]) -> None:
    from campaigns.models import NodeLease

    campaign = launched("again", ["off1"], repetitions=2)
    services.campaign_advance(campaign_id=campaign.pk)
    first, second = campaign.runs.order_by("sequence")
    services.run_finish(run_id=first.pk, status=RunStatus.FAILED, error="lost")
    services.run_kill_unconfirmed(run_id=first.pk, hosts={"off1": "timed out"})

    assert services.campaign_advance(campaign_id=campaign.pk) == "failed"
    second.refresh_from_db()
    assert second.status == RunStatus.FAILED and "is not confirmed (timed out)" in second.error
    assert NodeLease.objects.get(node__name="off1").held_for_id == first.pk


# --- a cancel during collecting ----------------------------------------------------------------------------


def test_a_run_cancelled_while_collecting_keeps_no_results(offline_nodes: list[Any]) -> None:
    run = a_run(RunStatus.COLLECTING)
    assert services.run_store_results(run=run, metrics=some_metrics(1)) == 40  # the collect stored them first

    services.run_finish(run_id=run.pk, status=RunStatus.CANCELLED, error="cancelled by the user", kill=True)

    assert not Result.objects.filter(run=run).exists()
    assert services.run_store_results(run=run, metrics=some_metrics(1)) == 0  # and none come after


# --- error texts ---------------------------------------------------------------------------------------------


def test_a_listener_that_never_sends_a_banner_is_named_as_such_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import socket

    from runners import ssh

    accepted: list[socket.socket] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()

        class NoKeys:
            def pinned(self, address: str, port: int) -> None:
                return None

            def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
                return key_type, key_base64

        pool = ssh.Pool(NoKeys(), ssh.Timeouts(connect=1.0))
        endpoint = ssh.Endpoint("127.0.0.1", server.getsockname()[1], "nobody", name="silent")
        with caplog.at_level(logging.INFO), pytest.raises(ssh.TransientSSHError) as failure:
            pool.run(endpoint, paramiko_key(), "true")
        time.sleep(0.5)  # paramiko's transport thread logs as it ends
    for sock in accepted:
        sock.close()
    assert "no SSH banner within 1 s" in str(failure.value) and "silent" in str(failure.value)
    noisy = [r for r in caplog.records if r.name.startswith("paramiko") and r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


def paramiko_key() -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from runners import ssh

    openssh = serialization.PrivateFormat.OpenSSH
    key = Ed25519PrivateKey.generate()
    return ssh.load_private_key(
        key.private_bytes(serialization.Encoding.PEM, openssh, serialization.NoEncryption()).decode()
    )


@pytest.mark.lab
@pytest.mark.worker
def test_a_benchmark_rackbench_killed_is_said_to_be_killed_by_rackbench(lab: dict[str, Any], worker: Any) -> None:
    from runners import remote

    campaign = launched("stopped", ["lab4"], fixed={"bs": "64k", "size": "8M", "runtime": 60, "time_based": 1})
    run = wait_for(lambda: campaign.runs.filter(status=RunStatus.RUNNING).first(), timeout=60, what="fio running")
    host = wait_for(lambda: Run.objects.get(pk=run.pk).hosts.filter(pid__isnull=False).first(), timeout=60, what="pid")
    remote.reset_pool()
    remote.job_kill(remote.node_target(lab["nodes"]["lab4"]), host.remote_dir)  # as a kill of this run would
    remote.reset_pool()

    finished(campaign, timeout=180)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "killed by rackbench on lab4" in run.error and "outside rackbench" not in run.error


# --- the circuit breaker -----------------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
def test_a_node_that_does_not_answer_is_marked_suspect_and_its_other_runs_fail_at_once(
    lab: dict[str, Any], worker: Any, django_user_model: Any, client: Any
) -> None:
    from django.urls import reverse

    from inventory.models import Node
    from runners import lab as lab_module

    lab_module.lab_node_down(2, lab_dir=lab["dir"])
    try:
        started = time.monotonic()
        campaign = launched("down", ["lab2"], repetitions=4)
        finished(campaign, timeout=120)
        seconds = time.monotonic() - started

        first, *others = campaign.runs.order_by("sequence")
        assert "node lab2 does not answer" in first.error and "marked suspect" in first.error, first.error
        assert all(r.status == RunStatus.FAILED for r in others)
        assert all(r.error.startswith("not started: node lab2 does not answer since") for r in others), [
            r.error for r in others
        ]
        assert all(r.started_at is None for r in others)  # no SSH attempt, no retries
        node = Node.objects.get(name="lab2")
        assert node.suspect_since and "cannot connect" in node.suspect_reason
        client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123"))
        page = client.get(reverse("inventory:node-detail", args=[node.pk])).content.decode()
        assert "suspect since" in page and "Does not answer over SSH" in page
        print(f"4 runs on a dead node ended in {seconds:.1f} s")
    finally:
        lab_module.lab_up(LAB_NODES, port=LAB_PORT, lab_dir=lab["dir"])

    assert run_tasks.nodes_reprobe_task.apply().get() == 1  # as the reconciler sends it: lab2 answers again
    assert Node.objects.get(name="lab2").suspect_since is None
    again = launched("back", ["lab2"])
    finished(again, timeout=120)
    assert again.status == CampaignStatus.SUCCEEDED, list(again.runs.values_list("error", flat=True))
