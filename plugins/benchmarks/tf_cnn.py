"""tf_cnn_benchmarks plug-in: TensorFlow's CNN benchmark under Horovod, one mpirun rank per GPU (seeds 000, 001, 004).

The command is the seeds' (seed 000, 48 GPUs)::

    mpirun -n 48 --allow-run-as-root --host dgx2-1:16,... --report-bindings --bind-to none --map-by slot
      -x LD_LIBRARY_PATH -x PATH -mca plm_rsh_agent ssh -mca plm_rsh_args "-p 2222" -mca pml ob1 ...
      -x NCCL_DEBUG=INFO ... ./round_robin_mpi.py python -u .../tf_cnn_benchmarks.py --model=resnet50
      --batch_size=256 --batch_group_size=20 --num_batches=1000 --nodistortions --num_gpus=1 --device=gpu ...
      --variable_update=horovod --horovod_device=gpu --data_dir=...

built by ``training.launch`` (header line, then ``mpirun_argv``); see ``plugins.benchmarks.training`` for the launch
header and the round-robin wrapper contract (``data_dirs_round_robin``: ``--data_dir={data_dir}`` filled in per rank).
``data_source: synthetic`` passes no ``--data_dir`` (tf_cnn_benchmarks then generates images on the GPU);
``storage`` reads TFRecords from ``data_dir`` or from the mounts round-robin.

What tf_cnn_benchmarks prints (benchmark_cnn.py, unchanged since 2017 in these lines): a header with
``Batch size:  384 global`` / ``192 per device`` and ``Devices: [...]``, then per step
``100\\timages/sec: 2340.5 +/- 5.1 (jitter = 20.3)\\t7.750`` (the rank's own rate, averaged since warm-up), and at the
end ``total images/sec: 2401.60``. Under Horovod every rank prints the total, each an estimate of the whole job's rate
(its own rate times the number of workers).

Metrics: ``images_per_sec`` (the mean of the ranks' totals), ``images_per_sec`` labelled {"rank": r} (the rank's last
step rate, when --tag-output says which rank printed it), ``images_per_sec_per_gpu`` (total / GPUs, GPUs being
global batch / per-device batch when the header lists GPUs, else the launch header's count) and
``storage_mb_per_sec`` (with ``record_size_bytes``).
"""

from __future__ import annotations

import re
from typing import Any

from common import parameters
from plugins.benchmarks import training as t
from plugins.benchmarks.base import HostCommand, HostContext, Metric, ParamError, ParseError, register

MODELS = re.compile(r"[a-z][a-z0-9_.]{0,63}")
VARIABLE_UPDATES = (
    "horovod",
    "parameter_server",
    "replicated",
    "distributed_replicated",
    "independent",
    "distributed_all_reduce",
    "collective_all_reduce",
)

# tf_cnn_benchmarks flags a campaign may set, in the seeds' order. Booleans are written --flag=True/False as the seeds
# do, except distortions, which the seeds write --nodistortions.
OPTIONS: dict[str, t.Option] = {
    "model": t.Option(
        "--model", parameters.matching(MODELS.pattern, "a tf_cnn_benchmarks model name such as resnet50")
    ),
    "batch_size": t.Option("--batch_size", parameters.integer(1, 65536)),
    "batch_group_size": t.Option("--batch_group_size", parameters.integer(1, 1024)),
    "num_batches": t.Option("--num_batches", parameters.integer(1, 100_000_000)),
    "num_warmup_batches": t.Option("--num_warmup_batches", parameters.integer(0, 100_000)),
    "display_every": t.Option("--display_every", parameters.integer(1, 100_000)),
    "distortions": t.Option("--distortions", parameters.boolean),
    "num_gpus": t.Option("--num_gpus", parameters.integer(1, 64)),
    "device": t.Option("--device", parameters.choice("gpu", "cpu")),
    "force_gpu_compatible": t.Option("--force_gpu_compatible", parameters.boolean),
    "data_format": t.Option("--data_format", parameters.choice("NCHW", "NHWC")),
    "use_fp16": t.Option("--use_fp16", parameters.boolean),
    "xla": t.Option("--xla", parameters.boolean),
    "use_tf_layers": t.Option("--use_tf_layers", parameters.boolean),
    "data_name": t.Option("--data_name", parameters.choice("imagenet", "cifar10")),
    "use_datasets": t.Option("--use_datasets", parameters.boolean),
    "num_intra_threads": t.Option("--num_intra_threads", parameters.integer(0, 4096)),
    "num_inter_threads": t.Option("--num_inter_threads", parameters.integer(0, 4096)),
    "datasets_prefetch_buffer_size": t.Option("--datasets_prefetch_buffer_size", parameters.integer(1, 100_000)),
    "datasets_num_private_threads": t.Option("--datasets_num_private_threads", parameters.integer(1, 4096)),
    "optimizer": t.Option("--optimizer", parameters.choice("sgd", "momentum", "rmsprop", "adam")),
    "train_dir": t.Option("--train_dir", t.absolute_path),
    "sync_on_finish": t.Option("--sync_on_finish", parameters.boolean),
    "summary_verbosity": t.Option("--summary_verbosity", parameters.integer(0, 3)),
    "save_summaries_steps": t.Option("--save_summaries_steps", parameters.integer(0, t.MAX_INT)),
    "save_model_secs": t.Option("--save_model_secs", parameters.integer(0, t.MAX_INT)),
    "variable_update": t.Option("--variable_update", parameters.choice(*VARIABLE_UPDATES)),
    "horovod_device": t.Option("--horovod_device", parameters.choice("gpu", "cpu")),
}
DEFAULTS = {
    "model": "resnet50",
    "batch_size": 64,
    "num_batches": 100,
    "num_gpus": 1,
    "device": "gpu",
    "variable_update": "horovod",
}

