"""Health suites: the suite files, their launch (one campaign per step), the verdict per node with reasons and
evidence, the actions (maintenance with history, Slurm drain and resume), the CLI and the API. Results are data here,
written with the ORM; tests/test_suites_lab.py runs a suite for real on the lab and drains a real Slurm node."""

from __future__ import annotations

import io
import json
from itertools import count
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from analysis import health
from campaigns import suites
from campaigns.errors import CampaignError
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunHost, RunStatus
from campaigns.services import campaign_apply, campaign_launch
from common.errors import FieldError, NotFound
from inventory.models import AllowedCommand, Node, NodeStatus
from inventory.services import node_set_status, node_store_facts, node_upsert
from plugins.launchers import slurm

_sequence = count(1)
NODES = ["n1", "n2", "n3", "n4"]


# --- suite files -------------------------------------------------------------------------------------------------


def test_the_shipped_suites_load_with_their_steps() -> None:
    found = {s.slug: s for s in suites.suite_list()}
    assert set(found) >= {"quick", "acceptance"}
    assert [s.name for s in found["quick"].steps] == ["check", "network", "collective"]
    assert {s.definition["kind"] for s in found["acceptance"].steps} >= {"command", "iperf3", "torch_dist", "fio"}
    assert found["quick"].step("network").judge == ("throughput_bps",)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("steps: []", "suite"),
        ("suite: {title: t}\nsteps: []", "steps"),
        ("suite: {title: t}\nsteps: [{name: Bad-Name, kind: fio}]", "steps[0].name"),
        ("suite: {title: t}\nsteps: [{name: a, kind: fio}, {name: a, kind: fio}]", "steps[1].name"),
        ("suite: {title: t}\nsteps: [{name: a}]", "steps[0]"),
        ("suite: {title: t}\nsteps: [{name: a, kind: fio, preset: storage-fio-iops}]", "steps[0]"),
        ("suite: {title: t}\nsteps: [{name: a, kind: fio, nodes: [x]}]", "steps[0].nodes"),
        ("suite: {title: t}\nsteps: [{name: a, preset: nothing}]", "steps[0].preset"),
        ("suite: {title: t}\nsteps: [{name: a, kind: fio, judge: bw}]", "steps[0].judge"),
    ],
)
def test_a_bad_suite_file_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(FieldError) as raised:
        suites.suite_load(text, slug="t")
    assert raised.value.field == field


def test_a_step_may_take_a_presets_campaign_with_its_own_values() -> None:
    suite = suites.suite_load(
        "suite: {title: t}\nsteps: [{name: net, preset: network-iperf3-pairs, fixed: {duration: 3, parallel: 1}}]",
        slug="t",
    )
    definition = suite.steps[0].definition
    assert definition["kind"] == "iperf3" and definition["fixed"]["duration"] == 3
    assert "parallel" not in definition["matrix"] and definition["matrix"]["reverse"] == [False, True]


def test_an_unknown_suite_is_not_found_and_names_the_known_ones() -> None:
    with pytest.raises(NotFound) as raised:
        suites.suite_get("nothing")
    assert "quick" in raised.value.message and raised.value.field == "suite"


# --- launching --------------------------------------------------------------------------------------------------


FACTS = {"kernel": "6.8.0-45-generic", "cpu_model": "AMD EPYC 9654", "cpu_cores": 96,
         "nics": [{"name": "eth0", "mtu": 9000, "speed_mbps": 100000, "state": "up"}]}  # fmt: skip


def known(name: str, address: str, team: Any = None, **facts: Any) -> Node:
    """A node whose facts were just collected: the drift gate a suite's launch runs compares them as stored (facts
    younger than RACKBENCH_FACTS_MAX_AGE are not collected again; these addresses answer nothing). The gate's
    collection itself runs on the lab in tests/test_suites_lab.py and tests/test_drift.py."""
    return node_store_facts(node=node_upsert(name=name, address=address, team=team), facts={**FACTS, **facts})


@pytest.fixture
def nodes(db: None) -> list[Node]:
    AllowedCommand.objects.create(name="health-check", program="true")
    return [known(n, f"10.0.0.{i}") for i, n in enumerate(NODES, 1)]


