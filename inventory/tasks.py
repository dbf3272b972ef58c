"""Inventory tasks (routed to the "ssh" queue by settings): thin wrappers around runners.facts."""

from __future__ import annotations

import logging
import random

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from inventory.models import Node
from runners import facts, ssh

log = logging.getLogger(__name__)


@shared_task(bind=True, acks_late=True, soft_time_limit=150, time_limit=180, max_retries=3)
def collect_facts_task(self: Task, node_id: int) -> None:
    """Discover and store a node's facts. Idempotent: a redelivery just collects them again."""
    node = Node.objects.select_related("credential").filter(pk=node_id).first()
    if node is None:
        return
    try:
        facts.collect_facts(node)
    except (ssh.SSHError, SoftTimeLimitExceeded) as exc:
        transient = isinstance(exc, SoftTimeLimitExceeded) or getattr(exc, "transient", False)
        if transient and self.request.retries < (self.max_retries or 0):
            countdown = settings.RACKBENCH["RETRY_BACKOFF"] * 2**self.request.retries * (1 + random.random() / 2)
            log.warning("facts of %s: transient failure, retry in %.1f s: %s", node.name, countdown, exc)
            raise self.retry(exc=exc, countdown=countdown) from exc
        log.error("facts of %s not collected: %s", node.name, exc)
