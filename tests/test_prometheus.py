"""Series pulled from a real Prometheus after a run: a real node_exporter scraped every second by a real prometheus
(Debian's packages, installed by scripts/bootstrap --services), a real fio campaign on the lab and a Celery worker
of its own (the Prometheus URL is the worker's setting)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.conf import settings

from campaigns import services
from campaigns.models import CampaignStatus, Run
from telemetry import codec
from telemetry.models import Chunk, Series, SeriesKind, SeriesSource
from telemetry.services import run_prometheus_pull
from tests.conftest import ROOT, Worker, finished, purge_broker, spare_broker, wait_for, worker_env

pytestmark = [pytest.mark.lab, pytest.mark.worker]

BINARIES = ("prometheus", "prometheus-node-exporter")
QUERIES = [
    {"name": "load1", "query": "node_load1"},
    {
        "name": "cpu_busy",
        "query": '100 * (1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[5s])))',
        "unit": "%",
    },
    {"name": "node_load", "query": 'node_load1{rackbench_node="{host}"}'},  # asked once per host of the run
    {"name": "broken", "query": "rate(node_load1"},  # Prometheus says "parse error": a warning, not a failure
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prometheus_query(url: str, expr: str) -> list[Any]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=2) as response:
        return list(json.loads(response.read())["data"]["result"])


@pytest.fixture(scope="session")
def prometheus_url() -> Iterator[str]:
    """A node_exporter and a prometheus scraping it every second, each on a port of its own, for the session."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{', '.join(missing)} missing in CI: scripts/bootstrap --services installs them")
        pytest.skip(f"{', '.join(missing)} not installed (scripts/bootstrap --services installs them)")
    work = Path(tempfile.mkdtemp(prefix="rackbench-test-prometheus-"))
    exporter_port, prometheus_port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "node",
                # the lab nodes are this machine: its node_exporter stands for lab1's
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"rackbench_node": "lab1"}}],
            }
        ],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(work / "log", "w")  # noqa: SIM115 - both daemons write to it until the session ends
    exporter_argv = [
        "prometheus-node-exporter", f"--web.listen-address=127.0.0.1:{exporter_port}", "--collector.disable-defaults",
        "--collector.loadavg", "--collector.cpu", "--collector.meminfo",
    ]  # fmt: skip
    prometheus_argv = [
        "prometheus", f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
    ]  # fmt: skip
    procs = [subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT) for argv in (exporter_argv, prometheus_argv)]
    url = f"http://127.0.0.1:{prometheus_port}"

    def scraped() -> bool:
        if any(p.poll() is not None for p in procs):
            pytest.fail(f"prometheus or node_exporter exited: {(work / 'log').read_text()[-3000:]}")
        try:  # a rate over 5 s needs a few scrapes: wait until it has a value
            return bool(prometheus_query(url, QUERIES[1]["query"]))
        except OSError:
            return False

    try:
        wait_for(scraped, timeout=60, interval=0.5, what="prometheus to have scraped node_exporter")
        yield url
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def prometheus_worker(prometheus_url: str, lab: dict[str, Any]) -> Iterator[dict[str, str]]:
    """A worker of its own on a broker database of its own, that knows where Prometheus is."""
    base = settings.CELERY_BROKER_URL
    if not base.startswith("redis://"):
        pytest.fail("this test needs Redis (scripts/test sets CELERY_BROKER_URL)")
    env = worker_env(
        CELERY_BROKER_URL=spare_broker(1, base),
        RACKBENCH_PROMETHEUS_URL=prometheus_url,
        RACKBENCH_PROMETHEUS_DELAY="2",
    )
    purge_broker(env["CELERY_BROKER_URL"])
    worker = Worker("prometheus", env)
    try:
        yield env
    finally:
        worker.stop()


def values(series: Series) -> codec.Decoded:
    chunks = [codec.decode(c.data) for c in Chunk.objects.filter(series=series).order_by("seq")]
    return codec.Decoded(
        np.concatenate([c.timestamps_ns for c in chunks]), np.concatenate([c.values for c in chunks]), None, None
    )


def test_it_pulls_the_run_window_from_prometheus_and_stores_it_as_series(
    prometheus_url: str, prometheus_worker: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {
        "name": "prom-fio",
        "kind": "fio",
        "nodes": ["lab1"],
        "repetitions": 1,
        "timeout": 120,
        "fixed": {"rw": "read", "bs": "64k", "size": "8M", "runtime": 4, "time_based": 1},
        "telemetry": {"interval": "1s", "groups": ["cpu"], "prometheus": QUERIES},
    }
    campaign = services.campaign_apply(data=data)
    subprocess.run(
        [sys.executable, "manage.py", "campaign", "run", campaign.name],
        cwd=ROOT, env=prometheus_worker, check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    run = wait_for(
        lambda: Run.objects.filter(campaign=campaign, provenance__telemetry__has_key="prometheus").first(),
        timeout=60,
        what="the Prometheus pull",
    )
    assert run.started_at and run.finished_at
    start_ns, end_ns = int(run.started_at.timestamp() * 1e9), int(run.finished_at.timestamp() * 1e9)
    pulled = run.provenance["telemetry"]["prometheus"]
    assert pulled["url"] == prometheus_url and pulled["series"] == 3 and pulled["samples"] >= 3 * 4

    series = {s.name: s for s in Series.objects.filter(run=run, source=SeriesSource.PROMETHEUS)}
    assert set(series) == {"prom.load1", "prom.cpu_busy", "prom.node_load"}
    instance = series["prom.load1"].labels["instance"]
    assert series["prom.load1"].host == instance  # asked once: stored under the instance it came from
    assert series["prom.load1"].labels == {
        "__name__": "node_load1", "instance": instance, "job": "node", "rackbench_node": "lab1",
    }  # fmt: skip
    assert series["prom.node_load"].host == "lab1"  # asked for {host} = lab1
    busy = series["prom.cpu_busy"]
    assert (busy.kind, busy.unit, busy.interval_ns) == (SeriesKind.GAUGE, "%", 1_000_000_000)
    for s in series.values():
        points = values(s)
        assert len(points.timestamps_ns) >= 4, s  # one a second over the run's window
        assert (
            start_ns - 1_000_000_000 <= points.timestamps_ns[0] and points.timestamps_ns[-1] <= end_ns + 1_000_000_000
        )
    assert (values(busy).values >= 0).all() and (values(busy).values <= 100).all()
    assert Series.objects.filter(run=run, source=SeriesSource.SAMPLER, name="cpu.util").exists()  # both kept
    assert run.results.filter(name="prom.cpu_busy.p99", host=instance, unit="%").exists()

    (warning,) = run.provenance["telemetry"]["warnings"]
    assert warning.startswith("prometheus: broken: bad_data: ") and "parse error" in warning

    # Prometheus gone: a warning per query, and what the last pull stored stays.
    monkeypatch.setitem(settings.RACKBENCH, "PROMETHEUS_URL", f"http://127.0.0.1:{free_port()}")
    outcome = run_prometheus_pull(run=run)
    assert outcome["series"] == 0 and len(outcome["warnings"]) == 4
    assert all("cannot be reached" in w for w in outcome["warnings"])
    assert Series.objects.filter(run=run, source=SeriesSource.PROMETHEUS).count() == 3
