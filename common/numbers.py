"""The one formatter of measured numbers: every table, chart axis, tooltip and the CLI show values through it.

A value comes with the unit its plug-in or sampler stored it in (``B/s``, ``ns``, ``MiB/s``, ``bit/s``, ``img/s``
...). The unit names a *family* (byte rate, bit rate, size, time, frequency, power, rate of things, count...), and
the value is shown in that family's best prefix with 3-4 significant digits:

    quantity(2142590765.33, "B/s")              -> "2.14 GB/s"
    quantity(2142590765.33, "B/s", network=True) -> "17.1 Gbit/s"   (network bit rates are read in bits)
    quantity(7711402.67, "ns")                  -> "7.71 ms"
    quantity(3193602842.5, "bit/s")             -> "3.19 Gbit/s"
    quantity(2912.4, "img/s")                   -> "2,912 img/s"
    quantity(1234567, "IOPS")                   -> "1.23M IOPS"

Byte rates and sizes named in decimal units (B/s, MB/s, GB/s, kB) stay decimal (SI); those named in binary units
(MiB/s, MiB, and memory sizes in plain ``B``) stay binary (IEC), so a number is never silently converted between
the two. Exact values stay in the API and the exports; pages show ``raw()`` on hover. No Django here: the CLI and
the charts use the same functions.
"""

from __future__ import annotations

import math
import re
from typing import Any

DASH = "—"

# unit as stored -> (family, factor to the family's base unit)
_UNITS: dict[str, tuple[str, float]] = {
    # byte rates, decimal
    "B/s": ("byte_rate", 1.0), "bytes/s": ("byte_rate", 1.0), "kB/s": ("byte_rate", 1e3), "KB/s": ("byte_rate", 1e3),
    "MB/s": ("byte_rate", 1e6), "GB/s": ("byte_rate", 1e9), "TB/s": ("byte_rate", 1e12),
    # byte rates, binary
    "KiB/s": ("byte_rate_iec", 1024.0), "MiB/s": ("byte_rate_iec", 1024.0**2), "GiB/s": ("byte_rate_iec", 1024.0**3),
    # bit rates
    "bit/s": ("bit_rate", 1.0), "bits/s": ("bit_rate", 1.0), "bps": ("bit_rate", 1.0),
    "kbit/s": ("bit_rate", 1e3), "Mbit/s": ("bit_rate", 1e6), "Mb/s": ("bit_rate", 1e6), "Mbps": ("bit_rate", 1e6),
    "Gbit/s": ("bit_rate", 1e9), "Gb/s": ("bit_rate", 1e9), "Gbps": ("bit_rate", 1e9),
    # sizes: plain bytes (memory, files) and binary multiples in IEC, decimal multiples in SI
    "B": ("bytes_iec", 1.0), "bytes": ("bytes_iec", 1.0), "KiB": ("bytes_iec", 1024.0),
    "MiB": ("bytes_iec", 1024.0**2), "GiB": ("bytes_iec", 1024.0**3), "TiB": ("bytes_iec", 1024.0**4),
    "kB": ("bytes_si", 1e3), "KB": ("bytes_si", 1e3), "MB": ("bytes_si", 1e6), "GB": ("bytes_si", 1e9),
    "TB": ("bytes_si", 1e12),
    # time
    "ns": ("time", 1e-9), "us": ("time", 1e-6), "µs": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0),
    "min": ("time", 60.0), "h": ("time", 3600.0),
    # physical
    "Hz": ("frequency", 1.0), "kHz": ("frequency", 1e3), "MHz": ("frequency", 1e6), "GHz": ("frequency", 1e9),
    "W": ("power", 1.0), "kW": ("power", 1e3),
    "%": ("percent", 1.0),
    "C": ("celsius", 1.0), "°C": ("celsius", 1.0),
}  # fmt: skip

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_IEC = ((1024.0**4, "Ti"), (1024.0**3, "Gi"), (1024.0**2, "Mi"), (1024.0, "Ki"), (1.0, ""))
# family -> (prefixes, unit after the prefix)
_PREFIXED = {
    "byte_rate": (_SI, "B/s"),
    "byte_rate_iec": (_IEC, "B/s"),
    "bit_rate": (_SI, "bit/s"),
    "bytes_iec": (_IEC, "B"),
    "bytes_si": (_SI, "B"),
    "frequency": (_SI, "Hz"),
    "power": (_SI, "W"),
}
# time: (seconds at or above which this unit is used, unit, seconds per unit), largest first
_TIME = ((7200.0, "h", 3600.0), (600.0, "min", 60.0), (1.0, "s", 1.0), (1e-3, "ms", 1e-3), (1e-6, "µs", 1e-6),
         (0.0, "ns", 1e-9))  # fmt: skip
