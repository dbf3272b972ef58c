"""What each analysis page shows, built from the selectors' aggregates: its tables (also the exports) and its chart.

The comparison's statistics are campaigns.selectors.compare's (itself the verdict rule of campaigns.verdicts); this
module only words and colours its outcomes.
"""

from __future__ import annotations

import html
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from analysis import calculations, charts, fleet, selectors
from analysis.exports import ROW_UNIT, Table
from campaigns import verdicts
from campaigns.models import Campaign
from common import numbers
from inventory.models import StorageSystem

# --- compare ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    css: str  # change-better, change-worse, change-none, change-missing
    text: str
    reason: str


def change_of(change: dict[str, Any] | None, cell: dict[str, Any] | None, base: dict[str, Any] | None) -> Change:
    """How a judged change reads: better or worse only when the verdict rule found it significant."""
    if change is None:
        return Change("change-reference", "reference", "the first set: every other column is compared with it")
    if cell is None or base is None:
        side = "this set" if cell is None else "the reference"
        return Change("change-missing", "not measured", f"{side} has no values for this metric")
    pct = change["change_pct"]
    amount = f"{pct:+.1f}%" if pct is not None else "from zero"
    outcome = change["outcome"]
    if str(change["reason"]).startswith("not comparable"):
        return Change("change-none", f"{amount}: not comparable", change["reason"])
    if outcome == verdicts.REGRESSION:
        return Change("change-worse", f"{amount} worse", change["reason"])
    if outcome == verdicts.IMPROVEMENT:
        return Change("change-better", f"{amount} better", change["reason"])
    return Change("change-none", f"{amount}: no significant change", change["reason"])


@dataclass(slots=True)
class CompareRow:
    params: str
    metric: str
    unit: str
    higher_is_better: bool
    cells: list[tuple[dict[str, Any] | None, Change]] = field(default_factory=list)


def compare_report(result: dict[str, Any]) -> tuple[list[CompareRow], Table]:
    """The compare page's rows and its export: each cell by the comparison's statistic (mean or median), named in
    the column headers and the title."""
    labels = [c["label"] for c in result["columns"]]
    statistic = result["statistic"]
    columns = ["parameters", "metric", "unit", "better"]
    for label in labels:
        columns += [f"{label} {statistic}", f"{label} stdev", f"{label} n", f"{label} change %", f"{label} verdict"]
    table = Table("compare", f"Comparison (each point: the {statistic} of its repetitions)", columns)
    rows = []
    for r in result["rows"]:
        params = selectors.describe_params(r["params"]) if result["by_point"] else ""
        row = CompareRow(params, r["metric"], r["unit"], r["higher_is_better"])
        record: list[Any] = [params, r["metric"], r["unit"], "higher" if r["higher_is_better"] else "lower"]
        base = r["values"][0]
        for cell, change in zip(r["values"], r["changes"], strict=True):
            judged = change_of(change, cell, base)
            row.cells.append((cell, judged))
            record += [cell["value"] if cell else None, cell["stdev"] if cell else None, cell["n"] if cell else 0,
                       change["change_pct"] if change else None, judged.text]  # fmt: skip
        rows.append(row)
        table.rows.append(record)
    return rows, table


# --- series --------------------------------------------------------------------------------------------------------


@dataclass
class Series:
    label: str
    points: list[selectors.PointStat]
    xs: list[float]
    key: tuple[Any, ...] = ()  # (campaign id, the other axes' values, host, labels)


