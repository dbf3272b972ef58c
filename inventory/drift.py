"""The drift gate's comparison: nodes' facts against each other, a golden node or pinned values.

Pure code (no database, no SSH): ``fact_values`` flattens the facts runners collect (runners/facts.py) into named
fields, ``compare`` finds the fields where a node differs from its reference, ``validate_config`` checks a
campaign's ``drift:`` setting. campaigns/drift.py refreshes stale facts and applies the verdict at launch.

Fields (a NIC, HCA or port is named in the field, so two NICs are never compared with each other):

- ``kernel``, ``driver_version``, ``cuda_version``, ``nccl_version``, ``ofed_version``
- ``gpu_model``, ``gpu_count``, ``gpu_memory_mb``, ``gpu_max_sm_clocks_mhz`` (one value per GPU), ``cpu_model``,
  ``cpu_cores``
- ``nic.NAME.mtu``, ``nic.NAME.speed_mbps``, ``nic.NAME.state``
- ``ib.HCA.fw_ver``, ``ib.HCA.port.N.state``, ``ib.HCA.port.N.active_mtu``, ``ib.HCA.port.N.link_layer``
- ``mounts`` (each storage mount as ``TARGET FSTYPE SOURCE``), ``container_runtimes``

The reference of a field is, in this order: its pinned value (``expect``), the golden node's value, or the value
most of the selected nodes share. Without a majority (two nodes that differ, or a three-way split) every node that
is not in the largest group is named, with the value of that group; a tie names every node with its value.
A field no node has is not compared; a field some nodes lack is reported as absent on those (a missing HCA is
drift), unless it is ignored.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from common.durations import duration_ns
from common.errors import FieldError

MODES = ("off", "warn", "refuse")
CONFIG_KEYS = {"mode", "golden", "expect", "fields", "ignore", "max_age"}
SCALARS = ("kernel", "driver_version", "cuda_version", "nccl_version", "ofed_version", "gpu_model", "gpu_count",
           "gpu_memory_mb", "cpu_model", "cpu_cores")  # fmt: skip
IB_PORT_FIELDS = ("state", "active_mtu", "link_layer")
ABSENT = "(absent)"
TIE = "no value is shared by most nodes"


@dataclass(frozen=True)
class Drift:
    """One node's field that differs from its reference."""

    node: str
    field: str
    value: Any
    expected: Any
    reference: str  # "pinned", "golden node NAME" or "N of M nodes"

    @property
    def message(self) -> str:
        if self.reference.startswith(TIE):
            return f"{self.node}: {self.field} is {_show(self.value)}; {self.reference}"
        return f"{self.node}: {self.field} is {_show(self.value)}, expected {_show(self.expected)} ({self.reference})"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "message": self.message}


def _show(value: Any) -> str:
    if value is None:
        return ABSENT
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def fact_values(facts: dict[str, Any]) -> dict[str, Any]:
    """The comparable fields of one node's facts; a value the node does not have is left out."""
    values: dict[str, Any] = {}
    for name in SCALARS:
        value = facts.get(name)
        if value not in (None, ""):
            values[name] = value
    clocks = facts.get("gpu_max_sm_clocks_mhz")
    if clocks:
        values["gpu_max_sm_clocks_mhz"] = list(clocks)
    for nic in facts.get("nics") or []:
        for key in ("mtu", "speed_mbps", "state"):
            if nic.get(key) not in (None, ""):
                values[f"nic.{nic['name']}.{key}"] = nic[key]
    for hca in facts.get("ib_devices") or []:
        if hca.get("fw_ver"):
            values[f"ib.{hca['name']}.fw_ver"] = hca["fw_ver"]
        for port in hca.get("ports") or []:
            for key in IB_PORT_FIELDS:
                if port.get(key):
                    values[f"ib.{hca['name']}.port.{port.get('port')}.{key}"] = port[key]
    mounts = facts.get("mounts")
    if mounts:
        values["mounts"] = sorted(f"{m['target']} {m['fstype']} {m['source']}" for m in mounts)
    runtimes = facts.get("container_runtimes")
    if runtimes:
        values["container_runtimes"] = list(runtimes)
    return values


def _selected(field: str, fields: list[str], ignore: list[str]) -> bool:
    if fields and not any(fnmatch.fnmatchcase(field, pattern) for pattern in fields):
        return False
    return not any(fnmatch.fnmatchcase(field, pattern) for pattern in ignore)


