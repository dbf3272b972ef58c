"""Presets from the reference papers instantiate against any inventory, all or nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from campaigns import selectors, services
from campaigns.models import Campaign
from campaigns.presets import preset_list
from campaigns.spec import SpecError
from inventory.services import node_upsert, storage_upsert

pytestmark = pytest.mark.django_db


@pytest.fixture
def inventory() -> None:
    for i in range(1, 9):
        node_upsert(name=f"dgx{i}", address=f"10.0.0.{i}", tags=["dgx"], gpu_count=8)
    storage_upsert(name="nas", kind="nfs", data_addresses=["10.1.0.1", "10.1.0.2"], export_path="/export")


@pytest.mark.parametrize("preset", [p.slug for p in preset_list()])
def test_every_preset_instantiates_and_previews(inventory: None, preset: str) -> None:
    created = services.preset_instantiate(slug=preset, name="x", node_tags=["dgx"], storage="nas")

    assert created
    for campaign in created:
        preview = selectors.campaign_preview(campaign=campaign)
        assert preview["runs"] > 0 and all(h["command"] for p in preview["shown"] for h in p["hosts"] if h["command"])


def test_a_suite_creates_one_campaign_per_part(inventory: None) -> None:
    created = services.preset_instantiate(slug="seed003-ontap-fio", name="ontap", nodes=["dgx1"], storage="nas")

    assert [c.name for c in created] == ["ontap-bandwidth", "ontap-iops"]
    assert created[0].fixed["numjobs"] == 120 and created[1].fixed["numjobs"] == 180


def test_a_preset_that_cannot_apply_creates_nothing(inventory: None) -> None:
    services.preset_instantiate(slug="seed002-read-by-node", name="taken-iops", node_tags=["dgx"], storage="nas")

    with pytest.raises(SpecError, match="'taken-iops' already exists"):  # its second part collides
        services.preset_instantiate(slug="seed003-ontap-fio", name="taken", node_tags=["dgx"], storage="nas")
    assert not Campaign.objects.filter(name="taken-bandwidth").exists()  # the first part was rolled back
    with pytest.raises(SpecError) as caught:
        services.preset_instantiate(slug="seed003-ontap-fio", name="new", node_tags=["dgx"])
    assert caught.value.field == "storage"
    assert not Campaign.objects.filter(name__startswith="new").exists()


def test_the_command_lists_and_applies_presets(inventory: None) -> None:
    out = io.StringIO()
    call_command("campaign", "preset", stdout=out)
    assert "seed000-fio-storage" in out.getvalue()

    out = io.StringIO()
    call_command(
        "campaign",
        "preset",
        "seed000-fio-storage",
        "--name",
        "isilon",
        "--node-tags",
        "dgx",
        "--storage",
        "nas",
        stdout=out,
    )

    assert "created isilon: 9 runs" in out.getvalue()
    assert Campaign.objects.get(name="isilon").mounts == {"count": 16, "path": "/mnt/rackbench"}
