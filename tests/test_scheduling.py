"""Schedules: next run times, firings (the task beat calls, and a real beat), the pages, bad input, the timeline."""

from __future__ import annotations

import html
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler

from campaigns import services as campaign_services
from campaigns.models import Campaign, CampaignStatus
from inventory.models import Node, NodeStatus
from inventory.services import node_upsert
from rackbench.celery import app as celery_app
from scheduling import recurrence, selectors, services
from scheduling.models import Firing, Schedule
from scheduling.tasks import schedule_fire_task
from tests.conftest import ARTIFACTS, ROOT, finished, wait_for, worker_env
from tests.test_campaign_e2e import fio_campaign

UTC_TZ = ZoneInfo("UTC")
AFTER = datetime(2026, 3, 11, 3, 0, tzinfo=UTC)  # a Wednesday


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def template(team: Any) -> Campaign:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    return campaign_services.campaign_apply(data=fio_campaign("nightly-fio", ["n1"]), team=team)


def later(**delta: float) -> datetime:
    return timezone.now() + timedelta(**delta)


# --- next run times ---------------------------------------------------------------------------------


def test_it_computes_the_next_nightly_weekly_and_cron_times() -> None:
    nightly = recurrence.next_times(recurrence.nightly(time(2, 30)), after=AFTER, tz=UTC_TZ, count=3)
    weekly = recurrence.next_times(recurrence.weekly(time(2, 30), 1), after=AFTER, tz=UTC_TZ, count=2)
    weekdays = recurrence.next_times("0 */6 * * 1-5", after=datetime(2026, 3, 13, 19, 0, tzinfo=UTC), tz=UTC_TZ)

    assert [t.isoformat() for t in nightly] == [
        "2026-03-12T02:30:00+00:00", "2026-03-13T02:30:00+00:00", "2026-03-14T02:30:00+00:00",
    ]  # fmt: skip
    assert [t.strftime("%a %Y-%m-%d %H:%M") for t in weekly] == ["Mon 2026-03-16 02:30", "Mon 2026-03-23 02:30"]
    assert [t.strftime("%a %H:%M") for t in weekdays] == ["Mon 00:00", "Mon 06:00", "Mon 12:00", "Mon 18:00",
                                                          "Tue 00:00"]  # fmt: skip


def test_its_next_times_are_the_ones_celery_fires_at() -> None:
    for expression in ["30 2 * * *", "15 4 * * 0", "*/20 9-17 * * 1-5", "0 0 1 * *", "0 12 13 * 5"]:
        minute, hour, dom, month, dow = expression.split()
        cron = crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow,
                       nowfun=lambda: AFTER, app=celery_app)  # fmt: skip
        ours = recurrence.next_times(expression, after=AFTER, tz=UTC_TZ, count=1)[0]
        assert ours == AFTER + cron.remaining_estimate(AFTER), expression


def test_it_shows_times_in_the_display_time_zone(template: Campaign, settings: Any) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 0))

    upcoming = selectors.next_runs(schedule, after=datetime(2026, 7, 1, 12, 0, tzinfo=UTC), count=1)
    assert upcoming[0].isoformat() == "2026-07-02T02:00:00+02:00"
    assert schedule.periodic_task.crontab.timezone.key == "Europe/Paris"


def test_a_disabled_or_fired_schedule_has_no_next_run(template: Campaign) -> None:
    once = services.schedule_create(campaign=template, kind="once", run_at=later(hours=2))
    assert len(selectors.next_runs(once)) == 1
    services.schedule_set_enabled(schedule=once, enabled=False)

    assert selectors.next_runs(once) == []
    assert PeriodicTask.objects.get(name=services.task_name(once.pk)).enabled is False


# --- firing -------------------------------------------------------------------------------------------


def test_a_one_off_firing_launches_a_clone_named_after_its_minute(template: Campaign, owner: Any) -> None:
    run_at = later(minutes=5)
    schedule = services.schedule_create(campaign=template, kind="once", run_at=run_at, user=owner)

    assert schedule_fire_task(schedule.pk).startswith("launched nightly-fio-")

    firing = Firing.objects.get()
    assert firing.ok and firing.campaign.name == f"nightly-fio-{timezone.localtime(run_at):%Y%m%d-%H%M}"
    assert firing.due_at == run_at.replace(second=0, microsecond=0)
    assert firing.campaign.status == CampaignStatus.RUNNING and firing.campaign.team == template.team
    assert firing.campaign.owner == owner and firing.campaign.family_name == "nightly-fio"
    assert Campaign.objects.get(pk=template.pk).status == CampaignStatus.DRAFT  # the template stays a template
    assert not Schedule.objects.get(pk=schedule.pk).enabled  # a one-off fires once
    assert schedule_fire_task(schedule.pk) == "skipped"