def test_a_suite_run_is_one_launched_campaign_per_step(nodes: list[Node]) -> None:
    created = suites.suite_launch(slug="quick", nodes=NODES, name="rack7")

    assert [c.name for c in created] == ["rack7-check", "rack7-network", "rack7-collective"]
    assert [c.family for c in created] == ["suite-quick-check", "suite-quick-network", "suite-quick-collective"]
    assert all(c.status == CampaignStatus.RUNNING for c in created)
    assert list(suites.suite_run_campaigns(name="rack7", team=None)) == created
    assert suites.step_of(created[1]) == ("quick", "network")


def test_the_sites_environment_reaches_every_step_and_a_bad_name_is_refused(nodes: list[Node]) -> None:
    created = suites.suite_launch(slug="quick", nodes=NODES, name="e1", env={"NCCL_SOCKET_IFNAME": "ib0"})
    assert all(c.env == {"NCCL_SOCKET_IFNAME": "ib0"} for c in created)
    with pytest.raises(FieldError) as raised:
        suites.suite_launch(slug="quick", nodes=NODES, name="e2", env={"BAD NAME": "x"})
    assert raised.value.field.startswith("steps.check.env")


def test_every_step_of_the_acceptance_suite_builds_on_the_nodes(nodes: list[Node]) -> None:
    created = suites.suite_launch(slug="acceptance", nodes=NODES, name="acc")
    assert [c.name for c in created] == ["acc-check", "acc-network", "acc-collective", "acc-training", "acc-storage"]
    assert created[1].repetitions == 3 and created[4].runs.count() == 2  # fio: read and write


def test_a_suite_run_may_pick_steps_and_refuses_unknown_ones_and_a_second_run_of_the_same_name(
    nodes: list[Node],
) -> None:
    created = suites.suite_launch(slug="quick", nodes=NODES, name="r1", steps=["network"])
    assert [c.name for c in created] == ["r1-network"]
    with pytest.raises(FieldError) as raised:
        suites.suite_launch(slug="quick", nodes=NODES, name="r2", steps=["nope"])
    assert raised.value.field == "steps" and "check, network, collective" in raised.value.message
    with pytest.raises(CampaignError) as conflict:
        suites.suite_launch(slug="quick", nodes=NODES, name="r1", steps=["check"])
    assert conflict.value.status == 409


def test_a_step_the_inventory_cannot_run_refuses_the_whole_run_naming_the_step(db: None) -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")  # no "health-check" on the allow-list
    with pytest.raises(FieldError) as raised:
        suites.suite_launch(slug="quick", nodes=NODES, name="r1")
    assert raised.value.field.startswith("steps.check") and "health-check" in raised.value.message
    assert not Campaign.objects.exists()


def test_a_suite_step_runs_on_a_node_in_maintenance_and_an_ordinary_campaign_does_not(nodes: list[Node]) -> None:
    node_set_status(node=nodes[0], status=NodeStatus.MAINTENANCE, reason="bad DIMM")
    assert suites.suite_launch(slug="quick", nodes=NODES, name="r1", steps=["check"])[0].status == "running"
    plain = campaign_apply(
        data={"name": "plain", "kind": "command", "nodes": NODES, "fixed": {"command": "health-check"}}
    )
    with pytest.raises(CampaignError, match="maintenance"):
        campaign_launch(campaign=plain)


# --- verdicts on stored results ------------------------------------------------------------------------------------


def step_campaign(
    run_name: str, step: str, kind: str, status: str = CampaignStatus.SUCCEEDED, names: list[str] = NODES
) -> Campaign:
    campaign = Campaign.objects.create(name=f"{run_name}-{step}", kind=kind, family=f"suite-quick-{step}",
                                       status=status, matrix=[])  # fmt: skip
    campaign.nodes.set(Node.objects.filter(name__in=names))
    return campaign


def a_run(campaign: Campaign, status: str, *, error: str = "", attempt: int = 1) -> Run:
    return Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params={}, repetition=1,
                              attempt=attempt, status=status, error=error)  # fmt: skip


