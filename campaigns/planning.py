"""Matrix expansion and run planning; pure functions, no database writes, no SSH."""

from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


RESERVED = frozenset({"nodes"})  # run-level parameters rackbench itself reads; plug-ins never see them
ENV_PREFIX = "env."  # env.NCCL_IB_DISABLE: 1 sets a variable for this point (RoCE vs TCP as a matrix axis)


def benchmark_params(params: dict[str, Any]) -> dict[str, Any]:
    """A run's parameters as its benchmark plug-in receives them."""
    return {k: v for k, v in params.items() if k not in RESERVED and not k.startswith(ENV_PREFIX)}


def run_env(campaign_env: dict[str, str], params: dict[str, Any]) -> dict[str, str]:
    """The campaign's environment with this point's ``env.NAME`` parameters on top."""
    env = dict(campaign_env)
    for key, value in params.items():
        if key.startswith(ENV_PREFIX):
            env[key[len(ENV_PREFIX) :]] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _axes(matrix: list[list[Any]], zipped: list[list[str]]) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    """The matrix as independent axes: a zipped group is one axis whose values are tuples."""
    in_group = {name: group for group in zipped for name in group}
    values = dict((name, vals) for name, vals in matrix)
    axes: list[tuple[list[str], list[tuple[Any, ...]]]] = []
    for name, vals in matrix:
        group = in_group.get(name)
        if group is None:
            axes.append(([name], [(v,) for v in vals]))
        elif name == group[0]:  # the group sits where its first member is declared
            axes.append((list(group), list(zip(*(values[n] for n in group), strict=True))))
    return axes


def _matches(params: dict[str, Any], when: dict[str, Any]) -> bool:
    return all(params.get(key) == value for key, value in when.items())


def expand(
    matrix: list[list[Any]], fixed: dict[str, Any], rules: dict[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """Every matrix point, merged over the fixed parameters.

    The cross product of the axes (first axis slowest), where zipped axes vary together; points matching
    an ``exclude`` entry are dropped; ``overrides`` ({when: {...}, set: {...}}) apply in order; then
    ``derived`` parameters are computed from the result (``np: nodes * gpus_per_node``).
    """
    rules = rules or {}
    axes = _axes(matrix, rules.get("zip", []))
    for combo in itertools.product(*(values for _, values in axes)):
        params = dict(fixed)
        for (names, _), values in zip(axes, combo, strict=True):
            params.update(zip(names, values, strict=True))
        if any(_matches(params, rule) for rule in rules.get("exclude", [])):
            continue
        for override in rules.get("overrides", []):
            if _matches(params, override["when"]):
                params.update(override["set"])
        for name, expression in rules.get("derived", {}).items():
            params[name] = evaluate(expression, params)
        yield params


class ExpressionError(ValueError):
    pass


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def evaluate(expression: str, params: dict[str, Any]) -> int | float:
    """Arithmetic over numeric parameters: numbers, names, + - * / // %, parentheses. Nothing else."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ExpressionError(f"{expression!r} is not an arithmetic expression") from None
    value = _eval(tree.body, params, expression)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _eval(node: ast.AST, params: dict[str, Any], expression: str) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name):
        value = params.get(node.id)
        if type(value) not in (int, float):
            raise ExpressionError(f"{expression!r}: {node.id} is not a numeric parameter of this point")
        return value  # type: ignore[return-value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand, params, expression)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left, params, expression), _eval(node.right, params, expression)
        try:
            result: int | float = _OPS[type(node.op)](left, right)
            return result
        except ZeroDivisionError:
            raise ExpressionError(f"{expression!r} divides by zero") from None
    raise ExpressionError(f"{expression!r}: only numbers, parameter names, + - * / // % and parentheses")


def nodes_for(params: dict[str, Any], nodes: list[T]) -> list[T]:
    """The hosts of a run: the first ``nodes`` of the selection when the matrix varies the node count."""
    count = params.get("nodes")
    return nodes[:count] if isinstance(count, int) and not isinstance(count, bool) else nodes


def product_size(matrix: list[list[Any]], rules: dict[str, Any] | None = None) -> int:
    """Points before exclusions: cheap, so a huge matrix is refused before it is enumerated."""
    count = 1
    for _, values in _axes(matrix, (rules or {}).get("zip", [])):
        count *= len(values)
    return count


def point_count(matrix: list[list[Any]], fixed: dict[str, Any], rules: dict[str, Any] | None = None) -> int:
    if not (rules or {}).get("exclude"):
        return product_size(matrix, rules)
    return sum(1 for _ in expand(matrix, fixed, rules))


def run_count(
    matrix: list[list[Any]], fixed: dict[str, Any], rules: dict[str, Any] | None, *, repetitions: int, warmup_runs: int
) -> int:
    return point_count(matrix, fixed, rules) * (repetitions + warmup_runs)


@dataclass(frozen=True)
class PlannedRun:
    sequence: int
    point: int
    params: dict[str, Any]
    repetition: int  # 0 for a warm-up run
    is_warmup: bool


def plan(
    matrix: list[list[Any]], fixed: dict[str, Any], rules: dict[str, Any] | None, *, repetitions: int, warmup_runs: int
) -> Iterator[PlannedRun]:
    """Runs in execution order: each point's warm-ups, then its repetitions, point after point."""
    sequence = 0
    for point, params in enumerate(expand(matrix, fixed, rules)):
        for i in range(warmup_runs + repetitions):
            sequence += 1
            warm = i < warmup_runs
            yield PlannedRun(sequence, point, params, 0 if warm else i - warmup_runs + 1, warm)
