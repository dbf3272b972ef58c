"""A newcomer's path through the pages in a real browser, at a laptop's 1280 px and a desktop's 1920 px, on a real
campaign: the demo login makes an API token, loads a preset in the builder, shrinks it to the lab's size, launches
it on two lab nodes (a real Celery worker, real sshd and fio), watches it to its end, then reads a run, a comparison,
the scaling, sweep and storage-sizing pages, schedules it, looks at the timeline and imports nodes in the admin.
Screenshots land in var/test-artifacts/browser/ (newcomer-*) to be looked at.

The machine running the suite may be loaded: the waits are generous (minutes) and nothing is timed."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from campaigns.models import Campaign, CampaignStatus, RunStatus
from inventory.models import Node
from scheduling.models import Schedule
from tests.browser import SCREENSHOTS, log_in

pytestmark = [pytest.mark.lab, pytest.mark.worker]

WIDTHS = (1280, 1920)
CAMPAIGN_WAIT_MS = 15 * 60_000  # 8 short fio runs; minutes on a loaded machine
PRESET = "storage-fio-bandwidth"
IMPORT = "name,address,ssh_user,gpu_count,gpu_model,role\ndgx-a01,10.40.0.1,root,8,NVIDIA H100 80GB HBM3,compute\n" \
         "dgx-a02,10.40.0.2,root,8,NVIDIA H100 80GB HBM3,compute\n"  # fmt: skip


def both_widths(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / f"newcomer-{name}-{width}.png"), full_page=True)
        page.screenshot(path=str(SCREENSHOTS / f"newcomer-{name}-{width}-top.png"))  # what shows without scrolling
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})


def lab_sized(preset_yaml: str) -> str:
    """The preset as the builder loaded it, made small enough for two lab nodes: no NFS mount, the lab's storage,
    16 MiB files read for 2 s, 1 and 2 nodes x 1 and 4 jobs, 2 repetitions, telemetry at 1 s."""
    spec = yaml.safe_load(preset_yaml)
    spec.pop("mounts", None)
    spec.update(
        name="newcomer-fio-bandwidth", nodes=["lab1", "lab2"], storage="lab-local", repetitions=2, timeout=300,
        fixed={"bs": "1M", "size": "16M", "runtime": 2, "time_based": 1, "rw": "read"},
        matrix={"nodes": [1, 2], "numjobs": [1, 4]},
        telemetry={"enabled": True, "interval": "1s", "groups": ["cpu", "mem", "net", "disk"]},
    )  # fmt: skip
    return yaml.safe_dump(spec, sort_keys=False)


def test_a_newcomer_runs_a_real_campaign_and_reads_every_page_of_it(
    page: Any, lab: dict[str, Any], worker: Any
) -> None:
    call_command("demo_user", stdout=io.StringIO())
    log_in(page, "demo", "rackbench")

    # an API token for a pipeline: the demo's only team is already chosen
    page.goto("/accounts/tokens/")
    page.fill("input[name=name]", "my-pipeline")
    page.select_option("select[name=scope]", "launch")
    page.click("button:has-text('Create token')")
    assert page.locator("#token-secret").inner_text().startswith("rbk_")
    both_widths(page, "01-token")

    # the builder, from a preset, shrunk to the lab and previewed: the preview's paths are the runs' own
    page.goto(f"/campaigns/new/?preset={PRESET}")
    definition = page.get_by_test_id("definition")
    assert "numjobs" in definition.input_value()
    definition.fill(lab_sized(definition.input_value()))
    definition.press("End")  # the preview listens for keyup
    page.locator("#preview-runs", has_text="8").wait_for(timeout=60_000)
    preview = page.locator("#preview").inner_text()
    assert "fio" in preview and "/lab1/run-ID" in preview
    both_widths(page, "02-builder")

    page.get_by_test_id("create-and-launch").click()
    page.wait_for_url("**/campaigns/*/", timeout=60_000)
    campaign = Campaign.objects.get(name="newcomer-fio-bandwidth")
    both_widths(page, "03-launched")

    # watched to its end by htmx polling
    page.locator("#campaign-runs[data-status=succeeded]").wait_for(timeout=CAMPAIGN_WAIT_MS)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.SUCCEEDED, list(campaign.runs.values_list("error", flat=True))
    assert campaign.runs.filter(status=RunStatus.SUCCEEDED).count() == 8
    stats = page.locator("table", has=page.locator("th", has_text="Median")).inner_text()
    assert "B/s" in stats and "e+" not in stats
    both_widths(page, "04-campaign")

    # a two-node run: its nodes, its start, its results per host, its telemetry drawn
    run = campaign.runs.filter(params__nodes=2).order_by("sequence").first()
    assert run is not None and run.started_at is not None
    remote_dir = run.hosts.get(host="lab1").remote_dir
    page.goto(f"/runs/{run.pk}/")
    assert "read_bw_bytes" in page.locator("[data-testid=headline-results]").inner_text()
    per_host = page.locator("[data-testid=per-host-results]").inner_text()
    assert "lab1" in per_host and "lab2" in per_host
    assert page.locator("#telemetry .time-axis").count() >= 1
    assert remote_dir in page.content()  # where it ran, as the preview said
    both_widths(page, "05-run")

    # the one-job and four-job points of two nodes side by side
    points = {(r.params["nodes"], r.params["numjobs"]): r.point for r in campaign.runs.all()}
    page.goto(f"/compare/?point={campaign.pk}:{points[(2, 1)]}&point={campaign.pk}:{points[(2, 4)]}")
    assert "param numjobs" in page.locator("[data-testid=differences]").inner_text()
    both_widths(page, "06-compare")

    # scaling: ticking the campaign fills the metric and axis lists; on GPU-less nodes it draws against nodes
    page.goto("/analysis/scaling/")
    page.locator(f"input[name=campaign][value='{campaign.pk}']").check()
    page.locator("#x option[value=node-count]").wait_for(state="attached")
    assert page.locator("#x").input_value() == "node-count"
    assert "node-gpus" not in page.locator("#x").inner_html()
    page.get_by_role("button", name="Draw").click()
    page.locator("figure[data-chart] .uplot").wait_for()
    body = page.locator("main").inner_text()
    assert "Nothing to draw" not in body and "no succeeded run" not in body
    assert "GB/s" in page.locator(".analysis-table").first.inner_text() or "MB/s" in body
    both_widths(page, "07-scaling")
    page.locator("figure[data-chart]").screenshot(path=str(SCREENSHOTS / "newcomer-07-scaling-chart.png"))

    # sweep: bandwidth against numjobs, per node and aggregate
    page.goto(f"/analysis/sweep/?campaign={campaign.pk}&metric=read_bw_bytes&x=numjobs&hosts=both")
    page.locator("figure[data-chart] .uplot").wait_for()
    assert "B/s" in page.locator(".analysis-table").first.inner_text()
    both_widths(page, "08-sweep")

    # storage sizing from what this campaign measured on the lab's storage
    page.goto(f"/analysis/storage/?measured={campaign.pk}&storage={lab['storage'].pk}&per_gpu=100&gpus=64")
    assert "One storage node feeds" in page.locator("main").inner_text()
    both_widths(page, "09-storage")

    # scheduled nightly, and the timeline of the nodes
    page.goto(f"/campaigns/{campaign.pk}/")
    page.get_by_test_id("schedule").click()
    page.locator("input[name=when][value=nightly]").check()
    page.fill("input[name=time]", "02:30")
    page.get_by_role("button", name="Schedule").click()
    page.get_by_text("02:30").first.wait_for()
    assert Schedule.objects.get(campaign=campaign).kind == "nightly"
    both_widths(page, "10-schedule")
    page.goto("/timeline/")
    assert page.locator("table").get_by_text("lab1").count() >= 1
    both_widths(page, "11-timeline")

    # the admin: import two nodes from CSV, then the node list
    page.goto("/admin/inventory/node/import/")
    page.fill("textarea[name=text]", IMPORT)
    both_widths(page, "12-admin-import")
    page.locator("input[type=submit], button[type=submit]").last.click()
    page.wait_for_url("**/admin/inventory/node/")
    assert Node.objects.filter(name__in=["dgx-a01", "dgx-a02"]).count() == 2
    both_widths(page, "13-admin-nodes")
