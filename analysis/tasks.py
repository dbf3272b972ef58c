"""Analysis tasks (the "default" queue): a health suite run's actions when its last step ends."""

from __future__ import annotations

from celery import shared_task

from analysis import health


@shared_task(soft_time_limit=120, time_limit=150, acks_late=True)
def suite_run_ended_task(campaign_id: int) -> str:
    """health.suite_run_ended: idempotent (each action is recorded once), so a redelivery does no harm."""
    return health.suite_run_ended(campaign_id=campaign_id)


def suite_run_ended_later(campaign_id: int) -> None:
    """``suite_run_ended_task`` on the broker (what the ``campaigns.dispatch.suite_step_ended`` port does)."""
    suite_run_ended_task.delay(campaign_id)
