"""pytorch_resnet plug-in: NVIDIA DeepLearningExamples' PyTorch ResNet-50 (PyTorch/Classification/ConvNets/main.py).

Launch: mpirun, one rank per GPU, like the other training kinds (see ``plugins.benchmarks.training``), rather than
torchrun: one command on the primary host keeps the seeds' MPI setup (container sshd port, NCCL variables passed with
-x, the same host list), where torchrun would need a command on every host and a rendezvous of its own. main.py reads
the torch.distributed environment (``WORLD_SIZE``, ``LOCAL_RANK``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
init_method env://), so each rank starts through a fixed ``sh`` line that copies Open MPI's
``OMPI_COMM_WORLD_{SIZE,RANK,LOCAL_RANK}`` into those names; ``MASTER_ADDR`` (the primary host's address) and
``MASTER_PORT`` (``master_port``, default 29500) go to every rank with mpirun's -x.

Output: rank 0 logs through DLLogger's stdout backend, one line per record::

    DLL 2023-02-14 06:30:27.972023 - PARAMETER data : /data/imagenet  ... world_size : 4
    DLL 2023-02-14 06:32:36.840745 - Epoch: 1  train.loss : 1.41090 None train.compute_ips : 10470.11 images/s
        train.total_ips : 10467.29 images/s ...
    DLL 2023-02-14 06:32:37.463116 - Summary: train.loss : 6.42087 None train.compute_ips : 10406.84 images/s
        train.total_ips : 10403.96 images/s ...

(older releases write "img/s"). ``train.total_ips`` counts every rank's images (batch x world size / step time).
Metrics: ``images_per_sec`` from the Summary's train.total_ips (labelled {"epoch": e} from the end-of-epoch lines),
``compute_images_per_sec`` from train.compute_ips (the rate without waiting for data: the gap to images_per_sec is the
input pipeline's, i.e. storage's, share), ``images_per_sec_per_gpu`` (total / world_size from the PARAMETER line, or
the launch header's GPU count) and ``storage_mb_per_sec`` (with ``record_size_bytes``). A run that stopped before its
Summary line has no images_per_sec and fails.

DLLogger's JSON backend writes one ``DLLL {...}`` record per step to the ``--raport-file``: with ``json_log: true``
that file is ``/dev/stdout`` (main.py joins it to ``--workspace``, and an absolute path stays itself), so the
records reach the output read here. Where the output holds any, they are read instead of the stdout lines: their
numbers are unrounded and their steps say what they are (``"PARAMETER"``, ``[epoch, iteration]``, ``[epoch]`` at an
epoch's end, ``[]`` for the Summary; a step's data may come in two records)::

    DLLL {"timestamp": "1570716934.289014", ..., "type": "LOG", "step": [], "data": {"train.loss": 8.34140625,
          "train.total_ips": 661.9801574510492, ...}}
"""

from __future__ import annotations

import json
import re
from typing import Any

from common import parameters
from plugins.benchmarks import training as t
from plugins.benchmarks.base import HostCommand, HostContext, Metric, MetricSpec, ParamError, ParseError, register

COMPUTE = MetricSpec(
    "compute_images_per_sec", "img/s", True, "training rate counting compute time only (DLLogger train.compute_ips)"
)
RANK_ENV_SCRIPT = (
    'export WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" RANK="$OMPI_COMM_WORLD_RANK" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK"; exec "$@"'
)
DATA_BACKENDS = ("synthetic", "dali-cpu", "dali-gpu", "pytorch")
OPTIONS: dict[str, t.Option] = {
    "arch": t.Option("--arch", parameters.matching(r"[a-z][a-z0-9_-]{0,63}", "a model name such as resnet50"), "space"),
    "data_backend": t.Option("--data-backend", parameters.choice(*DATA_BACKENDS), "space"),
    "workers": t.Option("--workers", parameters.integer(0, 256), "space"),
    "epochs": t.Option("--epochs", parameters.integer(1, 10_000), "space"),
    "batch_size": t.Option("--batch-size", parameters.integer(1, 65536), "space"),
    "prof": t.Option("--prof", parameters.integer(1, 100_000_000), "space"),
    "print_freq": t.Option("--print-freq", parameters.integer(1, 100_000), "space"),
    "amp": t.Option("--amp", parameters.boolean, "switch"),
    "static_loss_scale": t.Option("--static-loss-scale", parameters.number(1, 2**24), "space"),
    "memory_format": t.Option("--memory-format", parameters.choice("nchw", "nhwc"), "space"),
    "training_only": t.Option("--training-only", parameters.boolean, "switch"),
    "no_checkpoints": t.Option("--no-checkpoints", parameters.boolean, "switch"),
}
CHECKS = {
    **t.COMMON,
    "master_port": parameters.integer(1024, 65535),
    "json_log": parameters.boolean,  # DLLogger's JSON records too (--raport-file /dev/stdout), read before stdout's
    **{n: o.check for n, o in OPTIONS.items()},
}

_DLL = re.compile(r"DLL [0-9-]+ [0-9:.]+ - (PARAMETER|Summary:|Epoch: (\d+)(?:\s+Iteration: \d+)?)")
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*) : (\S+)")
_DLLL = re.compile(r"DLLL (\{.*\})\s*$")
# DLLogger's JSON backend writes the file named by --raport-file; /dev/stdout puts it in the output read here.
JSON_LOG = "/dev/stdout"


