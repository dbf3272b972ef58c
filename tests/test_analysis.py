"""Comparison and analysis pages: compare, scaling, storage demand and sizing, sweeps, and their exports.

Results are data: most tests write them with the ORM (as an import would). One test compares two fio campaigns
that really ran on the lab nodes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import xml.etree.ElementTree as ET
from itertools import count
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from analysis import calculations, selectors
from campaigns import selectors as campaign_selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunHost, RunStatus
from inventory.models import Node, StorageSystem
from tests.conftest import launch_and_wait
from tests.test_compare_sql import assert_same

UNITS = {"bw_bytes": "B/s", "iops": "IOPS", "read_lat_mean_ns": "ns", "images_per_sec": "img/s",
         "busbw_gbps": "GB/s", "read_bw_bytes": "B/s", "read_mb_per_sec": "MB/s"}  # fmt: skip
_sequence = count(1)


def campaign(team: Any, name: str, *, kind: str = "fio", axes: dict[str, list[Any]] | None = None, **extra: Any) -> Any:
    matrix = [[k, v] for k, v in (axes or {}).items()]
    return Campaign.objects.create(name=name, kind=kind, team=team, matrix=matrix, status=CampaignStatus.SUCCEEDED,
                                   **extra)  # fmt: skip


def runs(
    c: Any, point: int, params: dict[str, Any], metrics: dict[str, list[float]], *, hosts: list[Node] = (),  # type: ignore[assignment]
    labels: dict[str, Any] | None = None, host: str = "",
) -> list[Run]:  # fmt: skip
    """One succeeded run per repetition of the point, each with its aggregate (or one host's) results."""
    made = []
    for i in range(len(next(iter(metrics.values())))):
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=point, params=params, repetition=i + 1,
                                 status=RunStatus.SUCCEEDED)  # fmt: skip
        for node in hosts:
            RunHost.objects.create(
                run=run, node=node, host=node.name, address=node.address, command="x", remote_dir="/"
            )
        Result.objects.bulk_create(
            Result(run=run, name=name, value=values[i], unit=UNITS.get(name, ""), host=host, labels=labels or {})
            for name, values in metrics.items()
        )
        made.append(run)
    return made


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def pair(team: Any) -> tuple[Any, Any]:
    """Last week's fio campaign and this week's: bandwidth clearly down, latency clearly down, IOPS only noise."""
    before = campaign(team, "fio-before", axes={"rw": ["read"]})
    after = campaign(team, "fio-after-firmware-upgrade", axes={"rw": ["read"]})
    runs(before, 0, {"rw": "read"}, {"bw_bytes": [100, 101, 99], "read_lat_mean_ns": [10, 10.1, 9.9],
                                      "iops": [100, 150, 50]})  # fmt: skip
    runs(after, 0, {"rw": "read"}, {"bw_bytes": [80, 81, 79], "read_lat_mean_ns": [8, 8.1, 7.9],
                                     "iops": [110, 170, 60]})  # fmt: skip
    return before, after


# --- compare ----------------------------------------------------------------------------------------------------


def cells(page: str, metric: str) -> str:
    """The table row of one metric."""
    start = page.index(f"<code>{metric}</code>")
    return page[start : page.index("</tr>", start)]


@pytest.mark.django_db
def test_it_flags_a_real_regression_and_an_improvement_and_calls_noise_no_significant_change(
    owner: Any, pair: tuple[Any, Any]
) -> None:
    before, after = pair
    page = client_for(owner).get(f"/compare/?campaign={before.pk}&campaign={after.pk}").content.decode()

    bw = cells(page, "bw_bytes")
    assert "change-worse" in bw and "-20.0% worse" in bw and "↑ higher is better" in bw
    lat = cells(page, "read_lat_mean_ns")
    assert "change-better" in lat and "-20.0% better" in lat and "↓ lower is better" in lat
    iops = cells(page, "iops")
    assert "change-none" in iops and "+13.3%: no significant change" in iops
    assert "within the spread of the repetitions" in iops  # the reason, as the cell's tooltip
    assert '>100 B/s</span> <span class="muted small">± <span class="qty" title="1 B/s">1.00 B/s</span>, n=3' in bw


@pytest.mark.django_db
def test_it_keeps_the_order_asked_for_so_the_first_set_is_the_reference(owner: Any, pair: tuple[Any, Any]) -> None:
    before, after = pair
    page = client_for(owner).get(f"/compare/?campaign={after.pk}&campaign={before.pk}").content.decode()

    assert "+25.0% better" in cells(page, "bw_bytes")
    assert '2 sets against <span class="long-name">fio-after-firmware-upgrade</span>' in page


@pytest.mark.django_db
def test_it_compares_matrix_points_and_single_runs(owner: Any, team: Any) -> None:
    c = campaign(team, "by-jobs", axes={"numjobs": [1, 4]})
    runs(c, 0, {"numjobs": 1}, {"bw_bytes": [100, 102, 98]})
    runs(c, 1, {"numjobs": 4}, {"bw_bytes": [300, 303, 297]})
    single = Run.objects.filter(campaign=c, point=1).first()
    assert single is not None
    page = client_for(owner).get(f"/compare/?point={c.pk}:0&run={single.pk}").content.decode()

    assert "by-jobs · point 0 (numjobs=1)" in page and f"by-jobs · run #{single.sequence} (point 1, numjobs=4)" in page
    assert "+200.0% worse" not in page and "+200.0% better" in cells(page, "bw_bytes")