def stored_suite_run(
    name: str = "r1", *, failing: str | None = "n3", slow: str | None = "n4", names: list[str] = NODES
) -> None:
    """A quick suite run: a command step on which ``failing`` exited 1, and iperf3 throughput with ``slow`` at 30 %."""
    check = step_campaign(
        name, "check", "command", CampaignStatus.FAILED if failing else CampaignStatus.SUCCEEDED, names
    )
    run = a_run(check, RunStatus.FAILED if failing else RunStatus.SUCCEEDED, error="n3: exited with code 1")
    for node in Node.objects.filter(name__in=names):
        code = 1 if node.name == failing else 0
        stderr = "GPU 2: row remap pending" if code else ""
        RunHost.objects.create(run=run, node=node, host=node.name, address=node.address, command="test",
                               remote_dir="/r", exit_code=code, stderr=stderr)  # fmt: skip
    network = step_campaign(name, "network", "iperf3", names=names)
    run = a_run(network, RunStatus.SUCCEEDED)
    for i, node in enumerate(names):
        value = 9.4e9 + 1e7 * i
        Result.objects.create(
            run=run,
            name="throughput_bps",
            unit="bit/s",
            host=node,
            value=value * (0.3 if node == slow else 1),
            labels={"peer": "x", "direction": "send"},
        )
        Result.objects.create(run=run, name="retransmits", unit="count", host=node, value=3 if node == names[0] else 0,
                              labels={"peer": "x", "direction": "send"})  # fmt: skip


@pytest.mark.django_db
def test_each_node_gets_a_verdict_with_reason_codes_and_evidence() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run()

    outcome = health.suite_run_outcome(name="r1", team=None)

    verdicts = {n.node: (n.verdict, n.reasons) for n in outcome.nodes}
    assert verdicts == {
        "n1": ("healthy", []),  # its 3 retransmits are not judged: the step judges throughput only
        "n2": ("healthy", []),
        "n3": ("failed", ["step_failed:check"]),
        "n4": ("failed", ["outlier:network.throughput_bps"]),
    }
    assert outcome.finished and outcome.counts() == {"healthy": 2, "suspect": 0, "failed": 2}
    failed, slow = outcome.nodes[2].findings[0], outcome.nodes[3].findings[0]
    assert "exited with code 1: GPU 2: row remap pending" in failed.detail and failed.run is not None
    assert slow.fleet_median == pytest.approx(9.405e9) and slow.value == pytest.approx(0.3 * 9.43e9)
    assert "30% of it" in slow.detail and slow.score is not None and slow.score < -3.5
    payload = json.loads(json.dumps(outcome.payload()))
    assert payload["nodes"][3]["evidence"][0]["code"] == "outlier:network.throughput_bps"


@pytest.mark.django_db
def test_a_node_somewhat_below_the_fleet_is_suspect_and_a_failed_collective_makes_its_members_suspect() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run(failing=None, slow=None)
    Result.objects.filter(host="n2", name="throughput_bps").update(value=9.4e9 * 0.85)  # score -3 with the 5 % floor
    collective = step_campaign("r1", "collective", "torch_dist", CampaignStatus.FAILED)
    run = a_run(collective, RunStatus.FAILED, error="mpirun exited with code 1")
    for node in Node.objects.filter(name__in=NODES[:2]):
        RunHost.objects.create(run=run, node=node, host=node.name, address=node.address, command="", remote_dir="/r")

    verdicts = {n.node: (n.verdict, n.reasons) for n in health.suite_run_outcome(name="r1", team=None).nodes}

    assert verdicts["n1"] == ("suspect", ["run_failed:collective"])
    assert verdicts["n2"] == ("suspect", ["low:network.throughput_bps", "run_failed:collective"])
    assert verdicts["n3"] == verdicts["n4"] == ("healthy", [])


@pytest.mark.django_db
def test_a_metric_the_plug_in_does_not_describe_is_judged_only_when_the_step_names_it() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run(failing=None, slow=None)
    run = Run.objects.get(campaign__name="r1-check")
    for node in NODES:  # a command step's declared pattern: n2 has half the memory, by design or not
        Result.objects.create(run=run, name="mem_total", unit="KiB", host=node, value=2**20 if node == "n2" else 2**21)

    assert {n.verdict for n in health.suite_run_outcome(name="r1", team=None).nodes} == {"healthy"}

    text = "suite: {title: t}\nsteps: [{name: check, kind: command, judge: [mem_total]}]"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suites, "suite_get", lambda slug: suites.suite_load(text, slug=slug))
        n2 = next(n for n in health.suite_run_outcome(name="r1", team=None).nodes if n.node == "n2")
    assert (n2.verdict, n2.reasons) == ("failed", ["outlier:check.mem_total"])


