"""Reads of the analysis pages. Every number is aggregated in SQL (mean, stdev and count per matrix point, host and
labels), so a campaign of 10,000 runs arrives as one row per point, not one per run.

Only succeeded repetitions count (warm-ups left out), as in campaigns.selectors.campaign_summary.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection, transaction
from django.db.models import (
    Avg,
    BinaryField,
    Count,
    Exists,
    Func,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    StdDev,
    Sum,
    TextField,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast
from django.http import Http404, HttpRequest

from accounts.selectors import visible
from analysis import fleet
from analysis.forms import Pick, parse_size
from campaigns import planning
from campaigns.baselines import Median
from campaigns.models import SUITE_FAMILY_PREFIX, Campaign, Result, Run, RunHost, RunStatus
from common import numbers
from common.collector import gc_paused
from inventory.models import Interface, StorageSystem
from plugins import localise
from plugins.benchmarks import training
from plugins.benchmarks.base import Benchmark, Metric, PairMetric, ParamError, get_benchmark

CAMPAIGN_CHOICES = 300  # newest visible campaigns offered in a picker (selected ones always are)
POINT_CHOICES = 200  # matrix points offered per selected campaign
CompareSet = tuple[str, Campaign, list[int] | None]  # label, campaign, its chosen runs (None: all of them)
X_RUN_GPUS = "gpus-used"  # x: the GPUs (ranks) the run used, as its own launch counted them
X_HOSTS = "node-count"  # x: the number of hosts (nodes) a run used
X_GPUS = "node-gpus"  # x: the GPUs of those hosts, as the inventory counts them
STATISTICS = ("mean", "median")  # what a point's repetitions are summed up by (seed 004: the median of 3)
SIZE_KEYS = frozenset({"bs", "size_bytes", "block_size", "blocksize", "length", "record_size", "record_size_bytes"})
STORAGE_METRICS = {"fio": ("read_bw_bytes", 1e-6), "storage_read": ("read_mb_per_sec", 1.0)}  # metric, to MB/s
# A training run's own throughput and what its plug-in derives from it (plugins/benchmarks/training.py)
THROUGHPUT, STORED_PER_GPU, STORED_DEMAND = (spec.name for spec in training.TRAINING_METRICS)
STORED_METRICS = (STORED_DEMAND, STORED_PER_GPU)
SUCCEEDED = Q(run__status=RunStatus.SUCCEEDED, run__is_warmup=False)


def visible_campaigns(*, request: HttpRequest) -> QuerySet[Campaign]:
    return visible(Campaign.objects.all(), request=request)


def campaigns_by_id(*, request: HttpRequest, ids: list[int]) -> list[Campaign]:
    """The campaigns asked for, in the order asked; one the user may not see is a 404, like one that is not."""
    if not ids:
        return []
    found = {c.pk: c for c in visible_campaigns(request=request).filter(pk__in=ids).select_related("storage")}
    missing = [i for i in ids if i not in found]
    if missing:
        raise Http404(f"no campaign {missing[0]}")
    return [found[i] for i in ids]


def campaign_choices(*, request: HttpRequest, selected: list[int]) -> list[dict[str, Any]]:
    """The newest visible campaigns (and every selected one) for a picker, with their result counts."""
    rows = (
        visible_campaigns(request=request)
        .filter(Q(pk__in=selected) | Q(pk__in=visible_campaigns(request=request).values("pk")[:CAMPAIGN_CHOICES]))
        .order_by("-created_at")
        .values("pk", "name", "kind", "status", "matrix")
    )
    return [{**row, "selected": row["pk"] in selected} for row in rows]


def point_choices(*, campaign_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Matrix points (index and parameters) of the given campaigns, at most POINT_CHOICES each, by campaign."""
    out: dict[int, list[dict[str, Any]]] = {i: [] for i in campaign_ids}
    found = sorted(point_params(campaign_ids=campaign_ids).items())
    for cid in campaign_ids:
        points = [(point, params) for (c, point), params in found if c == cid]
        varying = _varying_keys([params for _, params in points])
        for point, params in points[:POINT_CHOICES]:
            shown = {k: v for k, v in params.items() if k in varying} or params
            out[cid].append({"point": point, "params": describe_params(shown), "all_params": describe_params(params)})
    return out


def _varying_keys(points: list[dict[str, Any]]) -> set[str]:
    """The parameters whose values differ between the points: what tells a point from its siblings."""
    keys = {k for params in points for k in params}
    return {k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in points}) > 1}