def test_a_second_delivery_in_the_same_minute_launches_nothing_more(template: Campaign) -> None:
    schedule = services.schedule_create(campaign=template, kind="cron", cron="*/5 * * * *")
    at = timezone.now().replace(second=10)

    first = services.schedule_fire(schedule_id=schedule.pk, at=at)
    again = services.schedule_fire(schedule_id=schedule.pk, at=at + timedelta(seconds=30))

    assert first is not None and first.ok and again is None
    assert Campaign.objects.count() == 2


def test_a_clone_name_taken_in_the_same_minute_gets_a_number(template: Campaign) -> None:
    at = datetime(2026, 3, 11, 2, 0, tzinfo=UTC)
    campaign_services.campaign_clone(campaign=template, name="nightly-fio-20260311-0200")

    assert services.clone_name(template, at) == "nightly-fio-20260311-0200-2"
    campaign_services.campaign_clone(campaign=template, name="nightly-fio-20260311-0200-2")
    assert services.clone_name(template, at) == "nightly-fio-20260311-0200-3"


def fire(schedule: Schedule, at: datetime) -> str | None:
    """The name of the clone a delivery of the schedule's task at ``at`` launched; None when it launched none."""
    firing = services.schedule_fire(schedule_id=schedule.pk, at=at)
    return firing.campaign.name if firing is not None and firing.campaign else None


def test_a_late_delivery_of_an_occurrence_launches_no_second_clone(template: Campaign) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 0))

    on_time = fire(schedule, datetime(2026, 3, 11, 2, 0, 0, 40_000, tzinfo=UTC))
    late = fire(schedule, datetime(2026, 3, 11, 2, 2, 7, tzinfo=UTC))  # a worker down, then redelivered

    assert on_time == "nightly-fio-20260311-0200" and late is None
    assert list(Firing.objects.values_list("due_at", flat=True)) == [datetime(2026, 3, 11, 2, 0, tzinfo=UTC)]
    assert Campaign.objects.count() == 2


def test_a_delivery_once_the_next_occurrence_is_due_is_that_occurrences_firing(template: Campaign) -> None:
    schedule = services.schedule_create(campaign=template, kind="cron", cron="*/5 * * * *")

    first = fire(schedule, datetime(2026, 3, 11, 3, 0, 1, tzinfo=UTC))
    # a backlog: a redelivery of 03:00 runs once 03:05 is due, then 03:05's own delivery
    very_late = fire(schedule, datetime(2026, 3, 11, 3, 6, 30, tzinfo=UTC))
    next_one = fire(schedule, datetime(2026, 3, 11, 3, 6, 31, tzinfo=UTC))

    assert (first, very_late, next_one) == ("nightly-fio-20260311-0300", "nightly-fio-20260311-0305", None)
    assert Campaign.objects.count() == 3


def test_a_delivery_seconds_early_belongs_to_the_occurrence_due_not_to_the_one_before(template: Campaign) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 0))
    fire(schedule, datetime(2026, 3, 10, 2, 0, 3, tzinfo=UTC))

    # beat's clock a second ahead of the worker's
    assert fire(schedule, datetime(2026, 3, 11, 1, 59, 59, tzinfo=UTC)) == "nightly-fio-20260311-0200"


def test_an_occurrence_in_the_hour_clocks_repeat_fires_once_named_in_the_display_time_zone(
    template: Campaign, settings: Any
) -> None:
    settings.TIME_ZONE = "Europe/Paris"  # clocks go back from 03:00 to 02:00 on 2026-10-25 (01:00 UTC)
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 30))

    first = fire(schedule, datetime(2026, 10, 25, 0, 30, 2, tzinfo=UTC))  # 02:30 summer time
    again = fire(schedule, datetime(2026, 10, 25, 1, 30, 2, tzinfo=UTC))  # 02:30 winter time

    assert first == "nightly-fio-20261025-0230" and again is None


