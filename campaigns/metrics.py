"""rackbench's own metrics for Prometheus (``/metrics``): read from the database and the broker at scrape time.

The database is the truth for runs, so every figure is computed per scrape rather than counted in processes:
web and worker processes then never disagree, and a restarted process loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery import current_app
from django.db.models import Count, DurationField, ExpressionWrapper, F, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from campaigns.models import Campaign, CampaignStatus, Run, RunStatus, Verdict

QUEUES = ("default", "ssh")


def queue_depths() -> dict[str, int | None]:
    """Messages waiting per Celery queue (None when the broker cannot be asked)."""
    app = current_app  # rackbench.celery's, configured by the wiring (rackbench/__init__.py)
    depths: dict[str, int | None] = {}
    try:
        with app.connection_for_read() as conn:
            channel: Any = conn.default_channel
            for queue in QUEUES:
                try:
                    depths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
                except Exception:  # a queue not declared yet holds nothing
                    depths[queue] = 0
    except Exception:  # broker down: say so with an absent value, never fail the scrape
        return dict.fromkeys(QUEUES)
    return depths


class RackbenchCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        campaigns = GaugeMetricFamily("rackbench_campaigns", "Campaigns by status", labels=["status"])
        counts = dict(Campaign.objects.values_list("status").annotate(n=Count("id")))
        for status in CampaignStatus.values:
            campaigns.add_metric([status], counts.get(status, 0))
        yield campaigns

        runs = GaugeMetricFamily("rackbench_runs", "Runs by status", labels=["status"])
        counts = dict(Run.objects.values_list("status").annotate(n=Count("id")))
        for status in RunStatus.values:
            runs.add_metric([status], counts.get(status, 0))
        yield runs

        depth = GaugeMetricFamily("rackbench_queue_depth", "Celery messages waiting per queue", labels=["queue"])
        for queue, n in queue_depths().items():
            if n is not None:
                depth.add_metric([queue], n)
        yield depth

        yield self._durations(
            "rackbench_run_duration_seconds", "Finished runs: time from start to end, by benchmark kind",
            "started_at", "finished_at",
        )  # fmt: skip
        yield self._durations(
            "rackbench_run_queue_wait_seconds", "Started runs: time queued before a worker started them, by kind",
            "queued_at", "started_at",
        )  # fmt: skip

        verdicts = CounterMetricFamily("rackbench_verdicts", "Verdicts stored, by outcome", labels=["outcome"])
        for outcome, n in Verdict.objects.values_list("outcome").annotate(n=Count("id")):
            verdicts.add_metric([outcome], n)
        yield verdicts

    @staticmethod
    def _durations(name: str, doc: str, start: str, end: str) -> SummaryMetricFamily:
        summary = SummaryMetricFamily(name, doc, labels=["kind"])
        took = ExpressionWrapper(F(end) - F(start), output_field=DurationField())
        rows = (
            Run.objects.filter(**{f"{start}__isnull": False, f"{end}__isnull": False})
            .values_list("campaign__kind")
            .annotate(n=Count("id"), total=Sum(took))
            .order_by("campaign__kind")
        )
        for kind, n, total in rows:
            summary.add_metric([kind], count_value=n, sum_value=total.total_seconds() if total else 0.0)
        return summary
