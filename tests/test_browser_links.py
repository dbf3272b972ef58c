"""The link matrix in a real browser at 1280 and 1920 px, for a pairwise benchmark of each kind of cell: nccl-tests'
pair busbw (higher is better) and perftest's latency (lower is better), from results the real helpers and parsers
produced. The bad node's row is on screen with its values readable, the page never scrolls sideways. Screenshots in
var/test-artifacts/browser/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks.base import get_benchmark
from tests.browser import log_in, snap
from tests.test_pairwise import LAT_GOOD, LAT_SLOW, hosts, nccl_pass, perftest_pass, stored


@pytest.mark.django_db(transaction=True)
def test_the_link_matrix_reads_at_1280_and_1920_px(page: Any, owner: Any, team: Any, tmp_path: Path) -> None:
    pairs = {"topology": "all_pairs"}
    busbw = stored(
        team, "nccl", [(pairs, nccl_pass(get_benchmark("nccl"), tmp_path / "nccl", pairs, hosts(8, 8), "n3"))]
    )
    lat = {"topology": "all_pairs", "test": "ib_send_lat"}
    latency = stored(team, "perftest", [
        (lat, perftest_pass(get_benchmark("perftest"), tmp_path / "lat", lat, 8, "n5", LAT_GOOD, LAT_SLOW)),
    ])  # fmt: skip
    log_in(page, "owner", "pw-owner-123")

    for width in (1280, 1920):
        page.set_viewport_size({"width": width, "height": 900})
        for campaign, name, bad, shown in ((busbw, "nccl", "n3", "43.8 GB/s"), (latency, "perftest-lat", "n5", "µs")):
            page.goto(f"/analysis/campaigns/{campaign.pk}/links/")
            assert f"Bad node {bad}" in page.locator("body").inner_text()
            table = page.locator("#link-matrix table")
            row = table.locator("tbody tr", has=page.locator(f"th:text-is('{bad}')"))
            assert shown in row.inner_text()
            box = table.bounding_box()
            assert box is not None and box["x"] + box["width"] <= width, (name, width)  # every column on screen
            assert page.evaluate("document.documentElement.scrollWidth") <= width, f"sideways scroll at {width}"
            snap(page, f"links-{name}-{width}")
