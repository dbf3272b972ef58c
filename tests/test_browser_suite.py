"""A health suite's run page in a real browser at 1280 and 1920 px: each node's verdict, its reason codes and their
evidence read on screen without sideways scrolling, the failed nodes named in the summary. Screenshots in
var/test-artifacts/browser/."""

from __future__ import annotations

from typing import Any

import pytest

from campaigns.models import Campaign
from inventory.services import node_upsert
from tests.browser import log_in, snap
from tests.test_suites import NODES, stored_suite_run


@pytest.mark.django_db(transaction=True)
def test_the_suite_run_page_reads_at_1280_and_1920_px(page: Any, owner: Any, team: Any) -> None:
    for i, name in enumerate(NODES, 1):
        node_upsert(name=name, address=f"10.0.0.{i}", team=team)
    stored_suite_run("accept-1")
    Campaign.objects.filter(name__startswith="accept-1-").update(team=team)
    log_in(page, "owner", "pw-owner-123")

    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto("/analysis/suite-runs/accept-1/")
        text = page.locator("body").inner_text()
        assert "2 healthy · 0 suspect · 2 failed" in text
        row = page.locator("tr", has=page.locator("text=outlier:network.throughput_bps")).first
        assert row.is_visible() and "n4" in row.inner_text()
        assert "2.83 Gbit/s against the fleet's median 9.40 Gbit/s (30% of it)" in row.inner_text()
        failed = page.locator("tr", has=page.locator("text=step_failed:check")).first
        assert "GPU 2: row remap pending" in failed.inner_text()
        assert page.evaluate("document.documentElement.scrollWidth") <= width, f"sideways scroll at {width}"
        snap(page, f"suite-run-{width}")
