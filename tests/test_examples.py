"""Every campaign file under examples/ applies against an inventory that has what it names."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaigns import selectors, services
from campaigns.spec import load_yaml
from inventory.services import node_upsert, storage_upsert

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "campaigns").glob("*.yaml"))


@pytest.mark.django_db
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_example_applies_and_previews(path: Path) -> None:
    for i in range(1, 5):
        node_upsert(name=f"lab{i}", address=f"127.0.1.{i}", tags=["lab"])
        node_upsert(name=f"dgx{i}", address=f"10.0.0.{i}", tags=["dgx"], gpu_count=8)
    for name in ("lab-local", "aff-a800", "ai400"):
        storage_upsert(name=name, kind="nfs", data_addresses=["10.1.0.1"], export_path="/export")

    campaign = services.campaign_apply(data=load_yaml(path.read_text()))

    assert selectors.campaign_preview(campaign=campaign)["runs"] > 0
