"""Layout in a real browser where it went wrong before: fields that overlapped, labels off their ticks, admin
columns cut off. Measured from the elements' boxes, not by looking; screenshots in var/test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from campaigns.models import Campaign
from inventory.models import Node
from tests.browser import log_in, snap


def box(page: Any, selector: str) -> dict[str, float]:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, selector
    return found


@pytest.mark.django_db(transaction=True)
def test_the_schedule_form_the_timeline_and_the_admin_node_list_lay_out_cleanly(
    page: Any, django_user_model: Any, team: Any
) -> None:
    django_user_model.objects.create_superuser("boss", password="pw-boss-12345")
    for i in range(1, 4):
        Node.objects.create(name=f"dgx-a100-rack12-node{i:02d}", address=f"10.20.30.{i}", team=team, gpu_count=8,
                            gpu_model="NVIDIA A100-SXM4-80GB", cpu_cores=128, ram_mb=2_063_731,
                            facts_collected_at=timezone.now())  # fmt: skip
    campaign = Campaign.objects.create(name="nightly-fio", kind="fio", team=team)
    log_in(page, "boss", "pw-boss-12345")

    page.goto(f"/campaigns/{campaign.pk}/schedule/")
    at, time_label = box(page, "input[name=run_at]"), box(page, "label[for=id_time]")
    assert at["x"] + at["width"] <= time_label["x"], "the date and time runs into 'Time of day'"
    snap(page, "layout-schedule-1280")

    page.goto("/timeline/")
    for tick, text in zip(page.locator("svg.timeline").first.locator("line").all(),
                          page.locator("svg.timeline").first.locator("text").all(), strict=True):  # fmt: skip
        line, label = tick.bounding_box(), text.bounding_box()
        assert label["x"] - 1 <= line["x"] <= label["x"] + label["width"] + 1, "a label off its tick"
    snap(page, "layout-timeline-1280")

    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto("/admin/inventory/node/")
    table, room = box(page, "#result_list"), box(page, "#changelist .results")
    assert table["x"] + table["width"] <= room["x"] + room["width"] + 1, "the node list is cut off at its right"
    header = page.locator("#result_list thead").inner_text()
    assert "RAM" in header and "FACTS COLLECTED" in header.upper()
    assert "1.97 TiB" in page.locator("#result_list").inner_text()
    snap(page, "layout-admin-nodes-1400")
