"""Every state change of schedules: create, enable/disable, delete, fire; and launching a campaign now.

A schedule's beat entry (a django-celery-beat ``PeriodicTask`` named ``rackbench-schedule-<id>``) is created,
switched and deleted in the same transaction as the schedule, so beat never fires a schedule that is not there.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, PeriodicTask, PeriodicTasks

from campaigns.models import Campaign, CampaignStatus
from campaigns.selectors import unused_name
from campaigns.services import CampaignError, campaign_clone, campaign_launch
from campaigns.spec import SpecError
from common.errors import ApplicationError
from scheduling import recurrence
from scheduling.models import Firing, Schedule, ScheduleKind

log = logging.getLogger(__name__)
FIRE_TASK = "scheduling.tasks.schedule_fire_task"
# Beat and a worker on another machine may disagree a little about the time: a delivery this much before an
# occurrence belongs to it, not to the one before (which has fired already: the delivery would be dropped).
CLOCK_SKEW = timedelta(seconds=5)


class ScheduleError(ApplicationError, ValueError):
    """Bad input for a schedule; ``field`` names the form field at fault."""


def display_tz() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


def task_name(schedule_id: int) -> str:
    return f"rackbench-schedule-{schedule_id}"


def clone_name(campaign: Campaign, at: datetime) -> str:
    """``<name>-YYYYMMDD-HHMM`` (local time), cut to fit the 100-character limit, with ``-2``, ``-3``... when
    that name is taken (two firings in one minute)."""
    stamp = f"-{timezone.localtime(at, display_tz()):%Y%m%d-%H%M}"
    return unused_name(campaign.name[: 100 - len(stamp) - 4] + stamp, campaign.team)


def _cron_for(kind: str, *, at: Any = None, weekday: int | None = None, cron: str = "") -> str:
    if kind == ScheduleKind.NIGHTLY:
        if at is None:
            raise ScheduleError("give the time of day (HH:MM)", field="time")
        return recurrence.nightly(at)
    if kind == ScheduleKind.WEEKLY:
        if at is None:
            raise ScheduleError("give the time of day (HH:MM)", field="time")
        if weekday is None or not 0 <= weekday <= 6:
            raise ScheduleError("choose a day of the week", field="weekday")
        return recurrence.weekly(at, weekday)
    expression = " ".join(cron.split())
    if not expression:
        raise ScheduleError("give a cron expression, e.g. 0 2 * * 1-5", field="cron")
    try:
        upcoming = recurrence.next_times(expression, after=timezone.now(), tz=display_tz(), count=1)
    except recurrence.RecurrenceError as exc:
        raise ScheduleError(str(exc), field="cron") from None
    if not upcoming:
        raise ScheduleError(f"{expression!r} never fires", field="cron")
    return expression


def schedule_create(
    *,
    campaign: Campaign,
    kind: str,
    run_at: datetime | None = None,
    at: Any = None,
    weekday: int | None = None,
    cron: str = "",
    user: Any = None,
) -> Schedule:
    """A schedule of ``campaign`` and its beat entry. ``at``/``weekday`` (0 = Sunday) make nightly and weekly
    recurrences, ``cron`` any other; ``run_at`` is the one time of a one-off. Raises ScheduleError; saves
    nothing then."""
    if kind not in ScheduleKind.values:
        raise ScheduleError(f"unknown kind {kind!r}", field="when")
    if kind == ScheduleKind.ONCE:
        if run_at is None:
            raise ScheduleError("give the date and time to launch at", field="run_at")
        if run_at <= timezone.now():
            when = timezone.localtime(run_at, display_tz())
            raise ScheduleError(f"{when:%Y-%m-%d %H:%M} is in the past", field="run_at")
        expression = ""
    else:
        expression = _cron_for(kind, at=at, weekday=weekday, cron=cron)
    with transaction.atomic():
        schedule = Schedule.objects.create(
            campaign=campaign, kind=kind, run_at=run_at if kind == ScheduleKind.ONCE else None, cron=expression,
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )  # fmt: skip
        schedule.periodic_task = PeriodicTask.objects.create(
            name=task_name(schedule.pk),
            task=FIRE_TASK,
            args=json.dumps([schedule.pk]),
            description=f"rackbench: launch a clone of campaign {campaign.name} ({schedule.describe()})",
            **_beat_schedule(schedule),
        )
        schedule.save(update_fields=["periodic_task"])
    return schedule


def _beat_schedule(schedule: Schedule) -> dict[str, Any]:
    if schedule.kind == ScheduleKind.ONCE:
        return {"clocked": ClockedSchedule.objects.create(clocked_time=schedule.run_at), "one_off": True}
    minute, hour, day_of_month, month, day_of_week = schedule.cron.split()
    crontab, _ = CrontabSchedule.objects.get_or_create(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month, day_of_week=day_of_week,
        timezone=settings.TIME_ZONE,
    )  # fmt: skip
    return {"crontab": crontab}


def schedule_set_enabled(*, schedule: Schedule, enabled: bool) -> Schedule:
    """Switch a schedule (and its beat entry) on or off; a one-off whose time has passed cannot come back."""
    if enabled and schedule.kind == ScheduleKind.ONCE and schedule.run_at and schedule.run_at <= timezone.now():
        raise ScheduleError("its time has passed: schedule it again at a new time")
    with transaction.atomic():
        Schedule.objects.filter(pk=schedule.pk).update(enabled=enabled)
        PeriodicTask.objects.filter(name=task_name(schedule.pk)).update(enabled=enabled)
        # django-celery-beat's own signals do not see queryset updates: tell beat to reread its schedule.
        PeriodicTasks.update_changed()
    schedule.enabled = enabled
    return schedule


def schedule_delete(*, schedule: Schedule) -> None:
    """The schedule, its firings and its beat entry; the campaigns it launched stay."""
    with transaction.atomic():
        _beat_entry_delete(schedule.pk)
        schedule.delete()


def _beat_entry_delete(schedule_id: int) -> None:
    task = PeriodicTask.objects.filter(name=task_name(schedule_id)).select_related("clocked").first()
    if task is not None:
        clocked = task.clocked
        task.delete()  # a model delete: django-celery-beat's signal tells beat
        if clocked is not None:
            clocked.delete()


def occurrence(schedule: Schedule, *, at: datetime) -> datetime:
    """The occurrence a delivery of the schedule's task at ``at`` belongs to, to the minute: a one-off's time, or
    the latest time its recurrence fires at or before ``at`` (in the display time zone, as beat fires it). A
    delivery so late that a later occurrence is due belongs to that one; a recurrence that never fired before
    ``at`` gives ``at``'s own minute."""
    if schedule.kind == ScheduleKind.ONCE:
        due = schedule.run_at or at
    else:
        due = recurrence.last_time(schedule.cron, at=at + CLOCK_SKEW, tz=display_tz()) or at
    return due.replace(second=0, microsecond=0)


