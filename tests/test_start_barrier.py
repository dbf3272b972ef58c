"""The start barrier: a run's hosts start at one instant, each records when it really started, a host whose submit
comes late starts nothing and the start is made again as a whole (or the run fails), never with mixed attempts.

Real lab sshd nodes, real workers (one of their own where the margin is forced to nothing), real fio.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from campaigns import services
from campaigns.models import CampaignStatus, Run, RunStatus
from runners import remote, ssh
from tests.conftest import ROOT, Worker, finished, purge_broker, spare_broker, wait_for, worker_env
from tests.test_campaign_e2e import fio_campaign

LAB = ["lab1", "lab2", "lab3", "lab4"]
FIXED = {"bs": "64k", "size": "8M", "runtime": 1, "time_based": 1}
TICK_NS = 10_000_000  # a start is recorded as a file's time: a clock tick's resolution, up to a tick behind


def job(lab: dict[str, Any], node: str, script: str) -> tuple[remote.Target, str]:
    """A job directory on ``node`` whose command runs ``script`` in sh."""
    target = remote.node_target(lab["nodes"][node])
    job_dir = f"{remote.remote_root(target)}/test/barrier-{time.monotonic_ns()}"
    remote.job_prepare(
        target, job_dir, extra_dirs=[], files={"command.sh": remote.command_script(["sh", "-c", script], {})}
    )
    return target, job_dir


def read(path: str) -> str:
    """A file of a lab node's job (the lab's nodes share this machine's filesystem); "" when it does not exist."""
    file = Path(path)
    return file.read_text() if file.exists() else ""


def wait_exit(target: remote.Target, job_dir: str) -> remote.JobState:
    return wait_for(
        lambda: (s := remote.job_state(target, job_dir)).finished and s, timeout=60, what=f"{job_dir} to end"
    )


# --- the launcher and the submit, on the lab's nodes ------------------------------------------------------------


@pytest.mark.lab
def test_hosts_submitted_with_one_instant_start_at_it_and_record_when(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    jobs = [job(lab, node, "echo ran") for node in LAB]
    at = time.time_ns() + 2_000_000_000  # far enough ahead on a loaded machine

    answers = ssh.fan_out(jobs, lambda j: remote.job_submit(*j, attempt="a1", start_at_ns=at, tolerance_ns=0))

    assert answers == [None] * 4
    assert time.time_ns() < at  # every host waits: none has started yet
    assert all(read(f"{d}/started") == "" for _, d in jobs)
    for target, job_dir in jobs:
        assert wait_exit(target, job_dir).exit_code == 0
    started = [int(read(f"{d}/started")) for _, d in jobs]
    assert min(started) >= at - TICK_NS  # none before the instant
    assert max(started) - min(started) < 1_000_000_000  # together (loose: the machine is shared)


@pytest.mark.lab
def test_a_submit_that_comes_after_the_instant_starts_nothing(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target, job_dir = job(lab, "lab1", "echo ran")

    late = remote.job_submit(target, job_dir, attempt="a1", start_at_ns=time.time_ns() - 500_000_000, tolerance_ns=0)

    assert late is not None and late >= 500_000_000
    state = remote.job_state(target, job_dir)
    assert not state.submitted and state.pid is None  # no marker: a later attempt may start it
    assert read(f"{job_dir}/started") == "" and read(f"{job_dir}/stdout") == ""


@pytest.mark.lab
def test_the_same_submit_delivered_twice_at_once_starts_the_host_once(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target, job_dir = job(lab, "lab2", "echo $$ >> launches")
    at = time.time_ns() + 1_000_000_000
    barrier = threading.Barrier(2)

    def submit(_: int) -> int | None:
        barrier.wait()
        return remote.job_submit(target, job_dir, attempt="twice", start_at_ns=at, tolerance_ns=0)

    assert ssh.fan_out([0, 1], submit) == [None, None]
    remote.job_submit(target, job_dir, attempt="twice", start_at_ns=at, tolerance_ns=0)  # and once more, later

    assert wait_exit(target, job_dir).exit_code == 0
    assert len(read(f"{job_dir}/launches").split()) == 1
    assert remote.job_state(target, job_dir).attempt == "twice"


@pytest.mark.lab
def test_a_submit_of_another_attempt_is_refused_until_the_earlier_one_is_undone(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target, job_dir = job(lab, "lab3", "echo $$ >> launches; sleep 30")
    remote.job_submit(target, job_dir, attempt="first")
    wait_for(lambda: remote.job_state(target, job_dir).alive, timeout=20, what="the first attempt running")

    with pytest.raises(ssh.TransientSSHError, match="started by attempt first"):
        remote.job_submit(target, job_dir, attempt="second")

    remote.job_undo(target, job_dir)
    remote.job_submit(target, job_dir, attempt="second")
    wait_for(lambda: len(read(f"{job_dir}/launches").split()) == 2, timeout=20, what="the second attempt running")
    assert remote.job_state(target, job_dir).attempt == "second"
    remote.job_kill(target, job_dir)


# --- runs through a worker ------------------------------------------------------------------------------------


def start_record(run: Run) -> dict[str, Any]:
    return dict(run.provenance.get("start") or {})


def host_files(run: Run, name: str) -> list[str]:
    return [read(f"{h.remote_dir}/{name}") for h in run.hosts.order_by("host")]


@pytest.mark.lab
@pytest.mark.worker
def test_a_run_records_how_together_its_hosts_started(lab: dict[str, Any], worker: Any, django_user_model: Any) -> None:
    data = fio_campaign("together", LAB, fixed=FIXED, repetitions=2)
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))
    finished(campaign, timeout=200)

    run, second = campaign.runs.order_by("sequence")
    assert run.status == second.status == RunStatus.SUCCEEDED, [run.error, second.error]
    start = start_record(run)
    # The margin is reckoned from what reaching the four hosts at once was measured to take: for the first run the
    # cache snapshot taken on them just before, for the next one the first run's submit wave, the very command.
    cfg = settings.RACKBENCH
    (first_attempt,) = start["attempts"]
    assert first_attempt["reckoned_from"] == "the cache snapshot on every host"
    factor, floor = cfg["START_MARGIN_FACTOR"], cfg["START_MARGIN"]
    assert first_attempt["margin_s"] == round(max(floor, factor * start["probe_s"]), 4)
    (next_attempt,) = start_record(second)["attempts"]
    assert next_attempt["reckoned_from"] == f"the submit wave of run {run.pk}"
    assert next_attempt["margin_s"] == round(max(floor, factor * first_attempt["wave_s"]), 4)
    assert start["recorded"] == 4 and len(start["attempts"]) == 1 and not start["attempts"][0]["late"]
    assert set(host_files(run, "submitted")) == {start["attempt"]}
    started = [int(t) for t in host_files(run, "started")]
    assert min(started) >= start["start_at_ns"] - TICK_NS and min(start["offsets_ms"].values()) >= -TICK_NS / 1e6
    assert start["spread_s"] == pytest.approx((max(started) - min(started)) / 1e9, abs=1e-6)
    assert start["spread_s"] < 1.0  # loose: the machine is shared
    assert settings.RACKBENCH["START_MARGIN"] <= start["margin_s"]
    flushed = max(datetime.fromisoformat(f["at"]).timestamp() for f in run.provenance["flush"])
    assert flushed * 1e9 < start["start_at_ns"]  # after its flush

    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password="pw-root-123456"))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Start spread" in page and "max − min of the start instants of 4 hosts" in page
    api = client.get(f"/api/v1/runs/{run.pk}/").json()["start"]
    assert api["spread_s"] == start["spread_s"] and api["spread"].endswith("s") and api["attempts"] == 1