def _split(
    stats: list[selectors.PointStat], campaigns: list[Campaign], x: str, *, by_host: bool = False
) -> list[Series]:
    """One series per campaign and per value of the matrix axes other than x (and per host and labels in sweeps)."""
    names = {c.pk: c.name for c in campaigns}
    # Axes that move along x: with GPUs or nodes on x, the node count and the ranks per node (mpi_slots: 1, 2, 4
    # GPUs of one node) are the same series as the multi-node points.
    machine_x = (selectors.X_RUN_GPUS, selectors.X_HOSTS, selectors.X_GPUS)
    along = {x, "nodes", "mpi_slots"} if x in machine_x else {x}
    axes = {c.pk: [a for a, _ in c.matrix if a not in along] for c in campaigns}
    groups: dict[tuple[Any, ...], list[tuple[float, selectors.PointStat]]] = defaultdict(list)
    for s in stats:
        value = selectors.x_value(s, x)
        if value is None:
            continue
        split = tuple((a, s.params.get(a)) for a in axes[s.campaign_id])
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != x))
        groups[(s.campaign_id, split, s.host if by_host else "", labels)].append((value, s))
    order = {c.pk: i for i, c in enumerate(campaigns)}
    series = []
    for key in sorted(groups, key=lambda k: (order[k[0]], str(k[1:]))):
        cid, split, host, labels = key
        parts = [names[cid]]
        parts += [f"{a}={v}" for a, v in split]
        if by_host:
            parts.append(host or "aggregate")
        parts += [f"{k}={v}" for k, v in labels]
        pts = sorted(groups[key], key=lambda p: p[0])
        series.append(Series(" · ".join(parts), [p for _, p in pts], [x for x, _ in pts], key))
    return series


def x_title(x: str) -> str:
    return {
        selectors.X_RUN_GPUS: "GPUs used",
        selectors.X_HOSTS: "nodes (hosts per run)",
        selectors.X_GPUS: "GPUs of the nodes",
    }.get(x, x)


MACHINE_X = (selectors.X_RUN_GPUS, selectors.X_GPUS, selectors.X_HOSTS)


def scaling_stats(*, campaigns: list[Campaign], metric: str, where: dict[str, str]) -> list[selectors.PointStat]:
    """The metric's statistics at the campaigns' points that pass the filter, read once per page."""
    return [s for s in selectors.point_stats(campaign_ids=[c.pk for c in campaigns], metric=metric)
            if all(str(s.params.get(k)) == v for k, v in where.items())]  # fmt: skip


def x_axes(stats: list[selectors.PointStat], campaigns: list[Campaign]) -> list[str]:
    """The x axes that have a value at one or more of these points: the GPUs the runs used, the GPUs of their nodes
    (none on GPU-less nodes), their node count, the campaigns' matrix axes."""
    axes = [*MACHINE_X, *sorted({a for c in campaigns for a, _ in c.matrix})]
    return [x for x in dict.fromkeys(axes) if any(selectors.x_value(s, x) is not None for s in stats)]


def default_x(stats: list[selectors.PointStat], axes: list[str]) -> str | None:
    """The axis drawn by default: the first of the GPUs used, GPUs of the nodes, the node count and the matrix axes
    along which the points take two or more values (one that scales); else the first with any value."""
    for x in axes:
        if len({selectors.x_value(s, x) for s in stats} - {None}) > 1:
            return x
    return axes[0] if axes else None


def _one_gpu_bases(series: list[Series], statistic: str) -> dict[tuple[Any, ...], float]:
    """One GPU's throughput for each series that has none of its own: that of a series of the same campaign whose
    points differ only in env.* axes (seed 004's RoCE and TCP share the one-node runs, which cross no network)."""
    own = {s.key: p.value(statistic) for s in series for x_, p in zip(s.xs, s.points, strict=True) if x_ == 1}

    def without_env(key: tuple[Any, ...]) -> tuple[Any, ...]:
        cid, split, host, labels = key
        return (cid, tuple((a, v) for a, v in split if not str(a).startswith("env.")), host, labels)

    shared = {without_env(k): v for k, v in own.items()}
    return {s.key: shared[without_env(s.key)] for s in series if s.key not in own and without_env(s.key) in shared}


def _error_bars(
    points: list[selectors.PointStat], values: list[float] | None = None
) -> tuple[list[float], list[float]]:
    """One stdev either side of each point's value (its mean, or the statistic drawn)."""
    ys = values if values is not None else [p.mean for p in points]
    return [y - (p.stdev or 0) for p, y in zip(points, ys, strict=True)], [
        y + (p.stdev or 0) for p, y in zip(points, ys, strict=True)
    ]


