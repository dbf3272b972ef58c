"""Campaign-level node reservations: a running campaign holds its nodes until it ends; the others queue for them.

The queue rules are tested on the services (no SSH needed); the invariant (two campaigns on one lab node never
overlap, the second starts by itself once the first has finished) on real lab nodes with a real Celery worker.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import connection
from django.template.loader import render_to_string
from django.test import Client
from django.utils import timezone

from accounts.services import team_add_member
from campaigns import services
from campaigns.models import RUN_ACTIVE, Campaign, CampaignStatus, NodeLease, Run, RunStatus
from campaigns.tasks import campaign_advance_task, reconcile_runs
from inventory.models import Node, NodeStatus
from inventory.services import node_upsert
from runners.tasks import campaign_teardown_task, run_kill_task, run_start_task
from scheduling.selectors import campaign_queue
from tests.conftest import finished, wait_for
from tests.test_campaign_e2e import fio_campaign


@pytest.fixture
def nodes(db: Any) -> dict[str, Node]:
    return {f"n{i}": node_upsert(name=f"n{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)}


def launch(name: str, nodes: list[str], **overrides: Any) -> Campaign:
    data = {"name": name, "kind": "fio", "nodes": nodes, "fixed": {"bs": "4k", "size": "16M"},
            "matrix": {"rw": ["read", "write"]}, **overrides}  # fmt: skip
    return services.campaign_launch(campaign=services.campaign_apply(data=data))


def advance(campaign: Campaign) -> str:
    return services.campaign_advance(campaign_id=campaign.pk)


def fresh(campaign: Campaign) -> Campaign:
    return Campaign.objects.get(pk=campaign.pk)


def held(campaign: Campaign) -> set[str]:
    return set(NodeLease.objects.filter(campaign=campaign).values_list("node__name", flat=True))


def cancel(campaign: Campaign) -> None:
    """Cancel, then do what the kill tasks of its active runs do once they are delivered (no worker here)."""
    active = list(campaign.runs.filter(status__in=RUN_ACTIVE).values_list("pk", flat=True))
    services.campaign_cancel(campaign=campaign)
    for run_id in active:
        run_kill_task.apply(args=(run_id,))


def test_a_running_campaign_holds_its_nodes_between_runs_until_it_ends(nodes: dict[str, Node]) -> None:
    first = launch("first", ["n1", "n2"])
    second = launch("second", ["n2"])

    assert advance(first) == "started"
    run = first.runs.get(status=RunStatus.QUEUED)
    services.run_finish(run_id=run.pk, status=RunStatus.SUCCEEDED)
    assert held(first) == {"n1", "n2"}  # between its two runs too
    assert advance(second) == "waiting"

    assert advance(first) == "started"
    services.run_finish(run_id=first.runs.get(status=RunStatus.QUEUED).pk, status=RunStatus.SUCCEEDED)
    assert advance(first) == "finished"
    assert fresh(first).status == CampaignStatus.SUCCEEDED and held(first) == set()
    assert advance(second) == "started" and held(second) == {"n2"}


def test_waiting_campaigns_are_served_in_launch_order_and_a_later_one_never_overtakes(
    nodes: dict[str, Node],
) -> None:
    holder = launch("holder", ["n1"])
    assert advance(holder) == "started"
    early = launch("early", ["n1", "n2"])  # waits for n1
    late = launch("late", ["n2"])  # n2 is free, but "early" wants it and came first
    elsewhere = launch("elsewhere", ["n3"])  # wants nothing anyone wants

    assert advance(early) == "waiting" and advance(late) == "waiting"
    assert advance(elsewhere) == "started"
    assert campaign_queue(campaign=fresh(early))["position"] == 1
    assert campaign_queue(campaign=fresh(late))["position"] == 2
    assert held(late) == set() and held(early) == set()

    cancel(holder)
    assert advance(late) == "waiting"  # still behind "early"
    assert advance(early) == "started" and held(early) == {"n1", "n2"}
    assert advance(late) == "waiting"
    assert campaign_queue(campaign=fresh(late))["position"] == 1


def test_the_campaign_page_names_the_holder_to_whoever_may_see_it(
    nodes: dict[str, Node], team: Any, owner: Any, outsider: Any
) -> None:
    red = outsider.memberships.get().team
    data = {"kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "size": "16M"}, "matrix": {"rw": ["read"]}}
    first = services.campaign_launch(campaign=services.campaign_apply(data={**data, "name": "blue-first"}, team=team))
    assert advance(first) == "started"
    second = services.campaign_launch(campaign=services.campaign_apply(data={**data, "name": "red-second"}, team=red))
    assert advance(second) == "waiting"

    def queue_note(user: Any) -> str:
        client = Client()
        client.force_login(user)
        return client.get(f"/campaigns/{second.pk}/").content.decode()

    assert ">blue-first</a>" not in queue_note(outsider)  # red may not see blue's campaign
    team_add_member(team=red, user=owner)  # a member of both teams sees both
    assert ">blue-first</a>" in queue_note(owner)


def test_the_queue_partial_names_the_holder_and_the_position_in_two_queries(
    nodes: dict[str, Node], django_assert_max_num_queries: Any
) -> None:
    first = launch("first", ["n1", "n2"])
    assert advance(first) == "started"
    second = fresh(launch("second", ["n1"]))

    with django_assert_max_num_queries(2):
        html = render_to_string("scheduling/_queue.html", {"campaign": second})

    assert "n1 held by campaign" in html and ">first</a>" in html
    assert "position 1 in the queue (next)" in html
    assert render_to_string("scheduling/_queue.html", {"campaign": fresh(first)}).strip() == ""
    # launched on a free node and not yet advanced: nothing to wait for, it is taking its nodes
    third = render_to_string("scheduling/_queue.html", {"campaign": fresh(launch("third", ["n3"]))})
    assert "Starting" in third and "Waiting" not in third


def test_a_node_put_into_maintenance_is_not_used_by_a_waiting_campaign(nodes: dict[str, Node]) -> None:
    holder = launch("holder", ["n1"])
    assert advance(holder) == "started"
    waiting = launch("waiting", ["n1", "n2"])
    Node.objects.filter(name="n1").update(status=NodeStatus.MAINTENANCE)
    behind = launch("behind", ["n2"])  # not held up by a campaign that cannot start anyway

    cancel(holder)
    assert advance(waiting) == "waiting" and held(waiting) == set()
    queue = campaign_queue(campaign=fresh(waiting))
    assert [n.name for n in queue["inactive"]] == ["n1"] and queue["holders"] == []
    assert "n1 is in maintenance" in render_to_string("scheduling/_queue.html", {"campaign": fresh(waiting)})
    assert advance(behind) == "started"

    cancel(behind)
    Node.objects.filter(name="n1").update(status=NodeStatus.ACTIVE)
    assert advance(waiting) == "started" and held(waiting) == {"n1", "n2"}


def test_a_running_campaign_pauses_while_a_node_of_its_next_run_is_in_maintenance(nodes: dict[str, Node]) -> None:
    campaign = launch("paused", ["n1"])
    assert advance(campaign) == "started"
    services.run_finish(run_id=campaign.runs.get(status=RunStatus.QUEUED).pk, status=RunStatus.SUCCEEDED)
    Node.objects.filter(name="n1").update(status=NodeStatus.MAINTENANCE)

    assert advance(campaign) == "paused" and held(campaign) == {"n1"}
    assert campaign_queue(campaign=fresh(campaign))["paused"]
    Node.objects.filter(name="n1").update(status=NodeStatus.ACTIVE)
    assert advance(campaign) == "started"


def test_a_rerun_keeps_the_nodes_it_holds_and_a_later_rerun_queues_again(nodes: dict[str, Node]) -> None:
    first = launch("first", ["n1"], matrix={"rw": ["read"]})
    assert advance(first) == "started"
    second = launch("second", ["n1"], matrix={"rw": ["read"]})
    services.run_finish(run_id=first.runs.get().pk, status=RunStatus.SUCCEEDED)
    # As campaign_finish does when a verdict re-runs suspected regressions: ended, still holding its nodes.
    services.campaign_transition(campaign=first, old=CampaignStatus.RUNNING, new=CampaignStatus.SUCCEEDED)

    services.campaign_rerun(campaign=fresh(first), points=[0])
    assert fresh(first).waiting_since is None and held(first) == {"n1"}
    assert advance(first) == "started" and advance(second) == "waiting"
    services.run_finish(run_id=first.runs.get(status=RunStatus.QUEUED).pk, status=RunStatus.FAILED)
    assert advance(first) == "finished" and held(first) == set()

    services.campaign_rerun(campaign=fresh(first), failed=True)  # ended and gave its nodes back: back of the queue
    assert fresh(first).waiting_since is not None
    assert advance(first) == "waiting" and advance(second) == "started"


def test_the_reconciler_advances_waiting_campaigns(nodes: dict[str, Node]) -> None:
    launch("alone", ["n1"])  # waits for nothing but its turn

    assert reconcile_runs()["advanced"] == 1


@pytest.mark.django_db(transaction=True)
def test_only_one_of_several_campaigns_racing_for_a_node_gets_it() -> None:
    node_upsert(name="n1", address="10.0.0.1")
    # The launches commit, and a Celery worker left running by an earlier test would advance the first campaign
    # before the race: keep their advance tasks off the broker, the threads below are the only advancers.
    with mock.patch.object(campaign_advance_task, "delay"):
        campaigns = [launch(f"racer{i}", ["n1"]) for i in range(6)]
    Campaign.objects.update(waiting_since=campaigns[0].waiting_since)  # nobody is ahead of anybody but by id
    outcomes: list[str] = []
    barrier = threading.Barrier(len(campaigns))

    def race(campaign: Campaign) -> None:
        barrier.wait()
        try:
            outcomes.append(advance(campaign))
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(c,)) for c in campaigns]
    # nor the winner's first run: a worker would try it on n1 while the test database is flushed
    with mock.patch.object(run_start_task, "delay") as started:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert sorted(outcomes) == ["started"] + ["waiting"] * 5 and started.call_count == 1
    assert NodeLease.objects.get().campaign == campaigns[0]


# --- on the lab, with a real worker -----------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
def test_a_second_campaign_on_a_busy_lab_node_waits_its_turn_and_starts_when_the_first_ends(
    lab: dict[str, Any], worker: Any
) -> None:
    fixed = {"bs": "4k", "size": "8M", "runtime": 2, "time_based": 1}
    first = services.campaign_apply(data=fio_campaign("first", ["lab1"], fixed=fixed, repetitions=2))
    second = services.campaign_apply(data=fio_campaign("second", ["lab1"], fixed=fixed))
    third = services.campaign_apply(data=fio_campaign("third", ["lab2"], fixed=fixed))
    services.campaign_launch(campaign=first)
    wait_for(lambda: Run.objects.filter(campaign=first, status=RunStatus.RUNNING).exists(), what="first running")
    services.campaign_launch(campaign=second)
    services.campaign_launch(campaign=third)

    queue = wait_for(lambda: campaign_queue(campaign=fresh(second)), what="second to be waiting")
    assert queue["waiting"] and queue["position"] == 1
    assert [(h.campaign.name, h.nodes) for h in queue["holders"]] == [("first", ["lab1"])]
    assert finished(third).status == CampaignStatus.SUCCEEDED
    assert fresh(first).status == CampaignStatus.RUNNING  # the third did not wait for it
    assert not second.runs.exclude(status=RunStatus.PENDING).exists()

    assert finished(first).status == CampaignStatus.SUCCEEDED
    assert finished(second).status == CampaignStatus.SUCCEEDED  # started by itself: no beat runs here
    first_runs = list(first.runs.order_by("started_at"))
    second_runs = list(second.runs.order_by("started_at"))
    assert min(r.queued_at for r in second_runs) >= fresh(first).finished_at
    spans = sorted((r.started_at, r.finished_at) for r in first_runs + second_runs)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, "two campaigns' runs overlapped on lab1"
    assert not NodeLease.objects.exists()


def test_a_cancelled_campaign_keeps_its_nodes_until_its_running_run_is_killed(nodes: dict[str, Node]) -> None:
    holder = launch("holder", ["n1"])
    assert advance(holder) == "started"
    run = holder.runs.get(status=RunStatus.QUEUED)
    waiting = launch("waiting", ["n1"])
    assert advance(waiting) == "waiting"

    services.campaign_cancel(campaign=holder)

    assert Run.objects.get(pk=run.pk).kill_pending  # its processes may still run on n1
    assert held(holder) == {"n1"} and advance(waiting) == "waiting"
    note = render_to_string("scheduling/_queue.html", {"campaign": fresh(waiting)})
    assert "n1 held by campaign" in note and "(ended, cleaning up)" in note
    run_kill_task.apply(args=(run.pk,))
    assert not Run.objects.get(pk=run.pk).kill_pending
    assert held(holder) == set() and advance(waiting) == "started" and held(waiting) == {"n1"}


def test_a_campaign_starts_no_run_while_the_kill_of_its_timed_out_run_is_under_way(nodes: dict[str, Node]) -> None:
    campaign = launch("timing-out", ["n1"])
    assert advance(campaign) == "started"
    first = campaign.runs.get(status=RunStatus.QUEUED)

    services.run_finish(run_id=first.pk, status=RunStatus.TIMED_OUT, error="exceeded the run timeout", kill=True)

    assert advance(campaign) == "active"  # the next run would measure beside the dying one
    assert not campaign.runs.filter(status=RunStatus.QUEUED).exists()
    run_kill_task.apply(args=(first.pk,))
    assert advance(campaign) == "started" and held(campaign) == {"n1"}


def test_an_ended_campaign_keeps_its_nodes_until_its_teardown_is_done(nodes: dict[str, Node]) -> None:
    Node.objects.filter(name="n1").update(address="127.0.0.1", ssh_port=9)  # the unmount is refused at once
    campaign = launch("mounted", ["n1"], matrix={"rw": ["read"]})
    Campaign.objects.filter(pk=campaign.pk).update(mounts={"count": 1, "path": "/mnt/rb"})
    assert advance(campaign) == "started"
    services.run_finish(run_id=campaign.runs.get(status=RunStatus.QUEUED).pk, status=RunStatus.SUCCEEDED)
    waiting = launch("next", ["n1"])

    assert advance(campaign) == "finished" and fresh(campaign).status == CampaignStatus.SUCCEEDED
    assert held(campaign) == {"n1"} and advance(waiting) == "waiting"  # unmounting on n1
    campaign_teardown_task.apply(args=(campaign.pk,))
    assert held(campaign) == set() and advance(waiting) == "started"


def test_the_reconciler_resends_a_lost_kill_and_frees_the_nodes_of_a_lost_teardown(
    nodes: dict[str, Node], settings: Any
) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "STALE_AFTER": 60.0}
    killed = launch("killed", ["n1"])
    assert advance(killed) == "started"
    run = killed.runs.get(status=RunStatus.QUEUED)
    services.campaign_cancel(campaign=killed)
    torn = launch("torn", ["n2"], matrix={"rw": ["read"]})
    Campaign.objects.filter(pk=torn.pk).update(mounts={"count": 1, "path": "/mnt/rb"})
    assert advance(torn) == "started"
    services.run_finish(run_id=torn.runs.get(status=RunStatus.QUEUED).pk, status=RunStatus.SUCCEEDED)
    assert advance(torn) == "finished"

    with mock.patch.object(run_kill_task, "delay") as resent:
        assert reconcile_runs()["kills resent"] == 0  # both are recent: their tasks are still on their way
        long_ago = timezone.now() - timedelta(hours=1)
        Run.objects.filter(pk=run.pk).update(heartbeat_at=long_ago)
        Campaign.objects.filter(pk=torn.pk).update(finished_at=long_ago)
        counts = reconcile_runs()

    assert counts["kills resent"] == 1 and resent.call_args.args == (run.pk,)
    assert counts["released"] == 1 and held(torn) == set()
    assert held(killed) == {"n1"}  # its kill is still to be done


def test_a_node_set_back_to_active_wakes_the_campaign_waiting_for_it_at_once(
    nodes: dict[str, Node], django_capture_on_commit_callbacks: Any
) -> None:
    holder = launch("holder", ["n1"])
    assert advance(holder) == "started"
    waiting = launch("waiting", ["n1", "n2"])
    Node.objects.filter(name="n1").update(status=NodeStatus.MAINTENANCE)
    cancel(holder)
    assert advance(waiting) == "waiting"

    n2 = Node.objects.get(name="n2")
    with django_capture_on_commit_callbacks() as unchanged:
        n2.save()  # saved, but it was active already
    n1 = Node.objects.get(name="n1")
    n1.status = NodeStatus.ACTIVE
    with django_capture_on_commit_callbacks() as woken:
        n1.save()  # as the admin and the API save it

    assert unchanged == []
    assert [callback.args for callback in woken] == [(waiting.pk,)]
    assert campaign_advance_task.apply(args=(waiting.pk,)).get() == "started" and held(waiting) == {"n1", "n2"}
