"""The byte format of one chunk of a series: timestamps and values, compressed with numpy and zlib.

Why this format (issue 5: at most 4 bytes per counter sample on disk, a million samples a second in):

- Timestamps (int64 ns) are stored as their intervals less the chunk's median interval: a sampler that keeps its
  cadence gives zeros, a jittery one small numbers. (Delta-of-delta, the usual choice, measured larger: it
  differences the jitter twice, tripling its variance.) A common divisor is divided out first, so timestamps
  read at microsecond resolution cost no more than microseconds.
- Integer values (counters; gauges whose values are all integers, e.g. bytes of memory) are stored as deltas:
  a monotonic byte counter's deltas are the bytes moved per interval, small next to the counter itself. Counter
  resets and wraps are just negative deltas; int64 arithmetic wraps modulo 2**64 both ways, so the round trip is
  exact for every int64 sequence.
- Float values are stored as the XOR of each value's bits with the previous one's (Gorilla's idea): slowly moving
  gauges share sign, exponent and high mantissa bits, which XOR to zero bytes. Exact for every float64, bit for bit.
  With a ``precision`` (e.g. 0.01 for a percentage) floats are quantized to multiples of it and stored as
  integers instead: lossy by at most precision/2, and far smaller.
- Each integer stream is zigzag-encoded (small negatives become small positives), cut to the bytes its largest
  number needs, laid out plain or byte-shuffled (all low bytes, then all next bytes, ...), whichever zlib
  compresses better on a probe, and compressed with zlib at level 1. Shuffling wins for noisy numbers (jitter,
  floats: high bytes become runs of zeros); plain wins for numbers that repeat whole (deltas of a byte counter
  that are sums of a few packet sizes). lzma, bz2 and higher zlib levels were measured: up to a third smaller on
  counters, but 4 to 20 times the CPU time, which the ingest target (a million samples a second) cannot pay.

Layout (little-endian): a fixed header (counts, first timestamp and value, ...), then the timestamp stream, then
the value stream; a stream is ``base, divisor, byte width, layout, payload length`` and the zlib payload.

A chunk also carries the sample just before it (``prev``), when there is one, so that a counter's rate over the
interval that ends at the chunk's first sample can be computed from this chunk alone.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

VERSION = 1
ZLIB_LEVEL = 1
PROBE = 4096  # numbers compressed both ways to choose a stream's byte layout

# How values are stored (header byte 1).
INT_DELTA = 0  # int64 deltas, exact
FLOAT_XOR = 1  # float64 bits XOR the previous value's bits, exact
SCALED = 2  # round(value / precision) as INT_DELTA; decodes to floats

# Header flags (header byte 2).
FLOAT_OUT = 1  # values decode to float64 (INT_DELTA values that were given as integral floats, SCALED)
HAS_PREV = 2

# Stream layouts.
SHUFFLED = 0  # all first bytes, then all second bytes, ...
PLAIN = 1  # each number's bytes together

# version, encoding, flags, count, first timestamp, first value's bits, prev timestamp, prev value's bits, precision
_HEADER = struct.Struct("<BBBxIqqqqd")
_STREAM = struct.Struct("<qqBBxxI")  # base, divisor, byte width, layout, payload length
_INT64_MAX_FLOAT = 2.0**63

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Values = npt.NDArray[np.int64] | npt.NDArray[np.float64]


@dataclass(frozen=True)
class Decoded:
    timestamps_ns: IntArray
    values: Values
    prev_t_ns: int | None
    prev_value: int | float | None


def _zigzag(a: IntArray) -> npt.NDArray[np.uint64]:
    return ((a << 1) ^ (a >> 63)).view(np.uint64)


def _unzigzag(u: npt.NDArray[np.uint64]) -> IntArray:
    return ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)


def _divisor(a: IntArray) -> int:
    """The greatest common divisor of ``a``, when dividing by it is exact (1 otherwise, and for all zeros)."""
    if a.size == 0:
        return 1
    g = int(np.gcd.reduce(a))
    # np.gcd of INT64_MIN overflows: check instead of trusting it.
    if g <= 1 or not np.array_equal((a // g) * g, a):
        return 1
    return g


def _compressed(rows: npt.NDArray[np.uint8]) -> tuple[int, bytes]:
    """(layout, payload) for numbers as rows of bytes, in whichever layout zlib compresses better.

    Shuffled wins for noisy numbers of varied magnitude (jittery timestamps, floats); plain wins for numbers that
    repeat whole (a counter's deltas that are sums of a few packet sizes). A long stream is judged on its start.
    """
    probe = rows[:PROBE] if len(rows) > 4 * PROBE else rows
    plain = zlib.compress(probe.tobytes(), ZLIB_LEVEL)  # tobytes() lays out in C order: .T gives the shuffle
    shuffled = zlib.compress(probe.T.tobytes(), ZLIB_LEVEL)
    if probe is rows:
        return (PLAIN, plain) if len(plain) < len(shuffled) else (SHUFFLED, shuffled)
    if len(plain) < len(shuffled):
        return PLAIN, zlib.compress(rows.tobytes(), ZLIB_LEVEL)
    return SHUFFLED, zlib.compress(rows.T.tobytes(), ZLIB_LEVEL)


def _pack(a: IntArray, *, base: int = 0, zigzag: bool = True) -> bytes:
    """One stream of int64: ``(a - base) / divisor``, zigzagged, cut to its bytes, laid out and compressed."""
    if zigzag:
        rest = a - np.int64(base) if base else a
        divisor = _divisor(rest)
        u = _zigzag(rest // divisor if divisor > 1 else rest)
    else:
        base, divisor, u = 0, 1, a.view(np.uint64)
    width = (int(u.max()).bit_length() + 7) // 8 if u.size else 0
    layout, payload = PLAIN, b""
    if width:
        layout, payload = _compressed(u.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8)[:, :width])
    return _STREAM.pack(base, divisor, width, layout, len(payload)) + payload


def _unpack(blob: memoryview, offset: int, count: int, *, zigzag: bool = True) -> tuple[IntArray, int]:
    """The inverse of ``_pack`` for a stream of ``count`` numbers at ``offset``; returns it and the next offset."""
    base, divisor, width, layout, length = _STREAM.unpack_from(blob, offset)
    offset += _STREAM.size
    rows = np.zeros((count, 8), dtype=np.uint8)
    if width:
        data = np.frombuffer(zlib.decompress(blob[offset : offset + length]), dtype=np.uint8)
        rows[:, :width] = data.reshape(count, width) if layout == PLAIN else data.reshape(width, count).T
    u = rows.view("<u8").reshape(count).astype(np.uint64, copy=False)
    if not zigzag:
        return u.view(np.int64), offset + length
    a = _unzigzag(u)
    if divisor > 1:
        a *= divisor
    if base:
        a += np.int64(base)
    return a, offset + length


def _undelta(first: int, deltas: IntArray) -> IntArray:
    out = np.empty(len(deltas) + 1, dtype=np.int64)
    out[0] = first
    np.cumsum(deltas, out=out[1:])
    out[1:] += np.int64(first)
    return out


def _as_integers(values: npt.NDArray[np.generic]) -> IntArray | None:
    """``values`` as int64 when that is exact (integers, or floats that are all integral and in range)."""
    if values.dtype.kind in "iub":
        return values.astype(np.int64, copy=False)
    floats = values.astype(np.float64, copy=False)
    if floats.size and (
        not np.array_equal(floats, np.rint(floats))
        or np.abs(floats).max() >= _INT64_MAX_FLOAT
        or np.signbit(floats[floats == 0]).any()
    ):
        return None
    return floats.astype(np.int64)


def encode(
    timestamps_ns: IntArray,
    values: npt.NDArray[np.generic],
    *,
    prev: tuple[int, int | float] | None = None,
    precision: float | None = None,
) -> bytes:
    """Encode one chunk of int64 timestamps and int64 or float64 values (of equal length, possibly empty).

    Integer values, and floats that are all integral, round-trip exactly (as int64 / float64 respectively).
    Other floats round-trip exactly, bit for bit, unless ``precision`` is given: then to within precision/2.
    ``prev`` is the sample just before this chunk, kept for counter rates (see ``counter_rates``).
    """
    count = len(timestamps_ns)
    if len(values) != count:
        raise ValueError(f"{count} timestamps but {len(values)} values")
    integers = _as_integers(values)
    scale = 0.0
    if integers is not None:
        encoding = INT_DELTA
    elif precision:
        encoding, scale = SCALED, float(precision)
        integers = np.rint(values.astype(np.float64) / scale).astype(np.int64)
    else:
        encoding = FLOAT_XOR
        integers = values.astype(np.float64).view(np.int64)
    float_out = encoding != INT_DELTA or values.dtype.kind not in "iub"
    flags = FLOAT_OUT if float_out else 0
    prev_t, prev_bits = 0, 0
    if prev is not None:
        flags |= HAS_PREV
        prev_t = int(prev[0])
        prev_bits = int(np.array(prev[1], dtype=np.float64 if float_out else np.int64).view(np.int64))
    t_first = int(timestamps_ns[0]) if count else 0
    v_first = int(integers[0]) if count else 0
    header = _HEADER.pack(VERSION, encoding, flags, count, t_first, v_first, prev_t, prev_bits, scale)
    # Timestamps: their intervals less the usual one (zero, or a sampler's jitter).
    intervals = _diff(timestamps_ns.astype(np.int64, copy=False))
    usual = int(np.partition(intervals, len(intervals) // 2)[len(intervals) // 2]) if intervals.size else 0
    if encoding == FLOAT_XOR:
        return header + _pack(intervals, base=usual) + _pack(integers[1:] ^ integers[:-1], zigzag=False)
    return header + _pack(intervals, base=usual) + _pack(_diff(integers))


def _diff(a: IntArray) -> IntArray:
    return a[1:] - a[:-1]


def decode(data: bytes | memoryview) -> Decoded:
    blob = memoryview(data)
    version, encoding, flags, count, t_first, v_first, prev_t, prev_bits, scale = _HEADER.unpack_from(blob, 0)
    if version != VERSION:
        raise ValueError(f"unknown telemetry chunk version {version}")
    if count == 0:
        empty: Values = np.empty(0, dtype=np.float64) if flags & FLOAT_OUT else np.empty(0, dtype=np.int64)
        return Decoded(np.empty(0, dtype=np.int64), empty, None, None)
    intervals, offset = _unpack(blob, _HEADER.size, count - 1)
    timestamps = _undelta(t_first, intervals)
    values: Values
    if encoding == FLOAT_XOR:
        xored, _ = _unpack(blob, offset, count - 1, zigzag=False)
        bits = np.empty(count, dtype=np.int64)
        bits[0] = v_first
        bits[1:] = xored
        values = np.bitwise_xor.accumulate(bits).view(np.float64)
    else:
        integers = _undelta(v_first, _unpack(blob, offset, count - 1)[0])
        if encoding == SCALED:
            values = integers * scale
        elif flags & FLOAT_OUT:
            values = integers.astype(np.float64)
        else:
            values = integers
    prev_value: int | float | None = None
    if flags & HAS_PREV:
        prev_value = float(np.int64(prev_bits).view(np.float64)) if flags & FLOAT_OUT else prev_bits
    return Decoded(timestamps, values, prev_t if flags & HAS_PREV else None, prev_value)


def counter_increments(values: Values, prev_value: int | float | None) -> Values:
    """What a counter counted over each interval (one per sample after ``prev_value``, or after the first).

    A decrease is read as a reset to zero (a reboot, a driver reload, a 32-bit counter wrapping): the increase is
    then the new value itself, as Prometheus does. Wraps are not unwrapped: the width is not known here.
    """
    if prev_value is not None:
        values = np.concatenate((np.array([prev_value], dtype=values.dtype), values))  # type: ignore[assignment]
    increments = values[1:] - values[:-1]
    reset = increments < 0
    if reset.any():
        increments[reset] = values[1:][reset]
    return increments


def counter_rates(decoded: Decoded) -> tuple[IntArray, FloatArray, Values]:
    """A counter chunk as rates per second: (timestamps each rate ends at, rates, increments)."""
    t = decoded.timestamps_ns
    increments = counter_increments(decoded.values, decoded.prev_value)
    if decoded.prev_t_ns is not None:
        dt = np.diff(t, prepend=np.int64(decoded.prev_t_ns))
        ends = t
    else:
        dt = np.diff(t)
        ends = t[1:]
    return ends, increments * (1e9 / dt), increments