@pytest.mark.django_db
def test_the_point_picker_labels_each_point_by_what_sets_it_apart(owner: Any, team: Any) -> None:
    c = campaign(team, "picker", axes={"numjobs": [1, 4]})
    shared = {"bs": "1M", "rw": "read", "size": "16M", "runtime": 2, "time_based": 1}
    runs(c, 0, {**shared, "numjobs": 1}, {"bw_bytes": [100]})
    runs(c, 1, {**shared, "numjobs": 4}, {"bw_bytes": [300]})
    page = client_for(owner).get(f"/compare/?campaign={c.pk}").content.decode()

    assert '<span class="muted small picker-name">numjobs=1</span>' in page
    assert '<span class="muted small picker-name">numjobs=4</span>' in page
    titles = [set(t.split(", ")) for t in re.findall(r'class="picker-item" title="([^"]*)"', page)]
    assert {"bs=1M", "rw=read", "size=16M", "runtime=2", "time_based=1", "numjobs=4"} in titles  # the rest on hover


@pytest.mark.django_db
def test_the_page_reads_the_apis_parameters_and_labels_every_set_as_the_api_does(owner: Any, team: Any) -> None:
    c = campaign(team, "by-jobs", axes={"numjobs": [1, 4]})
    runs(c, 0, {"numjobs": 1}, {"bw_bytes": [100, 102, 98]})
    runs(c, 1, {"numjobs": 4}, {"bw_bytes": [300, 303, 297]})
    single = Run.objects.filter(campaign=c, point=1).first()
    assert single is not None
    client = client_for(owner)
    query = f"points={c.pk}:0&runs={single.pk}&threshold_pct=30"

    page = client.get(f"/compare/?{query}").content.decode()
    api = client.get(f"/api/v1/compare/?{query}").json()
    labels = [column["label"] for column in api["columns"]]
    assert labels == ["by-jobs · point 0 (numjobs=1)", f"by-jobs · run #{single.sequence} (point 1, numjobs=4)"]
    assert all(f'title="{label}"' in page for label in labels)
    assert "+200.0% better" in cells(page, "bw_bytes") and 'name="threshold" step="any" min="0" value="30"' in page


@pytest.mark.django_db
def test_it_exports_the_comparison_as_csv_and_json_that_match_the_table(owner: Any, pair: tuple[Any, Any]) -> None:
    before, after = pair
    client = client_for(owner)
    url = f"/compare/?campaign={before.pk}&campaign={after.pk}"

    response = client.get(url + "&format=csv")
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="compare-compare.csv"'
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    bw = next(r for r in rows if r["metric"] == "bw_bytes")
    assert bw["parameters"] == "rw=read" and bw["better"] == "higher"
    assert float(bw["fio-before mean"]) == pytest.approx(100)
    assert float(bw["fio-after-firmware-upgrade change %"]) == pytest.approx(-20)
    assert bw["fio-after-firmware-upgrade verdict"] == "-20.0% worse"

    data = json.loads(client.get(url + "&format=json").content)
    assert data["columns"] == list(rows[0])
    assert [r["metric"] for r in data["rows"]] == [r["metric"] for r in rows]
    iops = next(r for r in data["rows"] if r["metric"] == "iops")
    assert iops["fio-after-firmware-upgrade verdict"] == "+13.3%: no significant change"
    assert iops["fio-after-firmware-upgrade n"] == 3


@pytest.mark.django_db
def test_it_judges_with_the_threshold_asked_for(owner: Any, pair: tuple[Any, Any]) -> None:
    before, after = pair
    page = client_for(owner).get(f"/compare/?campaign={before.pk}&campaign={after.pk}&threshold=30").content.decode()
    assert "-20.0%: no significant change" in cells(page, "bw_bytes")


@pytest.mark.django_db
def test_it_shows_the_outsider_a_404_and_sends_the_anonymous_to_log_in(
    owner: Any, outsider: Any, pair: tuple[Any, Any]
) -> None:
    before, after = pair
    for url in (f"/compare/?campaign={before.pk}&campaign={after.pk}", f"/compare/?point={before.pk}:0",
                f"/analysis/scaling/?campaign={before.pk}", f"/analysis/sweep/?campaign={before.pk}",
                f"/analysis/storage/?campaign={before.pk}", f"/analysis/storage/?measured={before.pk}"):  # fmt: skip
        assert client_for(outsider).get(url).status_code == 404, url
        anonymous = Client().get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/"), url
    run = Run.objects.filter(campaign=before).first()
    assert run is not None
    assert client_for(outsider).get(f"/compare/?run={run.pk}").status_code == 404
    assert client_for(owner).get(f"/compare/?point={before.pk}:7").status_code == 404  # no such point
    outsider_page = client_for(outsider).get("/compare/").content.decode()
    assert "fio-before" not in outsider_page and "No campaigns yet" in outsider_page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("campaign=abc", "campaign=&#x27;abc&#x27; is not a whole number"),
        ("point=12", "point=&#x27;12&#x27; is not CAMPAIGN:POINT"),
        ("threshold=-3", "threshold: must be a number ≥ 0"),
        ("format=xml", "format=&#x27;xml&#x27; is not one of csv, json, svg"),
        ("table=nope&format=csv", "table=&#x27;nope&#x27; is not a table of this page"),
    ],
)
def test_it_explains_a_nonsense_parameter_on_the_page(
    owner: Any, pair: tuple[Any, Any], query: str, message: str
) -> None:
    before, after = pair
    response = client_for(owner).get(f"/compare/?campaign={before.pk}&campaign={after.pk}&{query}")
    assert response.status_code == 200
    assert message in response.content.decode()


@pytest.mark.django_db
def test_it_shows_empty_states(owner: Any, team: Any) -> None:
    client = client_for(owner)
    for url in ("/compare/", "/analysis/", "/analysis/scaling/", "/analysis/sweep/", "/analysis/storage/"):
        assert "No campaigns yet" in client.get(url).content.decode(), url
    lonely = campaign(team, "no-results-yet")
    other = campaign(team, "no-results-either")
    assert "tick at least one more" in client.get(f"/compare/?campaign={lonely.pk}").content.decode()
    page = client.get(f"/compare/?campaign={lonely.pk}&campaign={other.pk}").content.decode()
    assert "None of these sets has a succeeded run with results yet" in page
    page = client.get(f"/analysis/scaling/?campaign={lonely.pk}").content.decode()
    assert "pick campaigns first" in page and "Traceback" not in page