def point_params(*, campaign_ids: list[int]) -> dict[tuple[int, int], dict[str, Any]]:
    """The parameters of every matrix point of the campaigns, by (campaign id, point), read from one run each."""
    if not campaign_ids:
        return {}
    rows = _first_per_point(Run.objects.filter(campaign_id__in=campaign_ids)).order_by()  # a dict: no join to sort
    return {(cid, point): params for cid, point, params in rows.values_list("campaign_id", "point", "params")}


def _first_per_point(runs: QuerySet[Run]) -> QuerySet[Run]:
    """The first of the given runs at each (campaign, point): one row per point, whatever its repetitions."""
    firsts = runs.values("campaign_id", "point").annotate(first=Min("pk")).values("first")
    return Run.objects.filter(pk__in=firsts)


# --- sets to compare ---------------------------------------------------------------------------------------------


def compare_sets(*, request: HttpRequest, picks: list[Pick]) -> list[CompareSet]:
    """(label, campaign, run ids or None for all of it) per pick, in order, for campaigns.selectors.compare: the
    /compare/ page's and the compare API's sets, labelled alike, in three queries whatever the number of picks.

    A campaign, run or point the user may not see is a 404 (Http404, which the API answers in its error shape),
    like one that does not exist.
    """
    run_ids = [p.id for p in picks if p.kind == "run"]
    runs = {r.pk: r for r in visible(Run.objects.filter(pk__in=run_ids), request=request, field="campaign__team")}
    for rid in run_ids:
        if rid not in runs:
            raise Http404(f"no run {rid}")
    campaign_ids = list(
        dict.fromkeys([p.id for p in picks if p.kind != "run"] + [r.campaign_id for r in runs.values()])
    )
    campaigns = {c.pk: c for c in campaigns_by_id(request=request, ids=campaign_ids)}
    wanted = [(p.id, p.point) for p in picks if p.kind == "point"]
    by_point: dict[tuple[int, int], list[int]] = {}
    params: dict[tuple[int, int], dict] = {}
    if wanted:
        query = Q()
        for cid, point in wanted:
            query |= Q(campaign_id=cid, point=point)
        for rid, cid, point, p in Run.objects.filter(query, is_warmup=False).values_list(
            "pk", "campaign_id", "point", "params"
        ):
            by_point.setdefault((cid, point), []).append(rid)
            params[(cid, point)] = p
    for pick in picks:
        if pick.kind == "point" and (pick.id, pick.point) not in by_point:
            raise Http404(f"campaign {campaigns[pick.id].name} has no point {pick.point}")
    # Points and runs are labelled by the parameters that differ between them (what the reader compares),
    # not by every parameter, so the label stays short and shows what varies.
    picked = [runs[p.id].params if p.kind == "run" else params[(p.id, p.point or 0)] for p in picks
              if p.kind != "campaign"]  # fmt: skip
    varying = differing_keys(picked)
    sets: list[CompareSet] = []
    for pick in picks:
        if pick.kind == "campaign":
            sets.append((campaigns[pick.id].name, campaigns[pick.id], None))
        elif pick.kind == "run":
            run = runs[pick.id]
            campaign = campaigns[run.campaign_id]
            shown = _only(run.params, varying)[2:-1]
            label = f"{campaign.name} · run #{run.sequence} (point {run.point}{', ' + shown if shown else ''})"
            sets.append((label, campaign, [run.pk]))
        else:
            assert pick.point is not None
            key = (pick.id, pick.point)
            campaign = campaigns[pick.id]
            sets.append((f"{campaign.name} · point {pick.point}{_only(params[key], varying)}", campaign,
                         by_point[key]))  # fmt: skip
    return sets


def differing_keys(params: list[dict[str, Any]]) -> list[str]:
    """The parameter names whose values are not the same in every one of ``params`` (missing counts as a value)."""
    keys = list(dict.fromkeys(k for p in params for k in p))
    return [k for k in keys if len({repr(p.get(k)) for p in params}) > 1]


def _only(params: dict[str, Any], keys: list[str]) -> str:
    shown = ", ".join(f"{k}={params[k]}" for k in keys if k in params)
    return f" ({shown})" if shown else ""


