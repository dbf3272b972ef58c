"""Judging nodes against their own fleet, without I/O: robust scores, the fleet view and the link matrix.

A node's value is compared with the fleet's median at the same point, with a robust score (the median absolute
deviation, scaled by 1.4826 to estimate a standard deviation for normal data): ``score = (value - median) / scale``,
signed so that a negative score is always worse (for a metric where lower is better the sign is turned). A node is
an outlier when its score is at or below ``-threshold``. The scale never drops below ``min_spread`` times the median:
a healthy fleet of near-identical nodes has a MAD close to 0, and a 1 % difference must not make a node an outlier.
With fewer than ``MIN_NODES`` nodes at a point there is no fleet to speak of, and nobody is judged there.

The link matrix reads pairwise flows (iperf3 ``all_pairs``: sender -> receiver, bit/s): a node's value is the
median of every flow it took part in, sending or receiving, so one bad peer does not make a good node look bad,
and a bad node shows as a whole row and column. A cell that is an outlier among all cells while neither of its
ends is an outlier node is a bad link.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from common.collector import gc_paused
from common.errors import ParamError

MAD_TO_SIGMA = 1.4826
DEFAULT_THRESHOLD = 3.5  # robust z-score beyond which a value is an outlier (Iglewicz and Hoaglin)
DEFAULT_MIN_SPREAD = 0.05  # the scale is at least 5 % of the median
MIN_NODES = 3
THRESHOLD_RANGE = (0.5, 50.0)


def parse_threshold(raw: Any) -> float:
    """The user's threshold (a robust score), checked; empty means the default."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return DEFAULT_THRESHOLD
    low, high = THRESHOLD_RANGE
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ParamError("threshold", f"must be a number from {low:g} to {high:g}, got {str(raw)[:40]!r}") from None
    if not low <= value <= high:  # NaN fails this too
        raise ParamError("threshold", f"must be a number from {low:g} to {high:g}, got {str(raw)[:40]!r}")
    return value


class Score(NamedTuple):
    """A node's (or a device's, or a link's) value against the median of its fleet. A named tuple, as Cell is: an
    export of a fleet view makes one of each for every cell (20,000 at 1,000 nodes x 20 metrics), and they cost a
    third of a frozen dataclass's time to make, and half its objects for the collector to walk."""

    node: str
    value: float
    median: float  # the fleet's
    score: float  # robust score, negative is worse
    outlier: bool

    @property
    def ratio(self) -> float | None:
        """The value as a fraction of the fleet's median (None when the median is 0)."""
        return self.value / self.median if self.median else None


def robust_scores(
    values: dict[str, float],
    *,
    higher_is_better: bool = True,
    threshold: float = DEFAULT_THRESHOLD,
    min_spread: float = DEFAULT_MIN_SPREAD,
) -> dict[str, Score]:
    """Every node's score against the median of ``values`` (node -> value)."""
    if not values:
        return {}
    median, scale = _spread(list(values.values()), min_spread)
    sign = 1 if higher_is_better else -1
    judged = len(values) >= MIN_NODES
    scores = {}
    for node, value in values.items():
        score = (value - median) / scale * sign
        scores[node] = Score(node, value, median, score, judged and score <= -threshold)
    return scores


def _spread(values: list[float], min_spread: float) -> tuple[float, float]:
    """The median of ``values`` and the scale a score divides by (see the module's docstring)."""
    median = _median(values)
    mad = _median([abs(v - median) for v in values])
    return median, max(MAD_TO_SIGMA * mad, min_spread * abs(median), 1e-12)


# --- the fleet view: node x metric ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One metric at one matrix point: its name, the labels that tell it apart, and the point's parameters."""

    point: int
    name: str
    labels: str  # "k=v, ..." ("" when none)
    params: str  # the point's parameters, "k=v, ..."
    unit: str
    higher_is_better: bool
    judged: bool = True  # False: context (the plug-in's MetricSpec.judged), scored but never an outlier

    @property
    def title(self) -> str:
        return " ".join(p for p in (self.name, f"[{self.labels}]" if self.labels else "", self.params) if p)