@pytest.mark.django_db
def test_a_retried_run_that_passed_counts_not_its_first_attempt() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run(failing="n3", slow=None)
    retry = a_run(Campaign.objects.get(name="r1-check"), RunStatus.SUCCEEDED, attempt=2)
    for node in Node.objects.filter(name__in=NODES):
        RunHost.objects.create(run=retry, node=node, host=node.name, address="a", command="t", remote_dir="/r",
                               exit_code=0)  # fmt: skip

    verdicts = {n.node: n.verdict for n in health.suite_run_outcome(name="r1", team=None).nodes}

    assert verdicts == dict.fromkeys(NODES, "healthy")


@pytest.mark.django_db
def test_a_node_that_does_not_answer_is_unreachable() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run(failing="n3", slow=None)
    Node.objects.filter(name="n3").update(suspect_since="2026-11-25T10:00:00Z", suspect_reason="connect timed out")
    RunHost.objects.filter(host="n3").update(exit_code=None)

    n3 = next(n for n in health.suite_run_outcome(name="r1", team=None).nodes if n.node == "n3")

    assert (n3.verdict, n3.reasons) == ("failed", ["unreachable"]) and "connect timed out" in n3.findings[0].detail


def test_no_such_suite_run_is_not_found(db: None) -> None:
    with pytest.raises(NotFound):
        health.suite_run_outcome(name="nothing", team=None)


# --- actions -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_actions_are_off_unless_asked_and_a_failed_node_goes_to_maintenance_with_its_reason_in_its_history() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    outcome = health.suite_run_outcome(name="r1", team=None)

    assert health.suite_run_act(outcome=outcome) == []
    assert set(Node.objects.values_list("status", flat=True)) == {"active"}

    done = health.suite_run_act(outcome=outcome, maintenance=True)

    assert [(a.node, a.action) for a in done] == [("n3", "maintenance"), ("n4", "maintenance")]
    n3 = Node.objects.get(name="n3")
    change = n3.status_changes.get()
    assert n3.status == "maintenance" and (change.old, change.new) == ("active", "maintenance")
    assert change.reason == "rackbench suite run r1: step_failed:check" and change.source == "suite run r1"
    assert health.suite_run_act(outcome=outcome, maintenance=True) == []  # already there: nothing twice


@pytest.mark.django_db
def test_a_node_comes_back_only_after_a_clean_re_run_and_one_an_administrator_took_out_stays_out() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    health.suite_run_act(outcome=health.suite_run_outcome(name="r1", team=None), maintenance=True)
    node_set_status(node=Node.objects.get(name="n1"), status=NodeStatus.MAINTENANCE, reason="new PSU")

    stored_suite_run("r2", failing="n3", slow=None)  # n3 fails again, n4 is clean now
    done = health.suite_run_act(outcome=health.suite_run_outcome(name="r2", team=None), maintenance=True)

    assert [(a.node, a.action) for a in done] == [("n4", "returned")]
    statuses = dict(Node.objects.values_list("name", "status"))
    assert statuses == {"n1": "maintenance", "n2": "active", "n3": "maintenance", "n4": "active"}
    back = Node.objects.get(name="n4").status_changes.first()
    assert back is not None and (back.new, back.reason) == ("active", "clean suite run r2")


@pytest.mark.django_db
def test_a_run_still_under_way_is_not_acted_on() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    step_campaign("r1", "collective", "torch_dist", CampaignStatus.RUNNING)
    with pytest.raises(CampaignError) as raised:
        health.suite_run_act(outcome=health.suite_run_outcome(name="r1", team=None), maintenance=True)
    assert raised.value.status == 409


# --- Slurm's command lines ----------------------------------------------------------------------------------------


