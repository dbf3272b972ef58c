"""The fleet view (node x metric against the fleet's median) and the link matrix (sender x receiver): their robust
judgement, pages, exports and API. Results are data here, written with the ORM; tests/test_fleet_e2e.py measures
them for real on a lab with degraded links."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import struct
from itertools import count
from typing import Any

import numpy as np
import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from analysis import fleet, reports, selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from common.errors import ParamError
from plugins.benchmarks.base import Metric, get_benchmark

_sequence = count(1)


# --- robust scores ------------------------------------------------------------------------------------------------


def test_a_node_far_below_the_fleets_median_is_an_outlier_and_the_others_are_not() -> None:
    scores = fleet.robust_scores({"n1": 100, "n2": 98, "n3": 103, "n4": 101, "n5": 60}, threshold=3.5)
    assert [n for n, s in scores.items() if s.outlier] == ["n5"]
    assert scores["n5"].median == 100 and scores["n5"].score < -3.5 and scores["n5"].ratio == pytest.approx(0.6)


def test_lower_is_better_turns_the_sign() -> None:
    scores = fleet.robust_scores({"n1": 10, "n2": 10.2, "n3": 9.9, "n4": 30}, higher_is_better=False)
    assert [n for n, s in scores.items() if s.outlier] == ["n4"]
    assert scores["n4"].score < 0


def test_near_identical_nodes_are_not_outliers_for_a_one_percent_difference() -> None:
    # MAD 0: without the spread floor any difference at all would be infinitely many deviations away
    scores = fleet.robust_scores({"n1": 100, "n2": 100, "n3": 100, "n4": 99})
    assert not any(s.outlier for s in scores.values())


def test_two_nodes_are_no_fleet_to_judge_against() -> None:
    assert not any(s.outlier for s in fleet.robust_scores({"n1": 100, "n2": 1}).values())


def test_the_threshold_is_the_users_and_is_checked_naming_its_field() -> None:
    values = {"n1": 100, "n2": 100, "n3": 100, "n4": 80}  # score -4 with the 5 % floor
    assert fleet.robust_scores(values, threshold=3.5)["n4"].outlier
    assert not fleet.robust_scores(values, threshold=5)["n4"].outlier
    assert fleet.parse_threshold("") == fleet.DEFAULT_THRESHOLD and fleet.parse_threshold("2.5") == 2.5
    for bad in ("x", "nan", "0", "1e9", "-3"):
        with pytest.raises(ParamError) as raised:
            fleet.parse_threshold(bad)
        assert raised.value.field == "threshold"


def test_a_context_metric_is_scored_but_never_makes_a_node_an_outlier() -> None:
    # a host's CPU use during iperf3 is context: a busy neighbour on a shared machine must not name the node
    def column(name: str, judged: bool) -> fleet.Column:
        return fleet.Column(0, name, "", "", "%", False, judged=judged)

    cpu, loss = column("cpu_local_percent", judged=False), column("lost_percent", judged=True)
    samples = [
        (c, node, [value]) for c in (cpu, loss) for node, value in {"n1": 1, "n2": 1.1, "n3": 0.9, "n4": 9}.items()
    ]
    view = fleet.fleet_view(samples)
    assert [o.node for o in view.outliers] == ["n4"]
    assert [c.name for c, _ in view.outliers[0].evidence] == ["lost_percent"]
    assert get_benchmark("iperf3").spec("cpu_local_percent").judged is False  # type: ignore[union-attr]


@pytest.mark.parametrize("repetitions", [1, 2, 3, 4])
def test_repetitions_as_an_array_are_judged_to_the_bit_as_the_same_samples_as_lists(repetitions: int) -> None:
    """The selector's common case (every node in every repetition) is judged with numpy: each cell, score, outlier
    and sample as statistics.median and plain floats give them."""
    rng = np.random.default_rng(repetitions)
    hosts = [f"n{i}" for i in range(1, 202)]
    columns = [fleet.Column(0, f"m{m}", "", "", "B/s", m != 2) for m in range(4)]
    arrays = {c: rng.normal(1e9, 3e7, size=(repetitions, len(hosts))) for c in columns}
    for values in arrays.values():
        values[:, 17] *= 0.5  # n18, an outlier wherever it is judged
    as_lists = fleet.fleet_view([(c, h, a[:, i].tolist()) for c, a in arrays.items() for i, h in enumerate(hosts)])
    as_arrays = fleet.fleet_view_by_column({c: fleet.Repetitions(hosts, a) for c, a in arrays.items()})

    assert as_arrays.cells == as_lists.cells and as_arrays.nodes == as_lists.nodes
    assert [(o.node, o.evidence) for o in as_arrays.outliers] == [(o.node, o.evidence) for o in as_lists.outliers]
    assert [o.node for o in as_arrays.outliers] == ["n18"] and len(as_arrays.outliers[0].evidence) == 3
    first = arrays[columns[0]]
    median = statistics.median(statistics.median(first[:, i].tolist()) for i in range(len(hosts)))
    assert as_arrays.cell("n1", 0).score.median == median  # type: ignore[union-attr]
    assert all(type(cell.score.value) is float and type(cell.samples[0]) is float for cell in as_arrays.row("n5"))


@pytest.mark.django_db
def test_postgresqls_binary_float8_array_reads_as_the_same_floats() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("array_send is PostgreSQL's")
    values = [0.1, -0.0, 5e-324, 1.7976931348623157e308, math.pi, -2.5e-7, 1e15 + 0.5, 940123456.789]
    with connection.cursor() as cursor:
        cursor.execute("SELECT array_send(%s::float8[]), array_send('{}'::float8[]), array_send('{1}'::int4[])",
                       [values])  # fmt: skip
        floats, empty, integers = cursor.fetchone()
    read = selectors.float8_array(floats).tolist()
    assert [struct.pack(">d", v) for v in read] == [struct.pack(">d", v) for v in values]  # -0.0 and all, exact
    assert selectors.float8_array(empty).tolist() == []
    with pytest.raises(ValueError, match="float8"):
        selectors.float8_array(integers)


# --- the link matrix ----------------------------------------------------------------------------------------------


def flows(bad_node: str | None = None, bad_link: tuple[str, str] | None = None, n: int = 6) -> list[Any]:
    nodes = [f"lab{i}" for i in range(1, n + 1)]
    out = []
    for s in nodes:
        for r in nodes:
            if s == r:
                continue
            value = 940e6 + 5e6 * ((3 * nodes.index(s) + 7 * nodes.index(r)) % 5 - 2)  # fixed noise (hash() is not)
            if bad_node in (s, r) or (s, r) == bad_link:
                value *= 0.3
            out.append((s, r, value))
    return out


def test_a_bad_node_is_its_row_and_column_and_is_named_alone() -> None:
    matrix = fleet.link_matrix(flows(bad_node="lab4"))
    assert matrix.outliers == ["lab4"] and matrix.bad_links == []
    assert matrix.relative("lab4", "lab1") == pytest.approx(0.3, abs=0.02)
    assert matrix.relative("lab1", "lab2") == pytest.approx(1, abs=0.02)


def test_a_bad_link_is_one_cell_and_names_no_node() -> None:
    matrix = fleet.link_matrix(flows(bad_link=("lab2", "lab5")))
    assert matrix.outliers == []
    assert [(s, r) for s, r, _ in matrix.bad_links] == [("lab2", "lab5")]


def test_a_bad_link_of_a_symmetric_matrix_is_named_once_though_shown_in_both_cells() -> None:
    """nccl-tests' and torch_dist's pairs: one value per pair, on both its nodes (node x peer)."""
    symmetric = [(a, b, v) for a, b, v in flows(bad_link=("lab2", "lab5")) if a < b]
    both = symmetric + [(b, a, v) for a, b, v in symmetric]
    matrix = fleet.link_matrix(both, symmetric=True, unit="GB/s", axes=("node", "peer"))
    assert matrix.outliers == []
    assert [(s, r) for s, r, _ in matrix.bad_links] == [("lab2", "lab5")]
    assert matrix.value("lab2", "lab5") == matrix.value("lab5", "lab2") < 0.5 * matrix.median_cell
    assert fleet.links_payload(matrix)["symmetric"] is True
    assert reports.link_findings(matrix)[0].startswith("Bad link lab2 ↔ lab5: ")
    directed = fleet.link_matrix(both, unit="GB/s")  # the same cells read as two flows: two links
    assert sorted((s, r) for s, r, _ in directed.bad_links) == [("lab2", "lab5"), ("lab5", "lab2")]


def test_a_healthy_matrix_names_nothing() -> None:
    matrix = fleet.link_matrix(flows())
    assert matrix.outliers == [] and matrix.bad_links == []


# --- pages and API, on stored results -----------------------------------------------------------------------------


def stored_campaign(team: Any, name: str = "fleet-iperf", *, bad: str = "lab4", nodes: int = 6) -> Campaign:
    """An iperf3 all_pairs campaign that ran twice (two repetitions of one point), ``bad``'s flows at 30 %."""
    campaign = Campaign.objects.create(name=name, kind="iperf3", team=team, status=CampaignStatus.SUCCEEDED,
                                       matrix=[["parallel", [1]]])  # fmt: skip
    for repetition in (1, 2):
        run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params={"parallel": 1},
                                 repetition=repetition, status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.bulk_create(
            Result(
                run=run,
                name="throughput_bps",
                value=value,
                unit="bit/s",
                host=s,
                labels={"peer": r, "direction": "send", "round": 0},
            )  # fmt: skip
            for s, r, value in flows(bad_node=bad, n=nodes)
        )
        Result.objects.create(run=run, name="throughput_bps", value=900e6, unit="bit/s", host="", labels={})
    return campaign


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_link_page_shows_the_matrix_readably_and_names_the_bad_node(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/links/").content.decode()

    assert "Bad node lab4" in page and "30% of the fleet" in page
    assert "Bad node lab1" not in page and "Bad link" not in page
    assert "Mbit/s" in page and "heat-bad" in page


@pytest.mark.django_db
def test_the_link_matrix_exports_as_csv_and_json(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    url = f"/analysis/campaigns/{campaign.pk}/links/"
    rows = list(csv.reader(io.StringIO(logged_in(owner).get(url, {"format": "csv"}).content.decode())))
    assert rows[0] == ["sender", *[f"lab{i}" for i in range(1, 7)]]
    assert rows[1][0] == "lab1" and rows[1][1] == "" and float(rows[1][2]) > 9e8
    assert float(rows[4][1]) < 3e8  # lab4 -> lab1
    nodes = json.loads(logged_in(owner).get(url, {"format": "json", "table": "nodes"}).content)
    assert [r["node"] for r in nodes["rows"] if r["outlier"]] == ["lab4"]


@pytest.mark.django_db
def test_the_fleet_page_names_the_outlier_with_its_evidence(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    response = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/fleet/")
    page = response.content.decode()

    assert response.status_code == 200
    assert "<strong>lab4</strong>" in page and "<strong>lab1</strong>" not in page
    evidence = json.loads(logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/fleet/", {"format": "json"}).content)
    assert {r["node"] for r in evidence["rows"]} == {"lab4"}
    assert all(len(r["samples"].split()) == 10 for r in evidence["rows"])  # 5 peers x 2 repetitions


@pytest.mark.django_db
def test_the_api_gives_a_verdict_per_node_and_the_matrix(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    api = api_for(owner)
    verdicts = api.get(f"/api/v1/campaigns/{campaign.pk}/fleet/").json()
    links = api.get(f"/api/v1/campaigns/{campaign.pk}/links/", {"threshold": "3"}).json()

    assert {n["node"]: n["verdict"] for n in verdicts["nodes"]} == {f"lab{i}": "ok" for i in (1, 2, 3, 5, 6)} | {
        "lab4": "outlier"
    }
    assert verdicts["nodes"][3]["evidence"][0]["metric"] == "throughput_bps"
    assert links["outliers"] == ["lab4"] and links["threshold"] == 3.0
    assert links["nodes"][0] == "lab1" and links["matrix"][0][0] is None and len(links["matrix"]) == 6


@pytest.mark.django_db
def test_a_bad_threshold_is_a_400_naming_the_field_and_a_message_on_the_page(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    response = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/fleet/", {"threshold": "lots"})
    assert response.status_code == 400 and response.json()["extra"]["field"] == "threshold"
    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/links/", {"threshold": "lots"})
    assert page.status_code == 200 and "threshold: " in page.content.decode()


@pytest.mark.django_db
def test_the_outsider_gets_404s(outsider: Any, team: Any) -> None:
    campaign = stored_campaign(team)
    for url in (f"/analysis/campaigns/{campaign.pk}/fleet/", f"/analysis/campaigns/{campaign.pk}/links/"):
        assert logged_in(outsider).get(url).status_code == 404
    for url in (f"/api/v1/campaigns/{campaign.pk}/fleet/", f"/api/v1/campaigns/{campaign.pk}/links/"):
        assert api_for(outsider).get(url).status_code == 404


@pytest.mark.django_db
def test_the_query_count_does_not_grow_with_the_fleet(
    owner: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    small, large = stored_campaign(team, "small", nodes=4, bad="lab2"), stored_campaign(team, "large", nodes=24)
    client, api = logged_in(owner), api_for(owner)
    for campaign in (small, large):
        with django_assert_max_num_queries(12):
            assert client.get(f"/analysis/campaigns/{campaign.pk}/fleet/").status_code == 200
        with django_assert_max_num_queries(12):
            assert client.get(f"/analysis/campaigns/{campaign.pk}/links/").status_code == 200
        with django_assert_max_num_queries(12):
            assert api.get(f"/api/v1/campaigns/{campaign.pk}/fleet/").status_code == 200
        with django_assert_max_num_queries(12):
            assert api.get(f"/api/v1/campaigns/{campaign.pk}/links/").status_code == 200


@pytest.mark.django_db
def test_the_link_page_reads_its_runs_and_results_once(owner: Any, team: Any) -> None:
    campaign = stored_campaign(team, "once", bad="lab2")
    with CaptureQueriesContext(connection) as queries:
        page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/links/", {"point": "0"})
    assert page.status_code == 200 and "lab2" in page.content.decode()
    statements = [q["sql"] for q in queries.captured_queries]
    assert sorted(s for s in statements if statements.count(s) > 1) == []  # no question asked twice
    assert len([s for s in statements if "campaigns_result" in s]) == 2  # which points have pairs, then their rows


# --- a node's history ---------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_nodes_history_shows_its_decline_beside_its_peers(
    owner: Any, outsider: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    for week, share in enumerate((1.0, 0.9, 0.8, 0.7)):  # lab4 slows down week after week
        c = Campaign.objects.create(name=f"week-{week}", kind="iperf3", team=team, status=CampaignStatus.SUCCEEDED)
        run = Run.objects.create(campaign=c, sequence=next(_sequence), point=0, params={}, repetition=1,
                                 status=RunStatus.SUCCEEDED)  # fmt: skip
        Result.objects.bulk_create(
            Result(
                run=run,
                name="throughput_bps",
                value=9e8 * (share if node == "lab4" else 1),
                unit="bit/s",
                host=node,
                labels={"peer": "x", "direction": "send"},
            )  # fmt: skip
            for node in ("lab1", "lab2", "lab3", "lab4", "lab5")
        )
    url, client = "/analysis/nodes/lab4/history/", logged_in(owner)
    with django_assert_max_num_queries(8):
        rows = json.loads(client.get(url, {"metric": "throughput_bps", "last": "3", "format": "json"}).content)

    # -2.0 at 90 %: within the 5 % spread floor's 3.5 at the default threshold; an outlier from 80 % on
    assert [(r["campaign"], r["ratio"], r["score"], r["outlier"]) for r in rows["rows"]] == [
        ("week-1", 0.9, -2.0, False), ("week-2", 0.8, -4.0, True), ("week-3", 0.7, -6.0, True)
    ]  # fmt: skip
    assert all(r["fleet_median"] == 9e8 for r in rows["rows"])
    assert "week-0" not in logged_in(owner).get(url, {"last": "3"}).content.decode()
    assert "must be a whole number" in logged_in(owner).get(url, {"last": "0"}).content.decode()
    assert json.loads(logged_in(outsider).get(url, {"format": "json"}).content)["rows"] == []


@pytest.mark.django_db
def test_the_fleet_page_shows_a_page_of_nodes_outliers_first_and_every_cell_in_the_export(
    owner: Any, team: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis import reports

    monkeypatch.setattr(reports, "FLEET_ROWS", 5)
    campaign = stored_campaign(team, nodes=12, bad="lab9")
    client, url = logged_in(owner), f"/analysis/campaigns/{campaign.pk}/fleet/"

    first = client.get(url).content.decode()
    third = client.get(url, {"page": "3"}).content.decode()
    cells = list(csv.reader(io.StringIO(client.get(url, {"format": "csv", "table": "cells"}).content.decode())))

    assert "page 1 of 3" in first and "<th>lab9</th>" in first and "<th>lab12</th>" not in first
    assert "<th>lab12</th>" in third and "<th>lab9</th>" not in third
    assert {row[0] for row in cells[1:]} == {f"lab{i}" for i in range(1, 13)}
    assert "page '9' is not one of" in client.get(url, {"page": "9"}).content.decode().replace("&#x27;", "'")


def stored_torch_two_pass(team: Any) -> Campaign:
    """A torch_dist two_pass campaign as it stores itself: pass 1's random pairs (lab4's pair low), and pass 2
    re-testing lab4 and its partner with known-good nodes (lab4 low again)."""
    campaign = Campaign.objects.create(name="torch-two-pass", kind="torch_dist", team=team,
                                       status=CampaignStatus.SUCCEEDED, matrix=[["op", ["all_reduce"]]])  # fmt: skip
    bench = get_benchmark("torch_dist")
    passes = [
        ({"topology": "two_pass"}, [("lab1", "lab2"), ("lab3", "lab4"), ("lab5", "lab6")]),
        (None, [("lab3", "lab1"), ("lab4", "lab2")]),
    ]
    params: dict[str, Any] = {"topology": "two_pass"}
    for asked, pairs in passes:
        params = asked or params
        run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params=params, repetition=1,
                                 status=RunStatus.SUCCEEDED)  # fmt: skip
        metrics = [
            Metric("busbw_max_gbps", 0.015 if "lab4" in (a, b) else 0.05, "GB/s", node, {"peer": peer, "round": 0})
            for a, b in pairs
            for node, peer in ((a, b), (b, a))
        ]
        Result.objects.bulk_create(
            Result(run=run, name=m.name, value=m.value, unit=m.unit, host=m.host, labels=m.labels) for m in metrics
        )
        params = bench.follow_up(params, metrics) or params
    return campaign


@pytest.mark.django_db
def test_a_torch_dist_two_pass_verdict_is_on_the_links_page_and_in_the_api(owner: Any, team: Any) -> None:
    campaign = stored_torch_two_pass(team)

    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/links/").content.decode()
    links = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/links/").json()

    assert "lab4: bad (low with a good partner too)" in page and "lab3: cleared" in page
    (verdict,) = links["localisation"]
    assert (verdict["suspects"], verdict["bad"], verdict["cleared"]) == (["lab3", "lab4"], ["lab4"], ["lab3"])
    assert verdict["reference"] == 0.05