def scaling_report(
    *,
    campaigns: list[Campaign],
    stats: list[selectors.PointStat],
    metric: str,
    x: str,
    statistic: str = "mean",
    reference: str = "smallest",
) -> tuple[charts.Figure, Table]:
    """The chart and table of the metric's statistics (scaling_stats) against x; each point by the statistic chosen
    (mean or median of its repetitions), the linear ideal from the reference chosen (calculations.scaling)."""
    unit = stats[0].unit if stats else ""
    columns = ["series", x_title(x), f"{metric} {statistic}", "stdev", "n", "linear", "efficiency %", "unit"]
    table = Table("scaling", f"{metric} against {x_title(x)}", columns, network=numbers.is_network(metric),
                  units={columns[2]: ROW_UNIT, "stdev": ROW_UNIT, "linear": ROW_UNIT, "efficiency %": "%"},
                  export_only=("unit",))  # fmt: skip
    lines: list[charts.Line] = []
    all_series = _split(stats, campaigns, x)
    bases = _one_gpu_bases(all_series, statistic) if reference == "one-gpu" else {}
    for series in all_series:
        values = [p.value(statistic) for p in series.points]
        scaled = calculations.scaling(
            list(zip(series.xs, values, strict=True)), reference=reference, base=bases.get(series.key)
        )
        by_x = {s.x: s for s in scaled}
        low, high = _error_bars(series.points, values)
        notes = []
        for x_, p, y in zip(series.xs, series.points, values, strict=True):
            s = by_x.get(x_)
            eff = s.efficiency_pct if s else None
            notes.append(f"{eff:.1f}% of linear, n={p.n}" if eff is not None else f"n={p.n}")
            table.rows.append([series.label, x_, y, p.stdev, p.n, s.ideal if s else None, eff, p.unit])
        index = len(lines)
        lines.append(charts.Line(series.label, series.xs, values, low, high, notes))
        if len(scaled) > 1:
            lines.append(charts.Line(f"{series.label} · linear", [s.x for s in scaled], [s.ideal for s in scaled],
                                     dashed=True, color_of=index))  # fmt: skip
    figure = charts.Figure(f"{metric} against {x_title(x)}", x_title(x), metric, lines, y_unit=unit)
    return figure, table


# --- sweeps -------------------------------------------------------------------------------------------------------


def sweep_report(
    *,
    campaigns: list[Campaign],
    metric: str,
    x: str,
    hosts: str,
    log: str,
    where: dict[str, str],
    statistic: str = "mean",
) -> tuple[charts.Figure, Table]:
    """The metric against x, each point by the statistic chosen (mean or median of its repetitions)."""
    stats = [s for s in selectors.sweep_stats(campaign_ids=[c.pk for c in campaigns], metric=metric, hosts=hosts)
             if all(str(s.params.get(k, s.labels.get(k))) == v for k, v in where.items())]  # fmt: skip
    unit = stats[0].unit if stats else ""
    series = _split(stats, campaigns, x, by_host=True)
    xs = [v for s in series for v in s.xs]
    is_size = x in selectors.SIZE_KEYS or any(isinstance(p.params.get(x), str) for s in series for p in s.points)
    positive = [v for v in xs if v > 0]
    wide = bool(positive) and max(positive) / min(positive) >= 100
    x_log = bool(positive) and (log == "on" or (log == "auto" and (wide or (is_size and len(set(positive)) > 2))))
    units = {f"{metric} {statistic}": ROW_UNIT, "stdev": ROW_UNIT, **({x: "B"} if is_size else {})}
    columns = ["series", "host", x, f"{metric} {statistic}", "stdev", "n", "unit"]
    table = Table("sweep", f"{metric} against {x}", columns, units=units, network=numbers.is_network(metric),
                  export_only=("unit",))  # fmt: skip
    lines = []
    for s in series:
        values = [p.value(statistic) for p in s.points]
        for x_, p, y in zip(s.xs, s.points, values, strict=True):
            table.rows.append([s.label, p.host or "aggregate", x_, y, p.stdev, p.n, p.unit])
        low, high = _error_bars(s.points, values)
        lines.append(charts.Line(s.label, s.xs, values, low, high, [f"n={p.n}" for p in s.points]))
    figure = charts.Figure(f"{metric} against {x}", x, metric, lines, x_log=x_log,
                           x_unit="B" if is_size else "", y_unit=unit)  # fmt: skip
    return figure, table