def schedule_fire(*, schedule_id: int, at: datetime | None = None) -> Firing | None:
    """Fire a schedule delivered at ``at`` (now): clone its campaign as ``<name>-YYYYMMDD-HHMM``, named after the
    occurrence the delivery belongs to (``occurrence``), and launch the clone.

    Every firing is recorded, with the launched campaign or with the reason it failed (a node in
    maintenance, a name taken, an invalid definition, anything else). Returns None, and does nothing, when the
    schedule is gone (its beat entry is removed then), disabled, or already fired for that occurrence: beat
    sends the task when it is due, but a worker may run it minutes later, or twice.
    """
    at = at or timezone.now()
    schedule = Schedule.objects.select_related("campaign", "created_by").filter(pk=schedule_id).first()
    if schedule is None:
        _beat_entry_delete(schedule_id)  # its campaign was deleted with it
        return None
    if not schedule.enabled:
        return None
    due = occurrence(schedule, at=at)
    with transaction.atomic():  # readers see a firing only with its outcome
        try:
            with transaction.atomic():
                firing = Firing.objects.create(schedule=schedule, due_at=due)
        except IntegrityError:
            return None
        try:
            with transaction.atomic():
                owner = schedule.created_by or schedule.campaign.owner
                name = clone_name(schedule.campaign, due)
                clone = campaign_clone(campaign=schedule.campaign, name=name, owner=owner)
                firing.campaign = campaign_launch(campaign=clone, user=owner)
        except (SpecError, CampaignError) as exc:
            firing.error = exc.message
        except Exception as exc:  # whatever else went wrong is recorded on the firing, never lost
            log.exception("schedule %s: firing failed", schedule_id)
            firing.error = f"{type(exc).__name__}: {exc}"[:10_000]
        firing.save(update_fields=["campaign", "error"])
        if schedule.kind == ScheduleKind.ONCE:
            schedule_set_enabled(schedule=schedule, enabled=False)
    return firing


def campaign_launch_now(*, campaign: Campaign, user: Any = None) -> Campaign:
    """Launch a draft; a campaign that was launched already is cloned (``<name>-YYYYMMDD-HHMM``) and the clone
    launched. Raises CampaignError or SpecError; nothing is left behind then."""
    if campaign.status == CampaignStatus.DRAFT:
        return campaign_launch(campaign=campaign, user=user)
    with transaction.atomic():
        clone = campaign_clone(campaign=campaign, name=clone_name(campaign, timezone.now()), owner=user)
        return campaign_launch(campaign=clone, user=user)
