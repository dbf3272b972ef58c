"""The one number formatter (common.numbers) and where it shows: run page, statistics, compare, verdict reasons,
analysis chart axes, telemetry chart captions and the CLI."""

from __future__ import annotations

import io
import math
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from analysis import charts
from campaigns import verdicts
from campaigns.models import Campaign, Result, Run, RunStatus
from campaigns.services import campaign_apply, campaign_launch
from common import numbers
from inventory.services import node_upsert


@pytest.mark.parametrize(
    ("value", "unit", "network", "shown"),
    [
        # the issue's own numbers
        (2_142_590_765.33, "B/s", False, "2.14 GB/s"),
        (7_711_402.67, "ns", False, "7.71 ms"),
        (3_193_602_842.50, "bit/s", False, "3.19 Gbit/s"),
        # byte rates: SI when stored in SI, IEC when stored in IEC, bits for the network
        (2_142_590_765.33, "B/s", True, "17.1 Gbit/s"),
        (1_250_000_000, "B/s", True, "10.0 Gbit/s"),
        (512, "B/s", False, "512 B/s"),
        (999_700_000, "B/s", False, "1.00 GB/s"),
        (12_500_000, "B/s", False, "12.5 MB/s"),
        (-12_500_000, "B/s", False, "-12.5 MB/s"),
        (0, "B/s", False, "0 B/s"),
        (990, "MB/s", False, "990 MB/s"),
        (11_800, "MB/s", False, "11.8 GB/s"),
        (1_250, "MB/s", True, "10.0 Gbit/s"),
        (512, "MiB/s", False, "512 MiB/s"),
        (1_010, "MiB/s", False, "1,010 MiB/s"),
        (1_023.9, "MiB/s", False, "1.00 GiB/s"),
        (2_048, "MiB/s", False, "2.00 GiB/s"),
        (215.3, "GB/s", False, "215 GB/s"),
        (9_410_000_000, "bit/s", False, "9.41 Gbit/s"),
        (94.1, "Mbit/s", False, "94.1 Mbit/s"),
        # sizes: plain bytes (memory) in IEC
        (17_179_869_184, "B", False, "16.0 GiB"),
        (115_000, "B", False, "112 KiB"),
        (81_920, "MiB", False, "80.0 GiB"),
        (4_000_000_000, "kB", False, "4.00 TB"),
        # time: ns, µs, ms, s, then minutes and hours
        (0.5, "ns", False, "0.500 ns"),
        (0, "ns", False, "0 s"),
        (850, "ns", False, "850 ns"),
        (85.3, "us", False, "85.3 µs"),
        (999.7, "us", False, "1.00 ms"),
        (1_500, "us", False, "1.50 ms"),
        (0.9996, "s", False, "1.00 s"),
        (9.996, "s", False, "10.0 s"),
        (650, "s", False, "10.8 min"),
        (10_800, "s", False, "3.00 h"),
        (42.0, "min", False, "42.0 min"),
        # rates and counts of things: plain up to 9,999, then k, M
        (2_912.4, "img/s", False, "2,912 img/s"),
        (100, "img/s", False, "100 img/s"),
        (93.754, "img/s", False, "93.8 img/s"),
        (9_999.6, "img/s", False, "10.0k img/s"),
        (1_234_567, "IOPS", False, "1.23M IOPS"),
        (154_321.9, "IOPS", False, "154k IOPS"),
        (99_999, "ops/s", False, "100k ops/s"),
        (3, "count", False, "3"),
        (12_345, "packets", False, "12.3k packets"),
        (8, "ranks", False, "8 ranks"),
        # physical
        (1_410, "MHz", False, "1.41 GHz"),
        (250.3, "W", False, "250 W"),
        (12.5, "%", False, "12.5%"),
        (93.75, "%", False, "93.8%"),
        (45, "C", False, "45.0 °C"),
        # anything else: 4 significant digits, never an exponent
        (0.9123, "ratio", False, "0.9123 ratio"),
        (123_456.7, "", False, "123k"),
    ],
)
def test_it_shows_a_value_in_its_unit_familys_best_prefix(value: float, unit: str, network: bool, shown: str) -> None:
    assert numbers.quantity(value, unit, network=network) == shown


@pytest.mark.parametrize("value", [None, "", math.nan, math.inf, -math.inf, True])
def test_nothing_to_show_is_a_dash(value: Any) -> None:
    assert numbers.quantity(value, "B/s") == "—"


def test_no_value_is_ever_written_with_an_exponent() -> None:
    for exponent in range(-12, 16):
        for unit in ("B/s", "ns", "bit/s", "IOPS", "img/s", "%", "", "ratio", "B", "MiB/s"):
            assert "e" not in numbers.quantity(1.2345 * 10.0**exponent, unit).replace("ratio", "")


def test_three_or_four_significant_digits_whatever_the_size() -> None:
    for exponent in range(0, 13):
        text, _ = numbers.split(1.23456789 * 10.0**exponent, "B/s")
        digits = text.replace(",", "").replace(".", "").lstrip("0")
        assert 3 <= len(digits) <= 4, text


