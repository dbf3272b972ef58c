"""Campaign-level tasks (the "default" queue): advancing campaigns and reconciling lost runs."""

from __future__ import annotations

import logging

from celery import Task, shared_task
from django.conf import settings
from django.utils import timezone

from campaigns import reconcile, services
from common.retry import Backoff

log = logging.getLogger(__name__)
WEBHOOK_BACKOFF = Backoff(base=5.0, ceiling=300.0)  # a receiver that is down gets minutes to come back


@shared_task(soft_time_limit=60, time_limit=90)
def campaign_advance_task(campaign_id: int) -> str:
    """Take the campaign's nodes or start its next run. A waiting campaign is not retried on a timer: the
    campaign whose nodes it wants advances it as it ends, and ``reconcile_runs`` advances every running
    campaign with nothing active (a node back from maintenance, a lost message)."""
    return services.campaign_advance(campaign_id=campaign_id)


def campaign_advance_later(campaign_id: int) -> None:
    """``campaign_advance_task`` on the broker (what the ``campaigns.dispatch.advance`` port does)."""
    campaign_advance_task.delay(campaign_id)


@shared_task(soft_time_limit=120, time_limit=150)
def reconcile_runs() -> dict[str, int]:
    """The reconciler (celery beat, every RACKBENCH_RECONCILE_EVERY seconds): campaigns.reconcile.runs_reconcile."""
    return reconcile.runs_reconcile()


@shared_task(bind=True, soft_time_limit=30, time_limit=45, max_retries=5)
def verdict_webhook_task(self: Task, verdict_id: int) -> str:
    """POST the verdict to the campaign's webhook; retried with backoff while the receiver fails."""
    import urllib.error
    import urllib.request

    from campaigns.baselines import webhook_request
    from campaigns.models import Verdict
    from common.addresses import url_refusal

    verdict = Verdict.objects.select_related("campaign").get(pk=verdict_id)
    url, body, headers = webhook_request(verdict)
    refusal = "" if settings.RACKBENCH["WEBHOOK_ALLOW_PRIVATE"] else url_refusal(url)
    if refusal:  # permanent: no retry (RACKBENCH_WEBHOOK_ALLOW_PRIVATE=1 lets it through)
        status = f"refused: {refusal}"
        Verdict.objects.filter(pk=verdict_id).update(webhook_status=status[:200])
        return status
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as resp:
            status = f"{resp.status} at {timezone.now():%Y-%m-%d %H:%M:%S}"
    except (urllib.error.URLError, OSError) as exc:
        status = f"failed (attempt {self.request.retries + 1}): {exc}"
        Verdict.objects.filter(pk=verdict_id).update(webhook_status=status[:200])
        if self.request.retries < (self.max_retries or 0):
            raise self.retry(countdown=WEBHOOK_BACKOFF.delay(self.request.retries)) from exc
        return status
    Verdict.objects.filter(pk=verdict_id).update(webhook_status=status[:200])
    return status