# a unit with no prefix family whose values are counts of things (shown as integers when they are whole)
_COUNTS = {"", "count", "elements", "ranks", "nodes", "results", "samples", "epochs", "packets", "gpus", "GPUs"}
_NETWORK_PREFIXES = ("net.", "rdma.", "network", "nic", "throughput_bps", "ib.")


def is_network(name: str) -> bool:
    """Whether a metric or telemetry series of this name is a network transfer (its byte rate is shown in bits)."""
    return name.startswith(_NETWORK_PREFIXES)


def family(unit: str) -> str:
    """The unit family of ``unit``: byte_rate, bit_rate, bytes_iec, time, percent, rate (of things), count..."""
    if unit in _UNITS:
        return _UNITS[unit][0]
    if unit.endswith("/s") or unit == "IOPS":
        return "rate"
    return "count" if unit in _COUNTS else "other"


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, fixed point (never an exponent), thousands separated."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = digits - 1 - magnitude
    if decimals <= 0:
        return f"{value:,.0f}"
    text = f"{value:,.{decimals}f}"
    # rounding can add a digit (9.996 -> "10.00"): say it with the right number of digits. Only a value whose kept
    # digits are all nines carries (at least 9.5 x 10^magnitude): the text is counted for those only.
    if (
        abs(value) >= 9 * 10.0**magnitude
        and len(text.replace(",", "").replace("-", "").replace(".", "").lstrip("0")) > digits
    ):
        text = f"{value:,.{decimals - 1}f}"
    return text


def _prefixed(base: float, prefixes: tuple[tuple[float, str], ...], suffix: str) -> tuple[str, str]:
    step = prefixes[-2][0]  # 1000 or 1024
    for factor, prefix in prefixes:
        if abs(base) >= factor or factor == 1.0:
            mantissa = base / factor
            text = significant(mantissa)
            # 999.7 MB/s rounds to "1,000": one prefix up reads better ("1.00 GB/s"); only from 999.5 up
            if abs(mantissa) >= 999 and abs(float(text.replace(",", ""))) >= step and factor != prefixes[0][0]:
                index = [f for f, _ in prefixes].index(factor)
                factor, prefix = prefixes[index - 1]
                text = significant(base / factor)
            return text, prefix + suffix
    raise AssertionError("unreachable: the last prefix has factor 1")


def _time(seconds: float) -> tuple[str, str]:
    if seconds == 0:
        return "0", "s"
    size = abs(seconds)
    for i, (floor, unit, per) in enumerate(_TIME):
        if size >= floor:
            text = significant(seconds / per)
            if unit in ("ns", "µs", "ms") and size / per >= 999 and abs(float(text.replace(",", ""))) >= 1000:
                # 999.7 µs -> "1.00 ms"
                _, unit, per = _TIME[i - 1]
                text = significant(seconds / per)
            return text, unit
    raise AssertionError("unreachable: the last time unit has floor 0")


def _counted(value: float, suffix: str) -> tuple[str, str]:
    """Things and rates of things: up to 9,999 in plain digits (whole counts exact), then k, M, G."""
    suffix = "" if suffix == "count" else suffix
    if abs(value) < 9_999.5:
        if float(value).is_integer():
            return f"{int(value):,}", suffix
        return significant(value, 4 if abs(value) >= 1000 else 3), suffix
    for factor, prefix in _SI:
        if abs(value) >= factor:
            text = significant(value / factor)
            if abs(value) / factor >= 999 and abs(float(text.replace(",", ""))) >= 1000 and factor != _SI[0][0]:
                factor, prefix = _SI[[f for f, _ in _SI].index(factor) - 1]
                text = significant(value / factor)
            return text + prefix, suffix
    raise AssertionError("unreachable")


def split(value: Any, unit: str = "", *, network: bool = False) -> tuple[str, str]:
    """``value`` (in ``unit``) as (number text, display unit); (DASH, "") for nothing or a non-number."""
    if value is None or isinstance(value, bool) or value == "":
        return DASH, ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value), unit
    if not math.isfinite(number):
        return DASH, ""
    unit = unit or ""
    kind = family(unit)
    if kind in ("byte_rate", "byte_rate_iec") and network:
        number, kind = number * _UNITS[unit][1] * 8, "bit_rate"
        unit = "bit/s"
    if kind in _PREFIXED:
        prefixes, suffix = _PREFIXED[kind]
        return _prefixed(number * _UNITS[unit][1], prefixes, suffix)
    if kind == "time":
        return _time(number * _UNITS[unit][1])
    if kind == "percent":
        return significant(number), "%"
    if kind == "celsius":
        return significant(number), "°C"
    if kind in ("rate", "count"):
        return _counted(number, unit)
    return _counted(number, unit) if float(number).is_integer() else (significant(number, 4), unit)


