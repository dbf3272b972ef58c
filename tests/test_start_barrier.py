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


def run_on_own_worker(name: str, overrides: dict[str, Any] | None = None, **env: str) -> Any:
    """A one-run campaign (fio for 1 s on the four lab nodes, caches flushed; ``overrides``: other settings) on a
    worker of its own whose start margin is forced to nothing unless ``env`` says otherwise: every submit of a first
    attempt comes after its start instant."""
    broker = spare_broker(0, settings.CELERY_BROKER_URL)
    purge_broker(broker)
    margins = {"RACKBENCH_START_MARGIN": "0", "RACKBENCH_START_MARGIN_FACTOR": "0", "RACKBENCH_START_TOLERANCE": "0"}
    environment = worker_env(CELERY_BROKER_URL=broker, **{**margins, **env})
    campaign = services.campaign_apply(data=fio_campaign(name, LAB, fixed=FIXED, **(overrides or {})))
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


# --- the start folded into the preparing round trip ----------------------------------------------------------


def folded(target: remote.Target, job_dir: str, script: str, *, attempt: str, at: int, layout: str = "") -> Any:
    """Write a job's files and submit it (start instant ``at``, no tolerance) in one round trip, as a folded start
    does; returns ``remote.job_submit``'s answer (or the Prepared where the layout skipped the submit)."""
    files = {"command.sh": remote.command_script(["sh", "-c", script], {})}
    line = remote.submit_line(job_dir, attempt=attempt, start_at_ns=at, tolerance_ns=0)
    prepared = remote.jobs_prepare(target, {job_dir: files}, extra_dirs=[], layout=layout, after="echo counters",
                                   submit=line)  # fmt: skip
    if prepared.submitted is None:
        return prepared
    assert prepared.after is not None and prepared.after.strip() == "counters"  # the output before the submit's
    return remote.submit_answer(target, job_dir, prepared.submitted)


def fresh_dir(target: remote.Target) -> str:
    return f"{remote.remote_root(target)}/test/folded-{time.monotonic_ns()}"


