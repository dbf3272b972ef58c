"""Reading the analysis pages' and the compare API's GET parameters. A bad value becomes a ``Problem``: a message on
the page, a 400 in the API; never a traceback.

Sets to compare come in the order written, whatever their kind (the first one is the reference): ``campaign=ID`` (a
whole campaign), ``point=CAMPAIGN:POINT`` (one matrix point of it), ``run=ID`` (one run). Each key may be repeated
or plural with comma-separated values (``campaigns=1,2``, ``runs=10,11``, ``points=1:0,2:0``, the API's spelling).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.http import QueryDict

from campaigns import verdicts

MAX_SETS = 12
PICK_KEYS = {"campaign": "campaign", "campaigns": "campaign", "point": "point", "points": "point", "run": "run",
             "runs": "run"}  # fmt: skip
POLICY_KEYS = {"threshold": "threshold_pct", "threshold_pct": "threshold_pct", "alpha": "alpha"}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


@dataclass(frozen=True)
class Pick:
    kind: str  # campaign, point or run
    id: int  # the campaign's id (campaign, point) or the run's id (run)
    point: int | None = None


@dataclass(frozen=True)
class Problem:
    """A parameter that is not what it should be: ``field`` is the key as written, ``message`` says why."""

    field: str
    message: str

    def __str__(self) -> str:
        return self.message


def picks(query_string: str) -> tuple[list[Pick], list[Problem]]:
    """The sets asked for, in the order of the query string (which a QueryDict loses across keys), without
    duplicates, and a problem per value that is not one."""
    found: list[Pick] = []
    problems: list[Problem] = []
    for key, raw in parse_qsl(query_string, keep_blank_values=False):
        kind = PICK_KEYS.get(key)
        if kind is None:
            continue
        for value in filter(None, (part.strip() for part in raw.split(","))):
            pick = _pick(kind, value)
            if pick is None:
                shape = "CAMPAIGN:POINT, two whole numbers such as 3:5" if kind == "point" else "a whole number"
                problems.append(Problem(key, f"{key}={value!r} is not {shape}"))
            elif pick not in found:
                found.append(pick)
    if len(found) > MAX_SETS:  # the page goes on with the first ones, the API refuses
        problems.append(Problem("campaigns", f"at most {MAX_SETS} sets can be compared at once, got {len(found)}"))
        found = found[:MAX_SETS]
    return found, problems


def _pick(kind: str, value: str) -> Pick | None:
    if kind == "point":
        match = re.fullmatch(r"([0-9]{1,12}):([0-9]{1,9})", value)
        return Pick("point", int(match.group(1)), int(match.group(2))) if match else None
    return Pick(kind, int(value)) if re.fullmatch(r"[0-9]{1,12}", value) else None


def ids(query: QueryDict, key: str) -> tuple[list[int], list[str]]:
    """Whole-number ids under ``key`` (repeated, or comma-separated), without duplicates, in order."""
    out: list[int] = []
    errors = []
    for raw in query.getlist(key):
        for part in filter(None, (p.strip() for p in raw.split(","))):
            if not re.fullmatch(r"[0-9]{1,12}", part):
                errors.append(f"{key}={part!r} is not a whole number (an id)")
            elif int(part) not in out:
                out.append(int(part))
    return out, errors


def positive_number(query: QueryDict, key: str, what: str, errors: list[str]) -> float | None:
    """A positive number (sizes may say 115k or 1MiB); None when absent; a message when it is not one."""
    raw = query.get(key, "").strip()
    if not raw:
        return None
    value = parse_size(raw)
    if value is None or not value > 0:
        errors.append(f"{what} must be a positive number, got {raw!r}")
        return None
    return value


def whole_number(query: QueryDict, key: str, what: str, errors: list[str], *, low: int, high: int) -> int | None:
    raw = query.get(key, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not low <= int(raw) <= high:
        errors.append(f"{what} must be a whole number from {low} to {high}, got {raw!r}")
        return None
    return int(raw)


def parse_size(value: Any) -> float | None:
    """A number as a matrix or a form holds it: 16, 2.5, "64k", "1024KiB", "1m" (k, m, g, t are binary)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    try:
        number = float(value)
    except ValueError:
        match = _SIZE.fullmatch(value)
        if not match:
            return None
        return float(match.group(1)) * _SIZE_FACTORS[match.group(2).lower()]
    return number if math.isfinite(number) else None


def policy(query: QueryDict, problems: list[Problem]) -> verdicts.Policy:
    """The verdict policy of a comparison, built by ``Policy.from_mapping``: the default one, or the threshold
    (``threshold=5``, or the API's ``threshold_pct=5``) and ``alpha`` asked for. A bad value is a problem named
    after the key as written, and the default policy stands."""
    settings: dict[str, float] = {}
    written: dict[str, str] = {}
    for key, name in POLICY_KEYS.items():
        raw = query.get(key, "").strip()
        if not raw or name in settings:
            continue
        try:
            settings[name] = float(raw)
        except ValueError:
            problems.append(Problem(key, f"{key}: must be a number, got {raw!r}"))
            return verdicts.Policy()
        written[name] = key
    try:
        return verdicts.Policy.from_mapping(settings)
    except verdicts.PolicyError as exc:
        key = written.get(exc.field, exc.field)
        problems.append(Problem(key, f"{key}: {exc.message}"))
        return verdicts.Policy()


def statistic(query: QueryDict, problems: list[Problem]) -> str | None:
    """The statistic asked for (``statistic=median``, or the scaling page's ``stat=``); None when none was: the
    campaign's own then stands. A value other than mean or median is a problem named after its key."""
    for key in ("statistic", "stat"):
        raw = query.get(key, "").strip()
        if raw:
            if raw in verdicts.STATISTICS:
                return raw
            problems.append(Problem(key, f"{key}: must be one of {', '.join(verdicts.STATISTICS)}, got {raw!r}"))
            return None
    return None


def where(query: QueryDict, errors: list[str]) -> dict[str, str]:
    """``where=model=resnet50`` (repeatable): only points whose parameter has that value."""
    out = {}
    for raw in query.getlist("where"):
        if not raw.strip():  # the form's empty input for one more filter
            continue
        name, sep, value = raw.partition("=")
        if not sep or not name.strip():
            errors.append(f"where={raw!r} must be written NAME=VALUE, such as model=resnet50")
        else:
            out[name.strip()] = value.strip()
    return out
