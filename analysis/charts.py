"""Line charts of the analysis pages, drawn on the server as SVG (no JavaScript needed, and the SVG download).

A ``Figure`` is lines over one x axis (linear or log) and one y axis, plus horizontal reference lines (rated and
measured storage throughput). The same figure is handed to the browser as JSON (``Figure.as_json``), where
static/analysis.js draws it again with uPlot for hover values and zoom, and offers it as a PNG.

A line longer than ``MAX_POINTS`` is cut into that many buckets of x, each drawn as its min/max band (the run page's
downsampling, telemetry.charts.minmax_buckets), so a series of a million points stays a few kilobytes of SVG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.utils.html import escape

from common import numbers
from telemetry.charts import band_points, minmax_buckets

WIDTH, HEIGHT = 800, 340
LEFT, RIGHT, TOP, BOTTOM = 78, 24, 16, 46
LEGEND_ROW = 18
MAX_POINTS = 1000  # per line: a point or a bucket per pixel or so
MAX_LABEL = 70  # characters of a legend entry; the whole name is its tooltip
PALETTE = ("#1f5fbf", "#c2410c", "#15803d", "#7c3aed", "#b91c1c", "#0e7490", "#a16207", "#be185d", "#4b5563")


@dataclass
class Line:
    """One series. ``low``/``high`` (per point) draw an error bar: mean ± stdev, or a bucket's min..max."""

    label: str
    x: list[float]
    y: list[float]
    low: list[float] | None = None
    high: list[float] | None = None
    notes: list[str] | None = None  # per point, shown in its tooltip (efficiency, n)
    dashed: bool = False
    color_of: int | None = None  # index of the line whose colour this one shares (an ideal line)
    banded: bool = field(default=False, init=False)


@dataclass
class Figure:
    title: str
    x_label: str
    y_label: str
    lines: list[Line]
    x_log: bool = False
    x_unit: str = ""  # "B": ticks on powers of two, labelled in KiB/MiB/GiB
    x_integer: bool = field(default=False, init=False)  # every x is whole (GPUs, nodes): ticks at whole numbers
    references: list[tuple[str, float]] = field(default_factory=list)  # horizontal lines
    y_unit: str = ""  # the stored unit of the y values: ticks, tooltips and the axis title read in its family
    y_divisor: float = field(default=1.0, init=False)  # stored y / y_divisor = the number a tick shows
    y_title: str = field(default="", init=False)  # y_label and the unit the ticks are in

    def __post_init__(self) -> None:
        self.lines = [_downsampled(line, self.x_log) for line in self.lines]
        measured = [line for line in self.lines if not line.dashed] or self.lines
        values = [y for line in measured for y in line.y] + [y for _, y in self.references]
        self.y_divisor, shown = numbers.axis(values, self.y_unit)
        self.y_title = f"{self.y_label} ({shown})" if shown else self.y_label
        xs = [x for line in self.lines for x in line.x]
        self.x_integer = bool(xs) and all(float(x).is_integer() for x in xs)

    def y_text(self, value: float) -> str:
        """A y value for a tooltip, in the best prefix of its own (common.numbers)."""
        return numbers.quantity(value, self.y_unit)

    def x_text(self, value: float) -> str:
        """An x value for a tooltip (common.numbers): a byte size in KiB/MiB, a count as it is."""
        return numbers.quantity(value, self.x_unit)

    @property
    def empty(self) -> bool:
        return not any(line.x for line in self.lines)

    def colors(self) -> list[str]:
        return [PALETTE[(i if ln.color_of is None else ln.color_of) % len(PALETTE)] for i, ln in enumerate(self.lines)]

    def as_json(self) -> dict[str, Any]:
        """uPlot's aligned data: one x array (every line's x values, merged) and one y array per line (null gaps).

        A line's ``low``/``high`` go with its series, aligned on the same x array: a min/max band (``band``) for a
        downsampled line, an error bar per point (mean ± stdev) otherwise; the SVG draws the same.
        """
        xs = sorted({x for line in self.lines for x in line.x})
        index = {x: i for i, x in enumerate(xs)}

        def aligned(line: Line, values: list[Any]) -> list[Any]:
            out: list[Any] = [None] * len(xs)
            for x, v in zip(line.x, values, strict=True):
                out[index[x]] = v
            return out

        colors = self.colors()
        series = []
        for i, line in enumerate(self.lines):
            hover = aligned(line, [self.y_text(y) for y in line.y])  # each value as common.numbers writes it
            entry: dict[str, Any] = {"label": line.label, "color": colors[i], "dashed": line.dashed, "text": hover}
            if line.low is not None and line.high is not None:
                entry.update(band=line.banded, low=aligned(line, line.low), high=aligned(line, line.high))
            series.append(entry)
        return {
            "title": self.title, "x_label": self.x_label, "y_label": self.y_title, "x_log": self.x_log,
            "y_divisor": self.y_divisor,
            "x_unit": self.x_unit, "x_integer": self.x_integer, "x_text": [self.x_text(x) for x in xs],
            "data": [list(xs), *(aligned(line, line.y) for line in self.lines)],
            "series": series, "references": [{"label": label, "y": y} for label, y in self.references],
        }  # fmt: skip


