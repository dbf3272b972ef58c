"""The task celery beat sends for each schedule (django-celery-beat PeriodicTask ``rackbench-schedule-<id>``)."""

from __future__ import annotations

from celery import shared_task

from scheduling import services


@shared_task(soft_time_limit=60, time_limit=90)
def schedule_fire_task(schedule_id: int) -> str:
    firing = services.schedule_fire(schedule_id=schedule_id)
    if firing is None:
        return "skipped"
    return f"launched {firing.campaign}" if firing.ok else f"failed: {firing.error}"
