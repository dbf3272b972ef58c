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

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Score:
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
    median = statistics.median(values.values())
    mad = statistics.median(abs(v - median) for v in values.values())
    scale = max(MAD_TO_SIGMA * mad, min_spread * abs(median), 1e-12)
    judged = len(values) >= MIN_NODES
    scores = {}
    for node, value in values.items():
        score = (value - median) / scale * (1 if higher_is_better else -1)
        scores[node] = Score(node, value, median, score, judged and score <= -threshold)
    return scores


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


@dataclass(frozen=True)
class Cell:
    score: Score
    samples: tuple[float, ...]  # every repetition's value (a node's value is their median)


@dataclass
class Outlier:
    node: str
    evidence: list[tuple[Column, Cell]]  # the cells that make it one, worst first


@dataclass
class FleetView:
    nodes: list[str]
    columns: list[Column]
    cells: dict[tuple[str, int], Cell]  # (node, column index) -> cell
    outliers: list[Outlier]
    threshold: float

    def row(self, node: str) -> list[Cell | None]:
        return [self.cells.get((node, i)) for i in range(len(self.columns))]


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
    with gc_paused():  # some 150,000 small objects at 1,000 nodes x 20 metrics (common/collector.py)
        return _fleet_view(samples, threshold=threshold, min_spread=min_spread)


def _fleet_view(
    samples: Iterable[tuple[Column, str, Sequence[float]]], *, threshold: float, min_spread: float
) -> FleetView:
    grouped: dict[Column, dict[str, list[float]]] = {}
    last: Column | None = None
    per_node: dict[str, list[float]] = {}
    for column, node, values in samples:
        if column is not last:  # samples come column by column: a column's hash (six fields) once per column
            per_node, last = grouped.setdefault(column, {}), column
        found = per_node.get(node)
        if found is None:
            per_node[node] = list(values)
        else:
            found.extend(values)
    columns = sorted(grouped, key=lambda c: (c.point, c.name, c.labels))
    nodes = sorted({node for per_node in grouped.values() for node in per_node}, key=_natural)
    cells: dict[tuple[str, int], Cell] = {}
    bad: dict[str, list[tuple[Column, Cell]]] = defaultdict(list)
    for index, column in enumerate(columns):
        medians = {node: _median(found) for node, found in grouped[column].items()}
        scores = robust_scores(
            medians,
            higher_is_better=column.higher_is_better,
            threshold=threshold if column.judged else math.inf,
            min_spread=min_spread,
        )
        for node, score in scores.items():
            cell = cells[(node, index)] = Cell(score, tuple(grouped[column][node]))
            if score.outlier:
                bad[node].append((column, cell))
    outliers = [Outlier(node, sorted(bad[node], key=lambda pair: pair[1].score.score)) for node in nodes if node in bad]
    return FleetView(nodes, columns, cells, outliers, threshold)


def _median(values: list[float]) -> float:
    """statistics.median for the few repetitions of one cell, without its overhead (20,000 cells a page)."""
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
    for key, score in sorted(cell_scores.items(), key=lambda item: item[1].score):
        sender, receiver = key.split("\0")
        if score.outlier and sender not in bad_nodes and receiver not in bad_nodes:
            bad_links.append((sender, receiver, score))
    return LinkMatrix(
        nodes, cells, dict(samples), node_scores, bad_links, threshold, outliers=[s.node for s in outliers],
        higher_is_better=higher_is_better, **about,
    )  # fmt: skip


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
