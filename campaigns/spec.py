"""Campaign as code: the YAML format, validated into a plain dict; every error names its field.

Format (see examples/campaigns/ and the README)::

    name: fio-read-vs-randread        # required, unique
    description: free text
    kind: fio                         # a benchmark plug-in
    nodes: [lab1, lab2]               # node names, and/or
    node_tags: [lab]                  # every active node with one of these tags
    storage: lab-local                # optional storage system (its flush command, export path)
    repetitions: 3
    warmup_runs: 0                    # per matrix point, run first and left out of statistics
    cache: {flush_clients: true, flush_storage: true}
    timeout: 600                      # seconds per run
    fixed: {bs: 1M, size: 64M}        # parameters of every run
    matrix:                           # full cross product, in this order
      rw: [read, randread]
      numjobs: [1, 4, 16]
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from runners.benchmarks.base import ParamError, get_benchmark

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
TOP_LEVEL = {
    "name", "description", "kind", "nodes", "node_tags", "storage", "repetitions", "warmup_runs", "cache",
    "timeout", "fixed", "matrix",
}  # fmt: skip
CACHE_KEYS = {"flush_clients", "flush_storage"}
SCALAR = (str, int, float, bool)


class SpecError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def load_yaml(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError("", f"not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError("", "a campaign file must be a mapping of fields (name:, kind:, matrix:, ...)")
    return data


def _int(data: dict[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(key, f"must be a whole number, got {value!r}")
    if value < minimum:
        raise SpecError(key, f"must be at least {minimum}, got {value}")
    return value


def _names(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SpecError(key, "must be a list of names")
    return value


def _params(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(field, "must be a mapping of parameter names to values")
    for name, v in value.items():
        if not isinstance(name, str):
            raise SpecError(field, f"parameter name {name!r} must be text")
        if not isinstance(v, SCALAR):
            raise SpecError(f"{field}.{name}", f"must be a single value (text, number or boolean), got {v!r}")
    return dict(value)


def _matrix(value: Any) -> list[list[Any]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise SpecError("matrix", "must be a mapping of parameter names to lists of values")
    axes: list[list[Any]] = []
    for name, values in value.items():
        if not isinstance(name, str):
            raise SpecError("matrix", f"parameter name {name!r} must be text")
        if not isinstance(values, list) or not values:
            raise SpecError(f"matrix.{name}", "must be a non-empty list of values")
        for i, v in enumerate(values):
            if not isinstance(v, SCALAR):
                raise SpecError(f"matrix.{name}[{i}]", f"must be a single value, got {v!r}")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"matrix.{name}", "lists a value twice")
        axes.append([name, list(values)])
    return axes


def validate(data: dict[str, Any]) -> dict[str, Any]:
    """Check a campaign definition and return it normalised. Raises SpecError naming the field."""
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known fields: {', '.join(sorted(TOP_LEVEL))})")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError("name", "required: letters, digits, '.', '_' or '-', up to 100 characters")
    kind = data.get("kind", "fio")
    try:
        benchmark = get_benchmark(kind)
    except ParamError as exc:
        raise SpecError("kind", exc.message) from None
    cache = data.get("cache") or {}
    if not isinstance(cache, dict) or set(cache) - CACHE_KEYS:
        raise SpecError("cache", f"must be a mapping with keys {sorted(CACHE_KEYS)}")
    for key in CACHE_KEYS & set(cache):
        if not isinstance(cache[key], bool):
            raise SpecError(f"cache.{key}", f"must be true or false, got {cache[key]!r}")
    fixed = _params(data.get("fixed"), "fixed")
    matrix = _matrix(data.get("matrix"))
    overlap = sorted(set(fixed) & {axis[0] for axis in matrix})
    if overlap:
        raise SpecError(f"matrix.{overlap[0]}", "is also set in fixed; set it in one place")
    spec = {
        "name": name,
        "description": str(data.get("description") or ""),
        "kind": kind,
        "nodes": _names(data, "nodes"),
        "node_tags": _names(data, "node_tags"),
        "storage": data.get("storage") or "",
        "repetitions": _int(data, "repetitions", 1, minimum=1),
        "warmup_runs": _int(data, "warmup_runs", 0, minimum=0),
        "flush_clients": cache.get("flush_clients", True),
        "flush_storage": cache.get("flush_storage", False),
        "timeout": _int(data, "timeout", 3600, minimum=1),
        "fixed": fixed,
        "matrix": matrix,
    }
    if not isinstance(spec["storage"], str):
        raise SpecError("storage", "must be the name of a storage system")
    if not spec["nodes"] and not spec["node_tags"]:
        raise SpecError("nodes", "select at least one node (nodes: [...] or node_tags: [...])")
    _validate_points(benchmark, spec)
    return spec


def _validate_points(benchmark: Any, spec: dict[str, Any]) -> None:
    from campaigns.planning import expand

    for params in expand(spec["matrix"], spec["fixed"]):
        try:
            benchmark.validate(params)
        except ParamError as exc:
            where = "matrix" if any(axis[0] == exc.field for axis in spec["matrix"]) else "fixed"
            raise SpecError(f"{where}.{exc.field}", exc.message) from None


def to_yaml(data: dict[str, Any]) -> str:
    """YAML of a campaign definition in the format above, keys in their documented order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