def test_the_drain_is_an_argv_with_a_sanitised_reason() -> None:
    argv = slurm.drain_argv("gpu-07", "suite run r1: step_failed:check; rm -rf / `id` $(x) 'q' \"q\"\nnext")
    assert argv[:4] == ["scontrol", "update", "NodeName=gpu-07", "State=DRAIN"]
    assert argv[4] == "Reason=suite run r1: step_failed:check; rm -rf / id (x) q q next"
    assert len(slurm.drain_argv("n1", "x" * 500)[4]) == len("Reason=") + slurm.REASON_MAX
    assert slurm.drain_argv("n1", "'\"`")[4] == "Reason=rackbench health check"
    assert slurm.resume_argv("gpu-07") == ["scontrol", "update", "NodeName=gpu-07", "State=RESUME"]
    for bad in ("n1 State=RESUME", "-n1", "n1;id", ""):
        with pytest.raises(FieldError) as raised:
            slurm.drain_argv(bad, "r")
        assert raised.value.field == "node"


def test_it_reads_a_slurm_nodes_state_and_reason() -> None:
    assert slurm.node_state_argv("lab1") == ["sinfo", "-h", "-N", "-n", "lab1", "-o", "%T|%E"]
    assert slurm.parse_node_state("drained|rackbench suite run r1: step_failed:check\n") == (
        "drained",
        "rackbench suite run r1: step_failed:check",
    )
    assert slurm.parse_node_state("IDLE|none") == ("idle", "none")
    assert slurm.parse_node_state("") == ("", "")


# --- CLI and API ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_cli_lists_suites_shows_a_run_and_acts_on_it() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    out = io.StringIO()
    call_command("suite", "list", stdout=out)
    assert "quick" in out.getvalue() and "network (iperf3)" in out.getvalue()

    out = io.StringIO()
    call_command("suite", "show", "r1", stdout=out)
    assert "n3                   failed   step_failed:check" in out.getvalue()
    out = io.StringIO()
    call_command("suite", "show", "r1", "--json", stdout=out)
    assert json.loads(out.getvalue())["counts"] == {"healthy": 2, "suspect": 0, "failed": 2}

    out = io.StringIO()
    call_command("suite", "act", "r1", "--maintenance", stdout=out)
    assert "n3: maintenance (rackbench suite run r1: step_failed:check)" in out.getvalue()
    out = io.StringIO()
    call_command("suite", "act", "r1", "--maintenance", stdout=out)
    assert out.getvalue() == "no action taken\n"  # each action once per run
    with pytest.raises(CommandError, match="STEP.NAME=VALUE"):
        call_command("suite", "run", "quick", "--nodes", "n1,n2", "--param", "duration=2")


@pytest.mark.django_db
def test_the_api_launches_a_suite_and_gives_the_verdicts_and_acts_for_the_team_only(
    owner: Any, outsider: Any, team: Any
) -> None:
    AllowedCommand.objects.create(name="health-check", program="true")
    for i, n in enumerate(NODES, 1):
        known(n, f"10.0.0.{i}", team)
    api = APIClient()
    api.force_authenticate(owner)

    listed = api.get("/api/v1/suites/").json()
    assert "quick" in [s["slug"] for s in listed]
    launched = api.post("/api/v1/suites/quick/run/", {"nodes": NODES, "name": "t1", "steps": ["check"]}, format="json")
    assert launched.status_code == 201, launched.content
    assert [c["name"] for c in launched.json()["campaigns"]] == ["t1-check"]
    bad = api.post("/api/v1/suites/quick/run/", {"nodes": NODES, "steps": ["nope"]}, format="json")
    assert bad.status_code == 400 and bad.json()["extra"]["field"] == "steps"

    Campaign.objects.filter(name="t1-check").delete()
    stored_suite_run("t1")
    Campaign.objects.filter(name__startswith="t1-").update(team=team)
    answer = api.get("/api/v1/suite-runs/t1/")
    assert answer.status_code == 200
    assert {n["node"]: n["verdict"] for n in answer.json()["nodes"]}["n3"] == "failed"
    assert api.get("/api/v1/suite-runs/t1/?threshold=x").status_code == 400

    acted = api.post("/api/v1/suite-runs/t1/act/", {"maintenance": True}, format="json")
    assert acted.status_code == 200 and [a["node"] for a in acted.json()["actions"]] == ["n3", "n4"]

    other = APIClient()
    other.force_authenticate(outsider)
    assert other.get("/api/v1/suite-runs/t1/").status_code == 404
    assert other.post("/api/v1/suite-runs/t1/act/", {"maintenance": True}, format="json").status_code == 404


