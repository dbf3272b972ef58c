"""The analysis charts, drawn on the server: well-formed SVG, round ticks, log axes, downsampling, long names."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from analysis import charts
from common import numbers
from telemetry.charts import band_points, minmax_buckets

SVG = "{http://www.w3.org/2000/svg}"


def figure(**kwargs: object) -> charts.Figure:
    lines = kwargs.pop("lines", [charts.Line("a", [1, 2, 4], [10, 19, 37], [9, 18, 36], [11, 20, 38])])
    return charts.Figure("images_per_sec against GPUs", "GPUs", "img/s", lines, **kwargs)  # type: ignore[arg-type]


def test_it_draws_well_formed_svg_with_a_marker_and_a_tooltip_per_point() -> None:
    root = ET.fromstring(charts.svg(figure(), standalone=True).encode())
    assert root.tag == f"{SVG}svg"
    circles = root.findall(f".//{SVG}circle")
    assert len(circles) == 3
    assert [c.findtext(f"{SVG}title") for c in circles] == ["a: 1 → 10", "a: 2 → 19", "a: 4 → 37"]
    assert len(root.findall(f".//{SVG}g[@class='series']/{SVG}line")) == 3  # error bars


def test_it_escapes_names_and_cuts_long_ones_in_the_legend_with_the_whole_name_as_tooltip() -> None:
    name = "<script>alert(1)</script> & " + "x" * 100
    root = ET.fromstring(charts.svg(figure(lines=[charts.Line(name, [1, 2], [1, 2])])))
    legend = root.find(f".//{SVG}g[@class='legend']/{SVG}text")
    assert legend is not None
    assert legend.text is not None and legend.text.endswith("…") and len(legend.text) == charts.MAX_LABEL
    assert legend.findtext(f"{SVG}title") == name


def test_it_draws_horizontal_references_and_starts_the_y_axis_at_zero() -> None:
    fig = figure(references=[("rated read throughput", 50.0)])
    svg = charts.svg(fig)
    assert 'class="reference"' in svg and "rated read throughput: 50" in svg
    assert ">0</text>" in svg


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert charts.nice_ticks(0, 39139) == [0, 10000, 20000, 30000, 40000]
    assert charts.nice_ticks(0, 1.05) == pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.2])


def test_log_ticks_use_powers_of_ten_or_of_two_for_byte_sizes() -> None:
    assert charts.log_ticks(1, 1000, binary=False) == [1, 10, 100, 1000]
    assert charts.log_ticks(4096, 1048576, binary=True) == [4096, 8192, 16384, 32768, 65536, 131072, 262144,
                                                            524288, 1048576]  # fmt: skip
    assert charts.log_ticks(8, 128 * 1024**2, binary=True)[:4] == [1, 16, 256, 4096]  # thinned to powers of 16
    assert numbers.tick_text(65536, "B") == "64 KiB"
    assert numbers.tick_text(39139) == "39.1k"


def test_a_log_axis_says_so_and_places_decades_evenly() -> None:
    fig = figure(lines=[charts.Line("busbw", [8, 80, 800, 8000], [1, 2, 3, 4])], x_log=True)
    root = ET.fromstring(charts.svg(fig))
    assert any(t.text == "GPUs (log scale)" for t in root.iter(f"{SVG}text"))
    xs = [float(c.get("cx", 0)) for c in root.findall(f".//{SVG}circle")]
    gaps = np.diff(xs)
    assert gaps == pytest.approx([gaps[0]] * 3)


def test_the_json_for_the_browser_aligns_every_line_on_one_x_array() -> None:
    fig = figure(lines=[charts.Line("a", [1, 2], [10, 20]), charts.Line("b", [2, 4], [5, 6], dashed=True, color_of=0)])
    data = fig.as_json()
    assert data["data"] == [[1, 2, 4], [10, 20, None], [None, 5, 6]]
    assert data["series"][1] == {"label": "b", "color": data["series"][0]["color"], "dashed": True,
                                 "text": [None, "5", "6"]}  # fmt: skip
    assert data["x_text"] == ["1", "2", "4"] and data["x_integer"] is True


def test_the_json_for_the_browser_carries_the_error_bars_and_bands_the_svg_draws() -> None:
    bars = charts.Line("mean ± stdev", [1, 4], [10, 40], [9, 38], [11, 42])
    fig = figure(lines=[bars, charts.Line("ideal", [1, 2], [10, 20], dashed=True)])
    data = fig.as_json()
    assert data["series"][0]["band"] is False
    assert (data["series"][0]["low"], data["series"][0]["high"]) == ([9, None, 38], [11, None, 42])  # on x [1, 2, 4]
    assert "low" not in data["series"][1]

    n = 5000
    spikes = charts.Line("spiky", list(range(n)), [1000.0 if i % 1000 == 0 else 1.0 for i in range(n)])
    data = figure(lines=[spikes]).as_json()
    band = data["series"][0]
    assert band["band"] is True and len(band["low"]) == len(band["high"]) == len(data["data"][0]) <= charts.MAX_POINTS
    assert max(band["high"]) == 1000.0 and min(band["low"]) == 1.0  # the spikes the midpoints alone would halve
    assert max(y for y in data["data"][1] if y is not None) < 1000.0


def test_an_empty_figure_says_there_is_nothing_to_draw() -> None:
    svg = charts.svg(figure(lines=[charts.Line("a", [], [])]))
    ET.fromstring(svg)
    assert "no values to draw" in svg


def test_a_million_points_become_a_min_max_band_of_at_most_max_points() -> None:
    """Its speed is bench/analysis_pages.py's (a 1,000,000-point chart), not a timed assertion here."""
    n = 1_000_000
    x = np.arange(n, dtype=np.float64)
    y = np.where(np.arange(n) % 5000 == 0, 1000.0, 1.0)  # rare spikes must survive
    fig = figure(lines=[charts.Line("a million", x.tolist(), y.tolist())])
    svg = charts.svg(fig)
    line = fig.lines[0]
    assert line.banded and len(line.x) <= charts.MAX_POINTS
    assert max(line.high or []) == 1000.0 and min(line.low or []) == 1.0
    assert svg.count("<polygon") == 1 and "<circle" not in svg and len(svg) < 100_000
    ET.fromstring(svg)


