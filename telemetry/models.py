"""Time series sampled during runs, stored as compressed chunks: one row per series per chunk, not per sample.

A 600 s run sampling 8 NICs on 3 nodes every millisecond makes 14.4 million samples; at 65,536 samples a chunk
that is 220 rows of a few hundred kilobytes each (see telemetry.codec for the byte format).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import models

from campaigns.models import Run


class SeriesKind(models.TextChoices):
    COUNTER = "counter"  # monotonic (byte counters, ...): read as rates per second
    GAUGE = "gauge"  # a level (utilisation, memory, power, ...): read as it is


def labels_key(labels: dict[str, Any]) -> str:
    """A fixed-length key for a labels mapping, for the unique constraint (jsonb cannot be in one portably)."""
    return hashlib.sha256(json.dumps(labels, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# Series kept for analysis only: neither summarised into results nor drawn (a chart per core would bury the rest).
DETAIL_SERIES = frozenset({"cpu.core_util"})


class SeriesSource(models.TextChoices):
    SAMPLER = "sampler"  # rackbench's sampler on a host of the run (plugins/tools/sampler.py)
    PROMETHEUS = "prometheus"  # pulled from Prometheus after the run (telemetry.prometheus)
    STORAGE = "storage"  # the storage's statistics command (runners/samplers.py, plugins/tools/isi_statistics.py)


class Series(models.Model):
    # The unique (run, host, name, labels_key) index serves lookups by run: no separate foreign-key index.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series", db_index=False)
    host = models.CharField(max_length=100, help_text="node name at the time of the run")
    name = models.CharField(max_length=100, help_text="what is measured, e.g. net.rx_bytes")
    labels = models.JSONField(default=dict, blank=True, help_text='which instance, e.g. {"nic": "mlx5_0"}')
    labels_key = models.CharField(max_length=64, editable=False)
    unit = models.CharField(max_length=30, blank=True, help_text="of the samples; a counter's rates are per second")
    kind = models.CharField(max_length=10, choices=SeriesKind.choices)
    source = models.CharField(max_length=20, choices=SeriesSource.choices, default=SeriesSource.SAMPLER)
    interval_ns = models.BigIntegerField(help_text="nominal sampling interval")
    sample_count = models.BigIntegerField(default=0)
    first_ns = models.BigIntegerField(null=True, blank=True, help_text="first timestamp, ns since the epoch")
    last_ns = models.BigIntegerField(null=True, blank=True, help_text="last timestamp, ns since the epoch")
    # The next append's first chunk carries the last sample (counter rates across chunks): kept here, so that an
    # append need not decode the last chunk to find it. JSON keeps an integer or a float exactly (bar the sign of a
    # float zero: jsonb has no -0, and a rate is the same either way).
    last_value = models.JSONField(null=True, blank=True, help_text="last sample's value")

    class Meta:
        ordering = ["run", "host", "name", "labels_key"]
        constraints = [
            models.UniqueConstraint(fields=["run", "host", "name", "labels_key"], name="series_unique"),
        ]
        verbose_name_plural = "series"

    def __str__(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return f"{self.host} {self.name}{{{labels}}}"

    @property
    def rate_unit(self) -> str:
        """The unit of what the series is read as: per second for counters."""
        if self.kind == SeriesKind.COUNTER:
            return f"{self.unit}/s" if self.unit else "/s"
        return self.unit


class Chunk(models.Model):
    """Up to telemetry.services.CHUNK_SAMPLES consecutive samples of one series.

    min/max are of what the series is read as (a counter's rates per second, over each interval ending at one of
    this chunk's samples, the first one from the previous chunk's last sample), sum of the samples for a gauge and
    of the increases for a counter: summaries and coarse windows read these instead of the data.
    """

    # The unique (series, seq) index serves every lookup by series: no separate foreign-key index.
    series = models.ForeignKey(Series, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    seq = models.PositiveIntegerField()
    t0_ns = models.BigIntegerField(help_text="first timestamp")
    t1_ns = models.BigIntegerField(help_text="last timestamp")
    count = models.PositiveIntegerField()
    min = models.FloatField(null=True, blank=True)
    max = models.FloatField(null=True, blank=True)
    sum = models.FloatField(default=0.0)
    data = models.BinaryField()

    class Meta:
        ordering = ["series", "seq"]
        constraints = [models.UniqueConstraint(fields=["series", "seq"], name="chunk_unique_seq")]
        indexes = [models.Index(fields=["series", "t0_ns"], name="chunk_series_t0")]

    def __str__(self) -> str:
        return f"{self.series} #{self.seq}"