@pytest.mark.django_db
def test_the_suite_run_page_shows_each_nodes_verdict_with_evidence_and_refuses_the_outsider(
    owner: Any, outsider: Any, team: Any, client: Any
) -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}", team=team)
    stored_suite_run("t1")
    Campaign.objects.filter(name__startswith="t1-").update(team=team)

    client.force_login(owner)
    page = client.get("/analysis/suite-runs/t1/").content.decode()
    assert "2 healthy · 0 suspect · 2 failed" in page
    assert "step_failed:check: exited with code 1: GPU 2: row remap pending" in page
    assert "outlier:network.throughput_bps" in page and "30% of it" in page
    detail = client.get(f"/campaigns/{Campaign.objects.get(name='t1-check').pk}/").content.decode()
    assert 'href="/analysis/suite-runs/t1/"' in detail
    assert "threshold: " in client.get("/analysis/suite-runs/t1/?threshold=x").content.decode()

    client.force_login(outsider)
    assert client.get("/analysis/suite-runs/t1/").status_code == 404


@pytest.mark.django_db
def test_the_suites_page_launches_a_suite_on_the_teams_nodes_and_names_what_is_wrong(
    owner: Any, outsider: Any, team: Any, client: Any
) -> None:
    AllowedCommand.objects.create(name="health-check", program="true")
    for i, n in enumerate(NODES, 1):
        known(n, f"10.0.0.{i}", team)
    client.force_login(owner)
    assert "Run quick" in client.get("/analysis/suites/").content.decode()

    answer = client.post("/analysis/suites/", {"suite": "quick", "nodes": "n1, n2 n3", "name": "p1", "steps": "check"})

    assert answer.status_code == 302 and answer["Location"] == "/analysis/suite-runs/p1/"
    campaign = Campaign.objects.get(name="p1-check")
    assert campaign.team == team and sorted(campaign.nodes.values_list("name", flat=True)) == ["n1", "n2", "n3"]
    bad = client.post("/analysis/suites/", {"suite": "quick", "nodes": "n1 n9", "steps": "check"})
    assert bad.status_code == 400 and "no node named &#x27;n9&#x27;" in bad.content.decode()

    client.force_login(outsider)
    refused = client.post("/analysis/suites/", {"suite": "quick", "nodes": "n1", "steps": "check"})
    assert refused.status_code == 400 and "no node named &#x27;n1&#x27;" in refused.content.decode()


@pytest.mark.django_db
def test_the_verdicts_query_count_does_not_grow_with_the_nodes() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(run_name: str, names: list[str]) -> int:
        for i, n in enumerate(names, 1):
            node_upsert(name=n, address=f"10.0.1.{i}")
        stored_suite_run(run_name, failing=names[2], slow=names[3], names=names)
        with CaptureQueriesContext(connection) as captured:
            outcome = health.suite_run_outcome(name=run_name, team=None)
        assert len(outcome.nodes) == len(names) and outcome.counts()["failed"] == 2
        return len(captured)

    assert queries("small", [f"s{i}" for i in range(4)]) == queries("large", [f"l{i}" for i in range(24)])


# --- the drift gate, on by default in a suite ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_suites_drift_gate_warns_by_default_naming_node_and_field_on_the_campaign_page_and_in_the_api(
    owner: Any, team: Any, client: Any
) -> None:
    AllowedCommand.objects.create(name="health-check", program="true")
    for i, n in enumerate(NODES, 1):
        known(n, f"10.0.0.{i}", team, **({"kernel": "6.8.0-31-generic"} if n == "n2" else {}))

    created = suites.suite_launch(slug="quick", nodes=NODES, name="d1", steps=["check"], owner=owner, team=team)

    campaign = created[0]
    assert campaign.status == "running" and campaign.rules["drift"] == {"mode": "warn"}
    warning = "n2: kernel is 6.8.0-31-generic, expected 6.8.0-45-generic (3 of 4 nodes)"
    assert campaign.drift_report["messages"] == [warning]
    finding = campaign.drift_report["findings"][0]
    assert (finding["node"], finding["field"]) == ("n2", "kernel")
    outcome = health.suite_run_outcome(name="d1", team=team)
    assert outcome.payload()["drift"] == [warning] and outcome.steps[0].drift == [warning]
    api = APIClient()
    api.force_authenticate(owner)
    assert api.get(f"/api/v1/campaigns/{campaign.pk}/").json()["drift_report"]["messages"] == [warning]
    assert api.get("/api/v1/suite-runs/d1/").json()["drift"] == [warning]
    client.force_login(owner)
    assert warning in client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert warning in client.get("/analysis/suite-runs/d1/").content.decode()