def set_differences(sets: list[CompareSet]) -> list[tuple[str, list[str]]]:
    """What differs between the compared sets' configurations (kind, fixed parameters, environment, container,
    storage, nodes, repetitions, and the points' own parameters): (name, one value per set), differing ones only."""
    configs = []
    ids_of = [i for _, _, ids in sets for i in ids or []]
    run_params = dict(Run.objects.filter(pk__in=ids_of).values_list("pk", "params"))
    campaign_ids = {c.pk for _, c, _ in sets}
    nodes: dict[int, list[str]] = {}
    for cid, name in Campaign.nodes.through.objects.filter(campaign_id__in=campaign_ids).values_list(
        "campaign_id", "node__name"
    ):
        nodes.setdefault(cid, []).append(name)
    storages = dict(StorageSystem.objects.filter(pk__in={c.storage_id for _, c, _ in sets}).values_list("pk", "name"))
    for _, campaign, ids in sets:
        config: dict[str, Any] = {"kind": campaign.kind, "repetitions": campaign.repetitions,
                                  "storage": storages.get(campaign.storage_id or 0, "—"),
                                  "nodes": ", ".join(sorted(nodes.get(campaign.pk, []))) or "—"}  # fmt: skip
        config.update({f"fixed {k}": v for k, v in campaign.fixed.items()})
        config.update({f"env {k}": v for k, v in campaign.env.items()})
        config.update({f"container {k}": v for k, v in campaign.container.items()})
        if ids:  # a point or a run: its own parameters too
            config.update({f"param {k}": v for k, v in run_params.get(ids[0], {}).items()})
        configs.append(config)
    return [(key, ["—" if key not in c else str(c[key]) for c in configs]) for key in differing_keys(configs)]


def describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "no parameters"


# --- metrics -------------------------------------------------------------------------------------------------------


def sample_runs(campaign_ids: list[int]) -> QuerySet[Run]:
    """The first succeeded repetition of each matrix point: what a campaign's runs report, without reading all of
    them (a 10,000-run campaign has a million result rows)."""
    return _first_per_point(
        Run.objects.filter(campaign_id__in=campaign_ids, status=RunStatus.SUCCEEDED, is_warmup=False)
    )


def metric_names(*, campaign_ids: list[int], aggregate_only: bool = True) -> list[str]:
    """The metrics the campaigns' points reported (aggregates across hosts, or any row)."""
    if not campaign_ids:
        return []
    rows = Result.objects.filter(run__in=sample_runs(campaign_ids))
    if aggregate_only:
        rows = rows.filter(host="")
    return list(rows.order_by("name").values_list("name", flat=True).distinct())


def label_keys(*, campaign_ids: list[int], metric: str) -> list[str]:
    """The label keys the metric carries (size_bytes, placement, peer, direction ...) at the campaigns' points."""
    rows = Result.objects.filter(run__in=sample_runs(campaign_ids), name=metric).exclude(labels={})
    keys: set[str] = set()
    for labels in rows.values_list("labels", flat=True)[:2000]:
        keys.update(labels)
    return sorted(keys)


@dataclass
class PointStat:
    """One matrix point of one campaign (per host and labels where asked): the metric over its repetitions."""

    campaign_id: int
    point: int
    params: dict[str, Any]
    mean: float
    stdev: float | None
    n: int
    unit: str
    host: str = ""
    labels: dict[str, Any] = field(default_factory=dict)
    hosts: float | None = None  # mean number of hosts per run at this point
    gpus: float | None = None  # mean GPUs of those hosts per run
    median: float | None = None  # the median of the repetitions
    used_gpus: float | None = None  # the GPUs (ranks) each run used: see used_gpus()

    def value(self, statistic: str) -> float:
        """The point's value by the statistic chosen (mean or median)."""
        return self.median if statistic == "median" and self.median is not None else self.mean


def point_stats(*, campaign_ids: list[int], metric: str) -> list[PointStat]:
    """The metric's aggregate across hosts (no labels) per campaign and point, with each point's hosts and GPUs."""
    rows = Result.objects.filter(SUCCEEDED, run__campaign_id__in=campaign_ids, name=metric, host="", labels={})
    stats = _stats(rows, campaign_ids)
    machines = _hosts_per_point(campaign_ids)
    rates = point_means(campaign_ids=campaign_ids, metrics=(THROUGHPUT, STORED_PER_GPU))
    for s in stats:
        s.hosts, s.gpus = machines.get((s.campaign_id, s.point), (None, None))
        s.used_gpus = used_gpus(s, rates.get((s.campaign_id, s.point), {}))
    return stats


def used_gpus(stat: PointStat, rates: dict[str, float]) -> float | None:
    """The GPUs (ranks) a point's runs used: a training run's own count (its throughput over its per-GPU rate, both
    stored by the plug-in from its launch), else mpi_slots ranks on each of its hosts, else the inventory's GPUs of
    its hosts. Each run of a point uses the same number, so the ratio of the means is that number."""
    total, per_gpu = rates.get(THROUGHPUT), rates.get(STORED_PER_GPU)
    if total and per_gpu:
        return round(total / per_gpu, 6)
    slots = stat.params.get("mpi_slots")
    if isinstance(slots, int) and not isinstance(slots, bool) and stat.hosts:
        return slots * stat.hosts
    return stat.gpus or None