@pytest.mark.django_db
def test_it_keeps_long_names_whole_in_tooltips_and_wraps_them(owner: Any, team: Any) -> None:
    name = "nightly-" + "very-long-campaign-name-" * 4
    c = campaign(team, name[:100], axes={"nodes": [1, 2]})
    runs(c, 0, {"nodes": 1}, {"bw_bytes": [10.0]}, host="")
    runs(c, 1, {"nodes": 2}, {"bw_bytes": [19.0]})
    page = client_for(owner).get(f"/analysis/scaling/?campaign={c.pk}&x=nodes&metric=bw_bytes").content.decode()
    assert f'title="{name[:100]}"' in page and "…<title>" in page  # legend cut short, whole name as its tooltip


def test_a_compare_row_escapes_a_unit_metric_or_reason_that_reads_as_markup_and_shows_numbers_as_they_are() -> None:
    from analysis.reports import Change, CompareRow
    from analysis.templatetags.analysis_tags import compare_row

    cell = {"value": 1500.0, "stdev": 2.5, "n": 3}
    reference, judged = Change("change-reference", "reference", "p=0.01 < 0.05"), Change("change-none", "+0%", "x")
    marked = str(compare_row(CompareRow("bs=4k", "<i>x</i>", "<b>'s", True, [(cell, reference), (cell, judged)])))
    plain = str(compare_row(CompareRow("bs=4k", "bw_bytes", "B/s", True, [(cell, reference), (cell, judged)])))

    assert "<b>" not in marked and "<i>" not in marked and "'s" not in marked
    assert 'title="1500 &lt;b&gt;&#x27;s"' in marked and "&lt;i&gt;x&lt;/i&gt;" in marked
    assert "p=0.01 &lt; 0.05" in marked
    assert plain.count('<span class="qty" title="1500 B/s">1.50 kB/s</span>') == 2
    assert 'title="2.5 B/s">2.50 B/s' in plain


@pytest.mark.django_db
def test_it_compares_with_a_fixed_number_of_queries_whatever_the_number_of_runs(
    owner: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    a, b = (
        campaign(team, "a", axes={"numjobs": list(range(20))}),
        campaign(team, "b", axes={"numjobs": list(range(20))}),
    )
    for c in (a, b):
        for point in range(20):
            runs(c, point, {"numjobs": point}, {"bw_bytes": [1.0, 2.0, 3.0], "iops": [1.0, 1.0, 1.0]})
    client = client_for(owner)
    with CaptureQueriesContext(connection) as two:
        page = client.get(f"/compare/?campaign={a.pk}&campaign={b.pk}").content.decode()
    assert page.count("<code>bw_bytes</code>") == 20
    assert len(two) <= 12
    more = [campaign(team, f"more{i}", axes={"numjobs": list(range(20))}) for i in range(4)]
    for c in more:
        runs(c, 0, {"numjobs": 0}, {"bw_bytes": [1.0, 2.0, 3.0]})
    six = "&".join(f"campaign={c.pk}" for c in (a, b, *more))
    with django_assert_max_num_queries(len(two)):  # six sets read in as many queries as two
        assert client.get(f"/compare/?{six}").status_code == 200
    with django_assert_max_num_queries(14):
        assert client.get(f"/analysis/scaling/?campaign={a.pk}&campaign={b.pk}&x=numjobs").status_code == 200
    with django_assert_max_num_queries(14):
        assert client.get(f"/analysis/sweep/?campaign={a.pk}&x=numjobs").status_code == 200


# --- scaling --------------------------------------------------------------------------------------------------------

# Seed 000 figure 7 (ResNet-50 on 16, 32 and 48 V100 GPUs of DGX-2s): at 48 GPUs the storage delivered 4,501 MB/s of
# 115 KB records, i.e. 39,139 images/s; the 16- and 32-GPU values here are of the same shape (linear within 2%).
FIG7 = {1: [13200.0, 13150.0, 13250.0], 2: [26100.0, 26050.0, 26150.0], 3: [39139.0, 39100.0, 39178.0]}


@pytest.fixture
def dgx2(team: Any) -> list[Node]:
    return [Node.objects.create(name=f"dgx2-{i}", address=f"10.0.0.{i}", team=team, gpu_count=16) for i in (1, 2, 3)]


def training(team: Any, name: str, nodes: list[Node], values: dict[int, list[float]], **extra: Any) -> Any:
    c = campaign(team, name, kind="tf_cnn_benchmarks", axes={"model": ["resnet50"], "nodes": [1, 2, 3]}, **extra)
    for point, (n, ys) in enumerate(values.items()):
        runs(c, point, {"model": "resnet50", "nodes": n}, {"images_per_sec": ys}, hosts=nodes[:n])
    return c


@pytest.mark.django_db
def test_it_draws_scaling_against_gpus_with_the_linear_ideal_and_the_efficiency(
    owner: Any, team: Any, dgx2: list[Node]
) -> None:
    isilon = training(team, "fig7-isilon", dgx2, FIG7)
    cache = training(team, "fig7-linux-cache", dgx2, {n: [v * 1.01 for v in ys] for n, ys in FIG7.items()})
    client = client_for(owner)
    url = f"/analysis/scaling/?campaign={isilon.pk}&campaign={cache.pk}&metric=images_per_sec"

    data = json.loads(client.get(url + "&format=json").content)
    rows = [r for r in data["rows"] if r["series"] == "fig7-isilon · model=resnet50"]
    assert [r["GPUs used"] for r in rows] == [16, 32, 48]  # no launch count stored: the inventory's 16 per DGX-2
    assert [r["linear"] for r in rows] == pytest.approx([13200, 26400, 39600])
    assert [r["efficiency %"] for r in rows] == pytest.approx([100.0, 26100 / 26400 * 100, 39139 / 39600 * 100])
    assert rows[2]["efficiency %"] == pytest.approx(98.84, abs=0.01)
    assert rows[0]["stdev"] == pytest.approx(50.0) and rows[0]["n"] == 3

    page = client.get(url).content.decode()
    assert "98.8% of linear, n=3" in page  # a point's tooltip
    assert "fig7-linux-cache · model=resnet50 · linear" in page and 'stroke-dasharray="6 4"' in page
    svg = client.get(url + "&format=svg")
    assert svg["Content-Type"] == "image/svg+xml" and svg["Content-Disposition"].endswith('.svg"')
    root = ET.fromstring(svg.content)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) == 4  # two series, two ideals


