"""Campaign definition, launch, scheduling and statistics services (no SSH needed)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from campaigns import selectors, services
from campaigns.models import Campaign, CampaignStatus, NodeLease, Result, Run, RunStatus
from campaigns.spec import SpecError, load_yaml
from campaigns.tasks import reconcile_runs
from inventory.models import NodeStatus
from inventory.services import node_upsert

FIXTURES = Path(__file__).parent / "fixtures" / "fio"
pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes() -> list[Any]:
    return [node_upsert(name=f"n{i}", address=f"10.0.0.{i}", tags=["rack1"]) for i in (1, 2)]


def spec(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "c1",
        "kind": "fio",
        "nodes": ["n1", "n2"],
        "repetitions": 3,
        "warmup_runs": 1,
        "fixed": {"bs": "4k", "size": "16M"},
        "matrix": {"rw": ["read", "randread"], "numjobs": [1, 4]},
    }
    data.update(overrides)
    return data


def test_it_applies_a_campaign_and_previews_every_command(nodes: list[Any]) -> None:
    campaign = services.campaign_apply(data=spec())

    preview = selectors.campaign_preview(campaign=campaign)
    assert (preview["points"], preview["runs"]) == (4, 16)
    assert [p["params"]["rw"] for p in preview["shown"]] == ["read", "read", "randread", "randread"]
    host = preview["shown"][1]["hosts"][1]
    assert host["host"] == "n2" and "fio" in host["command"] and "--output-format=json" in host["command"]
    assert "numjobs=4" in host["files"]["job.fio"] and "directory=/root/.rackbench/data/n2" in host["files"]["job.fio"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"bogus": 1}, "bogus"),
        ({"name": "has space"}, "name"),
        ({"repetitions": 0}, "repetitions"),
        ({"repetitions": "3"}, "repetitions"),
        ({"matrix": {"rw": []}}, "matrix.rw"),
        ({"matrix": {"rw": ["read", "read"]}}, "matrix.rw"),
        ({"matrix": {"rw": ["raed"]}}, "matrix.rw"),
        ({"fixed": {"bs": "4k", "exec_prerun": "rm -rf /"}}, "fixed.exec_prerun"),
        ({"fixed": {"bs": ["4k"]}}, "fixed.bs"),
        ({"nodes": ["n1", "nope"]}, "nodes[1]"),
        ({"nodes": [], "node_tags": []}, "nodes"),
        ({"node_tags": ["missing-tag"]}, "node_tags[0]"),
        ({"storage": "nas"}, "storage"),
        ({"cache": {"flush_storage": True}}, "cache.flush_storage"),
        ({"cache": {"flush_clients": "yes"}}, "cache.flush_clients"),
        ({"kind": "nope"}, "kind"),
    ],
)
def test_it_refuses_a_bad_campaign_naming_the_field_and_creates_nothing(
    nodes: list[Any], change: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=spec(**change))

    assert caught.value.field == field
    assert not Campaign.objects.exists()


def test_it_reports_where_a_yaml_file_is_malformed() -> None:
    with pytest.raises(SpecError, match="line 4, column 1"):
        load_yaml("name: x\nkind: fio\nmatrix: {rw: [read\n")


def test_it_refuses_a_matrix_over_the_run_limit(nodes: list[Any], settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "MAX_RUNS_PER_CAMPAIGN": 15}

    with pytest.raises(SpecError, match="16 runs, more than the limit of 15"):
        services.campaign_apply(data=spec())


def test_it_creates_every_run_at_launch_with_warmups_first(nodes: list[Any]) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec()))

    runs = list(campaign.runs.order_by("sequence"))
    assert campaign.status == CampaignStatus.RUNNING and len(runs) == 16
    assert [(r.point, r.repetition, r.is_warmup) for r in runs[:4]] == [
        (0, 0, True),
        (0, 1, False),
        (0, 2, False),
        (0, 3, False),
    ]
    assert all(r.status == RunStatus.PENDING and r.hosts.count() == 2 for r in runs)


def test_it_refuses_to_launch_twice_or_change_a_launched_campaign(nodes: list[Any]) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec()))

    with pytest.raises(services.CampaignError) as launched:
        services.campaign_launch(campaign=campaign)
    with pytest.raises(services.CampaignError) as changed:
        services.campaign_apply(data=spec(repetitions=1))
    assert launched.value.conflict and changed.value.conflict
    assert campaign.runs.count() == 16


def test_it_refuses_to_launch_on_a_node_in_maintenance(nodes: list[Any]) -> None:
    campaign = services.campaign_apply(data=spec())
    nodes[1].status = NodeStatus.MAINTENANCE
    nodes[1].save()

    with pytest.raises(services.CampaignError, match="n2"):
        services.campaign_launch(campaign=campaign)
    assert campaign.runs.count() == 0


def test_it_selects_active_nodes_by_tag(nodes: list[Any]) -> None:
    node_upsert(name="n3", address="10.0.0.3", tags=["rack1"], status=NodeStatus.RETIRED)
    campaign = services.campaign_apply(data=spec(nodes=[], node_tags=["rack1"]))

    assert [n.name for n in services.campaign_target_nodes(campaign=campaign)] == ["n1", "n2"]


def test_it_keeps_a_second_campaign_off_busy_nodes_until_the_first_ends(nodes: list[Any]) -> None:
    first = services.campaign_launch(campaign=services.campaign_apply(data=spec(name="a")))
    second = services.campaign_launch(campaign=services.campaign_apply(data=spec(name="b", nodes=["n2"])))

    assert services.campaign_advance(campaign_id=first.pk) == "started"
    assert services.campaign_advance(campaign_id=first.pk) == "active"
    assert services.campaign_advance(campaign_id=second.pk) == "waiting"
    run = first.runs.get(status=RunStatus.QUEUED)
    assert set(NodeLease.objects.values_list("node__name", "campaign_id")) == {("n1", first.pk), ("n2", first.pk)}

    assert services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)
    assert services.campaign_advance(campaign_id=second.pk) == "waiting"  # the first holds n2 until it ends
    services.campaign_cancel(campaign=first)
    assert not NodeLease.objects.exists()
    assert services.campaign_advance(campaign_id=second.pk) == "started"


def test_a_transition_from_the_wrong_state_changes_nothing(nodes: list[Any]) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec()))
    run = campaign.runs.first()

    assert not services.run_transition(run_id=run.pk, old=[RunStatus.RUNNING], new=RunStatus.COLLECTING)
    assert services.run_finish(run_id=run.pk, status=RunStatus.CANCELLED)
    assert not services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_it_finishes_a_campaign_when_its_last_run_ends(nodes: list[Any]) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec(repetitions=1, warmup_runs=0)))
    for run in campaign.runs.all():
        services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)

    assert services.campaign_advance(campaign_id=campaign.pk) == "finished"
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.SUCCEEDED


def test_it_summarises_repetitions_and_leaves_warmups_out(nodes: list[Any]) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec(matrix={"rw": ["read"]})))
    values = {0: 999.0, 1: 100.0, 2: 110.0, 3: 120.0}  # repetition 0 is the warm-up
    for run in campaign.runs.all():
        services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)
        Result.objects.create(run=run, name="bw_bytes", value=values[run.repetition], unit="B/s")
        Result.objects.create(run=run, name="bw_bytes", value=1.0, unit="B/s", host="n1")

    (row,) = selectors.campaign_summary(campaign=campaign)
    assert row["n"] == 3 and row["mean"] == pytest.approx(110.0) and row["median"] == 110.0
    assert row["stdev"] == pytest.approx(10.0) and (row["min"], row["max"]) == (100.0, 120.0)
    assert row["cv"] == pytest.approx(10.0 / 110.0)


def test_the_reconciler_fails_a_run_it_may_not_resume_any_more(nodes: list[Any], settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "MAX_RESUMES": 1, "STALE_AFTER": 60}
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=spec(repetitions=1, warmup_runs=0)))
    stale = timezone.now() - timezone.timedelta(minutes=5)
    run = campaign.runs.first()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, heartbeat_at=stale, resumes=1)

    counts = reconcile_runs()

    run.refresh_from_db()
    assert counts["failed"] == 1
    assert run.status == RunStatus.FAILED and "abandoned: no worker made progress" in run.error


def test_parse_output_prints_the_metrics_as_json() -> None:
    out = io.StringIO()
    call_command("parse_output", "--kind", "fio", str(FIXTURES / "fio-3.33-read.json"), "--json", stdout=out)

    metrics = json.loads(out.getvalue())
    doc = json.loads((FIXTURES / "fio-3.33-read.json").read_text())
    totals = {m["name"]: m["value"] for m in metrics if not m["labels"]}
    assert totals["read_bw_bytes"] == sum(job["read"]["bw_bytes"] for job in doc["jobs"])
    assert {m["host"] for m in metrics} == {"fio-3.33-read"}


def test_import_results_stores_a_run_made_by_hand(nodes: list[Any]) -> None:
    campaign = services.campaign_apply(data=spec())
    files = [str(FIXTURES / "fio-3.33-read.json"), str(FIXTURES / "fio-3.33-write.json")]

    call_command("import_results", "--campaign", "c1", "--kind", "fio", *files, stdout=io.StringIO())

    run = campaign.runs.get()
    assert run.status == RunStatus.SUCCEEDED and run.provenance["imported"]
    hosts = set(run.results.values_list("host", flat=True))
    assert hosts == {"fio-3.33-read", "fio-3.33-write", ""}


def test_campaign_apply_names_the_file_and_the_field(tmp_path: Path, nodes: list[Any]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: c2\nkind: fio\nnodes: [n1]\nfixed: {bs: 4k}\nmatrix: {rw: [read, 'x; rm -rf ~']}\n")

    with pytest.raises(CommandError, match=r"bad.yaml: matrix.rw"):
        call_command("campaign", "apply", str(bad))
    assert not Campaign.objects.exists()


def test_campaign_export_round_trips(tmp_path: Path, nodes: list[Any]) -> None:
    services.campaign_apply(data=spec())
    out = io.StringIO()
    call_command("campaign", "export", "c1", stdout=out)

    exported = load_yaml(out.getvalue())
    assert exported["matrix"] == {"rw": ["read", "randread"], "numjobs": [1, 4]}
    exported["name"] = "c1-copy"
    services.campaign_apply(data=exported)
    assert selectors.campaign_preview(campaign=Campaign.objects.get(name="c1-copy"))["runs"] == 16
