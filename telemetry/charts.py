"""Server-side charts of telemetry series: inline SVG drawn from a downsampled window (no JavaScript needed).

Each chart is the series' min/max band per bucket (spikes stay visible, see telemetry.selectors.series_window)
over one shared time window, so the charts of a run line up and can be read against each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.models import Series
from telemetry.selectors import SeriesWindow, series_window

WIDTH, HEIGHT = 600, 90
POINTS = 300  # buckets per chart: about two pixels each
HIDDEN = frozenset({"cpu.core_util"})  # stored for analysis; one chart per core would bury the rest


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


def chart(series: Series, *, start_ns: int, end_ns: int) -> Chart:
    window = series_window(series=series, start_ns=start_ns, end_ns=end_ns, max_points=POINTS)
    t, lo, hi = window.t_ns.tolist(), window.min.tolist(), window.max.tolist()
    low, high = (min(lo), max(hi)) if t else (0.0, 0.0)
    span_t = max(end_ns - start_ns, 1)
    span_y = (high - low) or 1.0

    def xy(ts: int, v: float) -> str:
        return f"{(ts - start_ns) * WIDTH / span_t:.1f},{HEIGHT - (v - low) * HEIGHT / span_y:.1f}"

    forward = [xy(ts, v) for ts, v in zip(t, hi, strict=True)]
    back = [xy(ts, v) for ts, v in zip(reversed(t), reversed(lo), strict=True)]
    return Chart(series=series, window=window, band=" ".join(forward + back), low=low, high=high)


def run_window(series: list[Series], t0_s: float | None, t1_s: float | None) -> tuple[int, int, int]:
    """The run's whole time span (ns) and the window asked for, in seconds from its start, clamped to it."""
    first = min((s.first_ns for s in series if s.first_ns is not None), default=0)
    last = max((s.last_ns for s in series if s.last_ns is not None), default=0)
    start = first + int((t0_s or 0) * 1e9)
    end = last if t1_s is None else first + int(t1_s * 1e9)
    start, end = max(first, min(start, last)), max(first, min(end, last))
    return first, start, end if end > start else last