@pytest.mark.django_db
def test_it_scales_against_a_matrix_axis_and_filters_points(owner: Any, team: Any) -> None:
    c = campaign(team, "roce-vs-tcp", kind="tf_cnn_benchmarks",
                 axes={"model": ["vgg16", "resnet50"], "gpus": [1, 8, 32]})  # fmt: skip
    point = count()
    for model, per_gpu in (("vgg16", 200.0), ("resnet50", 400.0)):
        for gpus, eff in ((1, 1.0), (8, 0.95), (32, 0.91)):
            runs(c, next(point), {"model": model, "gpus": gpus}, {"images_per_sec": [per_gpu * gpus * eff]})
    client = client_for(owner)
    data = json.loads(client.get(f"/analysis/scaling/?campaign={c.pk}&x=gpus&format=json").content)
    resnet = [r for r in data["rows"] if r["series"] == "roce-vs-tcp · model=resnet50"]
    assert [r["gpus"] for r in resnet] == [1, 8, 32]
    assert [r["efficiency %"] for r in resnet] == pytest.approx([100, 95, 91])  # seed 004: "over 91% efficiency"
    only = json.loads(client.get(f"/analysis/scaling/?campaign={c.pk}&x=gpus&where=model=vgg16&format=json").content)
    assert {r["series"] for r in only["rows"]} == {"roce-vs-tcp · model=vgg16"}
    # two filters come back as two inputs (plus an empty one), so submitting the form again keeps both
    page = client.get(f"/analysis/scaling/?campaign={c.pk}&x=gpus&where=model=vgg16&where=gpus=8").content.decode()
    assert 'name="where" value="model=vgg16"' in page and 'name="where" value="gpus=8"' in page
    again = client.get(f"/analysis/scaling/?campaign={c.pk}&x=gpus&where=model=vgg16&where=gpus=8&where=&format=json")
    assert [(r["series"], r["gpus"]) for r in json.loads(again.content)["rows"]] == [("roce-vs-tcp · model=vgg16", 8)]
    # an axis with no value at any point is not offered; asked for, the default is drawn and the page says so
    page = client.get(f"/analysis/scaling/?campaign={c.pk}&x=model").content.decode()
    assert "No point of the chosen campaigns has a value for model: drawn against gpus." in page  # not numbers
    assert 'value="model"' not in page and "Nothing to draw" not in page
    page = client.get(f"/analysis/scaling/?campaign={c.pk}&x=node-gpus").content.decode()
    # these runs recorded no hosts, so no GPUs of the inventory
    assert "has a value for GPUs of the nodes: drawn against gpus." in page and "no succeeded run" not in page


# Seed 004 figure 4: "scaling efficiency ... compared to linear scaling of one GPU", the median of 3 runs after steady
# state. Data of its shape: one GPU 100 img/s; 1, 2, 4, 8 GPUs of one DGX-1 (mpi_slots) and 2 and 4 DGX-1s (16 and 32
# GPUs), RoCE; over TCP only the multi-node points (one node crosses no network). At 32 GPUs the median is 2,912 img/s.
SEED004 = {  # (nodes, mpi_slots or None, NCCL_IB_DISABLE): images/s of the 3 repetitions
    (1, 1, 0): [100.0, 99.0, 101.5], (1, 2, 0): [199.0, 198.0, 200.0], (1, 4, 0): [396.0, 395.0, 397.5],
    (1, 8, 0): [776.5, 770.0, 780.0], (2, None, 0): [1520.0, 1510.0, 1530.0], (4, None, 0): [2912.0, 2900.0, 2990.0],
    (2, None, 1): [1200.0, 1190.0, 1215.0], (4, None, 1): [2100.0, 2080.0, 2150.0],
}  # fmt: skip


@pytest.fixture
def seed004(team: Any) -> Any:
    dgx1 = [Node.objects.create(name=f"dgx1-{i}", address=f"10.0.1.{i}", team=team, gpu_count=8) for i in range(4)]
    c = campaign(team, "airi", kind="tf_cnn_benchmarks",
                 axes={"nodes": [1, 2, 4], "mpi_slots": [1, 2, 4, 8], "env.NCCL_IB_DISABLE": [0, 1]})  # fmt: skip
    for point, ((nodes, slots, tcp), ys) in enumerate(SEED004.items()):
        gpus = (slots or 8) * nodes
        params = {"nodes": nodes, "env.NCCL_IB_DISABLE": tcp, **({"mpi_slots": slots} if slots else {})}
        runs(c, point, params, {"images_per_sec": ys, "images_per_sec_per_gpu": [y / gpus for y in ys]},
             hosts=dgx1[:nodes])  # fmt: skip
    return c


