"""Server-side charts of telemetry series: inline SVG drawn from a downsampled window (no JavaScript needed).

Each chart is the series' min/max band per bucket (spikes stay visible, see telemetry.selectors.series_window)
over one shared time window, so the charts of a run line up and can be read against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common import numbers
from telemetry import codec
from telemetry.models import DETAIL_SERIES, Series
from telemetry.selectors import SeriesWindow, bucketed, series_window

WIDTH, HEIGHT = 600, 90
POINTS = 300  # buckets per chart: about two pixels each


@dataclass(frozen=True)
class Chart:
    series: Series
    window: SeriesWindow
    band: str  # SVG polygon points: the max line forward, the min line back
    low: float
    high: float

    @property
    def label(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.series.labels.items()))
        return f"{self.series.name}{{{labels}}}" if labels else self.series.name

    @property
    def range_text(self) -> str:
        """'0 B/s – 9.41 Gbit/s': the window's lowest and highest value, network byte rates in bits."""
        network = numbers.is_network(self.series.name)
        low, high = (numbers.quantity(v, self.window.unit, network=network) for v in (self.low, self.high))
        return f"{low} – {high}"


def chart(series: Series, *, start_ns: int, end_ns: int) -> Chart:
    window = series_window(series=series, start_ns=start_ns, end_ns=end_ns, max_points=POINTS)
    t, lo, hi = window.t_ns.tolist(), window.min.tolist(), window.max.tolist()
    low, high = (min(lo), max(hi)) if t else (0.0, 0.0)
    span_t = max(end_ns - start_ns, 1)
    span_y = (high - low) or 1.0

    def x_px(ts: float) -> float:
        return (ts - start_ns) * WIDTH / span_t

    def y_px(v: float) -> float:
        if high == low:  # a constant series: a line across the middle, not lost on the bottom edge
            return HEIGHT / 2
        return HEIGHT - (v - low) * HEIGHT / span_y

    return Chart(series=series, window=window, band=band_points(t, lo, hi, x_px, y_px), low=low, high=high)


def band_points(
    xs: Sequence[float],
    lows: Sequence[float],
    highs: Sequence[float],
    x_px: Callable[[float], float],
    y_px: Callable[[float], float],
) -> str:
    """SVG polygon points of a min/max band: the max line forward, the min line back (pixels from x_px, y_px)."""
    forward = [f"{x_px(x):.1f},{y_px(v):.1f}" for x, v in zip(xs, highs, strict=True)]
    back = [f"{x_px(x):.1f},{y_px(v):.1f}" for x, v in zip(reversed(xs), reversed(lows), strict=True)]
    return " ".join(forward + back)


def minmax_buckets(
    x: codec.FloatArray, y: codec.FloatArray, *, max_points: int
) -> tuple[codec.FloatArray, codec.FloatArray, codec.FloatArray]:
    """Any series (x sorted ascending) in at most ``max_points`` equal buckets of x, each its least and greatest
    y (the run page's downsampling, telemetry.selectors.series_window, for series that are not telemetry).

    Answers (bucket start, min, max); a series that already fits comes back whole, with min == max.
    """
    if len(x) <= max_points:
        return x, y, y
    start = float(x[0])
    width = (float(x[-1]) - start) / max_points or 1.0
    ids = np.minimum(((x - start) // width).astype(np.int64), max_points - 1)
    buckets = bucketed(ids, y, start=0, width=1)
    return (start + buckets.ids * width).astype(np.float64), buckets.min, buckets.max


def run_window(series: list[Series], t0_s: float | None, t1_s: float | None) -> tuple[int, int, int]:
    """The run's whole time span (ns) and the window asked for, in seconds from its start, clamped to it."""
    first = min((s.first_ns for s in series if s.first_ns is not None), default=0)
    last = max((s.last_ns for s in series if s.last_ns is not None), default=0)
    start = first + int((t0_s or 0) * 1e9)
    end = last if t1_s is None else first + int(t1_s * 1e9)
    start, end = max(first, min(start, last)), max(first, min(end, last))
    return first, start, end if end > start else last


SECONDS_MAX = 10 * 365 * 86400.0  # a window far beyond any run is clamped to the run anyway


def _seconds(text: str | None) -> float | None:
    """Seconds from the run's first sample; anything else (a hand-edited URL: text, nan, 1e400) shows the whole run."""
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    if value is None or not math.isfinite(value):
        return None
    return min(max(0.0, value), SECONDS_MAX)


def run_charts(series: list[Series], t0: str | None, t1: str | None) -> dict[str, Any]:
    """A run's series drawn over one window (``t0``/``t1``: seconds from the first sample, as the query string
    gives them), grouped by host; the run page's chart context, empty when the run has no series."""
    if not series:
        return {}
    drawn = [s for s in series if s.name not in DETAIL_SERIES]
    first, start, end = run_window(drawn or series, _seconds(t0), _seconds(t1))
    by_host: dict[str, list[Chart]] = {}
    idle: list[Chart] = []  # zero throughout the window (an unused NIC): named, not drawn
    for s in drawn:
        c = chart(s, start_ns=start, end_ns=end)
        if c.low == c.high == 0:
            idle.append(c)
        else:
            by_host.setdefault(s.host, []).append(c)
    last = max(s.last_ns or first for s in series)
    return {
        "hosts": list(by_host.items()), "hidden": len(series) - len(drawn), "width": WIDTH, "height": HEIGHT,
        "t0": (start - first) / 1e9, "t1": (end - first) / 1e9, "duration": (last - first) / 1e9,
        "zoomed": (start, end) != (first, last), "idle": idle,
        "time_ticks": time_ticks((start - first) / 1e9, (end - first) / 1e9),
    }  # fmt: skip


def time_ticks(t0: float, t1: float, count: int = 5) -> list[tuple[float, str]]:
    """(percent of the chart's width, seconds since the run's first sample) for the time axis under each chart."""
    span = max(t1 - t0, 1e-9)
    return [(100 * i / (count - 1), numbers.quantity(t0 + span * i / (count - 1), "s")) for i in range(count)]
