"""The run page reads in order: the benchmark's headline numbers, then per host, then telemetry in its own section;
no row that repeats another, idle series folded away, charts with a time axis and units."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from django.test import Client

from campaigns.models import Result, Run
from campaigns.run_results import run_sections
from campaigns.services import campaign_apply, campaign_launch
from inventory.services import node_upsert
from plugins.benchmarks.base import get_benchmark
from telemetry.services import series_append

T0 = 1_700_000_000_000_000_000  # ns


def r(name: str, value: float, unit: str = "B/s", host: str = "", **labels: Any) -> Any:
    return SimpleNamespace(name=name, value=value, unit=unit, host=host, labels=labels)


def fio_results() -> list[Any]:
    """What a read-only fio run on one host with telemetry stores (the shape the issue saw)."""
    return [
        r("bw_bytes", 2.1e9), r("read_bw_bytes", 2.1e9), r("iops", 32_000, "IOPS"), r("read_iops", 32_000, "IOPS"),
        r("read_lat_mean_ns", 7.7e6, "ns"), r("read_lat_p99_ns", 9e6, "ns"),
        r("read_bw_bytes", 2.1e9, host="n1"), r("read_bw_bytes", 2.1e9, host="n1", job="0"),
        r("bw_bytes", 2.1e9, host="n1"), r("bw_bytes", 2.1e9, host="n1", job="0"),
        r("net.rx_bytes.mean", 1e8, host="n1", nic="eth0"), r("net.rx_bytes.p99", 2e8, host="n1", nic="eth0"),
        r("net.rx_bytes.max", 3e8, host="n1", nic="eth0"),
        r("net.rx_bytes.mean", 0, host="n1", nic="eth1"), r("net.rx_bytes.p99", 0, host="n1", nic="eth1"),
        r("net.rx_bytes.max", 0, host="n1", nic="eth1"),
    ]  # fmt: skip


def test_the_headline_is_the_plugins_own_numbers_in_its_order() -> None:
    fio = get_benchmark("fio")
    sections = run_sections(fio_results(), headline=fio.headline, totals=fio.totals)
    assert [x.name for x in sections.headline] == ["read_bw_bytes", "read_iops", "read_lat_mean_ns"]
    assert [x.name for x in sections.aggregates] == ["read_lat_p99_ns"]


def test_no_row_repeats_another() -> None:
    fio = get_benchmark("fio")
    sections = run_sections(fio_results(), headline=fio.headline, totals=fio.totals)
    (host, rows), *_ = sections.per_host
    assert host == "n1" and [(x.name, x.labels) for x in rows] == [("read_bw_bytes", {})]
    assert sections.hidden == 5  # bw_bytes and iops (= their one part), n1's bw_bytes, and both lone jobs


def test_a_total_stays_when_both_parts_are_there() -> None:
    fio = get_benchmark("fio")
    mixed = [r("bw_bytes", 3e9), r("read_bw_bytes", 2e9), r("write_bw_bytes", 1e9)]
    names = [x.name for x in run_sections(mixed, headline=fio.headline, totals=fio.totals).headline]
    assert names == ["read_bw_bytes", "write_bw_bytes", "bw_bytes"]


def test_telemetry_is_one_row_per_series_and_idle_ones_are_folded() -> None:
    sections = run_sections(fio_results(), headline=(), totals={})
    (busy,) = sections.telemetry
    assert (busy.series, busy.labels, sorted(busy.stats)) == ("net.rx_bytes", {"nic": "eth0"}, ["max", "mean", "p99"])
    assert [(t.series, t.labels) for t in sections.idle] == [("net.rx_bytes", {"nic": "eth1"})]
    assert all(not x.name.startswith("net.") for x in sections.headline + sections.aggregates)


@pytest.fixture
def measured_run(team: Any) -> Run:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "page", "kind": "fio", "nodes": ["n1"], "fixed": {"rw": "read", "bs": "4k", "size": "1M"}}
    run = campaign_launch(campaign=campaign_apply(data=data, team=team)).runs.get()
    Result.objects.bulk_create(Result(run=run, **vars(x)) for x in fio_results())
    t = T0 + np.arange(60, dtype=np.int64) * 1_000_000_000
    for nic, rate in (("eth0", 125_000_000), ("eth1", 0)):
        series_append(run=run, host="n1", name="net.rx_bytes", labels={"nic": nic}, unit="B", kind="counter",
                      timestamps_ns=t, values=np.cumsum(np.full(60, rate)).astype(np.int64))  # fmt: skip
    return run


@pytest.mark.django_db
def test_the_run_page_reads_headline_then_hosts_then_telemetry(owner: Any, measured_run: Run) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{measured_run.pk}/").content.decode()
    headline, per_host = page.index('data-testid="headline-results"'), page.index('data-testid="per-host-results"')
    summary, charts = page.index('data-testid="telemetry-summary"'), page.index('<section id="telemetry">')
    assert headline < per_host < summary < charts
    top = page[headline:per_host]
    assert top.index("read_bw_bytes") < top.index("read_iops") < top.index("read_lat_mean_ns")
    assert "2.10 GB/s" in top and "7.70 ms" in top and "net.rx_bytes" not in top
    assert page[per_host:summary].count("<tr>") == 2  # the header and n1's one read_bw_bytes
    assert "800 Mbit/s" in page[summary:charts]  # a NIC's bytes per second read as bits
    assert "1 idle series (zero throughout)" in page
    drawn = page[charts:]
    assert drawn.count("<polygon") == 1 and "1 idle series not drawn" in drawn  # eth1 is named, not drawn
    band = drawn[drawn.index('<polygon points="') + 17 :].split('"')[0]
    assert {p.split(",")[1] for p in band.split()} == {"45.0"}  # a constant rate: mid-height, not on the edge
    assert 'class="time-axis"' in drawn and ">0 s</span>" in drawn and ">59.0 s</span>" in drawn
    assert "1.00 Gbit/s – 1.00 Gbit/s" in drawn  # the caption's range, in the NIC's unit


def test_the_demo_campaign_samples_telemetry_every_second() -> None:
    """So that a newcomer's first run page has charts."""
    from pathlib import Path

    import yaml

    from plugins.telemetry import validate_telemetry

    demo = yaml.safe_load((Path(__file__).parent.parent / "examples/campaigns/demo-fio.yaml").read_text())
    config = validate_telemetry(demo["telemetry"])
    assert config["enabled"] and config["interval"] == "1s" and "net" in config["groups"]


@pytest.mark.django_db
def test_statistics_never_say_no_results_yet_once_runs_have_succeeded(owner: Any, team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "hosts-only", "kind": "fio", "nodes": ["n1"], "repetitions": 3, "fixed": {"rw": "read"}}
    campaign = campaign_launch(campaign=campaign_apply(data=data, team=team))
    from campaigns.models import RunStatus

    campaign.runs.update(status=RunStatus.SUCCEEDED)
    for run in campaign.runs.all():  # each host's numbers, no aggregate across hosts
        Result.objects.create(run=run, name="read_bw_bytes", value=1e9, unit="B/s", host="n1")
    client = Client()
    client.force_login(owner)
    page = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert "No results yet" not in page and "3 runs succeeded, but none stored a metric aggregated" in page