@pytest.mark.django_db
def test_it_reproduces_seed_004s_91_percent_from_its_definition(owner: Any, seed004: Any) -> None:
    client = client_for(owner)
    url = f"/analysis/scaling/?campaign={seed004.pk}&metric=images_per_sec&format=json"

    data = json.loads(client.get(url + "&stat=median&reference=one-gpu").content)
    roce = [r for r in data["rows"] if r["series"] == "airi · env.NCCL_IB_DISABLE=0"]
    assert [r["GPUs used"] for r in roce] == [1, 2, 4, 8, 16, 32]  # one node's GPUs and the nodes: one series
    assert roce[-1]["images_per_sec median"] == 2912
    assert roce[-1]["linear"] == pytest.approx(3200)  # one GPU (100 img/s) x 32
    assert roce[-1]["efficiency %"] == pytest.approx(91.0)
    tcp = [r for r in data["rows"] if r["series"] == "airi · env.NCCL_IB_DISABLE=1"]
    assert [r["GPUs used"] for r in tcp] == [16, 32]
    assert tcp[-1]["efficiency %"] == pytest.approx(100 * 2100 / 3200)  # the same one-GPU base as RoCE

    # The same data by the old definitions: the mean, linear from the smallest point of an 8-GPU-first series.
    mean = json.loads(client.get(url + "&stat=mean&reference=one-gpu").content)
    assert [r for r in mean["rows"] if r["series"].endswith("=0")][-1]["efficiency %"] == pytest.approx(
        100 * (2912 + 2900 + 2990) / 3 / ((100 + 99 + 101.5) / 3 * 32)  # the mean of the one-GPU runs too
    )
    from_eight = json.loads(client.get(url + "&stat=median&reference=smallest&where=mpi_slots=8").content)
    assert from_eight["rows"][0]["GPUs used"] == 8 and from_eight["rows"][0]["efficiency %"] == pytest.approx(100)
    page = client.get(f"/analysis/scaling/?campaign={seed004.pk}&stat=median&reference=one-gpu").content.decode()
    assert "91.0% of linear, n=3" in page and 'value="one-gpu" selected' in page


@pytest.mark.django_db
def test_it_says_a_single_point_has_nothing_to_scale_from(owner: Any, team: Any, dgx2: list[Node]) -> None:
    c = training(team, "one-point", dgx2, {1: [1000.0]})
    page = client_for(owner).get(f"/analysis/scaling/?campaign={c.pk}").content.decode()
    assert "A single point: there is nothing to scale from yet" in page


# --- storage demand and sizing ----------------------------------------------------------------------------------------


def test_it_sizes_storage_like_seed_000_table_3() -> None:
    tf_storage_per_node = 24_772 / 8  # TensorFlow storage benchmark, 8 F800 nodes: the training limit (footnote 2)
    fio_per_node = 28_750 / 8  # fio: the inference limit (footnote 4)
    h500 = 0.25  # "approximated to be 25% of F800 performance" (footnote 3)
    table = {
        (100, "F800"): calculations.sizing(per_gpu_mbps=100, per_node_mbps=tf_storage_per_node, gpus=48),
        (100, "H500"): calculations.sizing(per_gpu_mbps=100, per_node_mbps=tf_storage_per_node * h500, gpus=48),
        (160, "F800"): calculations.sizing(per_gpu_mbps=160, per_node_mbps=fio_per_node, gpus=48),
        (160, "H500"): calculations.sizing(per_gpu_mbps=160, per_node_mbps=fio_per_node * h500, gpus=48),
        (300, "F800"): calculations.sizing(per_gpu_mbps=300, per_node_mbps=tf_storage_per_node, gpus=48),
        (300, "H500"): calculations.sizing(per_gpu_mbps=300, per_node_mbps=tf_storage_per_node * h500, gpus=48),
    }
    assert {k: s.gpus_per_node for k, s in table.items()} == {
        (100, "F800"): 30, (100, "H500"): 7, (160, "F800"): 22, (160, "H500"): 5, (300, "F800"): 10, (300, "H500"): 2,
    }  # fmt: skip
    resnet = table[(100, "F800")]
    assert resnet.nodes_exact == pytest.approx(1.6)  # "48 / 30 = 1.6 Isilon F800 nodes"
    assert (resnet.nodes_minimum, resnet.nodes_recommended) == (2, 4)  # "add two nodes to the minimum"
    assert calculations.demand_mb_per_sec(39_139, 115_000) == pytest.approx(4501, abs=0.5)  # 4,501 MB/s at 48 GPUs
    assert [r["gpus_per_node"] for r in calculations.reference_table(tf_storage_per_node)] == [30, 19, 10]
    with pytest.raises(calculations.SizingError):
        calculations.sizing(per_gpu_mbps=0, per_node_mbps=100, gpus=1)


@pytest.mark.django_db
def test_it_draws_the_demand_against_rated_and_measured_throughput_and_sizes_from_it(
    owner: Any, team: Any, dgx2: list[Node]
) -> None:
    f800 = StorageSystem.objects.create(name="isilon-f800", team=team, rated_read_mbps=30_000, node_count=8)
    train = training(team, "fig7-storage", dgx2, FIG7, storage=f800, fixed={"record_size_bytes": 115000})
    fio = campaign(team, "fig15-fio", axes={"nodes": [1, 3]})
    runs(fio, 0, {"nodes": 1}, {"read_bw_bytes": [24_875e6, 24_875e6]})
    runs(fio, 1, {"nodes": 3}, {"read_bw_bytes": [28_700e6, 28_800e6]})
    client = client_for(owner)
    url = f"/analysis/storage/?campaign={train.pk}&measured={fio.pk}"

    demand = json.loads(client.get(url + "&format=json&table=demand").content)["rows"]
    assert [r["GPUs used"] for r in demand] == [16, 32, 48]
    assert demand[2]["demand MB/s"] == pytest.approx(39139 * 0.115, rel=1e-3)  # 4,501 MB/s
    assert demand[2]["% of measured"] == pytest.approx(100 * 4501 / 28_750, abs=0.01)
    assert demand[2]["% of rated"] == pytest.approx(100 * 4501 / 30_000, abs=0.01)

    page = client.get(url).content.decode()
    assert "rated read throughput of isilon-f800" in page and "measured by fig15-fio (read_bw_bytes)" in page
    sizing = json.loads(client.get(url + "&format=json&table=sizing").content)["rows"][0]
    assert sizing["MB/s per storage node"] == pytest.approx(28_750 / 8)  # measured / the storage's 8 nodes
    assert sizing["GPUs"] == 48
    assert sizing["MB/s per GPU"] == pytest.approx(13200 * 0.115 / 16)  # the highest per-GPU demand: at 16 GPUs

    typed = client.get(url + "&per_gpu=100&per_node=3096.5&gpus=48").content.decode()
    assert "One storage node feeds 30 GPUs" in typed and "48 / 30 = 1.600 storage nodes" in typed
    assert "at least <strong>2</strong>; <strong>4</strong> recommended" in typed
    rows = list(csv.DictReader(io.StringIO(client.get(url + "&per_node=3593.75&format=csv&table=reference")
                                           .content.decode())))  # fmt: skip
    assert [r["GPUs per storage node"] for r in rows] == ["35", "22", "11"]