def compare(
    nodes: dict[str, dict[str, Any]],
    *,
    golden: dict[str, Any] | None = None,
    golden_name: str = "",
    expect: dict[str, Any] | None = None,
    fields: list[str] | None = None,
    ignore: list[str] | None = None,
) -> list[Drift]:
    """Every (node, field) of ``nodes`` (name -> fact_values) that differs from its reference, by node then field.

    ``golden``: the golden node's fact_values (``golden_name`` its name); ``expect``: pinned values by field."""
    expect = expect or {}
    fields, ignore = fields or [], ignore or []
    names = set(expect) | {f for values in nodes.values() for f in values} | set(golden or {})
    found: list[Drift] = []
    for field in sorted(f for f in names if _selected(f, fields, ignore) or f in expect):
        have = {node: values.get(field) for node, values in nodes.items()}
        if field in expect:
            reference, expected = "pinned", expect[field]
        elif golden is not None:
            reference, expected = f"golden node {golden_name}", golden.get(field)
        else:
            found += _against_majority(field, have)
            continue
        found += [
            Drift(node, field, value, expected, reference) for node, value in have.items() if not _same(value, expected)
        ]
    return sorted(found, key=lambda d: (d.node, d.field))


def _same(value: Any, expected: Any) -> bool:
    return value == expected or (value is not None and str(value) == str(expected))


def _against_majority(field: str, have: dict[str, Any]) -> list[Drift]:
    groups = Counter(_key(v) for v in have.values())
    if len(groups) < 2:
        return []
    (top, top_count), *rest = groups.most_common()
    if rest[0][1] == top_count:  # a tie: no value is the fleet's, every node is named with every value
        listed = ", ".join(f"{node} {_show(value)}" for node, value in sorted(have.items()))
        reference = f"{TIE} ({listed[:300]})"
        return [Drift(node, field, value, None, reference) for node, value in have.items()]
    expected = next(v for v in have.values() if _key(v) == top)
    reference = f"{top_count} of {len(have)} nodes"
    return [Drift(node, field, value, expected, reference) for node, value in have.items() if _key(value) != top]


def _key(value: Any) -> str:
    return repr(value)


# --- the campaign's setting ----------------------------------------------------------------------------------


def validate_config(value: Any, *, default_mode: str = "off") -> dict[str, Any]:
    """A campaign's ``drift:`` (a mode, or a mapping), normalised; {} when the gate is off. Errors name the field.

    ``{mode: refuse | warn | off, golden: NODE, expect: {FIELD: VALUE}, fields: [PATTERN], ignore: [PATTERN],
    max_age: DURATION}``: patterns are shell-style (``nic.*.mtu``); ``max_age`` is how old facts may be before the
    launch collects them again (default: RACKBENCH_FACTS_MAX_AGE)."""
    if value in (None, {}, ""):
        value = {"mode": default_mode}
    if isinstance(value, str):
        value = {"mode": value}
    if not isinstance(value, dict):
        raise FieldError("drift", f"must be a mode ({', '.join(MODES)}) or a mapping with keys {sorted(CONFIG_KEYS)}")
    unknown = sorted(set(value) - CONFIG_KEYS)
    if unknown:
        raise FieldError(f"drift.{unknown[0]}", f"unknown field (known: {', '.join(sorted(CONFIG_KEYS))})")
    mode = value.get("mode", "refuse")
    if mode not in MODES:
        raise FieldError("drift.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return {}
    config: dict[str, Any] = {"mode": mode}
    golden = value.get("golden", "")
    if not isinstance(golden, str):
        raise FieldError("drift.golden", "must be the name of a node")
    if golden:
        config["golden"] = golden
    expect = value.get("expect") or {}
    if not isinstance(expect, dict):
        raise FieldError("drift.expect", "must map fact fields to values, e.g. {kernel: 6.8.0-45-generic}")
    for field, pinned in expect.items():
        if not isinstance(field, str) or not field:
            raise FieldError("drift.expect", f"{field!r} is not a fact field")
        if not isinstance(pinned, str | int | float | list) or isinstance(pinned, bool):
            raise FieldError(f"drift.expect.{field}", f"must be a value or a list of values, got {pinned!r}")
    if expect:
        config["expect"] = dict(expect)
    for key in ("fields", "ignore"):
        patterns = value.get(key) or []
        if not isinstance(patterns, list) or not all(isinstance(p, str) and p for p in patterns):
            raise FieldError(f"drift.{key}", "must be a list of fact fields or patterns, e.g. [kernel, nic.*.mtu]")
        if patterns:
            config[key] = list(patterns)
    if "max_age" in value:
        config["max_age_s"] = duration_ns(value["max_age"], "drift.max_age") / 1e9
    return config


def config_as_definition(config: dict[str, Any]) -> dict[str, Any]:
    """A validated setting as a campaign file writes it (``max_age`` in seconds)."""
    data = {k: v for k, v in config.items() if k != "max_age_s"}
    if "max_age_s" in config:
        data["max_age"] = config["max_age_s"]
    return data
