"""The web UI in a real browser (Playwright driving Debian's headless Chromium) against a live server, a real
Celery worker and the lab's sshd nodes running fio. Screenshots of every page land in var/test-artifacts/browser/.
"""

from __future__ import annotations

from typing import Any

import pytest

from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from scheduling.models import Schedule
from tests.browser import SCREENSHOTS, log_in, snap
from tests.test_analysis import campaign, runs

DEFINITION = """\
name: browser-fio
kind: fio
description: fio reads on one lab node with one and two jobs, from the builder
nodes: [lab1]
repetitions: 2
timeout: 120
cache: {flush_clients: false}
fixed: {bs: 64k, size: 8M, rw: read}
matrix:
  numjobs: [1, 2]
"""


@pytest.mark.lab
@pytest.mark.worker
def test_it_builds_launches_and_watches_a_campaign_to_the_end(
    page: Any, lab: dict[str, Any], worker: Any, owner: Any
) -> None:
    log_in(page, "owner", "pw-owner-123")
    snap(page, "01-dashboard-empty")

    page.goto("/inventory/nodes/")
    assert page.locator("table").get_by_text("lab1").count() == 1
    snap(page, "02-nodes")

    page.goto("/campaigns/new/")
    definition = page.get_by_test_id("definition")
    definition.fill(DEFINITION.replace("numjobs: [1, 2]", "numjobs: [1, 2, bogus]"))
    definition.press("End")  # the preview listens for keyup
    errors = page.get_by_test_id("preview-errors").filter(has_text="bogus")
    errors.wait_for()  # the field and the bad value are named
    assert "numjobs" in errors.inner_text()
    snap(page, "03-builder-error")

    definition.fill(DEFINITION)
    definition.press("End")
    page.locator("#preview-runs", has_text="4").wait_for()
    assert "fio" in page.locator("#preview").inner_text()
    snap(page, "04-builder-preview")

    page.get_by_test_id("create-and-launch").click()
    page.wait_for_url("**/campaigns/*/")
    campaign = Campaign.objects.get(name="browser-fio")
    assert campaign.team is not None and campaign.team.name == "blue"
    snap(page, "05-campaign-launched")

    # htmx polls the live region every 2 s; the progress bar moves to 4 / 4 and the polling stops
    done = page.locator("#campaign-runs[data-status=succeeded]")
    done.wait_for(timeout=150_000)
    bar = page.locator("#progress")
    assert bar.get_attribute("data-done") == bar.get_attribute("data-total") == "4"
    assert done.get_attribute("hx-trigger") is None
    assert page.locator("#run-grid a.cell[data-status=succeeded]").count() == 4
    snap(page, "06-campaign-done")

    page.locator("#run-grid a.cell").first.click()
    page.wait_for_url("**/runs/*/")
    assert "bw_bytes" in page.content()
    snap(page, "07-run")

    page.goto("/")
    assert "browser-fio" in page.content()
    snap(page, "08-dashboard")
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.SUCCEEDED

    # a second campaign of the same definition, launched from a clone of the first
    page.goto(f"/campaigns/{campaign.pk}/")
    page.get_by_test_id("clone").click()
    page.get_by_test_id("definition").wait_for()
    page.get_by_test_id("create-and-launch").click()
    page.wait_for_url("**/campaigns/*/")
    page.locator("#campaign-runs[data-status=succeeded]").wait_for(timeout=150_000)
    again = Campaign.objects.exclude(pk=campaign.pk).get(family=campaign.family_name)

    # compare the two: a row per point and metric, each change judged against the spread of the repetitions
    page.goto(f"/compare/?campaign={campaign.pk}&campaign={again.pk}")
    table = page.locator("#table-compare")
    assert table.get_by_text("bw_bytes").count() >= 2  # one row per point
    assert again.name in table.inner_text()
    snap(page, "09-compare")

    # the scaling chart over the numjobs axis, drawn on the server and redrawn by uPlot
    page.goto(f"/analysis/scaling/?campaign={campaign.pk}&campaign={again.pk}&metric=bw_bytes&x=numjobs")
    figure = page.locator("figure[data-chart]")
    assert figure.locator(".chart-svg svg").count() == 1
    page.locator("figure[data-chart] .uplot").wait_for()
    assert "%" in page.locator(".analysis-table").first.inner_text()  # the efficiency at each point
    snap(page, "10-scaling")

    # schedule the first campaign nightly: the schedule page lists its next launches; the timeline shows the node
    page.goto(f"/campaigns/{campaign.pk}/")
    page.get_by_test_id("schedule").click()
    page.locator("input[name=when][value=nightly]").check()
    page.fill("input[name=time]", "02:30")
    page.get_by_role("button", name="Schedule").click()
    page.get_by_text("02:30").first.wait_for()
    assert Schedule.objects.get(campaign=campaign).kind == "nightly"
    snap(page, "11-schedule")
    page.goto("/timeline/")
    assert page.locator("table").get_by_text("lab1").count() >= 1
    snap(page, "12-timeline")


@pytest.mark.django_db(transaction=True)
def test_it_redraws_the_error_bars_and_min_max_bands_of_the_server_chart_with_uplot(
    page: Any, owner: Any, team: Any
) -> None:
    # three repetitions per point: each point's mean ± stdev is an error bar, in the SVG and in uPlot
    bars = campaign(team, "browser-error-bars", axes={"numjobs": [1, 2, 4]})
    for point, jobs in enumerate((1, 2, 4)):
        runs(bars, point, {"numjobs": jobs}, {"bw_bytes": [100.0 * jobs, 110.0 * jobs, 90.0 * jobs]})
    # 1,500 points on one line: drawn as a min/max band of at most charts.MAX_POINTS buckets
    wide = campaign(team, "browser-band", axes={"step": list(range(1500))})
    made = Run.objects.bulk_create(
        Run(campaign=wide, sequence=i + 1, point=i, params={"step": i}, repetition=1, status=RunStatus.SUCCEEDED)
        for i in range(1500)
    )
    Result.objects.bulk_create(
        Result(run=run, name="bw_bytes", value=1000.0 if i % 100 == 0 else 10.0, unit="B/s")
        for i, run in enumerate(made)
    )
    log_in(page, "owner", "pw-owner-123")

    page.goto(f"/analysis/scaling/?campaign={bars.pk}&metric=bw_bytes&x=numjobs")
    live = page.locator("figure[data-chart] .chart-live[data-error-bars]")
    live.wait_for()
    assert live.get_attribute("data-error-bars") == "3" and live.get_attribute("data-bands") == "0"
    page.locator("figure[data-chart] .u-over").scroll_into_view_if_needed()  # below the form at 800 px high
    over = page.locator("figure[data-chart] .u-over").bounding_box()
    page.mouse.move(over["x"] + 1, over["y"] + over["height"] / 2)  # the first point: its spread in the legend
    assert "100 B/s (90–110)" in page.locator(".u-legend").inner_text()  # the value as common.numbers writes it
    snap(page, "13-error-bars")

    page.goto(f"/analysis/sweep/?campaign={wide.pk}&metric=bw_bytes&x=step&log=off")
    live = page.locator("figure[data-chart] .chart-live[data-bands]")
    live.wait_for()
    assert live.get_attribute("data-bands") == "1" and live.get_attribute("data-error-bars") == "0"
    assert "browser-band · aggregate · max" in page.locator(".u-legend").inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("figure[data-chart]").screenshot(path=str(SCREENSHOTS / "14-min-max-band.png"))  # not 1,500 rows