def _stats(rows: QuerySet[Result], campaign_ids: list[int], *by: str) -> list[PointStat]:
    """The rows' mean, sample stdev (None for a single repetition), count and unit per campaign and point (and per
    ``by``: host, labels), in that order, each with its point's parameters."""
    group = ("run__campaign_id", "run__point", *by)
    grouped = (
        rows.values(*group)
        .annotate(mean=Avg("value"), stdev=StdDev("value", sample=True), n=Count("id"), unit=Max("unit"),
                  median=Median("value"))
        .order_by(*group)
    )  # fmt: skip
    params = point_params(campaign_ids=campaign_ids)
    return [
        PointStat(r["run__campaign_id"], r["run__point"], params.get((r["run__campaign_id"], r["run__point"]), {}),
                  r["mean"], r["stdev"] if r["n"] > 1 else None, r["n"], r["unit"], r.get("host", ""),
                  r.get("labels", {}), median=r["median"])
        for r in grouped
    ]  # fmt: skip


def _hosts_per_point(campaign_ids: list[int]) -> dict[tuple[int, int], tuple[float, float]]:
    """Mean hosts and GPUs per succeeded run, by (campaign, point)."""
    rows = (
        RunHost.objects.filter(SUCCEEDED, run__campaign_id__in=campaign_ids)
        .values("run__campaign_id", "run__point")
        .annotate(hosts=Count("id"), runs=Count("run_id", distinct=True), gpus=Sum("node__gpu_count"))
    )
    return {
        (r["run__campaign_id"], r["run__point"]): (r["hosts"] / r["runs"], (r["gpus"] or 0) / r["runs"]) for r in rows
    }


def x_value(stat: PointStat, x: str) -> float | None:
    if x == X_RUN_GPUS:
        return stat.used_gpus
    if x == X_HOSTS:
        return stat.hosts
    if x == X_GPUS:
        return stat.gpus or None
    if x in stat.params:
        return parse_size(stat.params[x])
    return parse_size(stat.labels.get(x))


def sweep_stats(*, campaign_ids: list[int], metric: str, hosts: str) -> list[PointStat]:
    """The metric per campaign, point, host and labels (``hosts``: aggregate, per-node or both); per-job rows of
    fio are left out (their hosts' totals stand for them)."""
    rows = Result.objects.filter(SUCCEEDED, run__campaign_id__in=campaign_ids, name=metric).exclude(
        labels__has_key="job"
    )
    if hosts == "aggregate":
        rows = rows.filter(host="")
    elif hosts == "per-node":
        rows = rows.exclude(host="")
    return _stats(rows, campaign_ids, "host", "labels")


# --- storage ---------------------------------------------------------------------------------------------------


def storage_choices(*, request: HttpRequest) -> QuerySet[StorageSystem]:
    return visible(StorageSystem.objects.all(), request=request).order_by("name")


def storage_by_id(*, request: HttpRequest, pk: int) -> StorageSystem:
    found = storage_choices(request=request).filter(pk=pk).first()
    if found is None:
        raise Http404(f"no storage system {pk}")
    return found


def measured_throughput(*, campaign: Campaign) -> tuple[float, str] | None:
    """The best read throughput (MB/s) a storage campaign measured: its best point's mean (the max of the points'
    means, in one query), and the metric."""
    metric, factor = STORAGE_METRICS.get(campaign.kind, (None, 0.0))
    if metric is None:
        return None
    best = (
        Result.objects.filter(SUCCEEDED, run__campaign_id=campaign.pk, name=metric, host="", labels={})
        .values("run__point")
        .annotate(mean=Avg("value"))
        .aggregate(best=Max("mean"))["best"]
    )
    return (best * factor, metric) if best is not None else None


def point_means(*, campaign_ids: list[int], metrics: tuple[str, ...]) -> dict[tuple[int, int], dict[str, float]]:
    """The means of a few aggregate metrics (across hosts, no labels) by (campaign, point), in one query: what a
    point's runs stored beside the metric drawn (a training run's storage_mb_per_sec, images_per_sec_per_gpu)."""
    rows = (
        Result.objects.filter(SUCCEEDED, run__campaign_id__in=campaign_ids, name__in=metrics, host="", labels={})
        .values("run__campaign_id", "run__point", "name")
        .annotate(mean=Avg("value"))
    )
    out: dict[tuple[int, int], dict[str, float]] = {}
    for r in rows:
        out.setdefault((r["run__campaign_id"], r["run__point"]), {})[r["name"]] = r["mean"]
    return out


def record_size_default(campaign: Campaign) -> float | None:
    """The data set's mean record size as the campaign states it (record_size_bytes, else record_size)."""
    for key in ("record_size_bytes", "record_size"):
        if key in campaign.fixed:
            return parse_size(campaign.fixed[key])
    for name, values in campaign.matrix:
        if name in ("record_size_bytes", "record_size") and len(values) == 1:
            return parse_size(values[0])
    return None


