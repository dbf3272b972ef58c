"""The parameter validators every plug-in uses, so that one YAML value means one thing everywhere.

A check takes the value as the campaign file gives it and returns it normalised, or raises ``ValueError`` with the
reason (``checked`` turns that into a ``ParamError`` naming the field). The rules, the same in every plug-in:

- **integer**: a YAML integer, or text of decimal digits with an optional sign (``20`` and ``"20"`` are 20).
  Never a boolean, never a fraction (``2.0`` is refused: write ``2``).
- **number**: a YAML integer or float, or text that reads as one (``"0.5"``); never a boolean, never inf/nan.
- **boolean**: YAML ``true``/``false``, the text ``"true"``/``"false"`` (as the builder's forms send them), or an
  integer by the rule above that is 1 or 0 (as fio job files and C tools write them: ``direct: 1``). Nothing
  else: not ``"yes"``, not ``"TRUE"``, not ``2``. The plug-in writes the tool's own spelling.
- **choice**: text, one of the listed values, case as listed; an integer is read as its decimal text.
- **size**: bytes, a YAML integer or digits with an optional unit suffix, binary units (``4k`` is 4096 bytes,
  ``1M`` 1048576) in every plug-in; the suffixes a tool reads are its own to list, the meaning is not.
- **duration**: seconds, a YAML integer or digits with an optional unit suffix (``30``, ``30s``, ``500ms``,
  ``2m``); the units a tool reads are its own to list.
- **matching** / **text**: non-empty text without control characters; an integer is read as its decimal text.

This module is Django-free and imports only ``common.errors``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from common.errors import ParamError

Check = Callable[[Any], Any]  # returns the normalised value; raises ValueError with the reason

MAX_TEXT = 1024
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
_NUMBER = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
SIZE_FACTORS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
DURATION_FACTORS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def checked(field: str, check: Check, value: Any) -> Any:
    """``check(value)``, its ValueError as a ParamError naming ``field``."""
    try:
        return check(value)
    except ValueError as exc:
        raise ParamError(field, str(exc)) from None


def text(value: Any, *, max_length: int = MAX_TEXT) -> str:
    """Non-empty text of at most ``max_length`` characters without control characters; an integer as its digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be non-empty text, got {value!r}")
    if len(value) > max_length:
        raise ValueError(f"must be at most {max_length} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must not contain control characters (newline, carriage return, NUL, ...)")
    return value


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        return int(value)
    return None


def integer(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        number = _whole(value)
        if number is None or not low <= number <= high:
            raise ValueError(f"must be a whole number from {low} to {high}, got {value!r}")
        return number

    return check


def number(low: float, high: float) -> Check:
    def check(value: Any) -> int | float:
        found: int | float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found = value
        elif isinstance(value, str) and _NUMBER.fullmatch(value):
            found = float(value) if _whole(value) is None else int(value)
        if found is None or not math.isfinite(found):
            raise ValueError(f"must be a number, got {value!r}")
        if not low <= found <= high:
            raise ValueError(f"must be from {low:g} to {high:g}, got {value!r}")
        return found

    return check


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    if _whole(value) in (0, 1):
        return _whole(value) == 1
    raise ValueError(f"must be true or false, got {value!r}")


def choice(*allowed: str) -> Check:
    def check(value: Any) -> str:
        found = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(found, str) or found not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}; got {value!r}")
        return found

    return check


def matching(pattern: str, expected: str, *, flags: int = 0, max_length: int = MAX_TEXT) -> Check:
    regex = re.compile(pattern, flags)

    def check(value: Any) -> str:
        found = text(value, max_length=max_length)
        if not regex.fullmatch(found):
            raise ValueError(f"must be {expected}, got {found!r}")
        return found

    return check


def _size_regex(units: str, iec: bool) -> re.Pattern[str]:
    suffix = f"[{units}]" + ("(i?b)?" if iec else "")
    return re.compile(rf"([0-9]{{1,18}})({suffix})?", re.IGNORECASE)


def size_bytes(value: str | int) -> int:
    """The bytes a size checked by ``size`` stands for (binary units: 4k = 4096)."""
    match = re.fullmatch(r"([0-9]+)([kmgtp]?)(i?b)?", str(value), re.IGNORECASE)
    if not match:
        raise ValueError(f"{value!r} is not a size")
    return int(match.group(1)) * SIZE_FACTORS[match.group(2).lower()]


def size(low: int = 1, high: int = 2**50, *, units: str = "kmgt", iec: bool = False) -> Check:
    """Bytes: an integer, or digits and one of ``units`` (k, m, g, t, p; either case; ``iec`` also reads the
    ``KiB``/``KB`` spellings). Binary units everywhere. Returns the text as given (an integer as its digits)."""
    regex = _size_regex(units, iec)
    spelled = ", ".join(f"{u}" for u in units)

    def check(value: Any) -> str:
        found = text(value, max_length=64)
        if not regex.fullmatch(found):
            raise ValueError(f"must be a size in bytes, digits with an optional unit ({spelled}), got {value!r}")
        if not low <= size_bytes(found) <= high:
            raise ValueError(f"must be from {low} to {high} bytes, got {value!r}")
        return found

    return check


def duration_seconds(value: str | int) -> float:
    """The seconds a duration checked by ``duration`` stands for (bare digits are seconds)."""
    match = re.fullmatch(r"([0-9]+)(us|ms|s|m|h|d)?", str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration")
    return int(match.group(1)) * DURATION_FACTORS[match.group(2) or "s"]


def duration(low: float = 0, high: float = 30 * 86400, *, units: tuple[str, ...] = ("s",)) -> Check:
    """Seconds: an integer, or digits and one of ``units`` (us, ms, s, m, h, d). Returns the text as given."""
    regex = re.compile(rf"[0-9]{{1,12}}({'|'.join(units)})?")

    def check(value: Any) -> str:
        found = text(value, max_length=32)
        if not regex.fullmatch(found):
            raise ValueError(f"must be a duration in seconds, digits with an optional unit ({', '.join(units)})")
        if not low <= duration_seconds(found) <= high:
            raise ValueError(f"must be from {low:g} to {high:g} seconds, got {value!r}")
        return found

    return check
