"""Reading the analysis pages' GET parameters. A bad value becomes a message on the page, never a traceback.

Sets to compare come in the order written, whatever their kind (the first one is the reference):
``campaign=ID`` (a whole campaign), ``point=CAMPAIGN:POINT`` (one matrix point of it), ``run=ID`` (one run).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from django.http import HttpRequest, QueryDict

from campaigns import verdicts

MAX_SETS = 12
PICK_KINDS = ("campaign", "point", "run")
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)
_SIZE_FACTORS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


@dataclass(frozen=True)
class Pick:
    kind: str  # campaign, point or run
    id: int  # the campaign's id (campaign, point) or the run's id (run)
    point: int | None = None


def picks(request: HttpRequest) -> tuple[list[Pick], list[str]]:
    """The sets asked for, in the order of the query string, and a message per value that is not one."""
    found: list[Pick] = []
    errors: list[str] = []
    for key, value in parse_qsl(request.META.get("QUERY_STRING", ""), keep_blank_values=False):
        if key not in PICK_KINDS:
            continue
        pick = _pick(key, value.strip())
        if pick is None:
            shape = "CAMPAIGN:POINT, two whole numbers such as 3:5" if key == "point" else "a whole number"
            errors.append(f"{key}={value!r} is not {shape}")
        elif pick not in found:
            found.append(pick)
    if len(found) > MAX_SETS:
        errors.append(f"at most {MAX_SETS} sets can be compared at once; the first {MAX_SETS} are shown")
        found = found[:MAX_SETS]
    return found, errors


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
                errors.append(f"{key}={part!r} is not a whole number (a campaign id)")
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


def policy(query: QueryDict, errors: list[str]) -> verdicts.Policy:
    """The verdict policy of a comparison: the default one, or the threshold asked for (``threshold=5``)."""
    raw = query.get("threshold", "").strip()
    if not raw:
        return verdicts.Policy()
    try:
        return verdicts.Policy(threshold_pct=float(raw))
    except (ValueError, verdicts.PolicyError) as exc:
        errors.append(f"threshold: {getattr(exc, 'message', None) or 'must be a number ≥ 0 (a percentage)'}")
        return verdicts.Policy()


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
