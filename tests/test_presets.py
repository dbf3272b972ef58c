"""Presets from the reference papers instantiate against any inventory, all or nothing."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from campaigns import planning, selectors, services
from campaigns.models import Campaign
from campaigns.presets import preset_list
from campaigns.spec import SpecError
from inventory.services import node_upsert, storage_upsert
from plugins.benchmarks import nccl

pytestmark = pytest.mark.django_db


@pytest.fixture
def inventory() -> None:
    for i in range(1, 31):  # seed 001 scales to 30 nodes
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
    created = services.preset_instantiate(slug="seed003-ontap-fio", name="ontap", node_tags=["dgx"], storage="nas")

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


def _points(campaign: Campaign) -> list[dict[str, Any]]:
    return list(planning.expand(campaign.matrix, campaign.fixed, campaign.rules))


def test_the_seed000_training_sweep_has_the_vgg16_batch_and_three_node_counts(inventory: None) -> None:
    isilon, cached = services.preset_instantiate(
        slug="seed000-tf-training", name="f7", node_tags=["dgx"], storage="nas"
    )

    assert [isilon.name, cached.name] == ["f7-isilon", "f7-linux-cache"]
    points = _points(isilon)
    assert sorted({p["nodes"] for p in points}) == [1, 2, 3]
    assert {"resnet50", "vgg16", "inception3"} <= {p["model"] for p in points}
    assert {p["batch_size"] for p in points if p["model"] == "vgg16"} == {192}
    assert {p["batch_size"] for p in points if p["model"] != "vgg16"} == {256}
    assert isilon.mounts["count"] == 16 and isilon.fixed["data_dirs_round_robin"] is True
    assert isilon.flush_clients and isilon.flush_storage and isilon.repetitions == 3
    assert isilon.env["NCCL_IB_GID_INDEX"] == "3" and isilon.env["NCCL_SOCKET_IFNAME"] == "^docker0,lo"
    # Linux cache: the small dataset on one mount, warmed up and never flushed
    assert cached.mounts["count"] == 1 and cached.warmup_runs >= 1
    assert not cached.flush_clients and not cached.flush_storage

    preview = selectors.campaign_preview(campaign=isilon)
    vgg = next(p for p in preview["shown"] if p["params"]["model"] == "vgg16" and p["params"]["nodes"] == 3)
    command = vgg["hosts"][0]["command"]
    assert "--batch_size=192" in command and "-n 24" in command  # 3 nodes x 8 GPUs from the inventory
    assert "plm_rsh_args '-p 2222'" in command and "-mca pml ob1" in command and "-mca btl '^openib'" in command
    assert command.count("/mnt/rackbench/") == 16 and "'--data_dir={data_dir}'" in command


def test_roce_vs_tcp_varies_nccl_ib_disable_with_the_tuned_parameters_per_model(inventory: None) -> None:
    (fabric,) = services.preset_instantiate(slug="seed004-roce-vs-tcp", name="airi", node_tags=["dgx"])

    points = _points(fabric)
    assert {p["env.NCCL_IB_DISABLE"] for p in points} == {0, 1}
    assert sorted({p["nodes"] for p in points}) == [1, 2, 4]
    for p in points:
        env = planning.run_env(fabric.env, p)
        assert env["NCCL_IB_DISABLE"] == str(p["env.NCCL_IB_DISABLE"])
        assert env.get("NCCL_SOCKET_IFNAME") == ("bond0" if p["env.NCCL_IB_DISABLE"] else None)
    assert not any(p["nodes"] == 1 and p["env.NCCL_IB_DISABLE"] == 1 for p in points)
    tuned = {p["model"]: (p["batch_size"], p["batch_group_size"], p["num_inter_threads"]) for p in points}
    assert tuned == {
        "resnet152": (64, 24, 10),
        "resnet50": (64, 20, 5),
        "inception3": (64, 24, 20),
        "vgg16": (64, 28, 40),
    }
    assert fabric.repetitions == 3 and fabric.warmup_runs == 1
    # one campaign: the one-GPU base (1, 2, 4, 8 GPUs of one node) and the nodes are one series per model
    gpus = sorted({p["nodes"] * p["mpi_slots"] for p in points if p["model"] == "resnet50"})
    assert gpus == [1, 2, 4, 8, 16, 32]
    assert all(p["mpi_slots"] == 8 for p in points if p["nodes"] > 1)


def test_the_nccl_presets_expect_gdrdma_between_nodes(inventory: None) -> None:
    (alone,) = services.preset_instantiate(slug="seed003-ontap-nccl", name="nccl", node_tags=["dgx"])
    suite = services.preset_instantiate(slug="seed003-ontap-validation", name="ontap", node_tags=["dgx"], storage="nas")

    assert [c.name for c in suite] == ["ontap-nccl", "ontap-fio-bandwidth", "ontap-fio-iops", "ontap-mdtest"]
    for campaign in (alone, suite[0]):
        expected = {p["nodes"]: p["expect_transport"] for p in _points(campaign)}
        assert expected == {1: "P2P", 2: "NET/IB/GDRDMA", 4: "NET/IB/GDRDMA"}
        assert campaign.env["NCCL_DEBUG"] == "INFO"  # NCCL names the transports only at INFO
    assert str(nccl.parse_transport_expectation("NET/IB/GDRDMA")) == "NET/IB/GDRDMA"


def test_presets_without_storage_in_their_needs_apply_without_one(inventory: None) -> None:
    for preset in preset_list():
        if "storage" not in preset.needs:
            assert services.preset_instantiate(slug=preset.slug, name=f"bare-{preset.slug}", node_tags=["dgx"])