def test_the_shared_minmax_helper_buckets_like_the_run_page_and_leaves_short_series_whole() -> None:
    x = np.arange(10, dtype=np.float64)
    y = np.array([1, 5, 2, 2, 9, 0, 3, 3, 3, 4], dtype=np.float64)
    same = minmax_buckets(x, y, max_points=10)
    assert same[0] is x and same[1] is y and same[2] is y
    start, low, high = minmax_buckets(x, y, max_points=2)
    assert start.tolist() == [0.0, 4.5] and low.tolist() == [1, 0] and high.tolist() == [9, 4]
    assert (
        band_points([0, 1], [0, 0], [1, 1], lambda v: v * 10, lambda v: 100 - v)
        == "0.0,99.0 10.0,99.0 10.0,100.0 0.0,100.0"
    )


def test_a_linear_ideal_far_above_the_data_is_clipped_not_allowed_to_squash_it() -> None:
    measured = charts.Line("fio", [1, 2, 4, 8], [1.0e9, 1.2e9, 1.3e9, 1.35e9])
    ideal = charts.Line("fio · linear", [1, 2, 4, 8], [1.0e9, 2.0e9, 4.0e9, 8.0e9], dashed=True, color_of=0)
    figure = charts.Figure("bw", "nodes", "bw_bytes", [measured, ideal], y_unit="B/s")
    svg = charts.svg(figure)
    ticks = [float(t) for t in re.findall(r'text-anchor="end" class="tick">([0-9.]+)</text>', svg)]
    assert max(ticks) < 2.0  # the axis ends near the data's 1.35 GB/s, not at the ideal's 8 GB/s
    assert 'clip-path="url(#plot-' in svg and "<clipPath" in svg  # the ideal line is cut at the plot's edge
    assert figure.y_title == "bw_bytes (GB/s)"


def test_a_whole_number_x_axis_gets_whole_number_ticks() -> None:
    one_point = charts.svg(figure(lines=[charts.Line("a", [1, 2], [10, 19])]))
    ticks = re.findall(r'text-anchor="middle" class="tick">([^<]+)</text>', one_point)
    assert ticks == ["1", "2"]  # not 0.95, 1.00, 1.05 ...
    assert charts.nice_ticks(0.9, 2.1, 8, integer=True) == [0, 1, 2, 3]