# --- storage demand and sizing ------------------------------------------------------------------------------------


@dataclass
class StorageInputs:
    record_size_bytes: float | None
    storage: StorageSystem | None
    measured: Campaign | None
    per_gpu_mbps: float | None = None
    per_node_mbps: float | None = None
    gpus: int | None = None
    record_size_entered: bool = False  # typed in the form: a what-if, computed at every point


@dataclass
class StorageReport:
    figure: charts.Figure
    demand: Table
    sizing: calculations.Sizing | None
    sizing_table: Table
    reference: Table
    measured_mbps: float | None
    measured_metric: str
    defaults: dict[str, Any]
    notes: list[str]
    x: str = selectors.X_GPUS
    source: str = ""  # which demand figures the table holds: the runs' own, computed, or both


@dataclass(frozen=True)
class PointDemand:
    mbps: float | None
    gpus: float | None
    per_gpu: float | None
    stored: bool  # mbps is the runs' own storage_mb_per_sec
    own_gpus: bool  # gpus is the runs' own count (images_per_sec / images_per_sec_per_gpu), not the inventory's


def point_demand(stat: selectors.PointStat, *, metric: str, stored: dict[str, float], record: float | None,
                 entered: bool) -> PointDemand:  # fmt: skip
    """A point's storage demand and MB/s per GPU. A training run stores both as results (storage_mb_per_sec and
    images_per_sec_per_gpu, derived from the record size and GPU count of its own launch), so they are read where
    the runs have them; where not (older runs, imported logs), or for a record size typed as a what-if, the demand
    is images/s x record size and the GPUs are those the inventory counts on the runs' nodes."""
    own = metric == selectors.THROUGHPUT
    rate = stored.get(selectors.STORED_PER_GPU) if own else None
    gpus = stat.mean / rate if rate else stat.gpus
    mbps = stored.get(selectors.STORED_DEMAND) if own and not entered else None
    from_runs = mbps is not None
    if mbps is None and record:
        mbps = calculations.demand_mb_per_sec(stat.mean, record)
    return PointDemand(mbps, gpus or None, mbps / gpus if mbps is not None and gpus else None, from_runs, bool(rate))


def _demand_source(demands: list[PointDemand], *, record: float | None, entered: bool) -> str:
    """One sentence saying where the demand figures come from."""
    stored = sum(d.stored for d in demands)
    own_gpus = sum(d.own_gpus for d in demands)
    computed = sum(d.mbps is not None and not d.stored for d in demands)
    parts = []
    if stored:
        where = "every point" if stored == len(demands) else f"{stored} of {len(demands)} points"
        parts.append(f"Demand at {where} is the runs' own {selectors.STORED_DEMAND}.")
    if computed:
        size = f"{record:,.0f} B" if record else ""
        why = f"the record size entered ({size})" if entered else f"the campaign's record size ({size})"
        where = "every point" if computed == len(demands) else f"{computed} point{'s' if computed > 1 else ''}"
        parts.append(f"Demand at {where} is computed: images/s × {why}.")
    if demands and own_gpus == len(demands):
        parts.append(f"MB/s per GPU divides by the runs' own GPU count (images/s ÷ {selectors.STORED_PER_GPU}).")
    elif own_gpus:
        parts.append(f"MB/s per GPU divides by the runs' own GPU count (images/s ÷ {selectors.STORED_PER_GPU}) at "
                     f"{own_gpus} of {len(demands)} points, elsewhere by the GPUs the inventory counts on the runs' "
                     "nodes.")  # fmt: skip
    elif any(d.per_gpu is not None for d in demands):
        parts.append("MB/s per GPU divides by the GPUs the inventory counts on the runs' nodes.")
    return " ".join(parts)