# --- fleet: node x metric, and the link matrix ---------------------------------------------------------------

# A node's results: per-host rows of succeeded repetitions (warm-ups left out)
HOST_RESULTS = SUCCEEDED & ~Q(host="")


def campaign_fleet_samples(*, campaign: Campaign) -> list[tuple[fleet.Column, str, list[float]]]:
    """(column, node, values) for every node's own per-host results (those of no device) at each column of the
    campaign's succeeded repetitions; see campaign_fleet_data."""
    return campaign_fleet_data(campaign=campaign).nodes


@dataclass
class FleetData:
    """A campaign's per-host results, split: the nodes' own (``by_column``: {column: {node: its values there}}, for
    fleet.fleet_view_by_column), and per device kind each device's (fleet.device_key), with the groups its NICs are
    judged within."""

    by_column: dict[fleet.Column, fleet.ColumnSamples]
    devices: dict[str, list[fleet.DeviceSample]] = field(default_factory=dict)
    groups: dict[tuple[str, str], str] = field(default_factory=dict)  # (node, nic) -> its link speed

    @property
    def nodes(self) -> list[tuple[fleet.Column, str, list[float]]]:
        """The nodes' own results as fleet.fleet_view's (column, node, values) samples."""
        return [(column, node, values) for column, per in self.by_column.items()
                for node, values in _as_lists(per).items()]  # fmt: skip


FLEET_WORK_MEM = "128MB"
_Values = list[float] | np.ndarray  # a group's values: a list, or an array read from PostgreSQL's binary form


class ArraySend(Func):
    """An array in PostgreSQL's binary form (``array_send``; read with ``float8_array``)."""

    function = "array_send"
    output_field = BinaryField()


_FLOAT8_OID = 701
_FLOAT8_ELEMENTS = np.dtype([("length", ">i4"), ("value", ">f8")])


def float8_array(blob: bytes | memoryview) -> np.ndarray:
    """A float8[] without NULLs from its binary form (``ArraySend``): a header (dimensions, a NULL flag, the element
    type, then each dimension's length and lower bound), then each element's length and its 8 big-endian bytes. The
    same floats, to the bit, as the array's text form gives, without parsing 60,000 numbers' text (a 1,000-node
    campaign's values: it was the fleet page's largest cost in Python)."""
    data = bytes(blob)
    dimensions, nulls, element = (int.from_bytes(data[i : i + 4], "big") for i in (0, 4, 8))
    if dimensions == 0:
        return np.empty(0)
    if dimensions != 1 or nulls or element != _FLOAT8_OID:
        raise ValueError(f"not a one-dimensional float8[] without NULLs: {dimensions}, {nulls}, {element}")
    return np.frombuffer(data, dtype=_FLOAT8_ELEMENTS, offset=20)["value"].astype(np.float64)


