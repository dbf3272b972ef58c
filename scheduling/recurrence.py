"""Recurrences as cron expressions, and the times they fire.

Every recurrence is stored as a five-field cron expression (minute hour day-of-month month day-of-week) in the
display time zone (settings.TIME_ZONE): nightly at 02:30 is ``30 2 * * *``, weekly on Monday at 02:30 is
``30 2 * * 1``. Expressions are parsed by Celery's own ``crontab``, the schedule celery beat fires, so the
times shown are the times it fires: a day matches when its day of month, month *and* day of week all match
(Celery's rule; classic cron ORs the two day fields), and days of the week count from 0 = Sunday.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from celery.schedules import ParseException, crontab

WEEKDAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]  # cron numbering
HORIZON_DAYS = 366 * 8  # an expression that fires less often than this is refused as never firing


class RecurrenceError(ValueError):
    pass


@dataclass(frozen=True)
class Cron:
    """The sets of values each field of an expression matches, as Celery expands them."""

    minute: frozenset[int]
    hour: frozenset[int]
    day_of_month: frozenset[int]
    month_of_year: frozenset[int]
    day_of_week: frozenset[int]


def parse(expression: str) -> Cron:
    """The expression expanded by Celery's crontab; RecurrenceError naming what is wrong."""
    fields = expression.split()
    if len(fields) != 5:
        raise RecurrenceError(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}"
        )
    minute, hour, day_of_month, month, day_of_week = fields
    try:
        cron: Any = crontab(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month, day_of_week=day_of_week
        )
    except (ValueError, ParseException) as exc:
        raise RecurrenceError(f"not a valid cron expression: {exc}") from None
    return Cron(*(frozenset(getattr(cron, name)) for name in Cron.__dataclass_fields__))


def nightly(at: time) -> str:
    return f"{at.minute} {at.hour} * * *"


def weekly(at: time, weekday: int) -> str:
    """``weekday`` counts from 0 = Sunday, as cron does."""
    return f"{at.minute} {at.hour} * * {weekday}"


def _day_matches(cron: Cron, day: date) -> bool:
    return day.month in cron.month_of_year and day.day in cron.day_of_month and day.isoweekday() % 7 in cron.day_of_week


def next_times(
    expression: str, *, after: datetime, tz: tzinfo, count: int = 5, until: datetime | None = None
) -> list[datetime]:
    """The next ``count`` times (aware, in ``tz``) strictly after ``after`` that the expression fires, none past
    ``until``. Walks day by day through at most HORIZON_DAYS days, so an expression that never fires ends."""
    cron = parse(expression)
    slots = sorted((h, m) for h in cron.hour for m in cron.minute)
    local = after.astimezone(tz)
    found: list[datetime] = []
    day = local.date()
    for _ in range(HORIZON_DAYS):
        if until is not None and datetime.combine(day, time(), tzinfo=tz) > until:
            break
        if _day_matches(cron, day):
            for hour, minute in slots:
                at = datetime.combine(day, time(hour, minute), tzinfo=tz)
                if at <= after:
                    continue
                if until is not None and at > until:
                    return found
                found.append(at)
                if len(found) == count:
                    return found
        day += timedelta(days=1)
    return found


def last_time(expression: str, *, at: datetime, tz: tzinfo) -> datetime | None:
    """The latest time (aware, in ``tz``) at or before ``at`` that the expression fires, or None when it did not
    fire in the HORIZON_DAYS days before. Walks back day by day, as ``next_times`` walks forward."""
    cron = parse(expression)
    slots = [time(h, m) for h in cron.hour for m in cron.minute]
    day = at.astimezone(tz).date()
    for _ in range(HORIZON_DAYS):
        if _day_matches(cron, day):
            # Compared as instants (aware datetimes of one tzinfo compare by wall time): on a day whose clocks
            # go forward, a time in the skipped hour reads with the offset before the change, after later ones.
            times = (datetime.combine(day, slot, tzinfo=tz) for slot in slots)
            fired = [t for t in times if t.timestamp() <= at.timestamp()]
            if fired:
                return max(fired, key=lambda t: t.timestamp())
        day -= timedelta(days=1)
    return None


def describe(kind: str, expression: str) -> str:
    """'nightly at 02:30', 'weekly on Monday at 02:30' or 'cron 0 */6 * * *'."""
    fields = expression.split()
    if kind in ("nightly", "weekly") and len(fields) == 5:
        at = f"{int(fields[1]):02d}:{int(fields[0]):02d}"
        if kind == "nightly":
            return f"nightly at {at}"
        return f"weekly on {WEEKDAYS[int(fields[4])]} at {at}"
    return f"cron {expression}"