_TOTAL = re.compile(r"total images/sec:\s*([0-9.eE+-]+|nan|inf)")
_STEP = re.compile(r"^\s*(\d+)\s+images/sec:\s*([0-9.eE+-]+) \+/- ([0-9.eE+-]+) \(jitter = ([0-9.eE+-]+)\)")
_GLOBAL = re.compile(r"Batch size:\s+(\d+) global")
_PER_DEVICE = re.compile(r"^\s*(\d+(?:\.\d+)?) per device")
_DEVICES = re.compile(r"^Devices:\s+\[(.*)\]")


def _values(params: dict[str, Any]) -> dict[str, Any]:
    values = t.checked(params, {**t.COMMON, **{k: o.check for k, o in OPTIONS.items()}}, required=("script",))
    if values.get("data_source") == "storage" and "data_name" in values and values["data_name"] != "imagenet":
        raise ParamError("data_name", "storage runs read ImageNet TFRecords; use data_name imagenet")
    return {**DEFAULTS, **values}


def _rank_argv(values: dict[str, Any], host: HostContext) -> list[str]:
    location = t.data_location(values, host)
    flags = dict(values)
    distortions = flags.pop("distortions", None)
    argv = [*location.prefix, values.get("python", "python"), "-u", values["script"]]
    for name, option in OPTIONS.items():
        if name == "distortions" and distortions is not None:
            argv.append("--distortions" if distortions else "--nodistortions")
        elif name in flags:
            argv += option.argv(flags[name])
    if location.directory is not None:
        argv.append(f"--data_dir={location.directory}")
    return argv


def _gpus(lines: list[str]) -> int | None:
    """Global batch / per-device batch from tf_cnn_benchmarks' header, when its device list names GPUs."""
    global_batch = per_device = None
    gpu_devices = False
    for line in lines:
        match = _GLOBAL.search(line)
        if match:
            global_batch = int(match.group(1))
            continue
        match = _PER_DEVICE.match(line)
        if match and global_batch is not None and per_device is None:
            per_device = float(match.group(1))
        match = _DEVICES.match(line)
        if match and "gpu" in match.group(1).lower():
            gpu_devices = True
    if not gpu_devices or not global_batch or not per_device:
        return None
    return round(global_batch / per_device)


def parse_output(text: str) -> list[Metric]:
    streams = t.rank_lines(text)
    head = t.header(streams)
    totals: list[float] = []
    per_rank: dict[int, float] = {}
    steps = 0
    for rank, lines in streams.items():
        for line in lines:
            match = _TOTAL.search(line)
            if match:
                value = t.to_float(match.group(1))
                if value is not None:
                    totals.append(value)
                continue
            match = _STEP.match(line)
            if match:
                steps += 1
                rate = t.to_float(match.group(2))
                if rank is not None and rate is not None:
                    per_rank[rank] = rate
    if not totals and not steps:
        raise ParseError("no tf_cnn_benchmarks result found (no 'total images/sec:' and no step lines)")
    out = [t.metric(t.THROUGHPUT, rate, rank=rank) for rank, rate in sorted(per_rank.items())]
    total = t.mean(totals)
    if total is not None:
        out.append(t.metric(t.THROUGHPUT, total))
    gpus = _gpus(t.all_lines(streams)) or t.header_number(head, "gpus")
    return out + t.derived(total, int(gpus) if gpus else None, t.header_number(head, "record_size_bytes"))


@register
class TfCnnBenchmarks(t.TrainingBenchmark):
    kind = "tf_cnn_benchmarks"
    description = "TensorFlow CNN benchmarks (tf_cnn_benchmarks.py) under Horovod and mpirun: images/s"
    version_argv = ["python", "-c", "import tensorflow as tf; print(tf.__version__)"]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        return _values(params)

    def command(self, params: dict[str, Any], values: dict[str, Any], host: HostContext) -> HostCommand:
        if t.ranks_of(params, host) > 1 and values["variable_update"] != "horovod":
            raise ParamError("variable_update", "must be horovod when mpirun starts more than one rank")
        return t.launch(self.kind, params, values, host, _rank_argv(values, host), gpus_per_rank=values["num_gpus"])

    def output(self, text: str) -> list[Metric]:
        return parse_output(text)

    def uses_gpus(self, params: dict[str, Any]) -> bool:
        return params.get("device", "gpu") == "gpu"