def storage_report(
    *,
    campaign: Campaign | None,
    stats: list[selectors.PointStat],
    metric: str | None,
    x: str | None,
    inputs: StorageInputs,
) -> StorageReport:
    """The campaign's demand against the storage's rated and measured throughput, and the sizing calculator (which
    also works with no campaign, from the numbers typed in). Every statistic is read once, whichever x it takes."""
    notes: list[str] = []
    ids = [campaign.pk] if campaign else []
    x = x or selectors.X_HOSTS
    own = bool(stats) and metric == selectors.THROUGHPUT  # only a training run stores figures beside it
    stored = selectors.point_means(campaign_ids=ids, metrics=selectors.STORED_METRICS) if own else {}
    record = inputs.record_size_bytes
    demands = {}
    for p in stats:
        key = (p.campaign_id, p.point)
        demands[key] = point_demand(p, metric=metric or "", stored=stored.get(key, {}), record=record,
                                    entered=inputs.record_size_entered)  # fmt: skip
    if record is None and any(d.mbps is None for d in demands.values()):
        notes.append("Enter the data set's mean record size to turn images/s into MB/s (seed 000: 115 KB).")
    measured = selectors.measured_throughput(campaign=inputs.measured) if inputs.measured else None
    if inputs.measured and measured is None:
        notes.append(f"Campaign {inputs.measured.name} has no read throughput to measure storage by "
                     f"(a fio or storage_read campaign with succeeded runs is needed).")  # fmt: skip
    rated = inputs.storage.rated_read_mbps if inputs.storage else None
    columns = ["series", x_title(x), f"{metric or 'metric'} mean", "demand MB/s", "GPUs per run", "MB/s per GPU",
               "% of rated", "% of measured", "demand from"]  # fmt: skip
    table = Table("demand", "Storage throughput demanded", columns,
                  units={columns[2]: stats[0].unit if stats else "", "demand MB/s": "MB/s", "MB/s per GPU": "MB/s",
                         "% of rated": "%", "% of measured": "%"})  # fmt: skip
    lines = []
    drawn: list[PointDemand] = []
    for series in _split(stats, [campaign] if campaign else [], x):
        ys = []
        for x_, p in zip(series.xs, series.points, strict=True):
            d = demands[(p.campaign_id, p.point)]
            drawn.append(d)
            table.rows.append([series.label, x_, p.mean, d.mbps, d.gpus, d.per_gpu,
                               100 * d.mbps / rated if d.mbps is not None and rated else None,
                               100 * d.mbps / measured[0] if d.mbps is not None and measured else None,
                               "run" if d.stored else "computed" if d.mbps is not None else None])  # fmt: skip
            ys.append(d.mbps)
        if any(y is not None for y in ys):
            lines.append(charts.Line(f"{series.label} · demand", series.xs, [y or 0.0 for y in ys]))
    references = []
    if rated and inputs.storage:
        references.append((f"rated read throughput of {inputs.storage.name}", rated))
    if measured and inputs.measured:
        references.append((f"measured by {inputs.measured.name} ({measured[1]})", measured[0]))
    figure = charts.Figure("Storage throughput demanded", x_title(x), "throughput", lines, references=references,
                           y_unit="MB/s")  # fmt: skip

    node_count = inputs.storage.node_count if inputs.storage else 1
    source = measured[0] if measured else rated
    per_gpus = [d.per_gpu for d in drawn if d.per_gpu is not None]
    gpu_counts = [int(round(d.gpus)) for d in drawn if d.gpus]
    defaults = {
        "per_gpu_mbps": max(per_gpus, default=None),
        "per_node_mbps": source / max(node_count, 1) if source else None,
        "gpus": max(gpu_counts, default=None),
    }
    per_gpu = inputs.per_gpu_mbps or defaults["per_gpu_mbps"]
    per_node = inputs.per_node_mbps or defaults["per_node_mbps"]
    gpus = int(inputs.gpus or defaults["gpus"] or 1)
    result = None
    sizing_table = Table("sizing", "Sizing", ["MB/s per GPU", "MB/s per storage node", "GPUs", "GPUs per storage node",
                                              "demand MB/s", "storage nodes (exact)", "storage nodes (minimum)",
                                              "storage nodes (recommended)"],
                         units=dict.fromkeys(("MB/s per GPU", "MB/s per storage node", "demand MB/s"),
                                             "MB/s"))  # fmt: skip
    if per_gpu and per_node:
        try:
            result = calculations.sizing(per_gpu_mbps=per_gpu, per_node_mbps=per_node, gpus=gpus)
        except calculations.SizingError as exc:
            notes.append(str(exc))
        else:
            sizing_table.rows.append([result.per_gpu_mbps, result.per_node_mbps, result.gpus, result.gpus_per_node,
                                      result.demand_mbps, result.nodes_exact, result.nodes_minimum,
                                      result.nodes_recommended])  # fmt: skip
    reference = Table("reference", "Seed 000 table 3 against this storage node",
                      ["demand", "workload", "MB/s per GPU", "GPUs per storage node"],
                      units={"MB/s per GPU": "MB/s"})  # fmt: skip
    if per_node:
        reference.rows = [[r["demand"], r["workload"], r["per_gpu_mbps"], r["gpus_per_node"]]
                          for r in calculations.reference_table(per_node)]  # fmt: skip
    return StorageReport(figure, table, result, sizing_table, reference, measured[0] if measured else None,
                         measured[1] if measured else "", defaults, notes, x,
                         _demand_source(drawn, record=record, entered=inputs.record_size_entered))  # fmt: skip