def campaign_fleet_data(*, campaign: Campaign) -> FleetData:
    """Every node's and device's per-host results at each column of the campaign's succeeded repetitions: two
    queries, a third only where there are NICs.

    PostgreSQL groups the rows by run, metric, unit and labels (the flow labels left out as ``fleet.label_text``
    leaves them out) into arrays of hosts and values, and hashes the groups (``FLEET_WORK_MEM``): a 1,000-node
    campaign's 60,000 rows of 20 metrics and 3 repetitions arrive as 60 rows, where grouping by host as well sorted
    every row by five keys, text among them, into 20,000 groups. The values come in binary (``float8_array``). A
    column's groups are joined here, a run's after the previous run's, so a node's values at a column are in run
    order (within a run, in the order the table holds them): where each run has every node once, the common case,
    into an array of repetitions x hosts (fleet.Repetitions). Elsewhere (SQLite) each row is its own group.

    Labels arrive as text and are read once per distinct text (a campaign has few): a result with a device label
    goes to that device (loopback and virtual NICs, and a telemetry series' p99 and max, to none)."""
    runs = campaign.runs.filter(status=RunStatus.SUCCEEDED, is_warmup=False).values_list("pk", "point", "params")
    points = {pk: point for pk, point, _ in runs}
    params = {point: run_params for _, point, run_params in runs}
    benchmark = get_benchmark(campaign.kind)
    results = Result.objects.filter(run_id__in=list(points)).exclude(host="").order_by()
    rows: Iterable[tuple[int, str, str, str, list[str], _Values]]
    if connection.vendor == "postgresql":
        grouped = (
            results.annotate(
                labels_text=RawSQL(f"({Result._meta.db_table}.labels - %s::text[])::text", (sorted(fleet.FLOW_LABELS),))
            )
            .values("run_id", "name", "unit", "labels_text")
            .annotate(hosts=ArrayAgg("host"), values=ArraySend(ArrayAgg("value")))  # no ORDER BY: it sorts every row
            .order_by("run_id")
            .values_list("run_id", "name", "unit", "labels_text", "hosts", "values")
        )
        with transaction.atomic(), connection.cursor() as cursor:
            # for this transaction only: room for the planner to hash the groups (it reckons 8 kB of array for each
            # of some rows / 6 groups; a campaign has few, and they take a few MB)
            cursor.execute("SELECT set_config('work_mem', %s, true)", [FLEET_WORK_MEM])
            rows = [(run, name, unit, raw, hosts, float8_array(blob)) for run, name, unit, raw, hosts, blob in grouped]
    else:
        each = results.annotate(labels_text=Cast("labels", TextField())).order_by("run_id", "id")
        fields = ("run_id", "name", "unit", "labels_text", "host", "value")
        rows = ((*row, [host], [value]) for *row, host, value in each.values_list(*fields))
    columns: dict[tuple[int, str, str, str], fleet.Column] = {}
    texts: dict[str, tuple[str, fleet.DeviceKey | None]] = {}
    nodes: dict[fleet.Column, list[tuple[list[str], _Values]]] = {}
    devices: dict[str, dict[tuple[fleet.Column, str], list[tuple[list[str], _Values]]]] = {}
    with gc_paused():  # where runs differ in their hosts, a list for each node and column (common/collector.py)
        for run_id, name, unit, raw, hosts, values in rows:
            found = texts.get(raw)
            if found is None:
                labels = json.loads(raw)
                found = texts[raw] = (fleet.label_text(labels), fleet.device_key(name, labels) if labels else None)
            text, device = found
            if device is not None:
                if device.virtual or not fleet.device_metric_shown(name):
                    continue
                text = fleet.label_text(device.labels)
            point = points[run_id]
            key = (point, name, text, unit)
            column = columns.get(key)
            if column is None:
                column = columns[key] = _fleet_column(benchmark, point, name, text, unit, params)
            if device is None:
                nodes.setdefault(column, []).append((hosts, values))
            else:
                devices.setdefault(device.kind, {}).setdefault((column, device.name), []).append((hosts, values))
        data = FleetData(by_column={column: _joined(arrays) for column, arrays in nodes.items()})
        for kind, per_device in devices.items():
            data.devices[kind] = [(column, node, device, found) for (column, device), arrays in per_device.items()
                                  for node, found in _as_lists(_joined(arrays)).items()]  # fmt: skip
    if fleet.NIC in data.devices:
        data.groups = _nic_groups({(node, nic) for _, node, nic, _ in data.devices[fleet.NIC]})
    return data


def _joined(arrays: list[tuple[list[str], _Values]]) -> fleet.ColumnSamples:
    """A column's (or a device's at a column) samples from (hosts, values) arrays, in the arrays' order. The common
    case, every array with the same hosts once each (every node in every repetition), is stacked whole into
    fleet.Repetitions; else {host: its values}."""
    first = arrays[0][0]
    if all(hosts == first for hosts, _ in arrays) and len(set(first)) == len(first):
        return fleet.Repetitions(first, np.array([values for _, values in arrays], dtype=np.float64))
    found: dict[str, list[float]] = {}
    for hosts, values in arrays:
        for host, value in zip(hosts, values.tolist() if isinstance(values, np.ndarray) else values, strict=True):
            have = found.get(host)
            if have is None:
                found[host] = [value]
            else:
                have.append(value)
    return found


def _as_lists(samples: fleet.ColumnSamples) -> dict[str, list[float]]:
    return samples.as_lists() if isinstance(samples, fleet.Repetitions) else samples


def _fleet_column(
    benchmark: Benchmark, point: int, name: str, text: str, unit: str, params: dict[int, Any]
) -> fleet.Column:
    spec = benchmark.spec(name)
    higher, judged = (spec.higher_is_better, spec.judged) if spec else fleet.series_direction(name)
    return fleet.Column(
        point=point,
        name=name,
        labels=text,
        params=fleet.label_text(params.get(point) or {}, leave_out=()),
        unit=unit,
        higher_is_better=higher,
        judged=judged,
    )