@pytest.mark.django_db
def test_it_reads_the_demand_and_per_gpu_rate_the_training_runs_stored_and_computes_only_what_is_missing(
    owner: Any, team: Any, dgx2: list[Node]
) -> None:
    # Each run used 8 of its DGX-2s' 16 GPUs and read records of its point's own size: only the runs know that.
    c = campaign(team, "stored-demand", kind="tf_cnn_benchmarks", axes={"nodes": [1, 2, 3]},
                 fixed={"record_size_bytes": 115000})  # fmt: skip
    for point, n in enumerate((1, 2, 3)):
        images = 1000.0 * 8 * n
        stored = {"storage_mb_per_sec": [images * 0.2] * 2} if n < 3 else {}  # point 2: an older run, not stored
        runs(c, point, {"nodes": n}, {"images_per_sec": [images] * 2, "images_per_sec_per_gpu": [1000.0] * 2,
                                      **stored}, hosts=dgx2[:n])  # fmt: skip
    client = client_for(owner)
    url = f"/analysis/storage/?campaign={c.pk}"

    rows = json.loads(client.get(url + "&format=json&table=demand").content)["rows"]
    assert [r["GPUs used"] for r in rows] == [8, 16, 24]  # the x axis: the GPUs the runs used, not their nodes' 16n
    assert [r["GPUs per run"] for r in rows] == [8, 16, 24]  # what each run used: images/s ÷ images/s per GPU
    assert [r["demand from"] for r in rows] == ["run", "run", "computed"]
    assert [r["demand MB/s"] for r in rows] == pytest.approx([1600, 3200, 24000 * 0.115])
    assert [r["MB/s per GPU"] for r in rows] == pytest.approx([200, 200, 115])  # over the runs' own 8n GPUs
    page = client.get(url).content.decode()
    assert "Demand at 2 of 3 points is the runs&#x27; own storage_mb_per_sec." in page
    assert "Demand at 1 point is computed: images/s × the campaign&#x27;s record size (115,000 B)." in page
    assert "MB/s per GPU divides by the runs&#x27; own GPU count (images/s ÷ images_per_sec_per_gpu)." in page
    sizing = json.loads(client.get(url + "&per_node=3000&format=json&table=sizing").content)["rows"][0]
    assert (sizing["MB/s per GPU"], sizing["GPUs"]) == (pytest.approx(200), 24)

    what_if = json.loads(client.get(url + "&record_size=100000&format=json&table=demand").content)["rows"]
    assert [r["demand from"] for r in what_if] == ["computed"] * 3  # a record size typed in: computed everywhere
    assert [r["demand MB/s"] for r in what_if] == pytest.approx([800, 1600, 2400])


@pytest.mark.django_db
def test_the_storage_page_falls_back_to_nodes_from_statistics_read_once(owner: Any, team: Any) -> None:
    lab = [Node.objects.create(name=f"lab{i}", address=f"10.0.1.{i}", team=team) for i in (1, 2)]  # no GPUs known
    c = campaign(team, "no-gpus", kind="tf_cnn_benchmarks", axes={"nodes": [1, 2]}, fixed={"record_size_bytes": 1e5})
    runs(c, 0, {"nodes": 1}, {"images_per_sec": [100.0, 110.0]}, hosts=lab[:1])
    runs(c, 1, {"nodes": 2}, {"images_per_sec": [200.0, 220.0]}, hosts=lab)
    client = client_for(owner)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/analysis/storage/?campaign={c.pk}").content.decode()
    assert '<option value="node-count" selected>' in page and "nodes (hosts per run)" in page
    reads = [q["sql"] for q in queries.captured_queries if "AVG" in q["sql"] and "= 'images_per_sec'" in q["sql"]]
    assert len(reads) == 1, reads  # the metric's statistics, once, whichever x they end on


@pytest.mark.django_db
def test_the_measured_throughput_is_the_best_points_mean_in_one_query(team: Any) -> None:
    fio = campaign(team, "measured", axes={"numjobs": [1, 4]})
    runs(fio, 0, {"numjobs": 1}, {"read_bw_bytes": [1e9, 3e9]})
    runs(fio, 1, {"numjobs": 4}, {"read_bw_bytes": [2.5e9, 2.5e9], "bw_bytes": [9e9, 9e9]})  # 4e9 is no point's mean
    with CaptureQueriesContext(connection) as queries:
        best = selectors.measured_throughput(campaign=fio)
    assert best == (pytest.approx(2500.0), "read_bw_bytes") and len(queries) == 1


@pytest.mark.django_db
def test_the_sizing_calculator_works_without_a_campaign_and_explains_bad_input(owner: Any) -> None:
    client = client_for(owner)
    page = client.get("/analysis/storage/?per_gpu=160&per_node=3593.75&gpus=48").content.decode()
    assert "One storage node feeds 22 GPUs" in page
    page = client.get("/analysis/storage/?per_gpu=lots&per_node=0&gpus=-1").content.decode()
    assert "MB/s per GPU must be a positive number, got &#x27;lots&#x27;" in page
    assert "MB/s per storage node must be a positive number" in page
    assert "the number of GPUs must be a whole number from 1 to 1000000" in page