def run_on_own_worker(name: str, **env: str) -> Any:
    """A one-run campaign (fio for 1 s on the four lab nodes, caches flushed) on a worker of its own whose start
    margin is forced to nothing: every submit of a first attempt comes after its start instant."""
    broker = spare_broker(0, settings.CELERY_BROKER_URL)
    purge_broker(broker)
    environment = worker_env(CELERY_BROKER_URL=broker, RACKBENCH_START_MARGIN="0", RACKBENCH_START_MARGIN_FACTOR="0",
                             RACKBENCH_START_TOLERANCE="0", **env)  # fmt: skip
    campaign = services.campaign_apply(data=fio_campaign(name, LAB, fixed=FIXED))
    worker = Worker(f"barrier-{name}", environment)
    try:
        subprocess.run(
            [sys.executable, "manage.py", "campaign", "run", name], cwd=ROOT, env=environment, check=True, timeout=60
        )
        return finished(campaign, timeout=200)
    finally:
        worker.kill()
        purge_broker(broker)


@pytest.mark.lab
def test_hosts_reached_after_the_instant_fail_the_run_with_nothing_started(lab: dict[str, Any]) -> None:
    campaign = run_on_own_worker("late", RACKBENCH_RETRY_MAX="0")

    run = campaign.runs.get()
    assert campaign.status == CampaignStatus.FAILED and run.status == RunStatus.FAILED
    assert "the start instant passed before the submit reached lab" in run.error
    assert "margin 0 s for 4 hosts" in run.error and "none keeps it" in run.error
    (attempt,) = start_record(run)["attempts"]
    assert attempt["late"] and attempt["margin_s"] == 0
    # Nothing of the attempt is left on any host: no marker, no start, no output, no exit code.
    for name in ("submitted", "started", "stdout", "exit_code"):
        assert host_files(run, name) == [""] * 4, name


@pytest.mark.lab
def test_a_late_start_is_made_again_as_a_whole_with_a_larger_margin(lab: dict[str, Any]) -> None:
    campaign = run_on_own_worker("again", RACKBENCH_RETRY_MAX="4")

    run = campaign.runs.get()
    assert run.status == RunStatus.SUCCEEDED, run.error
    start = start_record(run)
    attempts = start["attempts"]
    assert len(attempts) >= 2 and attempts[0]["late"] and not attempts[-1]["late"]
    assert len({a["id"] for a in attempts}) == len(attempts)
    assert [a["margin_s"] for a in attempts] == sorted(a["margin_s"] for a in attempts) and attempts[-1]["margin_s"] > 0
    # One attempt on every host, the last one, and it started after the flush made for it.
    assert set(host_files(run, "submitted")) == {attempts[-1]["id"]} == {start["attempt"]}
    assert min(int(t) for t in host_files(run, "started")) >= attempts[-1]["start_at_ns"] - TICK_NS
    flushed = max(datetime.fromisoformat(f["at"]).timestamp() for f in run.provenance["flush"])
    assert attempts[-2]["start_at_ns"] < flushed * 1e9 < attempts[-1]["start_at_ns"]
    assert run.results.filter(host="").exists()
