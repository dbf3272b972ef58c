from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from campaigns.models import Campaign


class ScheduleKind(models.TextChoices):
    ONCE = "once", "once, at a given time"
    NIGHTLY = "nightly", "nightly"
    WEEKLY = "weekly", "weekly"
    CRON = "cron", "cron expression"


class Schedule(models.Model):
    """Launches of a template campaign, once at a given time or on a recurrence, fired by celery beat.

    Each firing clones the template as ``<name>-YYYYMMDD-HHMM`` and launches the clone. The beat entry is a
    django-celery-beat ``PeriodicTask`` kept in step with this row by ``scheduling.services``. A schedule
    belongs to its template's team.
    """

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="schedules")
    kind = models.CharField(max_length=20, choices=ScheduleKind.choices)
    run_at = models.DateTimeField(null=True, blank=True, help_text="once: when")
    cron = models.CharField(
        max_length=100, blank=True, help_text="recurrences: minute hour day-of-month month day-of-week (TIME_ZONE)"
    )
    enabled = models.BooleanField(default=True)
    periodic_task = models.OneToOneField(
        PeriodicTask, null=True, blank=True, on_delete=models.SET_NULL, related_name="rackbench_schedule"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["campaign__name", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind="once", run_at__isnull=False) | (~models.Q(kind="once") & ~models.Q(cron="")),
                name="schedule_has_a_time",
            )
        ]

    def __str__(self) -> str:
        return f"{self.campaign.name}: {self.describe()}"

    def describe(self) -> str:
        """'once at 2026-03-11 02:30' (in the current time zone, as templates show times) or the recurrence."""
        from scheduling import recurrence

        if self.kind == ScheduleKind.ONCE:
            return f"once at {timezone.localtime(self.run_at):%Y-%m-%d %H:%M}" if self.run_at else "once"
        return recurrence.describe(self.kind, self.cron)


class Firing(models.Model):
    """One time a schedule fired: the campaign it launched, or why it could not."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    # One firing per schedule and occurrence (scheduling.services.occurrence): a task delivered twice, or late,
    # launches once.
    due_at = models.DateTimeField(help_text="the minute it was due")
    fired_at = models.DateTimeField(auto_now_add=True)
    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", help_text="the launched clone"
    )
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-fired_at", "-pk"]
        constraints = [models.UniqueConstraint(fields=["schedule", "due_at"], name="firing_once_per_minute")]

    def __str__(self) -> str:
        return f"{self.schedule} at {self.due_at:%Y-%m-%d %H:%M}"

    @property
    def ok(self) -> bool:
        return not self.error