def _nic_groups(nics: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(node, nic) -> the NIC's link speed as the inventory knows it ("unknown speed" where it does not): a NIC is
    judged against NICs of its speed only. One query."""
    speeds = {
        (node, name): speed
        for node, name, speed in Interface.objects.filter(
            node__name__in={node for node, _ in nics}, name__in={nic for _, nic in nics}
        ).values_list("node__name", "name", "speed_mbps")
    }
    groups = {}
    for key in nics:
        speed = speeds.get(key)
        groups[key] = numbers.quantity(speed * 1e6, "bit/s") if speed else "unknown speed"
    return groups


@dataclass(frozen=True)
class Links:
    """The pairwise results of a campaign as the link matrix shows them: (sender, receiver, value) of every pair of
    every run, as its plug-in reads them (``Benchmark.pair_flows``), and what the value is (``metric``)."""

    flows: list[tuple[str, str, float]]
    metric: PairMetric | None
    points: list[int]  # the points with pairwise results (one metric each; the matrix shows one kind of metric)


@dataclass(frozen=True)
class PairRuns:
    """A campaign's pairwise runs, read once: {point: (its pair metric, its succeeded repetitions)} of the points
    whose runs have pairwise results, and the plug-in that reads them. A page picks a point among ``points`` and
    then reads its links (``pair_links``)."""

    benchmark: Benchmark
    by_point: dict[int, tuple[PairMetric, list[int]]]

    @property
    def points(self) -> list[int]:
        return sorted(self.by_point)


def campaign_pair_runs(*, campaign: Campaign) -> PairRuns:
    """The points of the campaign whose runs are pairwise (its plug-in's pair_metric) and have pairwise results
    (labelled ``peer``): two queries, the second asking of each pairwise run only whether it has one."""
    benchmark = get_benchmark(campaign.kind)
    runs = campaign.runs.filter(status=RunStatus.SUCCEEDED, is_warmup=False).order_by("point", "sequence")
    found: dict[int, tuple[PairMetric, list[int]]] = {}
    for pk, point, params in runs.values_list("pk", "point", "params"):
        try:
            metric = benchmark.pair_metric(planning.benchmark_params(params))
        except ParamError:  # a run of an older version of the plug-in: not shown rather than a failed page
            metric = None
        if metric is not None:
            found.setdefault(point, (metric, []))[1].append(pk)
    paired = Result.objects.filter(run_id=OuterRef("pk"), labels__has_key="peer").exclude(host="")
    measured = Run.objects.filter(Exists(paired), pk__in=[pk for _, pks in found.values() for pk in pks])
    points = set(measured.order_by().values_list("point", flat=True).distinct())
    return PairRuns(benchmark, {point: runs for point, runs in found.items() if point in points})


def pair_links(pair_runs: PairRuns, *, point: int | None = None) -> Links:
    """The pairwise results of one point, or of every point whose pair metric is the first one's: one query (none
    when there is no such point)."""
    points = pair_runs.points
    chosen = [p for p in points if p == point] if point is not None else points
    if not chosen:
        return Links([], None, points)
    by_point = pair_runs.by_point
    metric = by_point[chosen[0]][0]
    runs = [pk for p in chosen if by_point[p][0] == metric for pk in by_point[p][1]]
    rows = Result.objects.filter(HOST_RESULTS, run_id__in=runs, name=metric.name, labels__has_key="peer")
    if metric.labels:  # key lookups (SQLite has no JSON containment); the keys are the plug-in's own
        rows = rows.filter(**{f"labels__{key}": value for key, value in metric.labels.items()})
    found: dict[int, list[Metric]] = defaultdict(list)
    fields = ("run_id", "name", "unit", "host", "labels", "value")
    for run_id, name, unit, host, labels, value in rows.values_list(*fields).iterator(chunk_size=10_000):
        found[run_id].append(Metric(name=name, value=value, unit=unit, host=host, labels=labels))
    flows = [
        (a, b, value) for metrics in found.values() for (a, b), value in pair_runs.benchmark.pair_flows(metrics).items()
    ]
    return Links(flows, metric, points)


def campaign_links(*, campaign: Campaign, point: int | None = None) -> Links:
    """The pairwise results of one point, or of every point whose pair metric is the first one's (three queries)."""
    return pair_links(campaign_pair_runs(campaign=campaign), point=point)


def campaign_link_flows(*, campaign: Campaign, point: int | None = None) -> list[tuple[str, str, float]]:
    """(sender, receiver, value) of every pair of the campaign (``campaign_links``), at one point or all."""
    return campaign_links(campaign=campaign, point=point).flows


def link_matrix(links: Links, *, threshold: float) -> fleet.LinkMatrix:
    """The N x N matrix of ``links``, in its metric's unit and direction."""
    metric = links.metric
    if metric is None:
        return fleet.link_matrix([], threshold=threshold)
    return fleet.link_matrix(
        links.flows, threshold=threshold, higher_is_better=metric.higher_is_better, unit=metric.unit,
        metric=metric.name, statistic=metric.statistic, axes=(metric.rows, metric.columns), symmetric=metric.symmetric,
    )  # fmt: skip


def campaign_localisation(*, campaign: Campaign) -> list[dict[str, Any]]:
    """The two-pass localisation of each point of a two_pass campaign (iperf3, torch_dist: plugins/localise.py):
    pass 1's suspects, and from pass 2 the bad nodes (low with a known-good partner too) and the cleared ones."""
    benchmark = get_benchmark(campaign.kind)
    runs = list(campaign.runs.filter(status=RunStatus.SUCCEEDED, params__topology="two_pass").order_by("sequence"))
    flows = _pair_flows(benchmark, runs)
    verdicts = []
    for first in (r for r in runs if r.params.get("localise_pass", 1) == 1):
        pairs = len(localise.pair_values(flows[first.pk]))
        verdict: dict[str, Any] = {"point": first.point, "pairs": pairs, "suspects": [], "bad": [], "cleared": [],
                                   "untested": [], "partners": []}  # fmt: skip
        for second in (r for r in runs if r.point == first.point and r.sequence > first.sequence):
            plan = benchmark.second_pass_of(planning.benchmark_params(second.params))
            if plan is None:
                continue
            judged = localise.judge(plan, flows[second.pk], threshold=float(second.params.get("threshold", 0.7)))
            verdict.update(asdict(judged), partners=[f"{a}:{b}" for a, b in plan.partners])
            verdict["reference"] = plan.reference  # in the unit of the pairs' values (iperf3 bit/s, torch_dist GB/s)
            if campaign.kind == "iperf3":
                verdict["reference_bps"] = plan.reference
            break
        verdicts.append(verdict)
    return verdicts


def _pair_flows(benchmark: Benchmark, runs: list[Run]) -> dict[int, localise.Flows]:
    """{run id: {(node, peer): value}} of these runs' pairwise results, as the benchmark reads them (one query)."""
    found: dict[int, list[Metric]] = {run.pk: [] for run in runs}
    rows = Result.objects.filter(HOST_RESULTS, run__in=runs, labels__has_key="peer")
    fields = ("run_id", "name", "unit", "host", "labels", "value")
    for run_id, name, unit, host, labels, value in rows.values_list(*fields):
        found[run_id].append(Metric(name=name, value=value, unit=unit, host=host, labels=labels))
    return {pk: benchmark.pair_flows(metrics) for pk, metrics in found.items()}


def suite_run_team(*, request: HttpRequest, name: str) -> Any:
    """The team of the suite run ``name`` the user may see (None: shared); a run they may not see is a 404."""
    campaign = (
        visible_campaigns(request=request)
        .filter(name__startswith=f"{name}-", family__startswith=SUITE_FAMILY_PREFIX)
        .select_related("team")
        .first()
    )
    if campaign is None:
        raise Http404(f"no suite run named {name[:80]!r}")
    return campaign.team


def campaign_by_id(*, request: HttpRequest, pk: int) -> Campaign:
    """A campaign the user may see; any other is a 404."""
    return campaigns_by_id(request=request, ids=[pk])[0]


HISTORY_CAMPAIGNS = (1, 100)  # how many of a node's last campaigns its history may span


def node_metric_names(*, request: HttpRequest, node: str) -> list[str]:
    """The metrics a node has per-host results for, in campaigns the user may see."""
    rows = Result.objects.filter(HOST_RESULTS, host=node, run__campaign__in=visible_campaigns(request=request))
    return sorted(rows.order_by().values_list("name", flat=True).distinct())


def node_history(*, request: HttpRequest, node: str, metric: str, last: int = 10) -> list[dict[str, Any]]:
    """The node's value of ``metric`` in the last ``last`` campaigns it ran in (oldest first), each beside the fleet
    of that campaign: the median over its other nodes and the node's robust score among them. Three queries."""
    campaigns = list(
        visible_campaigns(request=request)
        .filter(pk__in=Result.objects.filter(HOST_RESULTS, host=node, name=metric).values("run__campaign"))
        .order_by("-created_at")
        .values("pk", "name", "kind", "created_at")[:last]
    )
    rows = Result.objects.filter(HOST_RESULTS, name=metric, run__campaign__in=[c["pk"] for c in campaigns])
    values: dict[int, dict[str, list[float]]] = {c["pk"]: {} for c in campaigns}
    for campaign_id, host, value in rows.values_list("run__campaign", "host", "value"):
        values[campaign_id].setdefault(host, []).append(value)
    history = []
    for c in reversed(campaigns):
        spec = get_benchmark(c["kind"]).spec(metric)
        per_node = {host: statistics.median(found) for host, found in values[c["pk"]].items()}
        scores = fleet.robust_scores(per_node, higher_is_better=spec.higher_is_better if spec else True)
        history.append({**c, "score": scores[node], "nodes": len(per_node)})
    return history
