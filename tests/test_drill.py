"""The long randomised drill: 100 runs while the worker is SIGKILLed 20 times and every task is delivered twice.

Excluded by default (marker ``drill``); run it with ``scripts/test -m drill -s tests/test_drill.py`` (about five
minutes). It prints its figures and writes them to test-artifacts/drill.json.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Count

from campaigns import services
from campaigns.models import Campaign, Result, Run, RunStatus
from runners import remote
from runners import tasks as run_tasks
from tests.conftest import ARTIFACTS, Worker, finished, purge_broker, worker_env
from tests.test_campaign_e2e import fio_campaign

pytestmark = [pytest.mark.drill, pytest.mark.lab, pytest.mark.worker, pytest.mark.timeout(1500)]

NODES = ["lab1", "lab2", "lab3", "lab4"]
RUNS_PER_NODE = 25
KILLS = 20


def test_drill_100_runs_20_worker_kills_and_every_task_twice(lab: dict[str, Any]) -> None:
    env = worker_env(
        RACKBENCH_STALE_AFTER="3", RACKBENCH_RECONCILE_EVERY="1", RACKBENCH_STEP_LEASE="3", RACKBENCH_RETRY_MAX="3"
    )
    purge_broker(env["CELERY_BROKER_URL"])
    rng = random.Random(13)
    started = time.monotonic()
    worker = Worker("drill-0", env, beat=True)
    fixed = {"bs": "64k", "size": "4M", "runtime": 1, "time_based": 1}
    campaigns = [
        services.campaign_launch(
            campaign=services.campaign_apply(
                data=fio_campaign(f"drill-{n}", [n], repetitions=RUNS_PER_NODE, fixed=fixed)
            )
        )
        for n in NODES
    ]
    kills, duplicates, seen = 0, 0, set()
    next_kill = time.monotonic() + rng.uniform(3, 7)
    deadline = time.monotonic() + 900
    try:
        while time.monotonic() < deadline:
            runs = list(Run.objects.filter(campaign__in=campaigns).values("pk", "status", "poll_token"))
            for run in runs:
                if (run["pk"], run["status"]) not in seen:
                    seen.add((run["pk"], run["status"]))
                    duplicates += _duplicate(run)
            if all(c.is_terminal for c in Campaign.objects.filter(pk__in=[c.pk for c in campaigns])):
                break
            if kills < KILLS and time.monotonic() > next_kill:
                worker.kill()
                kills += 1
                worker = Worker(f"drill-{kills}", env, beat=True)
                next_kill = time.monotonic() + rng.uniform(3, 7)  # after the new worker is up
            time.sleep(0.05)
        for campaign in campaigns:
            finished(campaign, timeout=120)
    finally:
        worker.stop()
    figures = _figures(campaigns, kills=kills, duplicates=duplicates, seconds=time.monotonic() - started)
    print("drill:", json.dumps(figures))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "drill.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["runs"] == len(NODES) * RUNS_PER_NODE and kills == KILLS
    assert figures["succeeded"] == figures["runs"], figures["errors"]
    assert figures["results stored twice"] == figures["leaked jobs"] == figures["overlaps"] == 0, figures


def _duplicate(run: dict[str, Any]) -> int:
    """A second copy of the task of the step the run is in (a broker redelivery, or a resume)."""
    if run["status"] in (RunStatus.QUEUED, RunStatus.PREPARING):
        run_tasks.run_start_task.delay(run["pk"])
    elif run["status"] == RunStatus.RUNNING and run["poll_token"]:
        run_tasks.run_poll_task.delay(run["pk"], run["poll_token"])
    elif run["status"] == RunStatus.COLLECTING:
        run_tasks.run_collect_task.delay(run["pk"])
    elif run["status"] in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT):
        run_tasks.run_kill_task.delay(run["pk"])
    else:
        return 0
    return 1


def _figures(campaigns: list[Campaign], *, kills: int, duplicates: int, seconds: float) -> dict[str, Any]:
    runs = list(Run.objects.filter(campaign__in=campaigns).prefetch_related("hosts"))
    doubled = (
        Result.objects.filter(run__in=runs)
        .values("run", "name", "host", "labels")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    return {
        "runs": len(runs),
        "succeeded": sum(r.status == RunStatus.SUCCEEDED for r in runs),
        "resumed": sum(r.resumes > 0 for r in runs),
        "results stored twice": doubled.count(),
        "leaked jobs": len(_leaked([h.remote_dir for r in runs for h in r.hosts.all() if h.remote_dir])),
        "overlaps": _overlaps(runs),
        "worker kills": kills,
        "duplicate tasks": duplicates,
        "wall seconds": round(seconds, 1),
        "errors": sorted({r.error[:200] for r in runs if r.error})[:10],
    }


def _leaked(job_dirs: list[str]) -> list[int]:
    """Live processes on this machine (where the lab nodes run) that carry one of the runs' job markers."""
    markers = {f"{remote.JOB_MARKER}={d}".encode() for d in job_dirs}
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if markers & set(environ.read_bytes().split(b"\0")):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def _overlaps(runs: list[Run]) -> int:
    """Pairs of runs on one node whose [started, finished] intervals overlap."""
    by_node: dict[str, list[Run]] = {}
    for run in runs:
        if run.started_at and run.finished_at:
            for host in run.hosts.all():
                by_node.setdefault(host.host, []).append(run)
    count = 0
    for node_runs in by_node.values():
        node_runs.sort(key=lambda r: r.started_at)  # type: ignore[arg-type, return-value]
        pairs = zip(node_runs, node_runs[1:], strict=False)
        count += sum(a.finished_at > b.started_at for a, b in pairs)  # type: ignore[operator]
    return count