@pytest.mark.lab
def test_files_and_submit_in_one_round_trip_start_the_job_at_its_instant(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    targets = [remote.node_target(lab["nodes"][node]) for node in LAB]
    dirs = [fresh_dir(t) for t in targets]
    at = time.time_ns() + 2_000_000_000

    answers = ssh.fan_out(list(zip(targets, dirs, strict=True)),
                          lambda j: folded(*j, "echo ran", attempt="f1", at=at))  # fmt: skip

    assert answers == [None] * 4
    assert time.time_ns() < at and all(read(f"{d}/started") == "" for d in dirs)  # they wait for the instant
    for target, job_dir in zip(targets, dirs, strict=True):
        state = wait_exit(target, job_dir)
        assert state.exit_code == 0 and state.attempt == "f1"
        assert read(f"{job_dir}/stdout") == "ran\n"
    assert min(int(read(f"{d}/started")) for d in dirs) >= at - TICK_NS


@pytest.mark.lab
def test_a_folded_submit_that_ends_after_the_instant_starts_nothing(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target = remote.node_target(lab["nodes"]["lab1"])
    job_dir = fresh_dir(target)

    late = folded(target, job_dir, "echo ran", attempt="f1", at=time.time_ns() - 300_000_000)

    assert isinstance(late, int) and late >= 300_000_000
    assert read(f"{job_dir}/command.sh") != ""  # prepared: the files are there
    state = remote.job_state(target, job_dir)
    assert not state.submitted and state.pid is None  # but nothing started, no marker: a later attempt may start it
    assert read(f"{job_dir}/started") == "" and read(f"{job_dir}/stdout") == ""


@pytest.mark.lab
def test_a_failed_layout_skips_the_folded_submit(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target = remote.node_target(lab["nodes"]["lab2"])
    job_dir = fresh_dir(target)

    prepared = folded(target, job_dir, "echo ran", attempt="f1", at=time.time_ns() + 1_000_000_000,
                      layout="echo no space left >&2; exit 3")  # fmt: skip

    assert isinstance(prepared, remote.Prepared) and prepared.layout is not None
    assert prepared.layout.exit_code == 3 and "no space left" in prepared.layout.stderr
    assert prepared.submitted is None and not remote.job_state(target, job_dir).submitted


@pytest.mark.lab
def test_a_job_started_by_a_folded_round_trip_is_started_once(lab: dict[str, Any]) -> None:
    remote.reset_pool()
    target = remote.node_target(lab["nodes"]["lab3"])
    job_dir = fresh_dir(target)
    at = time.time_ns() + 1_500_000_000

    assert folded(target, job_dir, "echo $$ >> launches", attempt="f1", at=at) is None
    # The same attempt's submit delivered again starts nothing more; another attempt's is refused.
    assert remote.job_submit(target, job_dir, attempt="f1", start_at_ns=at, tolerance_ns=0) is None
    with pytest.raises(ssh.TransientSSHError, match="started by attempt f1"):
        remote.job_submit(target, job_dir, attempt="f2", start_at_ns=at, tolerance_ns=0)

    assert wait_exit(target, job_dir).exit_code == 0
    assert len(read(f"{job_dir}/launches").split()) == 1


@pytest.mark.lab
def test_later_runs_are_started_in_the_round_trip_that_prepares_them(lab: dict[str, Any]) -> None:
    floor, factor = 2.0, settings.RACKBENCH["START_MARGIN_FACTOR"]  # a margin no host misses, however loaded
    margins = {"RACKBENCH_START_MARGIN": str(floor), "RACKBENCH_START_MARGIN_FACTOR": str(factor),
               "RACKBENCH_START_TOLERANCE": "0.05"}  # fmt: skip
    campaign = run_on_own_worker("folded", {"repetitions": 3, "cache": {"flush_clients": False}},
                                 RACKBENCH_START_FOLD="1", **margins)  # fmt: skip

    runs = list(campaign.runs.order_by("sequence"))
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 3, [r.error for r in runs]
    (first,), (second,), (third,) = (start_record(r)["attempts"] for r in runs)
    # The first run is prepared, then submitted; each later one has its instant chosen before its preparing round
    # trip, with a margin reckoned from the campaign's last preparation and submit to its hosts.
    assert not first.get("folded") and second["folded"] and third["folded"]
    assert second["reckoned_from"] == f"the files round trip and the submit wave of run {runs[0].pk}"
    assert third["reckoned_from"] == f"the preparing round trip of run {runs[1].pk}"
    files = runs[0].provenance["timing"]["prepare"]["files"]
    assert second["margin_s"] == pytest.approx(max(floor, factor * (files + first["wave_s"])), abs=1e-3)
    # What the margin had to cover: from sending the round trip to the last host's check of the instant.
    assert 0 < second["needed_s"] <= second["wave_s"] + 0.05  # the nodes' clocks are this machine's
    assert third["margin_s"] == pytest.approx(max(floor, factor * second["needed_s"]), abs=1e-3)
    for run in runs:
        start = start_record(run)
        assert set(host_files(run, "submitted")) == {start["attempt"]} and start["recorded"] == 4
        assert min(int(t) for t in host_files(run, "started")) >= start["start_at_ns"] - TICK_NS
        assert set(run.provenance["hosts"]) == set(LAB) and set(run.provenance["cache"]["start"]) == set(LAB)
        assert run.results.filter(host="").exists()


@pytest.mark.lab
def test_a_folded_start_that_comes_late_is_undone_and_made_again_at_once(lab: dict[str, Any]) -> None:
    campaign = run_on_own_worker("fold-late", {"repetitions": 2, "cache": {"flush_clients": False}},
                                 RACKBENCH_START_FOLD="1", RACKBENCH_RETRY_MAX="4")  # fmt: skip

    first, second = campaign.runs.order_by("sequence")
    assert first.status == second.status == RunStatus.SUCCEEDED, [first.error, second.error]
    start = start_record(second)
    folded, *others = start["attempts"]
    # With no margin, every host's preparing round trip ends after the instant: none starts, and the start is made
    # again the usual way (prepared, then submitted) with a margin reckoned from the late attempt.
    assert folded["folded"] and set(folded["late"]) == set(LAB) and folded["margin_s"] == 0
    assert others and not any(a.get("folded") for a in others) and not others[-1]["late"]
    assert others[0]["margin_s"] >= 2 * max(folded["late"].values()) - 1e-3
    assert set(host_files(second, "submitted")) == {others[-1]["id"]} == {start["attempt"]}
    assert min(int(t) for t in host_files(second, "started")) >= others[-1]["start_at_ns"] - TICK_NS
    assert second.results.filter(host="").exists()