def test_a_failed_firing_is_recorded_with_its_reason_and_leaves_nothing_behind(template: Campaign, owner: Any) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(1, 0))
    Node.objects.filter(name="n1").update(status=NodeStatus.MAINTENANCE)

    assert schedule_fire_task(schedule.pk).startswith("failed:")

    firing = Firing.objects.get()
    assert firing.campaign is None and "not active (maintenance or retired): n1" in firing.error
    assert list(Campaign.objects.values_list("name", flat=True)) == ["nightly-fio"]
    assert Schedule.objects.get(pk=schedule.pk).enabled  # a recurrence goes on
    page = signed_in(owner).get(f"/schedules/{schedule.pk}/").content.decode()
    assert "failed" in page and "maintenance" in page


def test_a_schedule_whose_campaign_was_deleted_removes_its_beat_entry(template: Campaign) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(1, 0))
    template.delete()

    assert schedule_fire_task(schedule.pk) == "skipped"
    assert not PeriodicTask.objects.filter(name=services.task_name(schedule.pk)).exists()


@pytest.mark.django_db(transaction=True)  # the scheduler closes a connection it finds inside a transaction
def test_the_database_scheduler_of_beat_reads_the_stored_schedules(template: Campaign) -> None:
    once = services.schedule_create(campaign=template, kind="once", run_at=later(seconds=30))
    cron = services.schedule_create(campaign=template, kind="cron", cron="*/10 * * * *")
    off = services.schedule_create(campaign=template, kind="cron", cron="*/15 * * * *")
    services.schedule_set_enabled(schedule=off, enabled=False)

    entries = DatabaseScheduler(app=celery_app).schedule

    assert "reconcile-runs" in entries  # CELERY_BEAT_SCHEDULE is still fired
    assert services.task_name(off.pk) not in entries
    for schedule in (once, cron):
        entry = entries[services.task_name(schedule.pk)]
        assert entry.task == "scheduling.tasks.schedule_fire_task" and list(entry.args) == [schedule.pk]
    assert entries[services.task_name(cron.pk)].schedule.minute == {0, 10, 20, 30, 40, 50}


@pytest.mark.lab
@pytest.mark.worker
def test_a_real_beat_fires_a_one_off_schedule_and_the_clone_runs_on_the_lab(lab: dict[str, Any], worker: Any) -> None:
    template = campaign_services.campaign_apply(data=fio_campaign("beat-fio", ["lab3"]))
    schedule = services.schedule_create(campaign=template, kind="once", run_at=later(seconds=4))
    log = open(ARTIFACTS / "beat-scheduling.log", "w")  # noqa: SIM115 - beat writes to it until it stops
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "rackbench", "beat", "--loglevel", "INFO"],
        cwd=ROOT, env=worker_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        firing = wait_for(lambda: Firing.objects.filter(schedule=schedule).first(), timeout=60, what="beat to fire")
    finally:
        beat.terminate()
        beat.wait(timeout=20)
        log.close()
    assert firing.ok, firing.error
    assert finished(firing.campaign).status == CampaignStatus.SUCCEEDED
    assert firing.campaign.name.startswith("beat-fio-")