# --- fleet: node x metric, link matrix ------------------------------------------------------------------------


FLEET_ROWS = 100  # nodes per page of the fleet view's matrix (every cell is in the CSV export)


def fleet_rows(view: fleet.FleetView, *, page: int = 1) -> list[dict[str, Any]]:
    """One page of rows, outliers first: a node's cells, each with its value, ratio to the fleet's median and score,
    readable (``cells``: the row's ``<td>``s, written by ``_fleet_cells``)."""
    outliers = {o.node for o in view.outliers}
    ordered = [o.node for o in view.outliers] + [n for n in view.nodes if n not in outliers]
    return [
        {"node": node, "outlier": node in outliers, "cells": _fleet_cells(view.columns, view.row(node))}
        for node in ordered[(page - 1) * FLEET_ROWS : page * FLEET_ROWS]
    ]


def _fleet_cells(columns: list[fleet.Column], cells: list[fleet.Cell | None], *, network: bool = False) -> SafeString:
    """A row's ``<td>``s, one text: each cell's value, ratio to the fleet's median and score. Written here rather
    than in the template, escaped with the standard library's ``html.escape``, and marked safe once a row: a page has
    2,000 cells, and the template engine (or format_html, or mark_safe for each) took a third of the page's time
    drawing them."""
    return mark_safe("".join(_fleet_cell(c, cell, network=network) for c, cell in zip(columns, cells, strict=True)))


def _fleet_cell(column: fleet.Column, cell: fleet.Cell | None, *, network: bool = False) -> str:
    """One cell's ``<td>``, every text in it escaped or formatted from numbers."""
    if cell is None:
        return '<td class="num">—</td>'
    ratio = cell.score.ratio
    worse = " change-worse" if cell.score.outlier else ""
    text = html.escape(numbers.quantity(cell.score.value, column.unit, network=network))
    raw = html.escape(f"{cell.score.value:g} {column.unit}".strip())
    share = f"{ratio:.0%}" if ratio is not None else "—"
    return (
        f'<td class="num{worse}" title="{raw}">{text}<br>'
        f'<span class="small muted">{share} · {cell.score.score:+.1f}</span></td>'
    )


def fleet_findings(view: fleet.FleetView) -> list[tuple[str, list[str]]]:
    """Each outlier node with its evidence in words: the cell, the fleet's median there, the score, the samples."""
    found = []
    for outlier in view.outliers:
        lines = []
        for c, cell in outlier.evidence:
            s = cell.score
            lines.append(f"{c.title}: {numbers.quantity(s.value, c.unit)}, {s.ratio or 0:.0%} of the fleet's "
                         f"{numbers.quantity(s.median, c.unit)} (score {s.score:+.1f}; median of {len(cell.samples)} "
                         f"sample{'s' if len(cell.samples) != 1 else ''})")  # fmt: skip
        found.append((outlier.node, lines))
    return found


