"""Telemetry through the REST API (series of a run with summaries, a window of a series) and the run page's link to
Grafana over the run's time window."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from django.test import Client
from rest_framework.test import APIClient

from campaigns.models import Run
from campaigns.services import campaign_apply, campaign_launch
from inventory.services import node_upsert
from telemetry.grafana import grafana_url
from telemetry.models import Series
from telemetry.services import run_telemetry_summarize, series_append

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000_000_000  # ns
S = 1_000_000_000


@pytest.fixture
def sampled_run(team: Any) -> Run:
    """A run with 10 s of a 1 ms counter (a 10 MB burst each second, 375 kB otherwise) and 10 s of a gauge."""
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "sampled", "kind": "fio", "nodes": ["n1"], "fixed": {"rw": "read", "bs": "4k", "size": "1M"}}
    run = campaign_launch(campaign=campaign_apply(data=data, team=team)).runs.get()
    t = T0 + np.arange(10_000, dtype=np.int64) * 1_000_000
    rx = np.cumsum(np.where(np.arange(10_000) % 1000 == 0, 10_000_000, 375_000)).astype(np.int64)
    series_append(run=run, host="n1", name="net.rx_bytes", labels={"nic": "eth0"}, unit="B", kind="counter",
                  timestamps_ns=t, values=rx)  # fmt: skip
    series_append(run=run, host="n1", name="cpu.util", labels={}, unit="%", kind="gauge",
                  timestamps_ns=T0 + np.arange(10, dtype=np.int64) * S, values=np.arange(10.0))  # fmt: skip
    run_telemetry_summarize(run=run)
    return run


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_it_lists_a_runs_series_with_their_summaries(
    owner: Any, outsider: Any, sampled_run: Run, django_assert_max_num_queries: Any
) -> None:
    api = api_for(owner)
    with django_assert_max_num_queries(8):
        body = api.get(f"/api/v1/runs/{sampled_run.pk}/telemetry/").json()
    cpu, net = body  # by host, then name
    assert (cpu["name"], cpu["kind"], cpu["source"], cpu["unit"], cpu["sample_count"]) == (
        "cpu.util", "gauge", "sampler", "%", 10,
    )  # fmt: skip
    assert cpu["summary"] == {"count": 10, "mean": 4.5, "min": 0.0, "max": 9.0, "p99": pytest.approx(8.91)}
    assert (net["labels"], net["unit"], net["sample_unit"]) == ({"nic": "eth0"}, "B/s", "B")
    assert net["summary"]["count"] == 9_999 and net["summary"]["max"] == 10_000_000_000  # a 10 MB burst in 1 ms
    assert net["summary"]["min"] == 375_000_000
    assert net["summary"]["p99"] == pytest.approx(375_000_000)
    assert api_for(outsider).get(f"/api/v1/runs/{sampled_run.pk}/telemetry/").status_code == 404


def test_it_reads_a_window_of_a_series_downsampled_or_at_full_resolution(
    owner: Any, outsider: Any, sampled_run: Run
) -> None:
    api = api_for(owner)
    net = Series.objects.get(run=sampled_run, name="net.rx_bytes")
    url = f"/api/v1/runs/{sampled_run.pk}/telemetry/{net.pk}/"
    whole = api.get(url, {"points": 100}).json()
    assert whole["bucket_ns"] == -(-(9_999 * 1_000_000 + 1) // 100) and len(whole["points"]) == 100
    assert max(p[2] for p in whole["points"]) == 10_000_000_000  # every burst survives the downsampling
    t0 = (T0 + 2 * S) / 1e9
    window = api.get(url, {"t0": f"{t0:.3f}", "t1": f"{t0 + 0.01:.3f}"}).json()
    assert window["bucket_ns"] == 0 and len(window["points"]) == 11  # every sample of 10 ms
    assert window["points"][0] == [T0 + 2 * S, 10_000_000_000.0, 10_000_000_000.0]

    bad = api.get(url, {"points": "0"})
    assert bad.status_code == 400 and bad.json() == {
        "message": "invalid input", "extra": {"points": ["must be a whole number from 1 to 1000000"]},
    }  # fmt: skip
    assert api.get(url, {"t0": "yesterday"}).json()["extra"] == {
        "t0": ["must be a time in seconds since the epoch, e.g. 1700000000.25"]
    }
    assert api.get(f"/api/v1/runs/{sampled_run.pk + 1}/telemetry/{net.pk}/").status_code == 404  # not that run's
    refused = api_for(outsider).get(url)
    assert refused.status_code == 404 and set(refused.json()) == {"message", "extra"}


def test_it_documents_the_telemetry_endpoints_in_the_schema(owner: Any) -> None:
    schema = api_for(owner).get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert "/api/v1/runs/{id}/telemetry/" in schema["paths"]
    one = schema["paths"]["/api/v1/runs/{id}/telemetry/{series_id}/"]["get"]
    assert {p["name"] for p in one["parameters"]} >= {"t0", "t1", "points", "series_id"}


def test_it_links_the_run_page_to_its_grafana_window(owner: Any, sampled_run: Run, settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "GRAFANA_URL": "https://grafana.example",
                          "GRAFANA_DASHBOARD": "/d/rYdddlPWk/node-exporter-full?var-job=node"}  # fmt: skip
    start = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    Run.objects.filter(pk=sampled_run.pk).update(started_at=start, finished_at=start + timedelta(seconds=60))
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{sampled_run.pk}/").content.decode()
    found = re.search(r'<a href="(https://grafana\.example/[^"]*)"[^>]*>Grafana</a>', page)
    assert found is not None
    link = urlsplit(html.unescape(found.group(1)))
    assert (link.netloc, link.path) == ("grafana.example", "/d/rYdddlPWk/node-exporter-full")
    at = int(start.timestamp() * 1000)
    assert parse_qs(link.query) == {"var-job": ["node"], "from": [str(at - 30_000)], "to": [str(at + 90_000)]}

    hour = grafana_url(start, start + timedelta(hours=10))  # 5% of a long run on each side
    assert hour.endswith(f"from={at - 1_800_000}&to={at + 36_000_000 + 1_800_000}")
    assert grafana_url(start, None).endswith("to=now")  # still running
    settings.RACKBENCH = {**settings.RACKBENCH, "GRAFANA_URL": ""}
    assert "Grafana" not in client.get(f"/runs/{sampled_run.pk}/").content.decode()
