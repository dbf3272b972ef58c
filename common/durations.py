"""Durations as campaigns spell them (``1s``, ``250ms``, ``100us``, or a number of seconds): the one parser of them,
for sampling intervals (runners.samplers) and Prometheus steps (telemetry.prometheus)."""

from __future__ import annotations

import re
from typing import Any

from common.errors import ParamError

UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m)?\s*$")


def duration_ns(value: Any, field: str) -> int:
    """A duration as YAML gives it (``1s``, ``250ms``, ``100us``, or a number of seconds) in nanoseconds.

    Raises ParamError naming ``field``, as every check of a campaign's definition does.
    """
    if isinstance(value, bool):
        raise ParamError(field, f"must be a duration such as 1s or 1ms, got {value!r}")
    if isinstance(value, int | float):
        ns = round(value * 1e9)
    else:
        match = DURATION.match(str(value))
        if not match:
            raise ParamError(field, f"must be a duration such as 1s, 500ms or 1ms, got {value!r}")
        number, unit = match.groups()
        ns = round(float(number) * UNITS_NS[unit or "s"])
    if ns <= 0:
        raise ParamError(field, f"must be longer than zero, got {value!r}")
    return ns


def duration_text(ns: int) -> str:
    """The shortest exact spelling of a duration: 1s, 250ms, 100us."""
    for unit in ("m", "s", "ms", "us"):
        if ns % UNITS_NS[unit] == 0:
            return f"{ns // UNITS_NS[unit]}{unit}"
    return f"{ns}ns"