def fleet_tables(view: fleet.FleetView) -> list[Table]:
    cells = Table("cells", "Every node at every point", ["node", "point", "metric", "labels", "parameters", "unit",
                  "value", "fleet_median", "score", "outlier", "repetitions"])  # fmt: skip
    for (node, index), cell in sorted(view.cells.items(), key=lambda item: (item[0][1], item[0][0])):
        c = view.columns[index]
        cells.rows.append([node, c.point, c.name, c.labels, c.params, c.unit, cell.score.value, cell.score.median,
                           round(cell.score.score, 3), cell.score.outlier, len(cell.samples)])  # fmt: skip
    outliers = Table("outliers", "Outliers and their evidence", ["node", "metric", "labels", "parameters", "value",
                     "fleet_median", "score", "samples"])  # fmt: skip
    for outlier in view.outliers:
        for c, cell in outlier.evidence:
            samples = " ".join(f"{v:.6g}" for v in cell.samples)
            outliers.rows.append([outlier.node, c.name, c.labels, c.params, cell.score.value, cell.score.median,
                                  round(cell.score.score, 3), samples])  # fmt: skip
    return [outliers, cells]


# --- fleet per device: GPU x metric, NIC x metric ---------------------------------------------------------------


def device_sections(views: list[fleet.DeviceView]) -> list[dict[str, Any]]:
    """Per device kind with data: its first FLEET_ROWS devices (outliers first), drawn as the node rows are, and its
    outliers in words."""
    sections = []
    for view in views:
        bad = [o.device for o in view.outliers]
        network = view.kind == fleet.NIC  # byte rates of a link, in bits as its speed is
        named = set(bad)
        ordered = bad + [d for d in view.devices if d not in named]
        rows = []
        for d in ordered[:FLEET_ROWS]:
            cells = _fleet_cells(view.columns, view.row(d), network=network)
            rows.append({"device": d.title, "group": d.group, "outlier": d in named, "cells": cells})
        findings = [(o.device.title, _evidence_lines(o, view.title, network=network)) for o in view.outliers]
        sections.append({"kind": view.kind, "title": view.title, "view": view, "rows": rows, "shown": len(rows),
                         "total": len(view.devices), "grouped": any(d.group for d in view.devices),
                         "findings": findings})  # fmt: skip
    return sections


def _evidence_lines(outlier: fleet.DeviceOutlier, kind: str, *, network: bool = False) -> list[str]:
    """The evidence in words, against the fleet's devices of its kind (and group: ``the fleet's 100 Gbit/s NICs'``)."""
    peers = f"the fleet's {outlier.device.group + ' ' if outlier.device.group else ''}{kind}s'"
    lines = []
    for c, cell in outlier.evidence:
        s = cell.score
        value, median = (numbers.quantity(v, c.unit, network=network) for v in (s.value, s.median))
        lines.append(f"{c.title}: {value}, {s.ratio or 0:.0%} of {peers} median {median} (score {s.score:+.1f}; "
                     f"median of {len(cell.samples)} sample{'s' if len(cell.samples) != 1 else ''})")  # fmt: skip
    return lines


def device_tables(views: list[fleet.DeviceView]) -> list[Table]:
    """Every device's cells and the outlier devices with their evidence, per kind (``gpu_cells``, ``nic_cells``...)."""
    tables = []
    for view in views:
        cells = Table(f"{view.kind}_cells", f"Every {view.title} at every point", ["device", "node", view.kind,
                      "group", "point", "metric", "labels", "parameters", "unit", "value", "fleet_median", "score",
                      "outlier", "repetitions"])  # fmt: skip
        for (device, index), cell in sorted(view.cells.items(), key=lambda item: (item[0][1], item[0][0].title)):
            c = view.columns[index]
            cells.rows.append([device.title, device.node, device.name, device.group, c.point, c.name, c.labels,
                               c.params, c.unit, cell.score.value, cell.score.median, round(cell.score.score, 3),
                               cell.score.outlier, len(cell.samples)])  # fmt: skip
        outliers = Table(f"{view.kind}_outliers", f"Outlier {view.title}s and their evidence", ["device", "metric",
                         "labels", "parameters", "unit", "value", "fleet_median", "score", "samples"])  # fmt: skip
        for outlier in view.outliers:
            for c, cell in outlier.evidence:
                samples = " ".join(f"{v:.6g}" for v in cell.samples)
                outliers.rows.append([outlier.device.title, c.name, c.labels, c.params, c.unit, cell.score.value,
                                      cell.score.median, round(cell.score.score, 3), samples])  # fmt: skip
        tables += [outliers, cells]
    return tables


