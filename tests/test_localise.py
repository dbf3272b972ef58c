"""Two-pass localisation (plugins/localise.py) and the iperf3 topologies that run it (two_pass, and ring)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plugins import localise
from plugins.benchmarks import iperf
from plugins.benchmarks.base import HostCommand, HostContext, HostInfo, Metric, ParamError, get_benchmark

GOOD, SLOW = 400e6, 120e6


def flows_of(pairs: list[tuple[str, str]], bad: set[str]) -> localise.Flows:
    """Both directions of each pair: slow where a bad node takes part."""
    found: localise.Flows = {}
    for a, b in pairs:
        value = SLOW if {a, b} & bad else GOOD
        found[(a, b)] = found[(b, a)] = value
    return found


@pytest.mark.parametrize("count", [2, 3, 6, 7, 16, 64])
def test_pass_one_tests_every_node_in_disjoint_rounds(count: int) -> None:
    rounds = localise.random_pair_rounds(count, seed=7)
    assert {host for pairs in rounds for pair in pairs for host in pair} == set(range(count))
    for pairs in rounds:
        members = [host for pair in pairs for host in pair]
        assert len(members) == len(set(members))
    assert len(rounds) == (1 if count % 2 == 0 else 2)


def test_pass_two_groups_partners_into_rounds_without_a_host_twice() -> None:
    assert localise.rounds_of([(0, 5), (1, 5), (2, 4)]) == [[(0, 5), (2, 4)], [(1, 5)]]


def test_a_bad_node_is_named_and_its_first_partner_cleared() -> None:
    first = flows_of([("n1", "n4"), ("n2", "n5"), ("n3", "n6")], bad={"n4"})
    second = localise.plan_second_pass(first, threshold=0.7)

    assert second is not None
    assert second.suspects == ["n1", "n4"] and second.good == ["n2", "n3", "n5", "n6"]
    assert second.partners == [("n1", "n2"), ("n4", "n3")] and second.reference == GOOD
    verdict = localise.judge(second, flows_of(second.partners, bad={"n4"}), threshold=0.7)
    assert (verdict.bad, verdict.cleared, verdict.untested) == (["n4"], ["n1"], [])


def test_a_healthy_fleet_or_one_where_every_pair_is_low_needs_no_second_pass() -> None:
    pairs = [("n1", "n2"), ("n3", "n4")]
    assert localise.plan_second_pass(flows_of(pairs, bad=set()), threshold=0.7) is None
    assert localise.plan_second_pass(flows_of(pairs, bad={"n1", "n3"}), threshold=0.7) is None


def test_a_suspect_without_a_result_in_pass_two_is_untested_not_bad() -> None:
    second = localise.SecondPass(["n1", "n4"], ["n2", "n3"], [("n1", "n2"), ("n4", "n3")], GOOD)
    verdict = localise.judge(second, flows_of([("n1", "n2")], bad=set()), threshold=0.7)
    assert (verdict.bad, verdict.cleared, verdict.untested) == ([], ["n1"], ["n4"])


# --- the iperf3 topologies ----------------------------------------------------------------------------------------


def hosts(count: int) -> tuple[HostInfo, ...]:
    return tuple(HostInfo(name=f"n{i}", address=f"198.18.250.{i + 1}") for i in range(count))


def build(params: dict[str, Any], index: int, count: int) -> list[HostCommand]:
    run_hosts = hosts(count)
    context = HostContext(node=f"n{index}", index=index, run_dir="/r", data_dir="/d", hosts=run_hosts)
    built = get_benchmark("iperf3").build(params, context)
    return built if isinstance(built, list) else [built] if built else []


def peers(commands: list[HostCommand]) -> list[tuple[int, str]]:
    main = next(c for c in commands if not c.service)
    return [(c.get("round", 0), c["peer"]) for c in json.loads(main.files["clients.json"])["clients"]]


def test_two_pass_runs_pass_one_as_random_pairs_in_turn() -> None:
    rounds = localise.random_pair_rounds(6, seed=3)
    for me in range(6):
        (partner,) = [b if a == me else a for a, b in rounds[0] if me in (a, b)]
        assert peers(build({"topology": "two_pass", "seed": 3}, me, 6)) == [(0, f"n{partner}")]


def test_pass_two_runs_only_on_the_suspects_and_their_partners() -> None:
    params = {"topology": "two_pass", "localise_pass": 2, "partners": "n0:n2,n1:n2", "reference_bps": GOOD}
    assert peers(build(params, 2, 4)) == [(0, "n0"), (1, "n1")]
    assert peers(build(params, 1, 4)) == [(1, "n2")]
    assert build(params, 3, 4) == []


def metric(sender: str, receiver: str, value: float) -> Metric:
    labels = {"peer": receiver, "direction": "send", "round": 0}
    return Metric(name="throughput_bps", value=value, unit="bit/s", host=sender, labels=labels)


def test_pass_one_asks_for_pass_two_with_the_suspects_partners() -> None:
    params = {"topology": "two_pass", "duration": 1}
    found = flows_of([("n0", "n3"), ("n1", "n4"), ("n2", "n5")], bad={"n3"})
    metrics = [metric(s, r, v) for (s, r), v in found.items()]

    follow = get_benchmark("iperf3").follow_up(params, metrics)

    assert follow == {**params, "localise_pass": 2, "partners": "n0:n1,n3:n2", "reference_bps": GOOD}
    get_benchmark("iperf3").validate(follow)
    assert get_benchmark("iperf3").follow_up(follow, metrics) is None  # pass 2 asks for nothing more
    healthy = [metric(s, r, GOOD) for (s, r) in found]
    assert get_benchmark("iperf3").follow_up(params, healthy) is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"topology": "all_pairs", "seed": 1}, "seed"),
        ({"topology": "two_pass", "partners": "n0:n1"}, "partners"),
        ({"topology": "two_pass", "localise_pass": 2}, "partners"),
        ({"topology": "two_pass", "localise_pass": 2, "partners": "n0", "reference_bps": 1}, "partners"),
        ({"topology": "two_pass", "threshold": 2}, "threshold"),
        ({"topology": "two_pass", "reverse": True}, "topology"),
    ],
)
def test_localisation_parameters_are_checked_naming_the_field(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError) as caught:
        get_benchmark("iperf3").validate(params)
    assert caught.value.field == field


def test_ring_sends_from_every_host_to_the_next_at_once() -> None:
    for me in range(4):
        assert peers(build({"topology": "ring", "port": 7000}, me, 4)) == [(0, f"n{(me + 1) % 4}")]
        service = next(c for c in build({"topology": "ring", "port": 7000}, me, 4) if c.service)
        servers = json.loads(service.files["servers.json"])["servers"]
        assert [(s["peer"], s["port"]) for s in servers] == [(f"n{(me - 1) % 4}", 7000 + (me - 1) % 4)]


def test_second_pass_of_reads_what_pass_two_re_tests() -> None:
    params = {"topology": "two_pass", "localise_pass": 2, "partners": "n0:n2,n1:n3", "reference_bps": GOOD}
    second = iperf.second_pass_of(params)
    assert second == localise.SecondPass(["n0", "n1"], ["n2", "n3"], [("n0", "n2"), ("n1", "n3")], GOOD)
    assert iperf.second_pass_of({"topology": "two_pass"}) is None