@pytest.mark.django_db
def test_a_suite_run_may_refuse_on_drift_or_turn_the_gate_off() -> None:
    AllowedCommand.objects.create(name="health-check", program="true")
    for i, n in enumerate(NODES, 1):
        known(n, f"10.0.0.{i}", **({"nics": [{"name": "eth0", "mtu": 1500}]} if n == "n4" else {}))

    with pytest.raises(CampaignError) as refused:
        suites.suite_launch(slug="quick", nodes=NODES, name="d2", steps=["check"], drift="refuse")
    assert refused.value.field == "drift" and "n4: nic.eth0.mtu is 1500, expected 9000" in refused.value.message
    assert not Campaign.objects.exists()  # the whole run or nothing

    created = suites.suite_launch(slug="quick", nodes=NODES, name="d3", steps=["check"], drift="off")
    assert "drift" not in created[0].rules and created[0].drift_report == {}
    with pytest.raises(FieldError) as bad:
        suites.suite_launch(slug="quick", nodes=NODES, name="d4", drift="loud")
    assert bad.value.field == "drift.mode"


def test_a_suite_file_may_set_its_drift_gate_and_a_bad_one_names_the_field() -> None:
    text = "suite: {title: t}\ndrift: {mode: refuse, fields: [kernel]}\nsteps: [{name: a, kind: fio}]"
    assert suites.suite_load(text, slug="t").drift == {"mode": "refuse", "fields": ["kernel"]}
    assert suites.suite_load("suite: {title: t}\nsteps: [{name: a, kind: fio}]", slug="t").drift == {"mode": "warn"}
    with pytest.raises(FieldError) as raised:
        suites.suite_load("suite: {title: t}\ndrift: {mode: maybe}\nsteps: [{name: a, kind: fio}]", slug="t")
    assert raised.value.field == "drift.mode"


def test_a_launch_may_shorten_a_steps_parameters_and_a_bad_one_names_the_step(nodes: list[Node]) -> None:
    created = suites.suite_launch(
        slug="acceptance", nodes=NODES, name="short", steps=["network", "storage"],
        params={"network": {"duration": 2, "omit": 0}, "storage": {"rw": "read", "size": "64M", "runtime": 2}},
    )  # fmt: skip
    assert created[0].fixed["duration"] == 2 and created[0].fixed["parallel"] == 4
    assert created[1].fixed["rw"] == "read" and created[1].runs.count() == 1
    with pytest.raises(FieldError) as unknown:
        suites.suite_launch(slug="quick", nodes=NODES, name="s2", params={"nope": {"duration": 2}})
    assert unknown.value.field == "params" and "check, network, collective" in unknown.value.message
    with pytest.raises(FieldError) as bad:
        suites.suite_launch(slug="quick", nodes=NODES, name="s3", params={"network": {"duration": -1}})
    assert bad.value.field.startswith("steps.network.")


