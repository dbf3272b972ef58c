"""Telemetry during runs, end to end: real fio campaigns on lab sshd nodes with the sampler on each host, a real
Celery worker, the test database. The lab nodes run on this machine, so what they sample is this machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from campaigns import services
from campaigns.models import CampaignStatus, Run, RunStatus
from telemetry import codec
from telemetry.models import Chunk, Series, SeriesKind
from telemetry.services import time_quantum
from tests.conftest import finished, group_alive, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.worker]

MS = 1_000_000
# the last sample kept closes the 1 ms interval the benchmark ended in; stored timestamps are rounded to the
# series' quantum (1/100 of the interval), so that sample may sit up to half a quantum past end + 1 ms
LAST = MS + time_quantum(MS) // 2
TELEMETRY = {"interval": "200ms", "fast_interval": "1ms", "fast": ["net"], "groups": ["cpu", "mem", "net", "disk"]}


def fio_campaign(name: str, fixed: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "fio",
        "nodes": ["lab1"],
        "repetitions": 1,
        "timeout": 120,
        "fixed": {"rw": "read", "bs": "64k", "size": "8M", **fixed},
        "telemetry": TELEMETRY,
        **overrides,
    }


def samples(series: Series) -> codec.Decoded:
    chunks = [codec.decode(c.data) for c in Chunk.objects.filter(series=series).order_by("seq")]
    return codec.Decoded(
        np.concatenate([c.timestamps_ns for c in chunks]), np.concatenate([c.values for c in chunks]), None, None
    )


def sampler_pid(run: Run) -> int | None:
    """The process group of the run's sampler on lab1 (the lab's run directories are on this machine)."""
    remote_dir = run.hosts.get().remote_dir
    pid_file = Path(remote_dir) / "telemetry" / "pid"
    return int(pid_file.read_text()) if remote_dir and pid_file.exists() else None


def test_a_fio_run_records_telemetry_and_summarises_it(lab: dict[str, Any], worker: Any) -> None:
    data = fio_campaign("sampled-fio", {"runtime": 3, "time_based": 1})
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    run = campaign.runs.get()
    host = run.hosts.get()
    assert run.results.filter(name="read_bw_bytes", host="lab1").exists()  # the benchmark's own results stand
    names = set(Series.objects.filter(run=run, host="lab1").values_list("name", flat=True))
    assert {"cpu.util", "cpu.busiest_util", "cpu.core_util", "mem.used_bytes", "net.rx_bytes", "net.tx_bytes"} <= names

    cpu = Series.objects.get(run=run, host="lab1", name="cpu.util")
    assert (cpu.kind, cpu.unit, cpu.interval_ns) == (SeriesKind.GAUGE, "%", 200 * MS)
    assert cpu.sample_count >= 10  # 3 s of fio at 200 ms
    lo = Series.objects.get(run=run, host="lab1", name="net.rx_bytes", labels={"nic": "lo"})
    assert (lo.kind, lo.unit, lo.interval_ns) == (SeriesKind.COUNTER, "B", MS)
    net = samples(lo)
    # 3 s at 1 ms; a loaded machine delays some reads (2,296 seen at a load average of ~50): the median interval
    # below is what shows the 1 ms sampling, the count that it went on for the run
    assert lo.sample_count == len(net.timestamps_ns) > 1500
    assert net.values[-1] > net.values[0]  # the worker's SSH traffic to the lab node crosses lo
    assert (np.diff(net.values) >= 0).all()
    median = float(np.median(np.diff(net.timestamps_ns)))
    assert 0.9 * MS <= median <= 1.1 * MS, f"the 1 ms sampler's median interval was {median / MS:.3f} ms"
    ended = os.stat(Path(host.remote_dir) / "exit_code").st_mtime_ns  # what the sampler recorded as the end
    assert ended - 100 * MS < lo.last_ns <= ended + LAST  # sampled to the end of fio, and no further

    results = {(r.name, r.labels.get("nic")): r for r in run.results.filter(host="lab1").exclude(name="read_bw_bytes")}
    peak = results[("net.rx_bytes.max", "lo")]
    assert peak.unit == "B/s" and peak.value > results[("net.rx_bytes.mean", "lo")].value > 0
    assert {("cpu.busiest_util.mean", None), ("cpu.busiest_util.p99", None), ("cpu.busiest_util.max", None)} <= set(
        results
    )
    assert not any(name.startswith("cpu.core_util") for name, _nic in results)

    telemetry = run.provenance["telemetry"]
    assert {"nic": "lo"} in telemetry["hosts"]["lab1"]["sources"]["net"]
    assert telemetry["hosts"]["lab1"]["sources"]["fast_loop"] == "compiled"  # the lab nodes have a C compiler
    assert telemetry["collected"]["errors"] == []
    assert telemetry["collected"]["hosts"]["lab1"]["series"] == Series.objects.filter(run=run).count()
    assert not group_alive(sampler_pid(run))


def test_a_cancelled_run_leaves_no_sampler_behind(lab: dict[str, Any], worker: Any) -> None:
    data = fio_campaign("sampled-cancel", {"bs": "4k", "runtime": 120, "time_based": 1})
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))
    run = campaign.runs.get()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.RUNNING, what="the run to be running")
    pid = wait_for(lambda: sampler_pid(run), what="the sampler's pid file")
    assert group_alive(pid)

    services.campaign_cancel(campaign=campaign)

    wait_for(lambda: not group_alive(pid), timeout=90, what="the sampler to be killed")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    # what it sampled until it was stopped is kept, as for a run that timed out or failed
    collected = wait_for(
        lambda: Run.objects.get(pk=run.pk).provenance.get("telemetry", {}).get("collected"),
        timeout=30,
        what="the telemetry of the cancelled run to be kept",
    )
    assert collected["errors"] == [] and collected["hosts"]["lab1"]["samples"] > 0
    assert Series.objects.filter(run=run, name="net.rx_bytes").exists()
    finished(campaign)  # wound down: the worker is done with it


def test_an_mpi_runs_other_host_is_sampled_up_to_the_benchmarks_end_and_stopped(
    lab: dict[str, Any], worker: Any
) -> None:
    from tests.test_mpi_e2e import storage_read

    data = {**storage_read("sampled-mpi", ["lab1", "lab2"]), "matrix": {"nodes": [2]}, "telemetry": TELEMETRY}
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    run = campaign.runs.get()
    other = run.hosts.get(host="lab2")
    assert not other.command  # lab2 only hosts ranks: no end of its own
    ended = os.stat(Path(run.hosts.get(host="lab1").remote_dir) / "exit_code").st_mtime_ns
    for host in ("lab1", "lab2"):
        lo = Series.objects.get(run=run, host=host, name="net.rx_bytes", labels={"nic": "lo"})
        assert ended - 100 * MS < lo.last_ns <= ended + LAST, host  # clipped to the primary's end
    pid = int((Path(other.remote_dir) / "telemetry" / "pid").read_text())
    assert not group_alive(pid)
