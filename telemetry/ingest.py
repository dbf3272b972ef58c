"""Storing what samplers and storage statistics loops recorded: their frames decoded with numpy and appended as
series of the run (services.series_append, in batches of whole chunks), replacing an earlier collection's.

No SSH here: runners/samplers.py fetches the files and hands their bytes over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from campaigns.models import Run
from plugins.tools import isi_statistics
from plugins.tools import sampler as tool
from telemetry.models import Series, SeriesKind, SeriesSource
from telemetry.services import CHUNK_SAMPLES, series_append

BATCH_ROWS = 16 * CHUNK_SAMPLES  # rows per series_append: whole chunks


def storage_ingest(
    *, run: Run, storage: str, parsed: list[isi_statistics.StatsSeries], interval_ns: int
) -> dict[str, int]:
    """Store each column of each node of a storage statistics loop's output as a series of the storage system."""
    Series.objects.filter(run=run, source=SeriesSource.STORAGE).delete()
    totals = {"series": 0, "samples": 0}
    for one in parsed:
        series_append(
            run=run, host=storage, name=one.name, labels=one.labels, unit=one.unit, kind=SeriesKind.GAUGE,
            timestamps_ns=np.array(one.timestamps_ns, dtype=np.int64), values=np.array(one.values),
            interval_ns=interval_ns, source=SeriesSource.STORAGE,
        )  # fmt: skip
        totals["series"] += 1
        totals["samples"] += len(one.timestamps_ns)
    return totals


@dataclass
class _Stream:
    """A stream of a sampler file being stored: its definition, rows not stored yet, the last timestamp kept."""

    definition: dict[str, Any]
    dtype: np.dtype[Any]
    parts: list[tuple[npt.NDArray[np.int64], npt.NDArray[Any]]] = field(default_factory=list)
    rows: int = 0
    last_ns: int = -(2**63)


def sampler_ingest(*, run: Run, host: str, blobs: list[bytes], end_ns: int | None = None) -> dict[str, int]:
    """Store the samples of a host's sampler files as series of the run, replacing the host's earlier ones.

    Samples after the end of the host's main command are left out; a host without one (an MPI job's other hosts)
    is clipped at ``end_ns`` when given. Returns the counts stored and ``ended_ns``, the main command's end.
    """
    Series.objects.filter(run=run, host=host, source=SeriesSource.SAMPLER).delete()
    streams: dict[tuple[int, int], _Stream] = {}
    ended_ns = None
    for index, blob in enumerate(blobs):  # definitions and the main command's end first
        for kind, payload in tool.read_frames(blob):
            if kind == tool.DEFINE:
                definition = json.loads(bytes(payload))
                dtype = np.dtype("<i8" if definition["type"] == "q" else "<f8")
                streams[(index, definition["stream"])] = _Stream(definition, dtype)
            elif kind == tool.END:
                ended_ns = json.loads(bytes(payload))["main_ended_ns"]
    end_ns = ended_ns or end_ns
    totals = {"series": 0, "samples": 0}
    for index, blob in enumerate(blobs):
        for kind, payload in tool.read_frames(blob):
            if kind != tool.SAMPLE:
                continue
            sid, rows, body = tool.sample_body(payload)
            stream = streams[(index, sid)]
            width = len(stream.definition["columns"])
            ts = np.frombuffer(body, "<i8", count=rows)
            values = np.frombuffer(body, stream.dtype, count=rows * width, offset=rows * 8).reshape(width, rows)
            stream.parts.append((ts, values))
            stream.rows += rows
            if stream.rows >= BATCH_ROWS:
                _store(run, host, stream, end_ns, totals)
    for stream in streams.values():
        _store(run, host, stream, end_ns, totals)
    totals["series"] = Series.objects.filter(run=run, host=host, source=SeriesSource.SAMPLER).count()
    if ended_ns:
        totals["ended_ns"] = ended_ns
    return totals


def _store(run: Run, host: str, stream: _Stream, end_ns: int | None, totals: dict[str, int]) -> None:
    """Append a stream's pending rows to its series: timestamps strictly increasing, none long after the end."""
    if not stream.parts:
        return
    ts = np.concatenate([p[0] for p in stream.parts])
    values = np.concatenate([p[1] for p in stream.parts], axis=1)
    stream.parts, stream.rows = [], 0
    interval = int(stream.definition["interval_ns"])
    running_max = np.maximum.accumulate(np.concatenate(([stream.last_ns], ts)))
    keep = ts > running_max[:-1]  # a clock stepped back, two lines read at once: the later ones go
    if end_ns is not None:
        keep &= ts <= end_ns + interval  # the sample that closes the interval the benchmark ended in stays
    if keep.any():
        stream.last_ns = int(ts[keep][-1])
    for col, column in zip(values, stream.definition["columns"], strict=True):
        present = keep & (col >= 0 if col.dtype.kind == "i" else ~np.isnan(col))
        if not present.any():
            continue
        scale = column.get("scale", 1)
        kept = col[present] if scale == 1 else col[present] * scale  # int64 stays int64 for a whole scale
        series_append(
            run=run,
            host=host,
            name=column["name"],
            labels=column["labels"],
            unit=column["unit"],
            kind=column["kind"],
            timestamps_ns=ts[present],
            values=kept,
            interval_ns=interval,
            precision=column.get("precision"),
        )
        totals["samples"] += int(present.sum())