def _downsampled(line: Line, x_log: bool) -> Line:
    if len(line.x) <= MAX_POINTS:
        return line
    order = np.argsort(np.asarray(line.x, dtype=np.float64), kind="stable")
    x = np.asarray(line.x, dtype=np.float64)[order]
    y = np.asarray(line.y, dtype=np.float64)[order]
    if x_log:
        keep = x > 0
        x, y = np.log10(x[keep]), y[keep]
    start, low, high = minmax_buckets(x, y, max_points=MAX_POINTS)
    xs = (10**start if x_log else start).tolist()
    lows, highs = low.tolist(), high.tolist()
    out = Line(line.label, xs, [(a + b) / 2 for a, b in zip(lows, highs, strict=True)], lows, highs,
               dashed=line.dashed, color_of=line.color_of)  # fmt: skip
    out.banded = True
    return out


# --- axes -----------------------------------------------------------------------------------------------------


def nice_ticks(low: float, high: float, count: int = 6, *, integer: bool = False) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) covering low..high; whole numbers only for an
    ``integer`` axis (GPUs, nodes: no tick at 1.05 GPUs)."""
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if integer:
        step = max(1.0, round(step))
    first = math.floor(low / step) * step
    ticks = [round(first, 12)]
    while ticks[-1] < high - step * 1e-9:  # the last tick is at or above high
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def log_ticks(low: float, high: float, *, binary: bool) -> list[float]:
    """Powers of 10 (or of 2 for byte sizes) between low and high, thinned to at most about ten."""
    base = 2 if binary else 10
    first, last = math.floor(math.log(low, base) + 1e-9), math.ceil(math.log(high, base) - 1e-9)
    stride = max(1, math.ceil((last - first + 1) / 10))
    if binary and stride > 1:
        stride = 2 * math.ceil(stride / 2)  # 1K, 4K, 16K ... or 1K, 16K, 256K: powers of 4 or 16 read better
        first -= first % stride
    return [float(base**e) for e in range(first, last + 1, stride)]


class _Scale:
    def __init__(self, low: float, high: float, pixels: tuple[float, float], log: bool) -> None:
        self.log = log
        self.low, self.high = (math.log10(low), math.log10(high)) if log else (low, high)
        if self.high == self.low:
            self.high = self.low + 1
        self.p0, self.p1 = pixels

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        return self.p0 + (v - self.low) * (self.p1 - self.p0) / (self.high - self.low)


def _bounds(fig: Figure) -> tuple[float, float, float, float]:
    xs = [x for ln in fig.lines for x in ln.x if x > 0 or not fig.x_log]
    # The y-range comes from the measured lines: a dashed ideal (linear scaling) far above them is clipped at the
    # top rather than squashing the data into the bottom of the chart.
    measured = [ln for ln in fig.lines if not ln.dashed] or fig.lines
    ys = [y for ln in measured for y in (ln.high or ln.y)] + [y for _, y in fig.references]
    ys += [y for ln in measured for y in (ln.low or ln.y)]
    x0, x1 = (min(xs), max(xs)) if xs else (1.0, 10.0)
    if fig.x_log:
        x0, x1 = (x0 / 1.5, x1 * 1.5) if x0 != x1 else (x0 / 2, x1 * 2)
    elif x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    else:
        pad = (x1 - x0) * 0.04
        x0, x1 = x0 - pad, x1 + pad
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    y0 = min(y0, 0.0)  # throughput starts at zero: a bar of 90% looks like 90%
    return x0, x1, y0, y1 * 1.05 if y1 > 0 else y1 + 1


# --- SVG ------------------------------------------------------------------------------------------------------


def svg(fig: Figure, *, standalone: bool = False) -> str:
    """The figure as one SVG element; ``standalone`` adds the XML declaration and inline styles of a download."""
    legend = [*((ln.label, i) for i, ln in enumerate(fig.lines)), *((label, -1) for label, _ in fig.references)]
    height = HEIGHT + LEGEND_ROW * len(legend)
    plot_bottom = HEIGHT - BOTTOM
    if fig.empty:
        return _empty_svg(fig, standalone)
    x0, x1, y0, y1 = _bounds(fig)
    sx = _Scale(x0, x1, (LEFT, WIDTH - RIGHT), fig.x_log)
    y_ticks = nice_ticks(y0, y1)
    sy = _Scale(min(y_ticks[0], y0), max(y_ticks[-1], y1), (plot_bottom, TOP), False)
    colors = fig.colors()
    binary = fig.x_unit == "B"
    parts = [_open(fig, height, standalone)]
    parts.append(f'<rect class="plot" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
                 f'height="{plot_bottom - TOP}" fill="#fafbfc" stroke="#d9dde3"/>')  # fmt: skip
    for t in y_ticks:
        py = sy(t)
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" stroke="#e9ecf0"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end" class="tick">'
                     f"{escape(numbers.tick(t, fig.y_divisor))}</text>")  # fmt: skip
    x_ticks = log_ticks(x0, x1, binary=binary) if fig.x_log else nice_ticks(x0, x1, 8, integer=fig.x_integer)
    for t in x_ticks:
        if not x0 <= t <= x1:
            continue
        px = sx(t)
        parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{plot_bottom}" stroke="#eef1f5"/>')
        parts.append(f'<text x="{px:.1f}" y="{plot_bottom + 16}" text-anchor="middle" class="tick">'
                     f"{escape(numbers.tick_text(t, fig.x_unit))}</text>")  # fmt: skip
    axis = f"{fig.x_label} (log scale)" if fig.x_log else fig.x_label
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{plot_bottom + 36}" text-anchor="middle" '
                 f'class="axis">{escape(axis)}</text>')  # fmt: skip
    parts.append(f'<text transform="translate(16 {(TOP + plot_bottom) / 2}) rotate(-90)" text-anchor="middle" '
                 f'class="axis">{escape(fig.y_title)}</text>')  # fmt: skip
    for label, value in fig.references:
        py = sy(value)
        parts.append(f'<line class="reference" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}" '
                     f'stroke="#4b5563" stroke-width="1.5" stroke-dasharray="2 4"><title>{escape(label)}: '
                     f"{escape(fig.y_text(value))}</title></line>")  # fmt: skip
    clip = f"plot-{abs(hash((fig.title, fig.y_label, len(fig.lines)))) % 10**9}"
    parts.append(f'<clipPath id="{clip}"><rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
                 f'height="{plot_bottom - TOP}"/></clipPath><g clip-path="url(#{clip})">')  # fmt: skip
    for i, line in enumerate(fig.lines):
        parts.append(_line(line, sx, sy, colors[i], fig))
    parts.append("</g>")
    for row, (label, i) in enumerate(legend):
        parts.append(_legend_entry(label, colors[i] if i >= 0 else "#4b5563", row,
                                   dashed=i < 0 or fig.lines[i].dashed))  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def _open(fig: Figure, height: int, standalone: bool) -> str:
    head = '<?xml version="1.0" encoding="UTF-8"?>\n' if standalone else ""
    style = (
        "<style>text{font-family:system-ui,sans-serif;font-size:12px;fill:#1d2430}"
        ".tick{fill:#5f6b7a;font-size:11px}.axis{font-weight:600}</style>"
    )
    return (
        f'{head}<svg xmlns="http://www.w3.org/2000/svg" class="analysis-chart" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="{escape(fig.title)}">'
        f"<title>{escape(fig.title)}</title>{style}"
    )


def _empty_svg(fig: Figure, standalone: bool) -> str:
    return (
        f'{_open(fig, HEIGHT, standalone)}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
        f'class="axis">no values to draw</text></svg>'
    )


def _line(line: Line, sx: _Scale, sy: _Scale, color: str, fig: Figure) -> str:
    pts = [(x, y) for x, y in zip(line.x, line.y, strict=True) if x > 0 or not fig.x_log]
    if not pts:
        return ""
    dash = ' stroke-dasharray="6 4"' if line.dashed else ""
    out = [f'<g class="series" data-label="{escape(line.label)}">']
    if line.banded and line.low is not None and line.high is not None:
        out.append(f'<polygon points="{band_points(line.x, line.low, line.high, sx, sy)}" fill="{color}" '
                   f'fill-opacity=".3" stroke="none"/>')  # fmt: skip
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>')
    if not line.banded:
        for j, (x, y) in enumerate(zip(line.x, line.y, strict=True)):
            if fig.x_log and x <= 0:
                continue
            px, py = sx(x), sy(y)
            if line.low is not None and line.high is not None and line.high[j] > line.low[j]:
                out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{sy(line.low[j]):.1f}" '
                           f'y2="{sy(line.high[j]):.1f}" stroke="{color}" stroke-width="1"/>')  # fmt: skip
            note = f" ({line.notes[j]})" if line.notes and line.notes[j] else ""
            tip = f"{line.label}: {fig.x_text(x)} → {fig.y_text(y)}{note}"
            shape = "none" if line.dashed else color
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{shape}" stroke="{color}">'
                       f"<title>{escape(tip)}</title></circle>")  # fmt: skip
    out.append("</g>")
    return "".join(out)


def _legend_entry(label: str, color: str, row: int, *, dashed: bool) -> str:
    y = HEIGHT + row * LEGEND_ROW - 4
    short = label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"
    dash = ' stroke-dasharray="6 4"' if dashed else ""
    return (
        f'<g class="legend"><line x1="{LEFT}" x2="{LEFT + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" '
        f'stroke-width="2"{dash}/><text x="{LEFT + 30}" y="{y}">{escape(short)}<title>{escape(label)}</title>'
        f"</text></g>"
    )