# --- pages ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_schedule_pages_need_a_login(client: Client, template: Campaign) -> None:
    for url in (f"/campaigns/{template.pk}/schedule/", "/schedules/", "/timeline/"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_the_owner_schedules_a_campaign_nightly_and_sees_the_next_runs(template: Campaign, owner: Any) -> None:
    client = signed_in(owner)
    assert "Times are in <strong>UTC</strong>" in client.get(f"/campaigns/{template.pk}/schedule/").content.decode()

    response = client.post(f"/campaigns/{template.pk}/schedule/", {"when": "nightly", "time": "02:30"})

    schedule = Schedule.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/schedules/{schedule.pk}/"
    assert schedule.cron == "30 2 * * *" and schedule.created_by == owner
    page = client.get(response["Location"]).content.decode()
    assert "nightly at 02:30" in page and page.count(" 02:30</li>") == 5
    weekly = client.post("/schedules/", {"campaign": "nightly-fio", "when": "weekly", "time": "06:00", "weekday": "1"})
    assert weekly.status_code == 302 and Schedule.objects.filter(cron="0 6 * * 1").exists()
    assert "weekly on Monday at 06:00" in client.get("/schedules/").content.decode()


def test_a_one_off_reads_with_its_date_and_time(template: Campaign, owner: Any) -> None:
    run_at = timezone.localtime(later(days=2)).replace(second=0, microsecond=0)
    client = signed_in(owner)

    data = {"when": "once", "run_at": f"{run_at:%Y-%m-%dT%H:%M}"}
    response = client.post(f"/campaigns/{template.pk}/schedule/", data, follow=True)

    when = f"once at {run_at:%Y-%m-%d %H:%M}"
    assert f"Scheduled nightly-fio: {when}." in response.content.decode()  # the message, over the detail page
    assert f"nightly-fio: {when}" in response.content.decode()
    assert f">{when}</a>" in client.get("/schedules/").content.decode()


def test_launch_now_launches_a_draft_and_clones_a_campaign_that_ran(template: Campaign, owner: Any) -> None:
    client = signed_in(owner)

    first = client.post(f"/campaigns/{template.pk}/schedule/", {"when": "now"})
    second = client.post(f"/campaigns/{template.pk}/schedule/", {"when": "now"})

    assert first["Location"] == f"/campaigns/{template.pk}/"
    assert Campaign.objects.get(pk=template.pk).status == CampaignStatus.RUNNING
    clone = Campaign.objects.exclude(pk=template.pk).get()
    assert second["Location"] == f"/campaigns/{clone.pk}/" and clone.status == CampaignStatus.RUNNING


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"when": "cron", "cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"when": "cron", "cron": "0 2 * *"}, "cron", "has 5 fields"),
        ({"when": "cron", "cron": "0 0 30 2 *"}, "cron", "never occurs"),
        ({"when": "once", "run_at": "2020-01-01T10:00"}, "run_at", "2020-01-01 10:00 is in the past"),
        ({"when": "once", "run_at": ""}, "run_at", "give the date and time"),
        ({"when": "nightly"}, "time", "give the time of day"),
        ({"when": "weekly", "time": "02:00"}, "weekday", "choose a day of the week"),
        ({"when": "monthly"}, "when", "Select a valid choice"),
    ],
)
def test_bad_input_gives_a_clear_form_error_and_saves_nothing(
    template: Campaign, owner: Any, data: dict[str, str], field: str, message: str
) -> None:
    response = signed_in(owner).post(f"/campaigns/{template.pk}/schedule/", data)

    assert response.status_code == 200
    errors = response.context["form"].errors
    assert message in " ".join(errors.get(field, [])), errors
    assert not Schedule.objects.exists() and not PeriodicTask.objects.filter(task__startswith="scheduling").exists()


def test_an_unknown_or_hidden_campaign_is_a_form_error(template: Campaign, outsider: Any, owner: Any) -> None:
    for user, name in ((owner, "no-such-campaign"), (outsider, "nightly-fio")):
        response = signed_in(user).post("/schedules/", {"campaign": name, "when": "nightly", "time": "02:00"})
        assert response.status_code == 200
        assert f"no campaign named &#x27;{name}&#x27;" in response.content.decode()
    assert not Schedule.objects.exists()


def test_an_outsider_gets_404_for_a_schedule_and_its_campaign(template: Campaign, outsider: Any) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 0))
    client = signed_in(outsider)

    assert client.get(f"/campaigns/{template.pk}/schedule/").status_code == 404
    assert client.post(f"/campaigns/{template.pk}/schedule/", {"when": "now"}).status_code == 404
    assert client.get(f"/schedules/{schedule.pk}/").status_code == 404
    assert client.post(f"/schedules/{schedule.pk}/toggle/").status_code == 404
    assert client.post(f"/schedules/{schedule.pk}/delete/").status_code == 404
    assert "nightly-fio" not in client.get("/schedules/").content.decode()
    assert Schedule.objects.get().enabled and Campaign.objects.get().status == CampaignStatus.DRAFT


def test_the_owner_disables_enables_and_deletes_a_schedule(template: Campaign, member: Any) -> None:
    schedule = services.schedule_create(campaign=template, kind="nightly", at=time(2, 0))
    client = signed_in(member)

    client.post(f"/schedules/{schedule.pk}/toggle/")
    assert (
        not Schedule.objects.get().enabled
        and not PeriodicTask.objects.get(name=services.task_name(schedule.pk)).enabled
    )
    assert "None: the schedule is disabled" in client.get(f"/schedules/{schedule.pk}/").content.decode()
    client.post(f"/schedules/{schedule.pk}/toggle/")
    assert Schedule.objects.get().enabled
    assert client.post(f"/schedules/{schedule.pk}/delete/")["Location"] == "/schedules/"
    assert (
        not Schedule.objects.exists() and not PeriodicTask.objects.filter(name=services.task_name(schedule.pk)).exists()
    )


