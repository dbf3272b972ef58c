"""A campaign's ``telemetry:`` section, validated (pure: no SSH, no database).

    telemetry: {enabled: true, interval: 1s, fast_interval: 1ms, fast: [net, rdma],
                groups: [cpu, mem, net, rdma, nfs, disk, gpu], prometheus: [{name:, query:, step:, unit:}]}

The samplers that take these settings to the hosts are runners/samplers.py's; Prometheus pulls, telemetry/.
"""

from __future__ import annotations

import re
from typing import Any

from common.durations import duration_ns, duration_text
from common.errors import ParamError
from plugins.tools import sampler as tool

GROUPS = tool.GROUPS
FAST_GROUPS = tool.FAST_GROUPS
KEYS = ("enabled", "interval", "fast_interval", "fast", "groups", "prometheus")
MIN_FAST_NS = 1_000_000  # what a sysfs counter read and a Python tick can keep up with
MIN_SLOW_NS = 100_000_000  # parsing /proc/stat, mountstats, ... takes a few ms on big hosts
DEFAULT_INTERVAL = "1s"
DEFAULT_FAST_INTERVAL = "1ms"
QUERY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:]{0,79}$")
QUERY_KEYS = ("name", "query", "step", "unit")


def validate_queries(value: Any, field: str) -> list[dict[str, Any]]:
    """A list of queries as YAML gives it, normalised (steps spelled canonically).

    Raises ParamError naming the field (``telemetry.prometheus[2].step``), as every check of a campaign does.
    """
    if not isinstance(value, list):
        raise ParamError(field, "must be a list of {name:, query:, step:} mappings")
    queries: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(item, dict):
            raise ParamError(where, "must be a mapping such as {name: node_load, query: node_load1}")
        unknown = sorted(set(item) - set(QUERY_KEYS))
        if unknown:
            raise ParamError(f"{where}.{unknown[0]}", f"unknown field (known fields: {', '.join(QUERY_KEYS)})")
        name, query = item.get("name"), item.get("query")
        if not isinstance(name, str) or not QUERY_NAME.match(name):
            raise ParamError(f"{where}.name", f"must be a name of letters, digits, _ . and : (got {name!r})")
        if not isinstance(query, str) or not query.strip():
            raise ParamError(f"{where}.query", "must be a PromQL expression")
        entry: dict[str, Any] = {"name": name, "query": query.strip()}
        if "step" in item:
            entry["step"] = duration_text(duration_ns(item["step"], f"{where}.step"))
        if "unit" in item:
            if not isinstance(item["unit"], str) or len(item["unit"]) > 30:
                raise ParamError(f"{where}.unit", "must be a short text such as %, B/s or W")
            entry["unit"] = item["unit"]
        if any(q["name"] == name for q in queries):
            raise ParamError(f"{where}.name", f"{name!r} is used twice")
        queries.append(entry)
    return queries


def _group_list(value: Any, field: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(g, str) for g in value):
        raise ParamError(field, f"must be a list of groups ({', '.join(GROUPS)})")
    for name in value:
        if name not in GROUPS:
            raise ParamError(field, f"unknown group {name!r} (known: {', '.join(GROUPS)})")
    if len(set(value)) != len(value):
        raise ParamError(field, "lists a group twice")
    return list(value)


def validate_telemetry(value: Any) -> dict[str, Any]:
    """The ``telemetry:`` section, normalised (durations spelled canonically); {} when telemetry is off.

    ``telemetry: true`` is every group at 1 s. Raises ParamError naming the field.
    """
    if value is None or value is False or value == {}:
        return {}
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ParamError("telemetry", "must be a mapping, e.g. {enabled: true, interval: 1s, fast: [net]}")
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ParamError(f"telemetry.{unknown[0]}", f"unknown field (known fields: {', '.join(KEYS)})")
    enabled = value.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ParamError("telemetry.enabled", f"must be true or false, got {enabled!r}")
    if not enabled:
        return {}
    groups = _group_list(value.get("groups", list(GROUPS)), "telemetry.groups")
    queries = validate_queries(value.get("prometheus", []), "telemetry.prometheus")
    if not groups and not queries:
        raise ParamError("telemetry.groups", "names no group: leave telemetry out, or set enabled: false")
    fast = _group_list(value.get("fast", []), "telemetry.fast")
    for name in fast:
        if name not in FAST_GROUPS:
            raise ParamError(
                "telemetry.fast",
                f"{name} cannot be sampled at fast_interval: only counters read from one sysfs file each "
                f"({', '.join(FAST_GROUPS)}) can",
            )
        if name not in groups:
            raise ParamError("telemetry.fast", f"{name} is not in telemetry.groups")
    interval = duration_ns(value.get("interval", DEFAULT_INTERVAL), "telemetry.interval")
    heavy = [g for g in groups if g not in fast and g not in FAST_GROUPS]  # parsed from text files
    floor = MIN_SLOW_NS if heavy else MIN_FAST_NS
    if interval < floor:
        message = f"{duration_text(interval)} is shorter than {duration_text(floor)}, the shortest interval"
        if heavy:
            message += (
                f" for {', '.join(heavy)}; sample {' and '.join(FAST_GROUPS)} more often with "
                "fast: [...] and fast_interval: (down to 1ms)"
            )
        raise ParamError("telemetry.interval", message)
    config: dict[str, Any] = {"enabled": True, "interval": duration_text(interval), "groups": groups, "fast": fast}
    if queries:
        config["prometheus"] = queries
    if "fast_interval" in value and not fast:
        raise ParamError("telemetry.fast_interval", "is set but telemetry.fast names no group")
    if fast:
        fast_interval = duration_ns(value.get("fast_interval", DEFAULT_FAST_INTERVAL), "telemetry.fast_interval")
        if fast_interval < MIN_FAST_NS:
            raise ParamError(
                "telemetry.fast_interval",
                f"{duration_text(fast_interval)} is shorter than {duration_text(MIN_FAST_NS)}, the shortest interval",
            )
        if fast_interval >= interval:
            raise ParamError("telemetry.fast_interval", f"must be shorter than interval ({duration_text(interval)})")
        config["fast_interval"] = duration_text(fast_interval)
    return config