def link_grid(matrix: fleet.LinkMatrix) -> list[dict[str, Any]]:
    """The heatmap's rows: per sender, per receiver, the readable value and a shade from its share of the median."""
    rows = []
    for sender in matrix.nodes:
        cells = []
        for receiver in matrix.nodes:
            value, share = matrix.value(sender, receiver), matrix.relative(sender, receiver)
            good = share if share is None or matrix.higher_is_better else 1 / share if share else None  # latency
            shade = "self" if sender == receiver else "none" if good is None else (
                "bad" if good < 0.5 else "low" if good < 0.8 else "ok")  # fmt: skip
            text = numbers.quantity(value, matrix.unit) if value is not None else ""
            cells.append({"receiver": receiver, "text": text,
                          "shade": shade, "share": f"{share:.0%}" if share is not None else ""})  # fmt: skip
        rows.append({"sender": sender, "outlier": sender in matrix.outliers, "cells": cells})
    return rows


def link_tables(matrix: fleet.LinkMatrix) -> list[Table]:
    rows, columns = matrix.axes
    grid = Table("matrix", f"{rows.capitalize()} x {columns}: {matrix.metric}, median over repetitions of the "
                 f"{matrix.statistic} ({matrix.unit})", [rows, *matrix.nodes],
                 units=dict.fromkeys(matrix.nodes, matrix.unit))  # fmt: skip
    for sender in matrix.nodes:
        grid.rows.append([sender, *(matrix.value(sender, receiver) for receiver in matrix.nodes)])
    nodes = Table("nodes", "Nodes against the fleet", ["node", "median_flow", "fleet_median", "score", "outlier"],
                  units={"median_flow": matrix.unit, "fleet_median": matrix.unit},
                  headings={"median_flow": "median of its pairs", "fleet_median": "fleet's median",
                            "score": "robust score"})  # fmt: skip
    for node in matrix.nodes:
        s = matrix.node_scores[node]
        nodes.rows.append([node, s.value, s.median, round(s.score, 3), s.outlier])
    return [grid, nodes]


def link_findings(matrix: fleet.LinkMatrix) -> list[str]:
    """The verdict in words, with its evidence: each bad node's median flow against the fleet's, each bad link."""
    found = []
    for node in matrix.outliers:
        s = matrix.node_scores[node]
        value, median = numbers.quantity(s.value, matrix.unit), numbers.quantity(s.median, matrix.unit)
        found.append(f"Bad node {node}: the median of its pairs is {value}, {s.ratio or 0:.0%} of the fleet's {median} "
                     f"(score {s.score:+.1f})")  # fmt: skip
    arrow = "↔" if matrix.symmetric else "→"
    for sender, receiver, s in matrix.bad_links:
        found.append(f"Bad link {sender} {arrow} {receiver}: {numbers.quantity(s.value, matrix.unit)}, "
                     f"{s.ratio or 0:.0%} of the median pair (score {s.score:+.1f})")  # fmt: skip
    return found


def history_table(node: str, metric: str, history: list[dict[str, Any]]) -> Table:
    columns = ["campaign", "created", "node_value", "fleet_median", "ratio", "score", "outlier", "nodes"]
    table = Table("history", f"{node}: {metric} in its last {len(history)} campaigns, beside its peers", columns,
                  empty="No per-node results of this node yet.")  # fmt: skip
    for row in history:
        s = row["score"]
        table.rows.append([row["name"], row["created_at"].date().isoformat(), s.value, s.median,
                           round(s.ratio, 3) if s.ratio is not None else None, round(s.score, 2), s.outlier,
                           row["nodes"]])  # fmt: skip
    return table