def test_the_schedule_list_shows_past_firings_in_a_fixed_number_of_queries(
    template: Campaign, owner: Any, django_assert_max_num_queries: Any
) -> None:
    for hour in range(5):
        schedule = services.schedule_create(campaign=template, kind="nightly", at=time(hour, 0))
        services.schedule_fire(schedule_id=schedule.pk, at=later(minutes=hour))
    client = signed_in(owner)

    with django_assert_max_num_queries(5):  # session, user, teams, the schedules with their counts
        page = client.get("/schedules/").content.decode()
    assert page.count("nightly-fio") >= 5 and "nightly at 04:00" in page
    detail = client.get(f"/schedules/{schedule.pk}/").content.decode()
    firing = Firing.objects.get(schedule=schedule)
    assert f'href="/campaigns/{firing.campaign.pk}/"' in detail and "launched" in detail


def test_the_timeline_shows_holders_queues_and_next_firings_and_hides_other_teams_names(
    team: Any, owner: Any, outsider: Any, django_assert_max_num_queries: Any
) -> None:
    for i in range(1, 4):
        node_upsert(name=f"shared{i}", address=f"10.0.1.{i}", tags=["rack"])  # no team: every team sees them
    holder = campaign_services.campaign_launch(
        campaign=campaign_services.campaign_apply(data=fio_campaign("holder", ["shared1"]), team=team)
    )
    assert campaign_services.campaign_advance(campaign_id=holder.pk) == "started"
    waiting = campaign_services.campaign_launch(
        campaign=campaign_services.campaign_apply(data=fio_campaign("waiter", ["shared1"]), team=team)
    )
    tagged = campaign_services.campaign_apply(data=fio_campaign("tagged", [], node_tags=["rack"]), team=team)
    services.schedule_create(campaign=tagged, kind="once", run_at=later(hours=3))
    services.schedule_create(campaign=tagged, kind="once", run_at=later(hours=30))  # beyond the next 24 h

    client = signed_in(owner)
    with django_assert_max_num_queries(10):
        page = client.get("/timeline/").content.decode()
    assert (
        f'href="/campaigns/{holder.pk}/">holder</a>' in page and f'href="/campaigns/{waiting.pk}/">waiter</a>' in page
    )
    assert page.count(": tagged</title>") == 3  # one firing on each of the three tagged nodes
    rows = selectors.timeline(scope=_scope(owner))
    assert [(r.node.name, [w.campaign.name for w in r.waiting]) for r in rows][0] == ("shared1", ["waiter"])
    hidden = html.unescape(signed_in(outsider).get("/timeline/").content.decode())
    assert "holder" not in hidden and "waiter" not in hidden and "tagged" not in hidden
    assert "another team's campaign" in hidden and "another team's schedule" in hidden


def _scope(user: Any) -> Any:
    from accounts.selectors import Scope

    return Scope(user=user)


def test_the_timeline_puts_a_firing_on_the_nodes_a_launch_would_use(
    team: Any, outsider: Any, django_user_model: Any
) -> None:
    red = outsider.memberships.get().team
    for name, node_team, status, tags in [
        ("mine-maintenance", team, NodeStatus.MAINTENANCE, ["rack"]),  # named: selected (the launch refuses it)
        ("mine-tagged", team, NodeStatus.ACTIVE, ["rack"]),
        ("mine-retired", team, NodeStatus.RETIRED, ["rack"]),
        ("mine-untagged", team, NodeStatus.ACTIVE, []),
        ("shared-tagged", None, NodeStatus.ACTIVE, ["rack"]),
        ("shared-maintenance", None, NodeStatus.MAINTENANCE, ["rack"]),
        ("theirs-tagged", red, NodeStatus.ACTIVE, ["rack"]),
    ]:
        node_upsert(name=name, address=f"10.0.2.{len(name)}", team=node_team, status=status, tags=tags)
    campaign = campaign_services.campaign_apply(
        data=fio_campaign("tagged", ["mine-maintenance"], node_tags=["rack"]), team=team
    )
    schedule = services.schedule_create(campaign=campaign, kind="once", run_at=later(hours=3))
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")  # sees every team's nodes

    rows = selectors.timeline(scope=_scope(root))

    shown = [r.node.name for r in rows if any(f["schedule"].pk == schedule.pk for f in r.firings)]
    assert shown == [n.name for n in campaign_services.campaign_target_nodes(campaign=campaign)]
    assert shown == ["mine-maintenance", "mine-tagged", "shared-tagged"]
