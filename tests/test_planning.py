"""Matrix expansion beyond the cross product: zip, exclude, overrides, derived, the node-count axis."""

from __future__ import annotations

from typing import Any

import pytest

from campaigns import planning, services
from campaigns.spec import SpecError, validate
from inventory.services import node_upsert


def test_it_expands_the_cross_product_first_axis_slowest() -> None:
    points = list(planning.expand([["rw", ["read", "write"]], ["numjobs", [1, 4]]], {"bs": "4k"}))

    assert [(p["rw"], p["numjobs"]) for p in points] == [("read", 1), ("read", 4), ("write", 1), ("write", 4)]
    assert all(p["bs"] == "4k" for p in points)


def test_zipped_axes_vary_together() -> None:
    matrix = [["model", ["resnet50", "vgg16"]], ["batch_size", [256, 192]], ["gpus", [16, 32]]]

    points = list(planning.expand(matrix, {}, {"zip": [["model", "batch_size"]]}))

    assert [(p["model"], p["batch_size"], p["gpus"]) for p in points] == [
        ("resnet50", 256, 16),
        ("resnet50", 256, 32),
        ("vgg16", 192, 16),
        ("vgg16", 192, 32),
    ]
    assert planning.product_size(matrix, {"zip": [["model", "batch_size"]]}) == 4


def test_exclusions_drop_points_and_overrides_change_them() -> None:
    matrix = [["model", ["resnet50", "vgg16"]], ["nodes", [1, 2]]]
    rules = {
        "exclude": [{"model": "vgg16", "nodes": 1}],
        "overrides": [{"when": {"model": "vgg16"}, "set": {"batch_size": 192}}],
    }

    points = list(planning.expand(matrix, {"batch_size": 256}, rules))

    assert [(p["model"], p["nodes"], p["batch_size"]) for p in points] == [
        ("resnet50", 1, 256),
        ("resnet50", 2, 256),
        ("vgg16", 2, 192),
    ]
    assert planning.point_count(matrix, {"batch_size": 256}, rules) == 3


def test_derived_parameters_are_arithmetic_over_the_point() -> None:
    rules = {"derived": {"np": "nodes * gpus_per_node", "half": "np / 2", "records": "(nodes + 1) // 2"}}

    (point,) = planning.expand([["nodes", [3]]], {"gpus_per_node": 16}, rules)

    assert (point["np"], point["half"], point["records"]) == (48, 24, 2)


@pytest.mark.parametrize(
    "expression", ["__import__('os').system('id')", "nodes ** 99", "open('x')", "nodes if 1 else 2"]
)
def test_derived_expressions_allow_nothing_but_arithmetic(expression: str) -> None:
    with pytest.raises(planning.ExpressionError):
        planning.evaluate(expression, {"nodes": 2})


def test_the_node_count_picks_the_first_nodes_of_the_selection() -> None:
    assert planning.nodes_for({"nodes": 2}, ["a", "b", "c"]) == ["a", "b"]
    assert planning.nodes_for({}, ["a", "b", "c"]) == ["a", "b", "c"]
    assert planning.benchmark_params({"nodes": 2, "rw": "read"}) == {"rw": "read"}


def spec(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "p",
        "kind": "fio",
        "nodes": ["n1"],
        "fixed": {"bs": "4k"},
        "matrix": {"rw": ["read"]},
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"zip": [["rw", "numjobs"]]}, "zip[0]"),
        ({"matrix": {"rw": ["read"], "numjobs": [1, 2]}, "zip": [["rw", "numjobs"]]}, "zip[0]"),
        ({"exclude": [{"nope": 1}]}, "exclude[0]"),
        ({"overrides": [{"when": {"rw": "read"}}]}, "overrides[0]"),
        ({"overrides": [{"when": {"rw": "read"}, "set": {"rw": "raed"}}]}, "overrides[0].set.rw"),
        ({"derived": {"x": "rw * 2"}}, "derived"),
        ({"derived": {"bs": "1 + 1"}}, "derived.bs"),
        ({"env": {"BAD NAME": "x"}}, "env"),
        ({"env": {"NCCL_DEBUG": "INFO\nX=1"}}, "env.NCCL_DEBUG"),
        ({"matrix": {"rw": ["read"], "nodes": [0]}}, "matrix.nodes"),
    ],
)
def test_it_names_the_field_of_a_bad_rule(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate(spec(**change))
    assert caught.value.field == field


@pytest.mark.django_db
def test_it_refuses_more_nodes_than_the_campaign_selects() -> None:
    node_upsert(name="n1", address="10.0.0.1")

    with pytest.raises(SpecError, match="asks for 2 nodes but the campaign selects 1"):
        services.campaign_apply(data=spec(matrix={"rw": ["read"], "nodes": [1, 2]}))


@pytest.mark.django_db
def test_each_run_gets_the_hosts_of_its_node_count() -> None:
    for i in (1, 2, 3):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}")
    data = spec(nodes=["n1", "n2", "n3"], matrix={"rw": ["read"], "nodes": [1, 3]}, env={"NCCL_DEBUG": "INFO"})
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    hosts = [sorted(r.hosts.values_list("host", flat=True)) for r in campaign.runs.order_by("sequence")]
    assert hosts == [["n1"], ["n1", "n2", "n3"]]
    assert campaign.env == {"NCCL_DEBUG": "INFO"}


def test_env_parameters_set_a_variable_for_their_point_only() -> None:
    params = {"rw": "read", "env.NCCL_IB_DISABLE": 1, "nodes": 2}

    assert planning.benchmark_params(params) == {"rw": "read"}
    assert planning.run_env({"NCCL_DEBUG": "INFO"}, params) == {"NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1"}
    with pytest.raises(SpecError) as caught:
        validate(spec(matrix={"rw": ["read"], "env.BAD-NAME": [1]}))
    assert caught.value.field == "matrix.env.BAD-NAME"


def test_the_retry_backoff_doubles_with_bounded_jitter_and_a_ceiling() -> None:
    from common.retry import Backoff

    policy = Backoff(base=2.0, ceiling=20.0)
    for attempt, low in ((0, 2.0), (1, 4.0), (2, 8.0)):
        delays = [policy.delay(attempt) for _ in range(200)]
        assert low <= min(delays) and max(delays) <= low * 1.5 and len(set(delays)) > 1
    assert max(policy.delay(10) for _ in range(50)) == 20.0