# --- sweeps -----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_draws_nccl_bus_bandwidth_against_message_size_on_a_log_axis(owner: Any, team: Any) -> None:
    c = campaign(team, "allreduce", kind="nccl")
    sizes = [8 * 4**i for i in range(13)]  # 8 B .. 128 MiB
    for placement in ("out-of-place", "in-place"):
        for size in sizes:
            busbw = 180 * size / (size + 4 * 1024**2)
            runs(c, 0, {}, {"busbw_gbps": [busbw, busbw * 1.01]},
                 labels={"size_bytes": size, "placement": placement})  # fmt: skip
    client = client_for(owner)
    url = f"/analysis/sweep/?campaign={c.pk}&metric=busbw_gbps&x=size_bytes"
    page = client.get(url).content.decode()
    assert "size_bytes (log scale)" in page and ">4 KiB<" in page and ">1 MiB<" in page
    chart = json.loads(page.split('<script id="chart-data" type="application/json">')[1].split("</script>")[0])
    assert chart["x_log"] is True and chart["x_unit"] == "B" and chart["data"][0] == sizes
    assert [s["label"] for s in chart["series"]] == ["allreduce · aggregate · placement=in-place",
                                                     "allreduce · aggregate · placement=out-of-place"]  # fmt: skip
    linear = client.get(url + "&log=off").content.decode()
    assert "(log scale)" not in linear
    root = ET.fromstring(client.get(url + "&format=svg").content)
    assert root.find("{http://www.w3.org/2000/svg}title").text == "busbw_gbps against size_bytes"  # type: ignore[union-attr]


@pytest.mark.django_db
def test_it_draws_fio_bandwidth_per_node_and_aggregate_against_numjobs(owner: Any, team: Any) -> None:
    c = campaign(team, "by-threads", axes={"rw": ["read"], "numjobs": [1, 4, 16]})
    for point, jobs in enumerate((1, 4, 16)):
        made = runs(c, point, {"rw": "read", "numjobs": jobs}, {"bw_bytes": [2e9 * math.log2(2 * jobs)] * 2})
        for run in made:
            for host in ("lab1", "lab2"):
                Result.objects.create(run=run, name="bw_bytes", value=1e9 * math.log2(2 * jobs), unit="B/s", host=host)
                Result.objects.create(run=run, name="bw_bytes", value=1.0, unit="B/s", host=host, labels={"job": "j"})
    client = client_for(owner)
    data = json.loads(client.get(f"/analysis/sweep/?campaign={c.pk}&x=numjobs&hosts=both&format=json").content)
    assert sorted({r["host"] for r in data["rows"]}) == ["aggregate", "lab1", "lab2"]
    lab1 = [r for r in data["rows"] if r["host"] == "lab1"]
    assert [(r["numjobs"], r["bw_bytes mean"]) for r in lab1] == [(1, 1e9), (4, 3e9), (16, 5e9)]  # no per-job rows
    page = client.get(f"/analysis/sweep/?campaign={c.pk}&x=numjobs").content.decode()
    assert "by-threads · rw=read · aggregate" in page and "(log scale)" not in page


@pytest.mark.django_db
def test_it_parses_block_sizes_and_explains_an_unknown_axis(owner: Any, team: Any) -> None:
    c = campaign(team, "by-block-size", axes={"bs": ["4k", "64k", "1m"]})
    for point, bs in enumerate(("4k", "64k", "1m")):
        runs(c, point, {"bs": bs}, {"iops": [1000.0 / (point + 1)]})
    client = client_for(owner)
    data = json.loads(client.get(f"/analysis/sweep/?campaign={c.pk}&metric=iops&x=bs&format=json").content)
    assert [r["bs"] for r in data["rows"]] == [4096, 65536, 1048576]
    page = client.get(f"/analysis/sweep/?campaign={c.pk}&metric=iops&x=colour").content.decode()
    assert "x axis &#x27;colour&#x27; is not one of: bs" in page


# --- on the lab -----------------------------------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
def test_it_compares_two_fio_campaigns_that_ran_on_the_lab(lab: dict[str, Any], worker: Any, admin_user: Any) -> None:
    base = {"kind": "fio", "nodes": ["lab1", "lab2"], "repetitions": 2, "timeout": 120,
            "cache": {"flush_clients": False, "flush_storage": False},
            "fixed": {"bs": "64k", "size": "4M", "runtime": 1, "time_based": 1, "rate": "8m"},
            "matrix": {"rw": ["read"], "numjobs": [1, 2]}}  # fmt: skip
    first = launch_and_wait({**base, "name": "lab-fio-a"})
    second = launch_and_wait({**base, "name": "lab-fio-b"})
    assert first.status == second.status == CampaignStatus.SUCCEEDED

    client = client_for(admin_user)
    url = f"/compare/?campaign={first.pk}&campaign={second.pk}"
    page = client.get(url).content.decode()
    assert "bw_bytes" in page and "↑ higher is better" in page
    rows = json.loads(client.get(url + "&format=json").content)["rows"]
    bw = [r for r in rows if r["metric"] == "bw_bytes"]
    assert sorted(r["parameters"] for r in bw) == ["rw=read, numjobs=1", "rw=read, numjobs=2"]
    for r in bw:  # both held at the same fio rate: the same bandwidth, within noise
        assert r["lab-fio-a n"] == 2 and r["lab-fio-b n"] == 2
        assert r["lab-fio-b verdict"].endswith("no significant change"), r
    sweep = json.loads(client.get(f"/analysis/sweep/?campaign={first.pk}&x=numjobs&metric=bw_bytes&hosts=both"
                                  "&format=json").content)  # fmt: skip
    assert {r["host"] for r in sweep["rows"]} == {"aggregate", "lab1", "lab2"}
    # the summaries the collects' writes kept are what every repetition gives
    sets: list[tuple[str, Campaign, list[int] | None]] = [("a", first, None), ("b", second, None)]
    assert_same(campaign_selectors.compare(sets=sets, in_sql=False), campaign_selectors.compare(sets=sets))


