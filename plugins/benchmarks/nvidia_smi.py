"""nvidia_smi: a parser for GPU telemetry recorded by hand, not a benchmark that runs.

GPU telemetry during runs is the telemetry sampler's (plugins/tools/sampler.py, ``gpu`` group): it reads
nvidia-smi itself on the node and its samples are stored as series (gpu.util, gpu.power_w, ...), summarised into
results like every series; this module plays no part in that. A run whose only job is to sample nvidia-smi would
measure idle GPUs, so build() and validate() refuse the kind and a campaign cannot use it. What parse() is for:
``manage.py parse_output --kind nvidia_smi`` turns a file recorded by hand into metrics. Two recordings are
understood:

1. ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits] [-l 1]``, e.g. with QUERY_FIELDS below.
   Columns are found by the header's names (``utilization.gpu [%]``, the alias ``clocks.sm`` printed as
   ``clocks.current.sm [MHz]``, ...); a header printed again (the file appended to) starts over. Output without
   a header must have the columns of QUERY_FIELDS, in that order; parse_query() takes other field lists. Values
   keep or drop their units (``45 %`` or ``45``); ``[N/A]``, ``N/A``, ``[Not Supported]`` and any other bracketed
   placeholder mean no value.
2. ``nvidia-smi dmon [-s ...] [-o T|D|DT]``: ``#`` header lines name the columns (``# gpu pwr gtemp ...``, or
   ``#Date Time gpu ...`` with -o DT); a repeated header starts over; ``-`` is no value. ``sm`` is the SM
   utilisation, the same NVML value as ``utilization.gpu``; ``pclk`` the processor clock; ``fb`` the memory used,
   in MB as dmon prints it (NVML's MiB).

A GPU is identified by its index (``index`` or dmon's ``gpu``), else by ``pci.bus_id``, else ``uuid``, else as
0 (one GPU per line). Metrics, for each GPU (labels {"gpu": index}) and for the host over all its GPUs' samples
(labels {}): ``gpu_util_percent``, ``mem_util_percent``, ``memory_used_mib``, ``power_w``, ``sm_clock_mhz``,
``temperature_c``, each the mean over the samples, and each with a ``_max`` twin (the highest sample);
``samples``, the number of samples; and, for the host only, ``power_w_total``, the sum of its GPUs' mean power.
aggregate() gives the same across hosts (host ""): means of the hosts' means, maxima of their maxima, the sum of
their power. A metric is left out when no sample had a value for it (MIG instances report no utilisation).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from plugins.benchmarks.base import Benchmark, HostContext, Metric, MetricSpec, ParamError, ParseError, register
from plugins.tools import sampler

QUERY_FIELDS = (
    "timestamp",
    "index",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "power.draw",
    "clocks.sm",
    "temperature.gpu",
)

# measurement -> (unit, higher is better, description)
MEASUREMENTS = {
    "gpu_util_percent": ("%", True, "GPU (SM) utilisation"),
    "mem_util_percent": ("%", True, "memory controller utilisation"),
    "memory_used_mib": ("MiB", False, "GPU memory used"),
    "power_w": ("W", False, "power draw"),
    "sm_clock_mhz": ("MHz", True, "SM clock"),
    "temperature_c": ("C", False, "GPU temperature"),
}
# query-gpu field (as named in a header, without its unit) -> measurement
QUERY_COLUMNS = {
    "utilization.gpu": "gpu_util_percent",
    "utilization.memory": "mem_util_percent",
    "memory.used": "memory_used_mib",
    "power.draw": "power_w",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.sm": "sm_clock_mhz",
    "temperature.gpu": "temperature_c",
}
GPU_KEYS = ("index", "pci.bus_id", "gpu_bus_id", "uuid", "gpu_uuid")
# dmon column -> measurement ("temp" before the gtemp/mtemp split)
DMON_COLUMNS = {
    "sm": "gpu_util_percent",
    "mem": "mem_util_percent",
    "fb": "memory_used_mib",
    "pwr": "power_w",
    "pclk": "sm_clock_mhz",
    "gtemp": "temperature_c",
    "temp": "temperature_c",
}


def _metric_specs() -> tuple[MetricSpec, ...]:
    specs = []
    for name, (unit, higher, what) in MEASUREMENTS.items():
        specs.append(MetricSpec(name, unit, higher, f"{what}, mean over the samples"))
        specs.append(MetricSpec(f"{name}_max", unit, higher, f"{what}, highest sample"))
    specs.append(MetricSpec("samples", "samples", True, "telemetry samples read"))
    specs.append(MetricSpec("power_w_total", "W", False, "sum of the GPUs' mean power draw"))
    return tuple(specs)


METRICS = _metric_specs()
_UNITS = {spec.name: spec.unit for spec in METRICS}


@dataclass
class _Series:
    """Every sample of one GPU (or of one host, over its GPUs)."""

    samples: int = 0
    values: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, sample: dict[str, float]) -> None:
        self.samples += 1
        for name, value in sample.items():
            self.values[name].append(value)


# --- reading ------------------------------------------------------------------------------------------------------

HEADER_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(?: \[[^\]]*\])?$")


def _value(text: str) -> float | None:
    """A reading without its unit; None for nvidia-smi's placeholders (the sampler's reader, one for both)."""
    value = sampler.gpu_number(text)
    return None if math.isnan(value) else value


def _gpu_key(text: str) -> int | str:
    text = text.strip()
    return int(text) if text.isdigit() else text


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace("\r", "").split("\n") if line.strip()]


def _is_header(cells: list[str]) -> bool:
    return all(HEADER_FIELD.match(c) for c in cells) and any(c.split(" [")[0] in QUERY_COLUMNS for c in cells)


def parse_query(text: str, fields: Iterable[str] = QUERY_FIELDS) -> dict[int | str, _Series]:
    """GPU -> samples, from --query-gpu CSV output; ``fields`` are the columns of output without a header."""
    columns = [f.strip() for f in fields]
    series: dict[int | str, _Series] = defaultdict(_Series)
    for line in _lines(text):
        cells = [c.strip() for c in line.split(",")]
        if _is_header(cells):
            columns = [c.split(" [")[0] for c in cells]
            continue
        if len(cells) != len(columns):
            continue  # not a sample of these columns (a message, a line cut short)
        row = dict(zip(columns, cells, strict=True))
        key: int | str = next((_gpu_key(row[k]) for k in GPU_KEYS if k in row and row[k]), 0)
        sample = {}
        for column, measurement in QUERY_COLUMNS.items():
            value = _value(row[column]) if column in row else None
            if value is not None:
                sample[measurement] = value
        series[key].add(sample)
    return dict(series)


def parse_dmon(text: str) -> dict[int | str, _Series]:
    """GPU -> samples, from ``nvidia-smi dmon`` output (read line by line as the sampler reads it)."""
    reader = sampler.DmonParser()
    series: dict[int | str, _Series] = defaultdict(_Series)
    for line in _lines(text):
        parsed = reader.feed(line)
        if parsed is None:
            continue
        gpu, row = parsed
        sample = {m: row[c] for c, m in DMON_COLUMNS.items() if c in row and not math.isnan(row[c])}
        series[gpu].add(sample)
    return dict(series)


def _is_dmon(text: str) -> bool:
    return any(line.startswith("#") and "gpu" in line.lstrip("#").split() for line in _lines(text))


# --- metrics ------------------------------------------------------------------------------------------------------


def _series_metrics(s: _Series, host: str, labels: dict[str, Any]) -> list[Metric]:
    def metric(name: str, value: float) -> Metric:
        return Metric(name=name, value=value, unit=_UNITS[name], host=host, labels=dict(labels))

    out = [metric("samples", float(s.samples))]
    for name in MEASUREMENTS:
        values = s.values.get(name)
        if values:
            out += [metric(name, sum(values) / len(values)), metric(f"{name}_max", max(values))]
    return out


def telemetry_metrics(gpus: dict[int | str, _Series], host: str) -> list[Metric]:
    metrics: list[Metric] = []
    whole = _Series()
    power = 0.0
    for key in sorted(gpus, key=str):
        metrics += _series_metrics(gpus[key], host, {"gpu": key})
        whole.samples += gpus[key].samples
        for name, values in gpus[key].values.items():
            whole.values[name].extend(values)
        watts = gpus[key].values.get("power_w")
        power += sum(watts) / len(watts) if watts else 0.0
    metrics += _series_metrics(whole, host, {})
    if whole.values.get("power_w"):
        metrics.append(Metric(name="power_w_total", value=power, unit="W", host=host))
    return metrics


def parse_telemetry(text: str, *, host: str = "") -> list[Metric]:
    gpus = parse_dmon(text) if _is_dmon(text) else parse_query(text)
    if not any(s.samples for s in gpus.values()):
        first = next(iter(_lines(text)), "")
        raise ParseError(f"no nvidia-smi query-gpu or dmon samples found (output begins: {first[:200]!r})")
    return telemetry_metrics(gpus, host)


REFUSED = (
    "is a parser for recorded GPU telemetry, not a benchmark: it is started by the telemetry sampler during other runs"
)


@register
class NvidiaSmi(Benchmark):
    kind = "nvidia_smi"
    description = "GPU telemetry recorded with nvidia-smi --query-gpu or dmon (parse only)"
    metrics = METRICS
    required_metrics = ("samples",)
    version_argv = ["nvidia-smi", "--version"]

    def validate(self, params: dict[str, Any]) -> None:
        raise ParamError("kind", f"nvidia_smi {REFUSED}")

    def build(self, params: dict[str, Any], host: HostContext) -> None:
        raise ParamError("kind", f"nvidia_smi {REFUSED}")

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        return parse_telemetry(text, host=host)

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Across hosts, from each host's totals (labels {}): means of means, maxima of maxima, summed power."""
        totals: dict[str, list[float]] = defaultdict(list)
        for m in per_host:
            if m.host and not m.labels:
                totals[m.name].append(m.value)
        out = []
        for name, values in totals.items():
            if name in ("samples", "power_w_total"):
                value = sum(values)
            elif name.endswith("_max"):
                value = max(values)
            else:
                value = sum(values) / len(values)
            out.append(Metric(name=name, value=value, unit=_UNITS[name], host=""))
        return out