# --- actions taken as the run ends ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_actions_asked_at_launch_are_taken_once_when_the_last_step_has_ended() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    first = Campaign.objects.get(name="r1-check")
    assert health.suite_run_ended(campaign_id=first.pk) == "no actions"  # off by default

    Campaign.objects.filter(name__startswith="r1-").update(suite_actions={"maintenance": True})
    running = step_campaign("r1", "collective", "torch_dist", CampaignStatus.RUNNING)
    assert health.suite_run_ended(campaign_id=first.pk) == "running"
    assert set(Node.objects.values_list("status", flat=True)) == {"active"}

    Campaign.objects.filter(pk=running.pk).update(status=CampaignStatus.SUCCEEDED)
    assert health.suite_run_ended(campaign_id=running.pk) == "acted: 2"
    assert health.suite_run_ended(campaign_id=first.pk) == "acted: 0"  # the same task again: nothing twice
    node_set_status(node=Node.objects.get(name="n3"), status=NodeStatus.ACTIVE, reason="checked by hand")
    assert health.suite_run_ended(campaign_id=first.pk) == "acted: 0"  # even where a node was put back since

    assert Node.objects.get(name="n3").status == "active" and Node.objects.get(name="n4").status == "maintenance"
    assert Node.objects.get(name="n4").status_changes.count() == 1
    outcome = health.suite_run_outcome(name="r1", team=None).payload()
    assert [(a["node"], a["action"], a["automatic"]) for a in outcome["actions"]] == [
        ("n3", "maintenance", True), ("n4", "maintenance", True)
    ]  # fmt: skip
    assert outcome["actions_asked"] == {"maintenance": True}


@pytest.mark.django_db
def test_an_action_is_recorded_once_per_run_node_and_action_by_the_database() -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    first = Campaign.objects.get(name="r1-check")

    taken = suites.suite_action_record(campaign_id=first.pk, node="n3", action="drain", reason="r")
    again = suites.suite_action_record(campaign_id=first.pk, node="n3", action="drain", reason="r")

    assert taken is not None and again is None
    assert suites.suite_action_record(campaign_id=first.pk, node="n3", action="maintenance") is not None


@pytest.mark.django_db
def test_only_someone_who_may_change_the_nodes_asks_for_actions(owner: Any, team: Any, client: Any) -> None:
    AllowedCommand.objects.create(name="health-check", program="true")
    for i, n in enumerate(NODES, 1):
        known(n, f"10.0.0.{i}", team if n != "n4" else None)  # n4 is shared: no team member changes it
    api = APIClient()
    api.force_authenticate(owner)

    refused = api.post("/api/v1/suites/quick/run/", {"nodes": NODES, "name": "a1", "steps": ["check"],
                                                     "maintenance": True}, format="json")  # fmt: skip
    assert refused.status_code == 403 and "n4" in refused.json()["message"]
    assert not Campaign.objects.exists()

    asked = {"nodes": NODES[:3], "name": "a2", "steps": ["check"], "maintenance": True, "threshold": 6}
    launched = api.post("/api/v1/suites/quick/run/", asked, format="json")
    assert launched.status_code == 201, launched.content
    actions = Campaign.objects.get(name="a2-check").suite_actions
    assert actions == {"maintenance": True, "slurm_login_node": "", "threshold": 6.0, "user": owner.pk}

    nowhere = api.post(
        "/api/v1/suites/quick/run/", {**asked, "name": "a3", "slurm_login_node": "login9"}, format="json"
    )
    assert nowhere.status_code == 404 and nowhere.json()["extra"]["field"] == "slurm_login_node"

    client.force_login(owner)
    page = client.post("/analysis/suites/", {"suite": "quick", "nodes": "n1 n4", "steps": "check", "maintenance": "on"})
    assert page.status_code == 400 and "you may not change nodes n4" in page.content.decode()


# --- the live page -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_suite_run_page_polls_while_a_step_runs_and_stops_when_all_have_ended(client: Any, admin_user: Any) -> None:
    for i, n in enumerate(NODES, 1):
        node_upsert(name=n, address=f"10.0.0.{i}")
    stored_suite_run("r1")
    running = step_campaign("r1", "collective", "torch_dist", CampaignStatus.RUNNING)
    client.force_login(admin_user)

    page = client.get("/analysis/suite-runs/r1/").content.decode()
    assert 'hx-trigger="every 2s"' in page and 'hx-get="/analysis/suite-runs/r1/"' in page and "(still running)" in page
    live = client.get("/analysis/suite-runs/r1/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="suite-run-live"' in live and "<html" not in live

    Campaign.objects.filter(pk=running.pk).update(status=CampaignStatus.SUCCEEDED)
    ended = client.get("/analysis/suite-runs/r1/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="suite-run-live"' in ended and "hx-trigger" not in ended and 'data-finished="true"' in ended