def test_raw_keeps_the_exact_value() -> None:
    assert numbers.raw(2_142_590_765.33, "B/s") == "2142590765.33 B/s"
    assert numbers.raw(4096.0, "B") == "4096 B"
    assert numbers.raw(None, "B") == ""


def test_plain_numbers_keep_whole_numbers_exact() -> None:
    assert numbers.plain(1_234_567) == "1,234,567"
    assert numbers.plain(1_234.5678) == "1,235"
    assert numbers.plain(0.91037) == "0.9104"


def test_network_series_are_recognised_by_name() -> None:
    assert numbers.is_network("net.rx_bytes") and numbers.is_network("rdma.tx_bytes")
    assert not numbers.is_network("disk.read_bytes") and not numbers.is_network("read_bw_bytes")


@pytest.mark.parametrize(
    ("values", "unit", "network", "divisor", "shown"),
    [
        ([0.5e9, 2.1e9], "B/s", False, 1e9, "GB/s"),
        ([5e5, 7.7e6], "ns", False, 1e6, "ms"),
        ([1.25e9], "B/s", True, 1.25e8, "Gbit/s"),
        ([100, 2000], "MB/s", False, 1e3, "GB/s"),
        ([50_000, 120_000], "IOPS", False, 1e3, "k IOPS"),
        ([3, 90], "%", False, 1, "%"),
        ([1, 8], "", False, 1, ""),
    ],
)
def test_an_axis_reads_in_the_unit_of_its_largest_value(
    values: list[float], unit: str, network: bool, divisor: float, shown: str
) -> None:
    got_divisor, got_shown = numbers.axis(values, unit, network=network)
    assert got_divisor == pytest.approx(divisor) and got_shown == shown


def test_the_analysis_chart_axis_ticks_and_tooltips_use_the_formatter() -> None:
    line = charts.Line("fio", [1, 2, 4], [0.6e9, 1.1e9, 2.14e9])
    figure = charts.Figure("bw", "nodes", "read_bw_bytes", [line], y_unit="B/s")
    svg = charts.svg(figure)
    assert "read_bw_bytes (GB/s)" in svg and figure.as_json()["y_label"] == "read_bw_bytes (GB/s)"
    assert ">2.5</text>" in svg or ">2</text>" in svg  # ticks in GB/s, not 2.5G or 2500000000
    assert "→ 2.14 GB/s" in svg  # a point's tooltip
    assert figure.as_json()["y_divisor"] == 1e9


def test_verdict_reasons_read_in_the_metrics_unit_family() -> None:
    text = verdicts._movement("read_bw_bytes", "B/s", 2.0e9, 1.5e9, -25.0, True)
    assert text == "read_bw_bytes is 25.0% worse: it fell from 2.00 GB/s to 1.50 GB/s"


# --- pages and the CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def measured(team: Any) -> Campaign:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_launch(
        campaign=campaign_apply(
            data={
                "name": "readable",
                "kind": "fio",
                "nodes": ["n1"],
                "repetitions": 1,
                "fixed": {"bs": "1m"},
                "matrix": {"rw": ["read"]},
            },  # fmt: skip
            team=team,
        )
    )
    now = timezone.now()
    for run in campaign.runs.all():
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, started_at=now - timedelta(seconds=5),
                                             finished_at=now)  # fmt: skip
        Result.objects.create(run=run, name="read_bw_bytes", value=2_142_590_765.33, unit="B/s")
        Result.objects.create(run=run, name="read_lat_mean_ns", value=7_711_402.67, unit="ns")
    return campaign


@pytest.mark.django_db
def test_the_run_and_campaign_pages_show_readable_numbers_with_the_exact_value_on_hover(
    member: Any, measured: Campaign
) -> None:
    client = Client()
    client.force_login(member)
    run = measured.runs.get()
    for page in (
        client.get(reverse("campaigns:run-detail", args=[run.pk])).content.decode(),
        client.get(reverse("campaigns:campaign-detail", args=[measured.pk])).content.decode(),
    ):
        assert 'title="2142590765.33 B/s">2.14 GB/s<' in page
        assert 'title="7711402.67 ns">7.71 ms<' in page
        assert "2,142,590,765" not in page and "7,711,402" not in page and "2142590765.33<" not in page


@pytest.mark.django_db
def test_campaign_show_prints_readable_numbers(measured: Campaign) -> None:
    out = io.StringIO()
    call_command("campaign", "show", "readable", stdout=out)
    text = out.getvalue()
    assert "2.14 GB/s" in text and "7.71 ms" in text
    assert "e+09" not in text and "2.14259e" not in text


def test_parameter_values_sort_as_numbers_and_sizes() -> None:
    assert sorted([16, 1, 4], key=numbers.sort_key) == [1, 4, 16]
    assert sorted(["1m", "4k", "64k", "16k"], key=numbers.sort_key) == ["4k", "16k", "64k", "1m"]
    assert sorted(["rank10", "rank2", "rank1"], key=numbers.sort_key) == ["rank1", "rank2", "rank10"]
    points = [{"numjobs": 16, "rw": "read"}, {"numjobs": 1, "rw": "read"}, {"numjobs": 4, "rw": "read"}]
    assert [p["numjobs"] for p in sorted(points, key=numbers.params_sort_key)] == [1, 4, 16]
