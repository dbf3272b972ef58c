"""The arithmetic of the analysis pages, free of the database: scaling efficiency, storage demand and sizing.

Scaling (seed 004 figure 4, seed 000 figure 7, seed 001 figure 3): x is what the run used (its GPUs, ranks or
nodes) and the ideal is linear from a reference the user chooses:

- ``smallest`` (seeds 000, 001): from the series' smallest point, ``ideal(x) = y0 * x / x0``;
- ``one-gpu`` (seed 004: "scaling efficiency ... compared to linear scaling of one GPU"): from the throughput of
  one GPU, ``ideal(x) = y1 * x``, with ``y1`` the series' point at x = 1.

The efficiency at each point is ``y / ideal(x)``. With seed 004's shape (1 GPU: 100 img/s; 32 GPUs: 2,912 img/s)
one-gpu gives 2912 / 3200 = 91.0%; smallest, when the series starts at 8 GPUs (776.5 img/s), gives 93.8%.

Sizing (seed 000 table 3): a storage node that reads ``per_node`` MB/s feeds ``floor(per_node / per_gpu)`` GPUs
that each demand ``per_gpu`` MB/s; ``gpus`` GPUs then need ``gpus / gpus_per_node`` storage nodes (the paper's
"48 / 30 = 1.6 Isilon F800 nodes"), at least the next whole number, and the paper advises two nodes more than
that minimum for failures, administrative jobs and other workloads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEADROOM_NODES = 2  # seed 000: "add two nodes to the minimum required number of Isilon nodes"

# Seed 000 table 3: MB/s each V100 GPU demanded of storage, by workload.
REFERENCE_WORKLOADS = (
    ("Low", "Training, small images, ResNet-50", 100.0),
    ("Medium", "Inference, small images, ResNet-50", 160.0),
    ("High", "Training, large images, Inception-v4", 300.0),
)


@dataclass(frozen=True)
class ScalingPoint:
    x: float
    y: float
    ideal: float
    efficiency_pct: float | None  # None where the ideal is 0 (a zero first point)


REFERENCES = ("smallest", "one-gpu")


def scaling(
    points: list[tuple[float, float]], *, reference: str = "smallest", base: float | None = None
) -> list[ScalingPoint]:
    """Each point against linear scaling from the reference (module docstring): the smallest x, or one GPU, whose
    throughput is the series' point at x = 1 or ``base`` (one GPU's, measured in another series). Points with
    x <= 0 cannot be scaled from; with one-gpu and no 1-GPU throughput there is no ideal (empty)."""
    usable = sorted((x, y) for x, y in points if x > 0)
    if not usable:
        return []
    if reference == "one-gpu":
        one = next((y for x, y in usable if x == 1), base)
        if one is None:
            return []
        x0, y0 = 1.0, one
    else:
        x0, y0 = usable[0]
    out = []
    for x, y in usable:
        ideal = y0 * x / x0
        out.append(ScalingPoint(x, y, ideal, 100 * y / ideal if ideal else None))
    return out


def demand_mb_per_sec(images_per_sec: float, record_size_bytes: float) -> float:
    """The read rate a training run demands of storage: images/s x mean record size (10^6 bytes/s)."""
    return images_per_sec * record_size_bytes / 1e6


@dataclass(frozen=True)
class Sizing:
    per_gpu_mbps: float
    per_node_mbps: float
    gpus: int
    gpus_per_node: int
    demand_mbps: float  # gpus x per_gpu
    nodes_exact: float | None  # gpus / gpus_per_node; None when one node cannot feed a single GPU
    nodes_minimum: int | None
    nodes_recommended: int | None


class SizingError(ValueError):
    pass


def sizing(*, per_gpu_mbps: float, per_node_mbps: float, gpus: int, headroom_nodes: int = HEADROOM_NODES) -> Sizing:
    """How many GPUs one storage node feeds, and how many storage nodes ``gpus`` GPUs need (module docstring)."""
    if not (math.isfinite(per_gpu_mbps) and per_gpu_mbps > 0):
        raise SizingError("the demand per GPU must be a positive number of MB/s")
    if not (math.isfinite(per_node_mbps) and per_node_mbps > 0):
        raise SizingError("the throughput per storage node must be a positive number of MB/s")
    if gpus < 1:
        raise SizingError("the number of GPUs must be at least 1")
    per_node = math.floor(per_node_mbps / per_gpu_mbps + 1e-9)  # 3000 / 100 is 30, not 29.999...
    exact = gpus / per_node if per_node else None
    minimum = math.ceil(exact - 1e-9) if exact is not None else None
    return Sizing(
        per_gpu_mbps=per_gpu_mbps,
        per_node_mbps=per_node_mbps,
        gpus=gpus,
        gpus_per_node=per_node,
        demand_mbps=gpus * per_gpu_mbps,
        nodes_exact=exact,
        nodes_minimum=minimum,
        nodes_recommended=minimum + headroom_nodes if minimum is not None else None,
    )


def reference_table(per_node_mbps: float) -> list[dict[str, object]]:
    """Seed 000 table 3's workloads against a storage node of ``per_node_mbps``: GPUs per storage node."""
    return [
        {"demand": level, "workload": what, "per_gpu_mbps": per_gpu,
         "gpus_per_node": math.floor(per_node_mbps / per_gpu + 1e-9)}
        for level, what, per_gpu in REFERENCE_WORKLOADS
    ]  # fmt: skip