class Cell(NamedTuple):
    score: Score
    samples: tuple[float, ...]  # every repetition's value (a node's value is their median)


@dataclass
class Outlier:
    node: str
    evidence: list[tuple[Column, Cell]]  # the cells that make it one, worst first


@dataclass(frozen=True)
class Repetitions:
    """A column's samples where every node has one in each repetition, the common case: ``hosts`` (each once) and
    ``values``, an array of repetitions x hosts. fleet_view_by_column takes it in place of {node: samples}: the
    medians and scores of 1,000 nodes are then a few array operations."""

    hosts: list[str]
    values: np.ndarray  # float64, (repetitions, len(hosts))

    def as_lists(self) -> dict[str, list[float]]:
        return dict(zip(self.hosts, self.values.T.tolist(), strict=True))


ColumnSamples = dict[str, list[float]] | Repetitions  # a column's samples: {node: its samples}, or Repetitions


@dataclass(frozen=True)
class _Scored:
    """One column of a fleet view, judged: every node's samples and value (their median), by position, the fleet's
    median and the scale. A cell's Score and Cell are made from it when asked for: a page shows 100 of 1,000 nodes,
    the API only the outliers' cells."""

    index: dict[str, int]  # node -> its position
    values: np.ndarray  # float64: each node's value
    samples: np.ndarray | list[list[float]]  # each node's samples (a row each)
    median: float
    scale: float
    sign: int
    limit: float | None  # a score at or below it is an outlier's (None: nobody is judged here)

    def cell(self, node: str) -> Cell | None:
        position = self.index.get(node)
        return None if position is None else self._cell(node, position)

    def _cell(self, node: str, position: int) -> Cell:
        value = float(self.values[position])
        score = (value - self.median) / self.scale * self.sign  # as the array in outliers() has it, to the bit
        row = self.samples[position]
        samples = tuple(row.tolist() if isinstance(row, np.ndarray) else row)
        return Cell(Score(node, value, self.median, score, self.limit is not None and score <= self.limit), samples)

    def cells(self) -> Iterator[tuple[str, Cell]]:
        for node, position in self.index.items():
            yield node, self._cell(node, position)

    def outliers(self) -> list[tuple[str, Cell]]:
        """(node, cell) of every outlier, in position order."""
        if self.limit is None:
            return []
        scores = (self.values - self.median) / self.scale * self.sign
        nodes = list(self.index)
        return [(nodes[i], self._cell(nodes[i], i)) for i in np.flatnonzero(scores <= self.limit).tolist()]


def _judged(
    column: Column,
    samples: ColumnSamples,
    *,
    threshold: float,
    min_spread: float,
    indexes: dict[tuple[str, ...], dict[str, int]],
) -> _Scored:
    """A column's samples scored: each node's value the median of its samples, scored against their median.
    ``indexes`` keeps the {node: position} of each list of hosts, for the columns that share it."""
    if isinstance(samples, Repetitions):
        hosts = tuple(samples.hosts)
        index = indexes.get(hosts)
        if index is None:
            index = indexes[hosts] = {host: position for position, host in enumerate(hosts)}
        rows: np.ndarray | list[list[float]] = samples.values.T
        values = samples.values[0] if len(samples.values) == 1 else np.median(samples.values, axis=0)
    else:
        index = {node: position for position, node in enumerate(samples)}
        rows = list(samples.values())
        values = np.array([_median(found) for found in rows], dtype=np.float64)
    median, scale = _spread_of(values, min_spread)
    judged = len(index) >= MIN_NODES and column.judged
    sign = 1 if column.higher_is_better else -1
    return _Scored(index, values, rows, median, scale, sign, -threshold if judged else None)


def _spread_of(values: np.ndarray, min_spread: float) -> tuple[float, float]:
    """_spread of an array: numpy's median is the same value, to the bit (the middle one, or the half-sum of the two
    middle ones)."""
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median)))
    return median, max(MAD_TO_SIGMA * mad, min_spread * abs(median), 1e-12)