class _Log:
    """What a DLLogger log says, from either backend: parameters, each epoch's and the Summary's fields."""

    def __init__(self) -> None:
        self.parameters: dict[str, str] = {}
        self.summary: dict[str, str] = {}
        self.epochs: dict[int, dict[str, str]] = {}
        self.iterations = 0

    def add_json(self, line: str) -> bool:
        """A ``DLLL {...}`` line: step "PARAMETER", [] (the Summary), [epoch], [epoch, iteration] or [epoch,
        iteration, validation step]; each step's data may come in several records. False when it is none."""
        match = _DLLL.search(line)
        if not match:
            return False
        try:
            record = json.loads(match.group(1))
        except ValueError:
            return False
        if not isinstance(record, dict) or record.get("type") != "LOG" or not isinstance(record.get("data"), dict):
            return isinstance(record, dict)  # METADATA records: nothing to read
        fields = {str(k): str(v) for k, v in record["data"].items() if not isinstance(v, (dict, list))}
        step = record.get("step")
        if step == "PARAMETER":
            self.parameters.update(fields)
        elif step == []:
            self.summary.update(fields)
        elif isinstance(step, list) and len(step) == 1 and isinstance(step[0], int):
            self.epochs.setdefault(step[0], {}).update(fields)
        elif isinstance(step, list):
            self.iterations += 1
        return True


def _values(params: dict[str, Any]) -> dict[str, Any]:
    values = t.checked(params, CHECKS, required=("script",))
    synthetic = values.get("data_source", "synthetic") == "synthetic"
    values.setdefault("data_backend", "synthetic" if synthetic else "dali-cpu")
    if synthetic != (values["data_backend"] == "synthetic"):
        raise ParamError("data_backend", "must be synthetic exactly when data_source is synthetic")
    return values


def _rank_argv(values: dict[str, Any], host: HostContext) -> list[str]:
    location = t.data_location(values, host)
    # main.py's data path is positional and required even with the synthetic backend, which never reads it.
    data = location.directory if location.directory is not None else host.data_dir
    program = [values.get("python", "python"), "-u", values["script"], data, *t.option_argv(OPTIONS, values)]
    if values.get("json_log"):
        program += ["--raport-file", JSON_LOG]
    return ["sh", "-c", RANK_ENV_SCRIPT, "rackbench-rank", *location.prefix, *program]


def _read_log(lines: list[str]) -> _Log:
    """The JSON records when the output has any (unrounded, and each step's full data), else the stdout lines."""
    json_log, text_log = _Log(), _Log()
    found_json = False
    for line in lines:
        if json_log.add_json(line):
            found_json = True
            continue
        match = _DLL.search(line)
        if not match:
            continue
        fields = dict(_FIELD.findall(line[match.end() :]))
        if match.group(1) == "PARAMETER":
            text_log.parameters.update(fields)
        elif match.group(1) == "Summary:":
            text_log.summary.update(fields)
        elif "Iteration" in match.group(1):
            text_log.iterations += 1
        else:
            text_log.epochs.setdefault(int(match.group(2)), {}).update(fields)
    return json_log if found_json else text_log


def parse_output(text: str) -> list[Metric]:
    streams = t.rank_lines(text)
    head = t.header(streams)
    log = _read_log(t.all_lines(streams))
    summary, epochs, parameters, iterations = log.summary, log.epochs, log.parameters, log.iterations
    if not summary and not epochs:
        if iterations:
            raise ParseError(f"DLLogger printed {iterations} iterations but no epoch or Summary line (interrupted?)")
        raise ParseError("no DLLogger output found (no 'DLL ... - Summary:'/'Epoch:' lines, no 'DLLL {...}' records)")
    out = []
    for epoch, fields in sorted(epochs.items()):
        rate = t.to_float(fields.get("train.total_ips", ""))
        if rate is not None:
            out.append(t.metric(t.THROUGHPUT, rate, epoch=epoch))
    total = t.to_float(summary.get("train.total_ips", ""))
    if total is not None:
        out.append(t.metric(t.THROUGHPUT, total))
    compute = t.to_float(summary.get("train.compute_ips", ""))
    if compute is not None:
        out.append(t.metric(COMPUTE, compute))
    world = t.to_float(parameters.get("world_size", "")) or t.header_number(head, "gpus")
    return out + t.derived(total, int(world) if world else None, t.header_number(head, "record_size_bytes"))


@register
class PytorchResnet(t.TrainingBenchmark):
    kind = "pytorch_resnet"
    description = "NVIDIA DeepLearningExamples PyTorch ResNet-50 (main.py) under mpirun: images/s"
    metrics = (*t.TRAINING_METRICS, COMPUTE)
    version_argv = ["python", "-c", "import torch; print(torch.__version__)"]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        return _values(params)

    def command(self, params: dict[str, Any], values: dict[str, Any], host: HostContext) -> HostCommand:
        address = host.hosts[0].address if host.hosts else ""
        master = {"MASTER_ADDR": address, "MASTER_PORT": str(values.get("master_port", 29500))}
        return t.launch(self.kind, params, values, host, _rank_argv(values, host), env=master)

    def output(self, text: str) -> list[Metric]:
        return parse_output(text)
