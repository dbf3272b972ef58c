"""The fleet page's GPU and NIC sections in a real browser at 1280 and 1920 px: the device's name and its first
cells are on screen without scrolling sideways, and the page itself never scrolls sideways (a wide table scrolls in
its own box). Screenshots in var/test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest

from tests.browser import log_in, snap
from tests.test_fleet_devices import gpu_campaign, nic_campaign


@pytest.mark.django_db(transaction=True)
def test_the_gpu_and_nic_sections_read_at_1280_and_1920_px(page: Any, owner: Any, team: Any) -> None:
    gpus, nics = gpu_campaign(team), nic_campaign(team)
    log_in(page, "owner", "pw-owner-123")

    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        for campaign, kind, bad in ((gpus, "gpu", "lab3/gpu5"), (nics, "nic", "lab2/eth0")):
            page.goto(f"/analysis/campaigns/{campaign.pk}/fleet/")
            section = page.locator(f"#fleet-{kind}")
            row = section.locator("tbody tr").first
            assert row.locator("th").inner_text() == bad  # outliers first
            for cell in (row.locator("th"), row.locator("td").first):
                found = cell.bounding_box()
                assert found is not None and found["x"] + found["width"] <= width, (kind, width)
            wide = page.evaluate("document.documentElement.scrollWidth")
            assert wide <= width, f"the page scrolls sideways at {width}"
            section.scroll_into_view_if_needed()
            snap(page, f"fleet-{kind}-{width}")