@dataclass
class FleetView:
    nodes: list[str]
    columns: list[Column]
    outliers: list[Outlier]
    threshold: float
    scored: list[_Scored] = field(default_factory=list, repr=False)  # one per column

    @cached_property
    def cells(self) -> dict[tuple[str, int], Cell]:
        """(node, column index) -> cell, every one (the exports)."""
        found = {}
        with gc_paused():  # 20,000 cells (common/collector.py)
            for index, column in enumerate(self.scored):
                for node, cell in column.cells():
                    found[(node, index)] = cell
        return found

    def cell(self, node: str, index: int) -> Cell | None:
        return self.scored[index].cell(node)

    def row(self, node: str) -> list[Cell | None]:
        return [column.cell(node) for column in self.scored]


# Labels that say which flow of a host a value is, not what was measured: a host's value at a point is the median
# over them (iperf3 all_pairs: over its peers and rounds).
FLOW_LABELS = frozenset({"peer", "round"})


def label_text(labels: dict[str, Any], *, leave_out: Iterable[str] = FLOW_LABELS) -> str:
    skip = set(leave_out)
    return ", ".join(f"{k}={labels[k]}" for k in sorted(labels) if k not in skip)


def fleet_view(
    samples: Iterable[tuple[Column, str, Sequence[float]]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_spread: float = DEFAULT_MIN_SPREAD,
) -> FleetView:
    """The node x metric matrix from (column, node, values) samples (a node's repetitions and flows at a column;
    several of one node and column are joined): each cell the median of its samples, scored against the other
    nodes' cells of its column."""
    grouped: dict[Column, dict[str, list[float]]] = {}
    last: Column | None = None
    per_node: dict[str, list[float]] = {}
    with gc_paused():  # a list for each node and column (common/collector.py)
        for column, node, values in samples:
            if column is not last:  # samples come column by column: a column's hash (six fields) once per column
                per_node, last = grouped.setdefault(column, {}), column
            found = per_node.get(node)
            if found is None:
                per_node[node] = list(values)
            else:
                found.extend(values)
        return fleet_view_by_column(grouped, threshold=threshold, min_spread=min_spread)


def fleet_view_by_column(
    grouped: Mapping[Column, ColumnSamples],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_spread: float = DEFAULT_MIN_SPREAD,
) -> FleetView:
    """fleet_view of samples already joined, a column's {node: every sample of the node there} or Repetitions. Each
    column's values (the medians of its cells' samples) and scores are computed here; a cell's Score and Cell only
    for the outliers' evidence, the rest when asked for (FleetView.cells, row)."""
    with gc_paused():  # 20,000 cells at 1,000 nodes x 20 metrics (common/collector.py)
        columns = sorted(grouped, key=lambda c: (c.point, c.name, c.labels))
        indexes: dict[tuple[str, ...], dict[str, int]] = {}
        scored = [_judged(c, grouped[c], threshold=threshold, min_spread=min_spread, indexes=indexes) for c in columns]
        nodes = sorted({node for judge in scored for node in judge.index}, key=_natural)
        bad: dict[str, list[tuple[Column, Cell]]] = defaultdict(list)
        for column, judge in zip(columns, scored, strict=True):
            for node, cell in judge.outliers():
                bad[node].append((column, cell))
        outliers = [Outlier(node, sorted(bad[node], key=lambda pair: pair[1].score.score)) for node in nodes
                    if node in bad]  # fmt: skip
        return FleetView(nodes, columns, outliers, threshold, scored)


def _median(values: list[float]) -> float:
    """statistics.median (the same value, to the bit) without its overhead: 20,000 cells a page, each the median of
    its few repetitions, and each column's median and MAD over its 1,000 nodes."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# --- the link matrix: sender x receiver ----------------------------------------------------------------------


@dataclass
class LinkMatrix:
    nodes: list[str]
    cells: dict[tuple[str, str], float]  # (sender, receiver) -> median over repetitions
    samples: dict[tuple[str, str], list[float]]
    node_scores: dict[str, Score]  # over the median of every flow a node took part in
    bad_links: list[tuple[str, str, Score]]  # (sender, receiver, the cell's score among all cells)
    threshold: float
    unit: str = "bit/s"
    outliers: list[str] = field(default_factory=list)  # the outlier nodes, worst first
    _median_cell: float | None = field(default=None, repr=False)
    # What the cells are: the metric, one run's value of a pair in words, its direction, rows and columns.
    metric: str = "throughput_bps"
    statistic: str = "throughput of the flow, as its receiver counted it"
    higher_is_better: bool = True
    axes: tuple[str, str] = ("sender", "receiver")
    symmetric: bool = False  # (a, b) and (b, a) are one link, shown twice, named once

    def value(self, sender: str, receiver: str) -> float | None:
        return self.cells.get((sender, receiver))

    def relative(self, sender: str, receiver: str) -> float | None:
        """The cell as a fraction of the median cell (for the heatmap's colour)."""
        value = self.cells.get((sender, receiver))
        return value / self.median_cell if value is not None and self.median_cell else None

    @property
    def median_cell(self) -> float:
        if self._median_cell is None:
            self._median_cell = statistics.median(self.cells.values()) if self.cells else 0.0
        return self._median_cell


def link_matrix(
    flows: Iterable[tuple[str, str, float]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    min_spread: float = DEFAULT_MIN_SPREAD,
    higher_is_better: bool = True,
    **about: Any,
) -> LinkMatrix:
    """The N x N matrix from (sender, receiver, value) flows, with outlier nodes and bad links named; ``about``:
    LinkMatrix's unit, metric, statistic and axes (iperf3's flows by default)."""
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sender, receiver, value in flows:
        samples[(sender, receiver)].append(value)
    cells = {pair: statistics.median(found) for pair, found in samples.items()}
    nodes = sorted({n for pair in cells for n in pair}, key=_natural)
    per_node: dict[str, list[float]] = defaultdict(list)
    for (sender, receiver), value in cells.items():
        per_node[sender].append(value)
        per_node[receiver].append(value)
    node_scores = robust_scores(
        {n: statistics.median(v) for n, v in per_node.items()},
        higher_is_better=higher_is_better,
        threshold=threshold,
        min_spread=min_spread,
    )
    outliers = sorted((s for s in node_scores.values() if s.outlier), key=lambda s: s.score)
    bad_nodes = {s.node for s in outliers}
    cell_scores = robust_scores(
        {f"{s}\0{r}": v for (s, r), v in cells.items()},
        higher_is_better=higher_is_better,
        threshold=threshold,
        min_spread=min_spread,
    )
    bad_links = []
    named: set[frozenset[str]] = set()
    for key, score in sorted(cell_scores.items(), key=lambda item: (item[1].score, _natural_pair(item[0]))):
        sender, receiver = key.split("\0")
        if score.outlier and sender not in bad_nodes and receiver not in bad_nodes:
            if about.get("symmetric"):  # the link once, in the order its nodes sort in
                if frozenset((sender, receiver)) in named:
                    continue
                named.add(frozenset((sender, receiver)))
                sender, receiver = sorted((sender, receiver), key=_natural)
            bad_links.append((sender, receiver, score))
    return LinkMatrix(
        nodes, cells, dict(samples), node_scores, bad_links, threshold, outliers=[s.node for s in outliers],
        higher_is_better=higher_is_better, **about,
    )  # fmt: skip


def _natural_pair(key: str) -> tuple[Any, ...]:
    sender, receiver = key.split("\0")
    return (_natural(sender), _natural(receiver))


def _natural(name: str) -> tuple[Any, ...]:
    """lab2 before lab10."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1, name)


def fleet_payload(view: FleetView) -> dict[str, Any]:
    """The fleet view for the API and the CI client: a verdict per node, outliers with their evidence."""
    outliers = {o.node: o for o in view.outliers}
    return {
        "threshold": view.threshold,
        "nodes": [
            {
                "node": node,
                "verdict": "outlier" if node in outliers else "ok",
                "evidence": [
                    {
                        "point": c.point,
                        "metric": c.name,
                        "labels": c.labels,
                        "parameters": c.params,
                        "unit": c.unit,
                        "value": cell.score.value,
                        "fleet_median": cell.score.median,
                        "score": round(cell.score.score, 3),
                        "samples": list(cell.samples),
                    }  # fmt: skip
                    for c, cell in (outliers[node].evidence if node in outliers else [])
                ],
            }
            for node in view.nodes
        ],
        "outliers": [o.node for o in view.outliers],
    }


def links_payload(matrix: LinkMatrix) -> dict[str, Any]:
    return {
        "threshold": matrix.threshold,
        "metric": matrix.metric,
        "unit": matrix.unit,
        "statistic": f"median over repetitions of the {matrix.statistic}",
        "higher_is_better": matrix.higher_is_better,
        "rows": matrix.axes[0],
        "columns": matrix.axes[1],
        "symmetric": matrix.symmetric,
        "nodes": matrix.nodes,
        "matrix": [[matrix.value(s, r) for r in matrix.nodes] for s in matrix.nodes],
        "node_scores": {
            n: {"median_flow": s.value, "fleet_median": s.median, "score": round(s.score, 3), "outlier": s.outlier}
            for n, s in matrix.node_scores.items()
        },
        "outliers": matrix.outliers,
        "bad_links": [
            {"sender": s, "receiver": r, "value": score.value, "median": score.median, "score": round(score.score, 3)}
            for s, r, score in matrix.bad_links
        ],
    }


# --- per device: GPU x metric, NIC x metric ------------------------------------------------------------------
#
# A result labelled with a device (telemetry's gpu.* {gpu}, net.* {nic}, rdma.* {device, port}; the nvidia_smi
# parser's {gpu}; perftest's {hca, port}) is one device's: it is judged against every device of its kind in the fleet
# at the same column (a GPU against all the fleet's GPUs there, not only against the other nodes' GPU of the same
# index), and NICs only within their group (the link speed the inventory knows), so a 25G port is never held against
# a 100G one. Loopback and virtual interfaces are no devices of the fleet and are left out.

GPU, NIC = "gpu", "nic"
DEVICE_KINDS = {GPU: "GPU", NIC: "NIC"}
VIRTUAL_NIC = re.compile(
    r"lo|veth.*|docker\d*|br-.*|virbr.*|cni.*|flannel.*|cali.*|vxlan.*|tun\d*|tap.*|dummy.*|kube-.*|cilium.*|weave.*"
    r"|genev.*|tailscale.*|wg\d+|zt.*|nodelocaldns|bridge\d*"
)
# Of a telemetry series' summaries (telemetry.services.SUMMARY_STATS), the device view judges the mean: the p99 and
# max of a device's rate say more about sampling than about the device, and would triple its columns.
DEVICE_STATS_LEFT_OUT = (".p99", ".max")
# Telemetry series (no plug-in MetricSpec): lower is better for these, and these are context only.
LOWER_IS_BETTER_SERIES = frozenset({"gpu.temperature_c"})
CONTEXT_SERIES = frozenset({"gpu.memory_used_bytes"})


@dataclass(frozen=True)
class DeviceKey:
    """Which device of its host a result is: its kind, its name ("gpu3", "eth1", "mlx5_0:1") and the labels left
    once the device's are taken out."""

    kind: str
    name: str
    labels: dict[str, Any]

    @property
    def virtual(self) -> bool:
        return self.kind == NIC and VIRTUAL_NIC.fullmatch(self.name) is not None


def device_key(name: str, labels: dict[str, Any]) -> DeviceKey | None:
    """The device a result (metric ``name``, ``labels``) belongs to, or None for a host's own result."""
    if "gpu" in labels:
        index = str(labels["gpu"])
        rest = {k: v for k, v in labels.items() if k != "gpu"}
        return DeviceKey(GPU, f"gpu{index}" if index.isdigit() else index, rest)
    if "nic" in labels:
        return DeviceKey(NIC, str(labels["nic"]), {k: v for k, v in labels.items() if k != "nic"})
    if "device" in labels and name.startswith("rdma."):  # an HCA port (plugins/tools/sampler.py, rdma group)
        return _hca_port(labels, "device")
    if "hca" in labels:  # the HCA port an RDMA benchmark's client ran on (plugins/benchmarks/perftest.py)
        return _hca_port(labels, "hca")
    return None


def _hca_port(labels: dict[str, Any], key: str) -> DeviceKey:
    """An HCA port named as telemetry names it (``mlx5_0:1``; the HCA alone where the port is not known), so an RDMA
    benchmark's results and the port's counters are one device's."""
    port = labels.get("port")
    device = f"{labels[key]}:{port}" if port not in (None, "") else str(labels[key])
    return DeviceKey(NIC, device, {k: v for k, v in labels.items() if k not in (key, "port")})


def device_metric_shown(name: str) -> bool:
    return not name.endswith(DEVICE_STATS_LEFT_OUT)


def series_direction(name: str) -> tuple[bool, bool]:
    """(higher is better, judged) of a telemetry summary such as ``gpu.temperature_c.mean``."""
    series = name.rsplit(".", 1)[0]
    return series not in LOWER_IS_BETTER_SERIES, series not in CONTEXT_SERIES


class Device(NamedTuple):
    node: str
    name: str
    group: str = ""  # the class it is judged within ("" when its kind is one class), e.g. "100 Gbit/s"

    @property
    def title(self) -> str:
        """How a device is named: ``node/gpu3``, ``node/eth1``."""
        return f"{self.node}/{self.name}"


@dataclass
class DeviceOutlier:
    device: Device
    evidence: list[tuple[Column, Cell]]  # worst first


@dataclass
class DeviceView:
    """Device x metric for one kind of device: every device's cell against the median of its kind and group."""

    kind: str
    devices: list[Device]
    columns: list[Column]
    outliers: list[DeviceOutlier]
    threshold: float
    scored: list[dict[str, _Scored]] = field(default_factory=list, repr=False)  # per column: group -> by title

    @property
    def title(self) -> str:
        return DEVICE_KINDS.get(self.kind, self.kind)

    @cached_property
    def cells(self) -> dict[tuple[Device, int], Cell]:
        """(device, column index) -> cell, every one (the exports)."""
        titled = {d.title: d for d in self.devices}
        found = {}
        with gc_paused():
            for index, groups in enumerate(self.scored):
                for judge in groups.values():
                    for title, cell in judge.cells():
                        found[(titled[title], index)] = cell
        return found

    def row(self, device: Device) -> list[Cell | None]:
        title = device.title
        return [judge.cell(title) if (judge := groups.get(device.group)) else None for groups in self.scored]


DeviceSample = tuple[Column, str, str, Sequence[float]]  # (column, node, device name, values)


def device_view(
    kind: str,
    samples: Iterable[DeviceSample],
    *,
    groups: dict[tuple[str, str], str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    min_spread: float = DEFAULT_MIN_SPREAD,
) -> DeviceView:
    """Device x metric from (column, node, device, values) samples: each cell the median of its samples, scored
    against the cells of the same column and group (``groups``: (node, device) -> group; absent: one group)."""
    with gc_paused():  # 1,000 GPUs x 10 metrics make as many small objects as fleet_view's nodes
        return _device_view(kind, samples, groups=groups or {}, threshold=threshold, min_spread=min_spread)


def _device_view(
    kind: str,
    samples: Iterable[DeviceSample],
    *,
    groups: dict[tuple[str, str], str],
    threshold: float,
    min_spread: float,
) -> DeviceView:
    known: dict[tuple[str, str], Device] = {}
    grouped: dict[Column, dict[Device, list[float]]] = {}
    for column, node, name, values in samples:
        device = known.get((node, name))
        if device is None:
            device = known[(node, name)] = Device(node, name, groups.get((node, name), ""))
        per_device = grouped.get(column)
        if per_device is None:
            per_device = grouped[column] = {}
        found = per_device.get(device)
        if found is None:
            per_device[device] = list(values)
        else:
            found.extend(values)
    columns = sorted(grouped, key=lambda c: (c.point, c.name, c.labels))
    devices = sorted(known.values(), key=_device_order)
    titled = {d.title: d for d in devices}
    scored = []
    bad: dict[Device, list[tuple[Column, Cell]]] = defaultdict(list)
    for column in columns:
        by_group: dict[str, dict[str, list[float]]] = {}
        for device, values in grouped[column].items():
            by_group.setdefault(device.group, {})[device.title] = values
        judges = {group: _judged(column, of_title, threshold=threshold, min_spread=min_spread, indexes={})
                  for group, of_title in by_group.items()}  # fmt: skip
        for judge in judges.values():
            for title, cell in judge.outliers():
                bad[titled[title]].append((column, cell))
        scored.append(judges)
    outliers = [DeviceOutlier(d, sorted(e, key=lambda pair: pair[1].score.score)) for d, e in bad.items()]
    outliers.sort(key=lambda o: o.evidence[0][1].score.score)
    return DeviceView(kind, devices, columns, outliers, threshold, scored)


def _device_order(device: Device) -> tuple[Any, ...]:
    """By group, then node (lab2 before lab10), then device (gpu2 before gpu10)."""
    return (device.group, _natural(device.node), _natural(device.name))


def _evidence(column: Column, cell: Cell) -> dict[str, Any]:
    return {
        "point": column.point,
        "metric": column.name,
        "labels": column.labels,
        "parameters": column.params,
        "unit": column.unit,
        "value": cell.score.value,
        "fleet_median": cell.score.median,
        "score": round(cell.score.score, 3),
        "samples": list(cell.samples),
    }


def devices_payload(payload: dict[str, Any], views: Sequence[DeviceView]) -> dict[str, Any]:
    """The per-device judgement added to a fleet_payload: every device with its verdict, and each node with an
    outlier device ``suspect`` (unless an outlier itself), naming the device with its evidence."""
    bad_devices: dict[str, list[dict[str, Any]]] = defaultdict(list)
    devices = []
    for view in views:
        outliers = {o.device: o for o in view.outliers}
        for device in view.devices:
            found = outliers.get(device)
            entry = {
                "kind": view.kind,
                "device": device.title,
                "node": device.node,
                "name": device.name,
                "group": device.group,
                "verdict": "outlier" if found else "ok",
                "evidence": [_evidence(c, cell) for c, cell in found.evidence] if found else [],
            }
            devices.append(entry)
            if found:
                bad_devices[device.node].append(entry)
    for node in payload["nodes"]:
        named = bad_devices.get(node["node"], [])
        node["devices"] = [{k: d[k] for k in ("kind", "device", "name", "evidence")} for d in named]
        if named and node["verdict"] == "ok":
            node["verdict"] = "suspect"
    known = {n["node"] for n in payload["nodes"]}
    for node, named in bad_devices.items():  # a node with device results only
        if node not in known:
            devices_of = [{k: d[k] for k in ("kind", "device", "name", "evidence")} for d in named]
            payload["nodes"].append({"node": node, "verdict": "suspect", "evidence": [], "devices": devices_of})
    payload["devices"] = devices
    payload["device_outliers"] = [o.device.title for view in views for o in view.outliers]
    payload["suspects"] = [n["node"] for n in payload["nodes"] if n["verdict"] == "suspect"]
    return payload


def device_views(
    samples: dict[str, list[DeviceSample]],
    *,
    groups: dict[tuple[str, str], str] | None = None,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[DeviceView]:
    """One DeviceView per kind of device that has results (GPUs first), none when no result is a device's."""
    return [
        device_view(kind, samples[kind], groups=groups if kind == NIC else None, threshold=threshold)
        for kind in DEVICE_KINDS
        if samples.get(kind)
    ]
