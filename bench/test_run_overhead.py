"""Per-run overhead on the lab: what a run costs beyond its benchmark (issue 16: at most 0.25 s on 4 nodes).

    PYTHONPATH=. scripts/test -p tests.conftest -m drill -s bench/test_run_overhead.py

Real worker, real lab sshd nodes, PostgreSQL and Redis, as the suite uses them. A campaign of RUNS repetitions of
a 1 s time-based fio on the 4 lab nodes runs on a worker of its own, once with the end watch
(RACKBENCH_POLL_WAIT=10: the first poll waits on the hosts for the job's end) and once with interval polls only
(RACKBENCH_POLL_WAIT=0, RACKBENCH_POLL_INTERVAL=2, the default; RACKBENCH_BENCH_POLLED=0 leaves this one out).
RACKBENCH_BENCH_DB_CONN_MAX_AGE sets the worker's RACKBENCH_DB_CONN_MAX_AGE (the suite's 0, a database connection
per task, unless given; 60 as deployed by default). Reported per run: wall time between run starts
(the campaign's pace), started -> finished, and the overhead beyond the 1 s job, median and p90. fio itself takes
longer than its 1 s runtime (starting, laying out its file; more on a loaded machine), so the job is also timed on
its hosts (from the first launcher's pid file to the last exit code file: the lab's nodes share this machine's
clock), and the overhead beyond that is reported too: what rackbench adds between one job's end and the next one's
start. That gap is then broken down (medians over the runs): the end noticed after the last exit code was written,
the collect, the hand-offs to the next run's start task, its preparation (each part as the run's provenance timed
it) and its submit wave and start margin.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings

from campaigns import services
from campaigns.models import Run
from runners import remote
from tests.conftest import ROOT, Worker, finished, purge_broker, spare_broker, worker_env

RUNS = int(os.environ.get("RACKBENCH_BENCH_RUNS", "10"))
POLLED = os.environ.get("RACKBENCH_BENCH_POLLED", "1") != "0"  # 0: the end watch only
# The worker's RACKBENCH_DB_CONN_MAX_AGE: the suite's 0 (a connection per task) unless given, e.g. 60 as deployed
CONN_MAX_AGE = os.environ.get("RACKBENCH_BENCH_DB_CONN_MAX_AGE", "0")
JOB_S = 1.0


def measure(name: str, **env: str) -> dict[str, float]:
    broker = spare_broker(0, settings.CELERY_BROKER_URL)
    purge_broker(broker)
    environment = worker_env(CELERY_BROKER_URL=broker, RACKBENCH_DB_CONN_MAX_AGE=CONN_MAX_AGE, **env)
    fixed = {"rw": "read", "bs": "64k", "size": "8M", "runtime": int(JOB_S), "time_based": 1}
    data = {"name": name, "kind": "fio", "nodes": ["lab1", "lab2", "lab3", "lab4"], "repetitions": RUNS,
            "fixed": fixed, "cache": {"flush_clients": False}}  # fmt: skip
    campaign = services.campaign_apply(data=data)
    worker = Worker(f"bench-{name}", environment)
    try:
        subprocess.run([sys.executable, "manage.py", "campaign", "run", name], cwd=ROOT, env=environment,
                       check=True, timeout=60)  # fmt: skip
        finished(campaign, timeout=60 + RUNS * 40)
    finally:
        worker.kill()
        purge_broker(broker)
    runs = list(campaign.runs.order_by("sequence"))
    assert all(r.status == "succeeded" for r in runs), [r.error for r in runs]
    for run in runs:  # the starts made again, and why
        attempts = run.provenance["start"]["attempts"]
        if len(attempts) > 1:
            shown = [{k: a.get(k) for k in ("folded", "margin_s", "needed_s", "wave_s", "late")} for a in attempts]
            print(f"\nrun {run.sequence}: {len(attempts)} start attempts: {shown}")
    spans = [(r.finished_at - r.started_at).total_seconds() for r in runs]
    paces = [(b.started_at - a.started_at).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    over = sorted(p - JOB_S for p in paces)
    windows = [job_window(r) for r in runs]
    jobs = [end - start for start, end in windows]
    beyond = sorted(p - job for p, job in zip(paces, jobs, strict=False))
    gaps = sorted(b[0] - a[1] for a, b in zip(windows, windows[1:], strict=False))
    figures = {
        "pace median": statistics.median(paces),
        "started->finished median": statistics.median(spans),
        "overhead median": statistics.median(over),
        "overhead p90": over[int(0.9 * (len(over) - 1))],
        "job on its hosts median": statistics.median(jobs),
        "overhead beyond the job median": statistics.median(beyond),
        "overhead beyond the job p90": beyond[int(0.9 * (len(beyond) - 1))],
        "job end -> next job start median": statistics.median(gaps),
        "load average (1 min) after": os.getloadavg()[0],
    }
    parts = [timeline(a, b, wa, wb) for a, b, wa, wb in zip(runs, runs[1:], windows, windows[1:], strict=False)]
    for key in parts[0]:
        figures[f"  {key}"] = statistics.median(p.get(key, 0.0) for p in parts)
    figures["  start attempts (mean)"] = statistics.mean(p["  start attempts"] for p in parts)
    figures["  folded (share)"] = statistics.mean(p["  folded (share)"] for p in parts)
    return figures


def timeline(run: Run, after: Run, window: tuple[float, float], next_window: tuple[float, float]) -> dict[str, float]:
    """Where the time goes between one job's end on its hosts and the next run's job start there (seconds), from the
    runs' rows, their provenance (``timing``, the start attempt) and the hosts' files: the parts add up to the
    overhead beyond the job."""
    timing = run.provenance["timing"]
    assert after.queued_at and after.started_at and run.finished_at
    attempt = after.provenance["start"]["attempts"][-1]
    issued = attempt["start_at_ns"] / 1e9 - attempt["margin_s"]  # the next run's submit wave was sent
    prepare = after.provenance["timing"]["prepare"]
    parts = {
        "end noticed": timing["noticed_at"] - window[1],
        "collect": run.finished_at.timestamp() - timing["noticed_at"],
        "finished->next queued": (after.queued_at - run.finished_at).total_seconds(),
        "queued->start task": (after.started_at - after.queued_at).total_seconds(),
        "prepare": issued - after.started_at.timestamp(),
        "submit->job start": next_window[0] - issued,
    }
    parts |= {f"  prepare {name}": seconds for name, seconds in prepare.items()}
    parts |= {f"  collect {name}": seconds for name, seconds in timing["collect"].items()}
    parts["  submit wave"] = attempt["wave_s"]
    parts["  margin"] = attempt["margin_s"]
    parts["  margin needed"] = attempt.get("needed_s", attempt["wave_s"])
    parts["  folded (share)"] = float(bool(attempt.get("folded")))
    parts["  start attempts"] = len(after.provenance["start"]["attempts"])
    return parts


def job_window(run: Run) -> tuple[float, float]:
    """The run's job as its hosts timed it (seconds since the epoch): the first host's start (the instant its
    launcher recorded in ``started``, else its pid file's time, where launchers start at once) and the last exit code
    file's time."""
    starts, ends = [], []
    for host in run.hosts.select_related("node__credential"):
        assert host.node is not None
        where = shlex.quote(host.remote_dir)
        line = f"cd {where} && {{ cat started 2>/dev/null || echo -; }} && stat -c %.9Y pid exit_code"
        recorded, pid, ended = remote.node_target(host.node).run(line).stdout.split()
        starts.append(int(recorded) / 1e9 if recorded.isdigit() else float(pid))
        ends.append(float(ended))
    return min(starts), max(ends)


@pytest.mark.drill
def test_per_run_overhead(lab: dict[str, Any]) -> None:
    watched = measure("overhead-watch", RACKBENCH_POLL_WAIT="10", RACKBENCH_POLL_INTERVAL="2")
    polled = measure("overhead-poll", RACKBENCH_POLL_WAIT="0", RACKBENCH_POLL_INTERVAL="2") if POLLED else {}
    print(f"\nper-run overhead, {RUNS} runs of a {JOB_S:g} s fio on 4 lab nodes (s)")
    print(f"{'':36} {'end watch':>10} {'2 s polls':>10}")
    for key in watched:
        print(f"{key:36} {watched[key]:10.3f} {polled.get(key, float('nan')):10.3f}")
