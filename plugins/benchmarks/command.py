"""Generic command step (kind "command"): one allowed program on every host of the run; it passes when it exits 0, and
its metrics come from patterns the campaign declares. Health checks such as ``dcgmi diag -r 1``, ``ibv_devinfo``,
``nvidia-smi topo -m`` or ``nvsm stress-test`` become campaign steps this way.

The program is never the campaign's to choose freely: it comes from an allow-list that admins keep
(``inventory.models.AllowedCommand``: a name, the program and its fixed leading arguments, and how many further
arguments a campaign may add, each matching a pattern in full). A campaign names an entry (param ``command``) and may
give further arguments (``args``: a list, or text split into words by shell rules, never run by a shell). The list
reaches this Django-free module through a port (``set_allow_list``) that the inventory app fills in at ``ready()``;
until then nothing is allowed.

``patterns`` declares the metrics: text, one ``NAME[UNIT]=REGEX`` a line (``mem_total[KiB]=^MemTotal:\\s+(\\d+) kB``),
or the same as ``{name: {"regex": ..., "unit": ...}}``. The host runs the program through a small helper
(``rackbench_command.py``, Python 3.6+, the argv from a JSON plan, no shell) that passes its output through and then
matches each regex line by line, on the node (so a costly regex costs the node, never the worker): the first match
gives the metric, from the group named ``value`` or else the first group (digits with an optional
sign, decimals, exponent and thousands commas). A declared pattern that matches nothing fails the run: a check whose
number is missing has not passed. Every host whose program exited 0 also reports ``passed`` (1); a non-zero exit
fails the run with the program's last lines, as for every plug-in.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import parameters
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    Metric,
    MetricSpec,
    ParamError,
    ParseError,
    register,
)
from plugins.tools import command_helper

MAX_ARG = 256
MAX_PATTERN = 200
MAX_PATTERNS = 32
_PROGRAM = re.compile(r"(/[A-Za-z0-9_.+-]+)+|[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")  # a name or absolute path
_METRIC = re.compile(r"[a-z][a-z0-9_]{0,62}")
_UNIT = re.compile(r"[A-Za-z%/°µ]{0,16}")
RESERVED = ("passed",)
HELPER = "rackbench_command.py"
PLAN = "command.json"
HEADER = command_helper.HEADER
HELPER_SCRIPT = Path(command_helper.__file__).read_text()  # shipped to the hosts as HELPER


@dataclass(frozen=True)
class AllowedProgram:
    """One allow-list entry as the plug-in needs it."""

    name: str
    argv: tuple[str, ...]  # the program and its fixed leading arguments
    max_args: int = 0  # further arguments a campaign may give
    arg_pattern: str = ""  # each of them must match it in full


# The port: name -> entry, or None when the allow-list has no such name. Filled in by inventory at ready().
_lookup: Callable[[str], AllowedProgram | None] = lambda name: None  # noqa: E731
_names: Callable[[], list[str]] = list


def set_allow_list(lookup: Callable[[str], AllowedProgram | None], names: Callable[[], list[str]]) -> None:
    global _lookup, _names
    _lookup, _names = lookup, names


# --- checks shared with the allow-list's admin form -----------------------------------------------------------


def check_program(value: Any) -> str:
    """A program name or absolute path: never an option, a relative path or shell text."""
    text = parameters.text(value, max_length=255)
    if not _PROGRAM.fullmatch(text) or ".." in text.split("/"):
        raise ValueError(f"must be a program name (uname) or an absolute path (/usr/bin/dcgmi), got {text!r}")
    return text


def check_word(value: Any) -> str:
    return parameters.text(value, max_length=MAX_ARG)


def check_pattern(value: Any) -> str:
    text = parameters.text(value, max_length=MAX_PATTERN)
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"is not a regular expression: {exc}") from None
    return text


# --- parameters -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pattern:
    name: str
    regex: re.Pattern[str]
    unit: str


def _args(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into words ({exc})") from None
    if not isinstance(value, list):
        raise ValueError("must be a list of arguments, or text of words")
    return [check_word(a) for a in value]


_PATTERN_LINE = re.compile(r"(?P<name>[^\s=\[]+)(?:\[(?P<unit>[^\]]*)\])?=(?P<regex>.+)")


def _pattern_lines(text: str) -> dict[str, dict[str, str]]:
    """Text, one pattern a line, ``NAME[UNIT]=REGEX`` (a campaign file's values are single values)."""
    found: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _PATTERN_LINE.fullmatch(line.strip())
        if not match:
            raise ValueError(
                f"each line must read NAME[UNIT]=REGEX, e.g. mem_total[KiB]=^MemTotal:\\s+(\\d+); got {line!r}"
            )
        found[match["name"]] = {"regex": match["regex"], "unit": match["unit"] or ""}
    return found


def _patterns(value: Any) -> list[_Pattern]:
    if isinstance(value, str):
        value = _pattern_lines(value)
    if not isinstance(value, dict) or len(value) > MAX_PATTERNS:
        raise ValueError(f'must map up to {MAX_PATTERNS} metric names to {{"regex": ..., "unit": ...}}')
    found = []
    for name, spec in value.items():
        if not isinstance(name, str) or not _METRIC.fullmatch(name) or name in RESERVED:
            raise ValueError(f"{name!r} is not a metric name (lower case, digits, _; not {', '.join(RESERVED)})")
        if not isinstance(spec, dict) or set(spec) - {"regex", "unit"} or "regex" not in spec:
            raise ValueError(f'{name}: must be {{"regex": ..., "unit": ...}}')
        regex = re.compile(check_pattern(spec["regex"]))
        if "value" not in regex.groupindex and regex.groups < 1:
            raise ValueError(f"{name}: the regex needs a group around the number (or a group named value)")
        unit = spec.get("unit", "")
        if not isinstance(unit, str) or not _UNIT.fullmatch(unit):
            raise ValueError(f"{name}: unit must be a short unit such as kB, ms, GB/s or % (got {unit!r})")
        found.append(_Pattern(name, regex, unit))
    return found


PARAMS: dict[str, tuple[parameters.Check, Any]] = {
    "command": (parameters.matching(r"[A-Za-z0-9_-]{1,64}", "the name of an allowed command"), None),  # a slug
    "args": (_args, []),
    "patterns": (_patterns, {}),
}


@dataclass(frozen=True)
class _Params:
    entry: AllowedProgram
    args: list[str]
    patterns: list[_Pattern]

    @property
    def argv(self) -> list[str]:
        return [*self.entry.argv, *self.args]


def params(raw: dict[str, Any]) -> _Params:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in PARAMS:
            raise ParamError(str(key), f"unknown command parameter (known: {', '.join(PARAMS)})")
        values[key] = parameters.checked(key, PARAMS[key][0], value)
    merged = {key: values.get(key, default) for key, (_, default) in PARAMS.items()}
    if merged["command"] is None:
        raise ParamError("command", f"name the allowed command to run ({_allowed_names()})")
    entry = _lookup(merged["command"])
    if entry is None:
        raise ParamError("command", f"{merged['command']!r} is not on the allow-list ({_allowed_names()})")
    args = merged["args"]
    if len(args) > entry.max_args:
        raise ParamError("args", f"{entry.name} takes at most {entry.max_args} further arguments, got {len(args)}")
    for arg in args:
        if not entry.arg_pattern or not re.fullmatch(entry.arg_pattern, arg):
            raise ParamError("args", f"{arg!r} is not an argument {entry.name} allows ({entry.arg_pattern or 'none'})")
    return _Params(entry, args, merged["patterns"])


def _allowed_names() -> str:
    names = _names()
    return "allowed: " + ", ".join(names) if names else "the allow-list is empty: an admin adds commands to it"


@register
class Command(Benchmark):
    kind = "command"
    description = "a command from the admins' allow-list on every host: passes on exit 0, metrics from patterns"
    metrics = (MetricSpec("passed", "count", True, "1 for a host whose command exited 0"),)
    required_metrics = ("passed",)
    headline = ("passed",)

    def validate(self, params_: dict[str, Any]) -> None:
        params(params_)

    def build(self, params_: dict[str, Any], host: HostContext) -> HostCommand:
        p = params(params_)
        plan = {
            "argv": p.argv,
            "patterns": {pt.name: {"regex": pt.regex.pattern, "unit": pt.unit} for pt in p.patterns},
        }
        return HostCommand(
            argv=["python3", HELPER, PLAN],
            files={HELPER: HELPER_SCRIPT, PLAN: json.dumps(plan, indent=1) + "\n"},
            env=dict(host.env),
        )

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """``passed`` and the declared patterns' numbers, from the helper's last line (printed after the program
        ended, so the program's own output cannot stand in for it)."""
        lines = [line for line in text.splitlines() if line.startswith(HEADER)]
        if not lines:
            raise ParseError("the command helper printed no result line (it was stopped before the program ended)")
        try:
            result = json.loads(lines[-1][len(HEADER) :])
            values, unmatched, units = result["values"], result["unmatched"], result.get("units", {})
        except (ValueError, KeyError, TypeError):
            raise ParseError(f"unreadable command result line: {lines[-1][:200]!r}") from None
        if unmatched:
            raise ParseError(f"declared pattern(s) matched no line of the output: {', '.join(map(str, unmatched))}")
        metrics = [Metric(name="passed", value=1.0, unit="count", host=host)]
        for name, value in sorted(values.items()):
            metrics.append(Metric(name=str(name), value=float(value), unit=str(units.get(name, "")), host=host))
        return metrics
