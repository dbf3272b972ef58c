"""Matrix expansion and run planning; pure functions, no database writes, no SSH."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


def expand(matrix: list[list[Any]], fixed: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every matrix point (full cross product, first axis slowest), merged over the fixed parameters."""
    names = [axis[0] for axis in matrix]
    for values in itertools.product(*(axis[1] for axis in matrix)):
        yield {**fixed, **dict(zip(names, values, strict=True))}


def point_count(matrix: list[list[Any]]) -> int:
    count = 1
    for axis in matrix:
        count *= len(axis[1])
    return count


def run_count(matrix: list[list[Any]], *, repetitions: int, warmup_runs: int) -> int:
    return point_count(matrix) * (repetitions + warmup_runs)


@dataclass(frozen=True)
class PlannedRun:
    sequence: int
    point: int
    params: dict[str, Any]
    repetition: int  # 0 for a warm-up run
    is_warmup: bool


def plan(matrix: list[list[Any]], fixed: dict[str, Any], *, repetitions: int, warmup_runs: int) -> Iterator[PlannedRun]:
    """Runs in execution order: each point's warm-ups, then its repetitions, point after point."""
    sequence = 0
    for point, params in enumerate(expand(matrix, fixed)):
        for i in range(warmup_runs + repetitions):
            sequence += 1
            warm = i < warmup_runs
            yield PlannedRun(sequence, point, params, 0 if warm else i - warmup_runs + 1, warm)
