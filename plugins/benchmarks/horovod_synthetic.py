"""horovod_synthetic plug-in: Horovod's synthetic-data benchmarks (examples/pytorch/pytorch_synthetic_benchmark.py,
examples/tensorflow2/tensorflow2_synthetic_benchmark.py and their older TensorFlow/Keras siblings), one mpirun rank
per GPU, launched as tf_cnn_benchmarks is (see ``plugins.benchmarks.training``). They need no data set: ``data_source``
is synthetic only.

Rank 0 prints (``device`` is GPU, or CPU with --no-cuda)::

    Number of GPUs: 8
    Iter #0: 592.3 img/sec per GPU
    ...
    Img/sec per GPU: 600.2 +-5.3
    Total img/sec on 8 GPU(s): 4801.4 +-42.7

Metrics: ``images_per_sec`` (the Total line), ``images_per_sec_per_gpu`` (the "Img/sec per GPU" line as printed) and
``storage_mb_per_sec`` (with ``record_size_bytes``, for sizing what storage the same rate would need).
"""

from __future__ import annotations

import re
from typing import Any

from common import parameters
from plugins.benchmarks import training as t
from plugins.benchmarks.base import HostCommand, HostContext, Metric, ParseError, register

OPTIONS: dict[str, t.Option] = {
    "model": t.Option(
        "--model", parameters.matching(r"[A-Za-z][A-Za-z0-9_]{0,63}", "a model name such as resnet50"), "space"
    ),
    "batch_size": t.Option("--batch-size", parameters.integer(1, 65536), "space"),
    "num_warmup_batches": t.Option("--num-warmup-batches", parameters.integer(0, 100_000), "space"),
    "num_batches_per_iter": t.Option("--num-batches-per-iter", parameters.integer(1, 100_000), "space"),
    "num_iters": t.Option("--num-iters", parameters.integer(1, 100_000), "space"),
    "fp16_allreduce": t.Option("--fp16-allreduce", parameters.boolean, "switch"),
    "use_adasum": t.Option("--use-adasum", parameters.boolean, "switch"),
    "no_cuda": t.Option("--no-cuda", parameters.boolean, "switch"),
}


def _script(value: Any) -> str:
    path = t.absolute_path(value)
    if not path.endswith(".py"):
        raise ValueError(f"must be the path of a Horovod *_synthetic_benchmark.py script, got {path!r}")
    return path


CHECKS = {
    "script": _script,
    "python": t.interpreter,
    "data_source": parameters.choice("synthetic"),
    "record_size_bytes": t.COMMON["record_size_bytes"],
    **{name: option.check for name, option in OPTIONS.items()},
}

_TOTAL = re.compile(r"Total img/sec on (\d+) (GPU|CPU)\(s\):\s*([0-9.eE+-]+|nan|inf)")
_PER_DEVICE = re.compile(r"Img/sec per (GPU|CPU):\s*([0-9.eE+-]+|nan|inf)")
_ITER = re.compile(r"Iter #\d+: [0-9.]+ img/sec per")


def parse_output(text: str) -> list[Metric]:
    streams = t.rank_lines(text)
    head = t.header(streams)
    total = per_device = None
    devices = 0
    iterations = 0
    for line in t.all_lines(streams):
        match = _TOTAL.search(line)
        if match and match.group(2) == "GPU":
            devices, total = int(match.group(1)), t.to_float(match.group(3))
            continue
        match = _PER_DEVICE.search(line)
        if match and match.group(1) == "GPU":
            per_device = t.to_float(match.group(2))
        elif _ITER.search(line):
            iterations += 1
    if total is None and per_device is None:
        if iterations:
            raise ParseError(f"Horovod benchmark printed {iterations} iterations but no result (interrupted?)")
        raise ParseError("no Horovod synthetic benchmark result found (no 'Total img/sec on N GPU(s)' line)")
    out = []
    if total is not None:
        out.append(t.metric(t.THROUGHPUT, total))
    if per_device is not None:
        out.append(t.metric(t.PER_GPU, per_device))
    elif total is not None and devices:
        out.append(t.metric(t.PER_GPU, total / devices))
    return out + t.derived(total, None, t.header_number(head, "record_size_bytes"))


@register
class HorovodSynthetic(t.TrainingBenchmark):
    kind = "horovod_synthetic"
    description = "Horovod synthetic benchmark (pytorch/tensorflow2 *_synthetic_benchmark.py) under mpirun: images/s"
    version_argv = ["horovodrun", "--version"]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        return t.checked(params, CHECKS, required=("script",))

    def command(self, params: dict[str, Any], values: dict[str, Any], host: HostContext) -> HostCommand:
        rank_argv = [values.get("python", "python"), "-u", values["script"], *t.option_argv(OPTIONS, values)]
        return t.launch(self.kind, params, values, host, rank_argv)

    def output(self, text: str) -> list[Metric]:
        return parse_output(text)

    def uses_gpus(self, params: dict[str, Any]) -> bool:
        return not params.get("no_cuda", False)
