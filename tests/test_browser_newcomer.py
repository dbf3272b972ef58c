"""A newcomer's path through the pages in a real browser, at a laptop's 1280 px and a desktop's 1920 px: the demo
login makes an API token, then reads a campaign's statistics, a run page (headline, per host, telemetry) and a
comparison of two points. Screenshots land in var/test-artifacts/browser/ (newcomer-*) to be looked at."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from django.core.management import call_command

from campaigns.models import Result
from tests.browser import SCREENSHOTS, log_in
from tests.test_analysis import campaign, runs

WIDTHS = (1280, 1920)
T0 = 1_700_000_000_000_000_000  # ns


def both_widths(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / f"newcomer-{name}-{width}.png"), full_page=True)
        page.screenshot(path=str(SCREENSHOTS / f"newcomer-{name}-{width}-top.png"))  # what shows without scrolling
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})


def fio_campaign(team: Any) -> Any:
    c = campaign(team, "newcomer-fio", axes={"numjobs": [1, 4, 16]})
    for point, jobs in enumerate((1, 4, 16)):
        made = runs(c, point, {"rw": "read", "numjobs": jobs},
                    {"read_bw_bytes": [2.1e8 * jobs, 2.2e8 * jobs, 2.0e8 * jobs],
                     "bw_bytes": [2.1e8 * jobs, 2.2e8 * jobs, 2.0e8 * jobs],
                     "read_iops": [3300.0 * jobs, 3350.0 * jobs, 3250.0 * jobs],
                     "read_lat_mean_ns": [3.0e5 * jobs, 3.1e5 * jobs, 2.9e5 * jobs]})  # fmt: skip
        for run in made:  # per host, with and without the job label, as fio reports it
            Result.objects.bulk_create(
                Result(run=run, name="read_bw_bytes", value=1.05e8 * jobs, unit="B/s", host=h, labels=labels)
                for h in ("lab1", "lab2") for labels in ({}, {"job": "0"})
            )  # fmt: skip
    Result.objects.filter(run__campaign=c, name="read_iops").update(unit="IOPS")  # as fio's plug-in stores it
    return c


@pytest.mark.django_db(transaction=True)
def test_a_newcomer_makes_a_token_and_reads_results_runs_and_comparisons(page: Any) -> None:
    from telemetry.services import series_append

    call_command("demo_user", stdout=io.StringIO())
    from accounts.models import Team

    team = Team.objects.get(name="demo")
    log_in(page, "demo", "rackbench")

    page.goto("/accounts/tokens/")
    assert page.locator("select[name=team]").input_value() == str(team.pk)  # the only team, already chosen
    page.fill("input[name=name]", "my-pipeline")
    page.select_option("select[name=scope]", "launch")
    page.click("button:has-text('Create token')")
    assert page.locator("#token-secret").inner_text().startswith("rbk_")
    both_widths(page, "01-token")

    fio = fio_campaign(team)
    run = fio.runs.filter(point=2).first()
    t = T0 + np.arange(120, dtype=np.int64) * 1_000_000_000
    for nic, rate in (("eth0", 1.1e9), ("eth1", 0)):
        series_append(run=run, host="lab1", name="net.tx_bytes", labels={"nic": nic}, unit="B", kind="counter",
                      timestamps_ns=t, values=np.cumsum(np.full(120, rate)).astype(np.int64))  # fmt: skip
    series_append(run=run, host="lab1", name="cpu.util", labels={}, unit="%", kind="gauge", timestamps_ns=t,
                  values=40 + 20 * np.sin(np.arange(120) / 10))  # fmt: skip

    page.goto(f"/campaigns/{fio.pk}/")
    stats = page.locator("table", has=page.locator("th", has_text="Median")).inner_text()
    assert "3.36 GB/s" in stats and "4.80 ms" in stats and "e+" not in stats
    assert page.locator("[data-testid=statistics-csv]").count() == 1
    both_widths(page, "02-campaign")

    page.goto(f"/runs/{run.pk}/")
    headline = page.locator("[data-testid=headline-results]").inner_text()
    assert headline.index("read_bw_bytes") < headline.index("read_iops") < headline.index("read_lat_mean_ns")
    assert "GB/s" in headline and "ms" in headline
    assert page.locator("[data-testid=per-host-results] tbody tr").count() == 2  # lab1 and lab2, once each
    assert page.locator("#telemetry .time-axis").count() == 2  # net eth0 and cpu; idle eth1 is folded away
    assert "Gbit/s" in page.locator("#telemetry").inner_text()
    both_widths(page, "03-run")

    page.goto(f"/compare/?point={fio.pk}:0&point={fio.pk}:2")
    differences = page.locator("[data-testid=differences]").inner_text()
    assert "param numjobs" in differences and "param rw" not in differences
    assert "newcomer-fio · point 2 (numjobs=16)" in page.content()
    both_widths(page, "04-compare")

    page.goto(f"/compare/?campaign={fio.pk}&campaign={fio.pk}")
    both_widths(page, "05-compare-campaigns")