@pytest.mark.django_db
def test_compare_labels_points_by_what_differs_sorts_numerically_and_lists_the_differences(
    owner: Any, team: Any
) -> None:
    c = campaign(team, "by-jobs", axes={"numjobs": [1, 4, 16]})
    for point, jobs in enumerate([1, 4, 16]):
        runs(c, point, {"numjobs": jobs, "rw": "read"}, {"bw_bytes": [100 * jobs, 101 * jobs, 99 * jobs]})
    client = client_for(owner)
    page = client.get(f"/compare/?point={c.pk}:2&point={c.pk}:0").content.decode()
    assert "by-jobs · point 2 (numjobs=16)" in page and "by-jobs · point 0 (numjobs=1)" in page
    differences = page[page.index('data-testid="differences"') : page.index('id="table-compare"')]
    assert "param numjobs" in differences and "<code>16</code>" in differences and "<code>1</code>" in differences
    assert "param rw" not in differences  # what is the same on both sides is not listed

    other = campaign(team, "by-jobs-2", axes={"numjobs": [1, 4, 16]})
    for point, jobs in enumerate([1, 4, 16]):
        runs(other, point, {"numjobs": jobs, "rw": "read"}, {"bw_bytes": [100 * jobs, 101 * jobs, 99 * jobs]})
    rows = client.get(f"/api/v1/compare/?campaigns={c.pk},{other.pk}").json()["rows"]
    assert [r["params"]["numjobs"] for r in rows] == [1, 4, 16]  # as numbers, not as text (1, 16, 4)
    whole = client.get(f"/compare/?campaign={c.pk}&campaign={other.pk}").content.decode()
    assert "The same configuration on every side" in whole


# --- defaults on GPU-less nodes, choices filled with htmx, numbers through the formatter ---------------------------


@pytest.fixture
def gpu_less_fio(team: Any) -> Any:
    """A fio campaign on 1 and 2 GPU-less lab nodes: there is no GPU axis to draw against."""
    lab = [Node.objects.create(name=f"lab{i}", address=f"10.0.2.{i}", team=team) for i in (1, 2)]
    c = campaign(team, "lab-fio", axes={"nodes": [1, 2]})
    runs(c, 0, {"nodes": 1}, {"read_bw_bytes": [1_298_236_952.0, 1_300_000_000.0]}, hosts=lab[:1])
    runs(c, 1, {"nodes": 2}, {"read_bw_bytes": [2_500_000_000.0, 2_520_000_000.0]}, hosts=lab)
    return c


@pytest.mark.django_db
def test_on_gpu_less_nodes_it_draws_against_the_node_count_and_offers_no_gpu_axis(
    owner: Any, gpu_less_fio: Any
) -> None:
    client = client_for(owner)
    page = client.get(f"/analysis/scaling/?campaign={gpu_less_fio.pk}").content.decode()
    assert '<option value="node-count" selected>' in page and 'value="node-gpus"' not in page
    assert "Nothing to draw" not in page and "no succeeded run" not in page
    # the form submitted with the GPU axis of an earlier page still draws something, and says what
    page = client.get(f"/analysis/scaling/?campaign={gpu_less_fio.pk}&x=gpus-used&metric=read_bw_bytes").content
    assert "drawn against nodes (hosts per run)" in page.decode() and "Nothing to draw" not in page.decode()


@pytest.mark.django_db
def test_ticking_campaigns_fills_the_metric_and_axis_lists_with_htmx(owner: Any, gpu_less_fio: Any) -> None:
    client = client_for(owner)
    for path in ("/analysis/scaling/", "/analysis/sweep/", "/analysis/storage/"):
        empty = client.get(path).content.decode()
        assert 'hx-target="#analysis-options"' in empty
        options = client.get(f"{path}?campaign={gpu_less_fio.pk}", HTTP_HX_REQUEST="true").content.decode()
        assert 'id="analysis-options"' in options and "<html" not in options
        assert '<option value="read_bw_bytes" selected>' in options, path
    sweep = client.get(f"/analysis/sweep/?campaign={gpu_less_fio.pk}", HTTP_HX_REQUEST="true").content.decode()
    assert '<option value="nodes" selected>' in sweep


@pytest.mark.django_db
def test_analysis_tables_show_numbers_in_their_unit_with_the_exact_value_on_hover(
    owner: Any, gpu_less_fio: Any
) -> None:
    client = client_for(owner)
    for path in (f"/analysis/scaling/?campaign={gpu_less_fio.pk}", f"/analysis/sweep/?campaign={gpu_less_fio.pk}"):
        page = client.get(path).content.decode()
        table = page[page.index('class="analysis-table"') :]
        assert '<td class="num" title="1299118476 B/s">1.30 GB/s</td>' in table, path
        assert "1,299,118,476" not in table and not re.search(r">[\d,.]+ B/s<", table)
    data = json.loads(client.get(f"/analysis/scaling/?campaign={gpu_less_fio.pk}&format=json").content)
    assert data["rows"][0]["read_bw_bytes mean"] == pytest.approx(1_299_118_476) and data["rows"][0]["unit"] == "B/s"


@pytest.mark.django_db
def test_an_empty_sweep_says_what_is_missing_not_that_nothing_succeeded(owner: Any, gpu_less_fio: Any) -> None:
    page = client_for(owner).get(f"/analysis/sweep/?campaign={gpu_less_fio.pk}&metric=read_bw_bytes&where=nodes=3")
    text = page.content.decode()
    assert "has both read_bw_bytes and a numeric nodes" in text and "no succeeded run" not in text.lower()