def quantity(value: Any, unit: str = "", *, network: bool = False) -> str:
    """``value`` (in ``unit``) as one readable text: "2.14 GB/s", "7.71 ms", "1.23M IOPS", "—" for nothing."""
    text, shown = split(value, unit, network=network)
    if not shown:
        return text
    return f"{text}{shown}" if shown == "%" else f"{text} {shown}"


def plain(value: Any) -> str:
    """A number with no unit: whole numbers exact with thousands separators, others with 4 significant digits."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if float(value).is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        return significant(value, 4)
    return quantity(value, "")


def raw(value: Any, unit: str = "") -> str:
    """The exact stored value and unit, for a tooltip: "2142590765.33 B/s"."""
    if value is None or isinstance(value, bool) or value == "":
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value} {unit}".strip()


def axis(values: list[float] | tuple[float, ...], unit: str, *, network: bool = False) -> tuple[float, str]:
    """One scale for a chart axis of these values: (divisor, display unit) so that every tick reads in the same
    unit as the largest value does ("GB/s" for 0.5-2.1e9 B/s); ticks are then ``significant(v / divisor)``."""
    finite = [abs(float(v)) for v in values if v is not None and math.isfinite(float(v))]
    top = max(finite, default=0.0)
    kind = family(unit)
    if kind in ("byte_rate", "byte_rate_iec") and network:
        factor, kind = 1 / (8 * _UNITS[unit][1]), "bit_rate"  # stored bytes, shown as bits
        top *= 8 * _UNITS[unit][1]
    elif unit in _UNITS:
        factor = 1 / _UNITS[unit][1]
        top *= _UNITS[unit][1]
    else:
        factor = 1.0
    if kind in _PREFIXED:
        prefixes, suffix = _PREFIXED[kind]
        for size, prefix in prefixes:
            if top >= size or size == 1.0:
                return size * factor, prefix + suffix
    if kind == "time":
        for floor, shown, per in _TIME:
            if top >= floor:
                return per * factor, shown
    if kind == "percent":
        return 1.0, "%"
    if kind == "celsius":
        return 1.0, "°C"
    if kind in ("rate", "count") and top >= 10_000:
        for size, prefix in _SI:
            if top >= size:
                return size, f"{prefix} {unit}".strip() if unit else prefix
    return 1.0, unit


def tick(value: float, divisor: float) -> str:
    """An axis tick scaled by ``axis``'s divisor: at most 3 significant digits, no exponent, no trailing zeros
    (ticks are round numbers: "0.5", "1", "1.5")."""
    return _trimmed(significant(value / divisor)) if value else "0"


def tick_text(value: float, unit: str = "") -> str:
    """An axis tick that carries its own unit (an x axis of counts or byte sizes): "16", "1.5k", "64 KiB"."""
    text, shown = split(value, unit)
    text = _trimmed(text)
    return f"{text} {shown}" if shown else text


def _trimmed(text: str) -> str:
    """ "2.50" -> "2.5", "1.00k" -> "1k": the zeros a round tick value does not need."""
    match = re.match(r"^(-?[\d,]+)(?:\.(\d*))?(\D*)$", text)
    if not match:
        return text
    decimals = (match.group(2) or "").rstrip("0")
    return match.group(1) + (f".{decimals}" if decimals else "") + match.group(3)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_FACTOR = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def sort_key(value: Any) -> tuple[int, Any]:
    """Order parameter values as a reader expects: numbers and sizes by magnitude (1, 4, 16; 4k, 64k, 1m), then
    text with its digit runs compared as numbers ("rank2" before "rank10"), then anything else."""
    if isinstance(value, bool):
        return (2, str(value))
    if isinstance(value, int | float):
        return (0, float(value))
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            return (0, float(match.group(1)) * _SIZE_FACTOR[match.group(2).lower()])
        parts = re.split(r"(\d+)", value)
        return (1, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p))
    return (2, str(value))


def params_sort_key(params: dict[str, Any]) -> tuple[Any, ...]:
    """A matrix point's parameters in key order, each by ``sort_key``."""
    return tuple((key, sort_key(params[key])) for key in sorted(params))
