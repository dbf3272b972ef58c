"""What campaign_apply accepts, the plug-in builds on every host and reads back: every preset, every example and
each plug-in's parameter space walked; the API and HTML previews answer the same, never a 500."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.urls import reverse
from rest_framework.test import APIClient

from campaigns import planning, selectors, services
from campaigns.models import Campaign
from campaigns.presets import preset_list
from campaigns.spec import SpecError, load_yaml
from inventory.services import node_upsert, storage_upsert
from plugins.benchmarks import fio, ior, iperf, mdtest, nccl, storage_read
from plugins.benchmarks import training as t
from plugins.benchmarks.base import ParamError, get_benchmark
from plugins.launchers.mpi import MPI_PARAMS

pytestmark = pytest.mark.django_db

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "campaigns").glob("*.yaml"))
PARTS = [(p.slug, i) for p in preset_list() for i in range(len(p.campaigns))]


@pytest.fixture
def inventory(team: Any) -> None:
    for i in range(1, 31):  # seed 001 scales to 30 nodes
        node_upsert(name=f"dgx{i}", address=f"10.0.0.{i}", tags=["dgx"], gpu_count=8, team=team)
    for i in range(1, 5):
        node_upsert(name=f"lab{i}", address=f"127.0.1.{i}", tags=["lab"], team=team)
    for name in ("nas", "lab-local", "aff-a800", "ai400"):
        storage_upsert(name=name, kind="nfs", data_addresses=["10.1.0.1", "10.1.0.2"], export_path="/export", team=team)


def _apply_and_walk(data: dict[str, Any], team: Any) -> Campaign:
    """Apply, then build every point on each of its hosts and check its (empty) results as collection does."""
    campaign = services.campaign_apply(data=data, team=team)
    benchmark = get_benchmark(campaign.kind)
    selectors.campaign_build_check(campaign=campaign)
    for params in planning.expand(campaign.matrix, campaign.fixed, campaign.rules):
        benchmark.check(planning.benchmark_params(params), [], {})  # what collection hands it
    return campaign


def _previews_agree(campaign: Campaign, owner: Any) -> None:
    api = APIClient()
    api.force_login(owner)
    answer = api.get(f"/api/v1/campaigns/{campaign.pk}/preview/")
    page = api.get(reverse("campaigns:campaign-preview", args=[campaign.pk]))
    assert answer.status_code == 200 and page.status_code == 200
    text = page.content.decode()
    for point in answer.json()["shown"]:
        for host in point["hosts"]:
            for command in (host["command"], host["service"]):
                assert html.escape(command) in text, command


@pytest.mark.parametrize(("slug", "part"), PARTS, ids=[f"{s}[{i}]" for s, i in PARTS])
def test_every_preset_part_applies_builds_and_previews_the_same_in_api_and_html(
    inventory: None, owner: Any, team: Any, slug: str, part: int
) -> None:
    preset = next(p for p in preset_list() if p.slug == slug)
    data = preset.definition(preset.campaigns[part], name=f"walk-{part}")
    data.update(node_tags=["dgx"], storage="nas")
    _previews_agree(_apply_and_walk(data, team), owner)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_applies_builds_and_previews_the_same_in_api_and_html(
    inventory: None, owner: Any, team: Any, path: Path
) -> None:
    _previews_agree(_apply_and_walk(load_yaml(path.read_text()), team), owner)


def test_a_fixed_node_count_means_what_the_matrix_axis_means(inventory: None, team: Any) -> None:
    """The preset that was accepted, ran, then failed at collection with 'nodes: unknown iperf3 parameter'."""
    for nodes in ({"fixed": {"nodes": 2}}, {"matrix": {"nodes": [2]}}):
        data = {"name": f"pairs-{len(Campaign.objects.all())}", "kind": "iperf3", "node_tags": ["dgx"], **nodes}
        campaign = _apply_and_walk(data, team)
        assert [len(p["hosts"]) for p in selectors.campaign_preview(campaign=campaign)["shown"]] == [2]
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(
            data={"name": "n9", "kind": "iperf3", "node_tags": ["dgx"], "fixed": {"nodes": 40}}, team=team
        )
    assert caught.value.field == "fixed.nodes"


@pytest.mark.parametrize(
    ("fixed", "field", "message"),
    [
        ({"topology": "pairs", "nodes": 3}, "fixed.topology", "even number of hosts"),
        ({"topology": "all_to_all", "port": 65530}, "fixed.port", "past 65535"),
        ({"kind": "nccl", "gpus_per_rank": 3}, "fixed.gpus_per_rank", "not a multiple of 3"),
        ({"kind": "tf_cnn_benchmarks", "script": "/opt/tf.py", "data_source": "storage", "data_dirs_round_robin": True},
         "fixed.data_dirs_round_robin", "no mount points"),
    ],
)  # fmt: skip
def test_apply_refuses_what_the_plug_in_refuses_to_build_naming_the_field(
    inventory: None, team: Any, fixed: dict[str, Any], field: str, message: str
) -> None:
    """Each passed the plug-in's validate(): only building the commands for the run's hosts finds them."""
    kind = fixed.pop("kind", "iperf3")
    data = {"name": "refused", "kind": kind, "node_tags": ["dgx"], "fixed": fixed}
    with pytest.raises(SpecError, match=message) as caught:
        services.campaign_apply(data=data, team=team)
    assert caught.value.field == field
    assert not Campaign.objects.filter(name="refused").exists()


def test_a_stored_campaign_the_plug_in_no_longer_builds_answers_400_in_the_api_and_explains_in_html(
    inventory: None, owner: Any, team: Any
) -> None:
    campaign = services.campaign_apply(data={"name": "odd", "kind": "iperf3", "node_tags": ["dgx"]}, team=team)
    Campaign.objects.filter(pk=campaign.pk).update(fixed={"nodes": 3})  # stored before the plug-in refused it
    api = APIClient()
    api.force_login(owner)
    answer = api.get(f"/api/v1/campaigns/{campaign.pk}/preview/")
    page = api.get(reverse("campaigns:campaign-preview", args=[campaign.pk]))
    assert answer.status_code == 400
    assert answer.json()["extra"]["field"] == "topology"
    assert page.status_code == 200
    assert html.escape(answer.json()["message"]) in page.content.decode()


# --- each plug-in's parameter space ------------------------------------------------------------------------------

TRAINING = {"tf_cnn_benchmarks": "tf_cnn", "pytorch_resnet": "pytorch_resnet", "mlperf_resnet": "mlperf"}
BASE: dict[str, dict[str, Any]] = {
    "fio": {"rw": "read"},
    "tf_cnn_benchmarks": {"script": "/opt/tf_cnn_benchmarks.py"},
    "pytorch_resnet": {"script": "/opt/resnet/main.py"},
    "mlperf_resnet": {"script": "/opt/mlperf/train.py", "data_dir": "/data"},
}
# Values of every shape a YAML file gives: booleans, integers at and past common limits, sizes, durations, words,
# paths, text with blanks, empty text and fractions.
PROBES: list[Any] = [
    True,
    False,
    0,
    1,
    2,
    "true",
    "20",
    64,
    65535,
    "4k",
    "1M",
    "30s",
    "read",
    "/data/x",
    "a b",
    "",
    2.5,
]


def _names(kind: str) -> list[str]:
    if kind == "fio":
        return [*fio.FIO_OPTIONS, *fio.CONTROL_PARAMS, "client_mode", "client_port"]
    if kind in ("iperf2", "iperf3"):
        return list(iperf.PARAMS)
    if kind in TRAINING:
        module = __import__(f"plugins.benchmarks.{TRAINING[kind]}", fromlist=["OPTIONS"])
        return [*t.COMMON, *module.OPTIONS, *MPI_PARAMS]
    known = {"ior": ior.KNOWN, "mdtest": mdtest.KNOWN, "storage_read": storage_read.KNOWN, "nccl": nccl.KNOWN_PARAMS}
    return sorted({*known[kind], *MPI_PARAMS})


@pytest.mark.parametrize("kind", [*BASE, "iperf3", "iperf2", "ior", "mdtest", "storage_read", "nccl"])
def test_each_value_of_each_parameter_is_refused_at_apply_or_built(inventory: None, team: Any, kind: str) -> None:
    accepted = 0
    for name in _names(kind):
        for value in PROBES:
            data = {
                "name": "probe",
                "kind": kind,
                "node_tags": ["dgx"],
                "storage": "nas",
                "fixed": {**BASE.get(kind, {}), name: value},
            }
            try:
                with transaction.atomic():
                    _apply_and_walk(data, team)
                    accepted += 1
                    transaction.set_rollback(True)
            except SpecError as exc:  # refused at apply: with the field named
                assert exc.field, (name, value, exc)
            except ParamError as exc:  # pragma: no cover - accepted at apply, then not built or not read back
                pytest.fail(f"{kind}: {name}={value!r} was accepted at apply but then refused: {exc}")
    assert accepted
