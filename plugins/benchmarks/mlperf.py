"""mlperf_resnet plug-in: an MLPerf Training ResNet-50 run (seed 002: MLPerf v0.6 on DGX-2; seed 003: v0.7 with MXNet,
DALI and Horovod on DGX A100), launched like the other training kinds (``plugins.benchmarks.training``): mpirun, one
rank per GPU, each rank running the reference's ``train_imagenet.py`` with ``--kv-store horovod``.

The run reads ImageNet RecordIO files (``train.rec``/``train.idx``/``val.rec``/``val.idx``) from ``data_dir``, or from
the mounts round-robin: MLPerf needs real data, so ``data_source`` is storage only.

Output: MLPerf's compliance log, interleaved with the framework's own lines and, under --tag-output, mpirun tags.
Since v0.7 each event is ``:::MLLOG {"namespace": ..., "time_ms": ..., "event_type": ..., "key": ..., "value": ...,
"metadata": {...}}`` (v0.7 TensorFlow logs omit event_type); v0.6 wrote ``:::MLL <unix seconds> <key>: {"value": ...,
"metadata": {...}}``. Submissions since v2 also print ``:::SYSJSON {...}`` with number_of_nodes and
accelerators_per_node. Keys used: run_start, run_stop (metadata status "success" or "aborted"), eval_accuracy (metadata
epoch_num), epoch_start/epoch_stop (epoch_num), block_start/block_stop (first_epoch_num, epoch_count), train_samples,
throughput (v1.0, value: images/s), tracked_stats (metadata step = epoch; value {"imgs_sec": ...} in v1.0,
{"throughput": ...} since v2).

Metrics (host ""):
- ``time_to_train_min``: run_start to run_stop in minutes, only when run_stop's status is success;
- ``eval_accuracy``: the last eval_accuracy (top-1, 0..1);
- ``epochs``: the epoch of that last evaluation, when the run succeeded (epochs to converge);
- ``images_per_sec`` labelled {"epoch": n}: each epoch's throughput as logged, else train_samples / (epoch_stop -
  epoch_start), else per block of epochs from block_start/block_stop (labelled {"epoch": first, "epoch_count": k});
  train_samples defaults to ImageNet's 1,281,167 training images when the log does not say (v0.6);
- ``images_per_sec``: the mean over epochs (seed 003 reports the average over the run); the first epoch's label
  shows the uncached epoch seed 002 compares with the cached ones;
- ``images_per_sec_per_gpu`` (GPUs from SYSJSON, else the launch header) and ``storage_mb_per_sec``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from common import parameters
from plugins.benchmarks import training as t
from plugins.benchmarks.base import HostCommand, HostContext, Metric, MetricSpec, ParseError, register

IMAGENET_TRAIN_SAMPLES = 1_281_167
TIME_TO_TRAIN = MetricSpec("time_to_train_min", "min", False, "run_start to run_stop (status success)")
EVAL_ACCURACY = MetricSpec("eval_accuracy", "ratio", True, "last evaluation's top-1 accuracy (0..1)")
EPOCHS = MetricSpec("epochs", "epochs", False, "epochs run until the target accuracy was reached")

OPTIONS: dict[str, t.Option] = {
    "batch_size": t.Option("--batch-size", parameters.integer(1, 65536), "space"),
    "kv_store": t.Option("--kv-store", parameters.choice("horovod", "device", "local", "nccl"), "space"),
    "lr": t.Option("--lr", parameters.number(0, 1000), "space"),
    "mom": t.Option("--mom", parameters.number(0, 1), "space"),
    "lr_step_epochs": t.Option(
        "--lr-step-epochs", parameters.matching(r"pow2|\d+(,\d+)*", "pow2 or epochs as 30,60"), "space"
    ),
    "lars_eta": t.Option("--lars-eta", parameters.number(0, 1), "space"),
    "label_smoothing": t.Option("--label-smoothing", parameters.number(0, 1), "space"),
    "wd": t.Option("--wd", parameters.number(0, 1), "space"),
    "warmup_epochs": t.Option("--warmup-epochs", parameters.integer(0, 1000), "space"),
    "eval_period": t.Option("--eval-period", parameters.integer(1, 1000), "space"),
    "eval_offset": t.Option("--eval-offset", parameters.integer(0, 1000), "space"),
    "optimizer": t.Option("--optimizer", parameters.matching(r"[a-z][a-z0-9_]{0,31}", "an optimizer name"), "space"),
    "network": t.Option("--network", parameters.matching(r"[a-z][a-z0-9_-]{0,63}", "a network name"), "space"),
    "num_layers": t.Option("--num-layers", parameters.integer(1, 1000), "space"),
    "num_epochs": t.Option("--num-epochs", parameters.integer(1, 1000), "space"),
    "accuracy_threshold": t.Option("--accuracy-threshold", parameters.number(0, 1), "space"),
    "seed": t.Option("--seed", parameters.integer(0, t.MAX_INT), "space"),
    "dtype": t.Option("--dtype", parameters.choice("float16", "float32"), "space"),
    "disp_batches": t.Option("--disp-batches", parameters.integer(1, 100_000), "space"),
    "image_shape": t.Option(
        "--image-shape", parameters.matching(r"\d{1,4},\d{1,4},\d{1,4}", "channels,height,width"), "space"
    ),
    "input_layout": t.Option("--input-layout", parameters.choice("NCHW", "NHWC"), "space"),
    "conv_layout": t.Option("--conv-layout", parameters.choice("NCHW", "NHWC"), "space"),
    "batchnorm_layout": t.Option("--batchnorm-layout", parameters.choice("NCHW", "NHWC"), "space"),
    "pooling_layout": t.Option("--pooling-layout", parameters.choice("NCHW", "NHWC"), "space"),
    "dali_threads": t.Option("--dali-threads", parameters.integer(1, 256), "space"),
    "dali_prefetch_queue": t.Option("--dali-prefetch-queue", parameters.integer(1, 64), "space"),
    "use_dali": t.Option("--use-dali", parameters.boolean, "switch"),
}
CHECKS = {
    **t.COMMON,
    "data_source": parameters.choice("storage"),
    "gpus_per_rank": parameters.integer(1, 64),
    **{name: option.check for name, option in OPTIONS.items()},
}
DATA_FILES = (
    ("--data-train", "train.rec"),
    ("--data-train-idx", "train.idx"),
    ("--data-val", "val.rec"),
    ("--data-val-idx", "val.idx"),
)

_MLLOG = re.compile(r":::MLLOG\s*\{")
_MLL = re.compile(r":::MLL (\d+(?:\.\d+)?) ([A-Za-z0-9_]+): \{")
_SYSJSON = re.compile(r":::SYSJSON\s*\{")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Event:
    key: str
    time_ms: float
    value: Any
    metadata: dict[str, Any] = field(default_factory=dict)


def _json_at(line: str, start: int) -> Any:
    try:
        return _DECODER.raw_decode(line, start)[0]
    except ValueError:
        return None


def _metadata(doc: dict[str, Any]) -> dict[str, Any]:
    metadata = doc.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _events(lines: list[str]) -> Iterator[Event]:
    for line in lines:
        match = _MLLOG.search(line)
        if match:
            doc = _json_at(line, match.end() - 1)
            if isinstance(doc, dict) and isinstance(doc.get("key"), str) and t.to_float(str(doc.get("time_ms"))):
                yield Event(doc["key"], float(doc["time_ms"]), doc.get("value"), _metadata(doc))
            continue
        match = _MLL.search(line)
        if match:
            doc = _json_at(line, match.end() - 1)
            if isinstance(doc, dict):
                yield Event(match.group(2), float(match.group(1)) * 1000, doc.get("value"), _metadata(doc))


def _system_gpus(lines: list[str]) -> int | None:
    for line in lines:
        match = _SYSJSON.search(line)
        doc = _json_at(line, match.end() - 1) if match else None
        if isinstance(doc, dict):
            try:
                return int(doc["number_of_nodes"]) * int(doc["accelerators_per_node"])
            except (KeyError, TypeError, ValueError):
                continue
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return t.to_float(str(value))


def _rate(value: Any) -> float | None:
    """An images/s value: a number, or tracked_stats' {"throughput": n} (v2+) or {"imgs_sec": n} (v1.0)."""
    if isinstance(value, dict):
        value = value.get("throughput", value.get("imgs_sec"))
    return _number(value)


def _epoch_rates(events: list[Event], samples: float) -> list[tuple[dict[str, int], float, int]]:
    """(labels, images/s, epochs covered) for each epoch or block, from logged throughput, else from timing."""
    logged: dict[int, float] = {}
    last_epoch: int | None = None
    for event in events:
        if event.key == "epoch_stop":
            last_epoch = _int(event.metadata.get("epoch_num"))
        elif event.key == "tracked_stats":
            epoch, rate = _int(event.metadata.get("step", event.metadata.get("epoch_num"))), _rate(event.value)
            if epoch is not None and rate is not None:
                logged[epoch] = rate
        elif event.key == "throughput" and last_epoch is not None:
            rate = _rate(event.value)
            if rate is not None:
                logged.setdefault(last_epoch, rate)
    if logged:
        return [({"epoch": epoch}, rate, 1) for epoch, rate in sorted(logged.items())]
    return _timed(events, "epoch", samples) or _timed(events, "block", samples)


def _timed(events: list[Event], unit: str, samples: float) -> list[tuple[dict[str, int], float, int]]:
    key = "epoch_num" if unit == "epoch" else "first_epoch_num"
    starts: dict[int, float] = {}
    out = []
    for event in events:
        number = _int(event.metadata.get(key))
        if number is None:
            continue
        if event.key == f"{unit}_start":
            starts.setdefault(number, event.time_ms)
        elif event.key == f"{unit}_stop" and number in starts and event.time_ms > starts[number]:
            count = 1 if unit == "epoch" else _int(event.metadata.get("epoch_count")) or 1
            labels = {"epoch": number} if unit == "epoch" else {"epoch": number, "epoch_count": count}
            out.append((labels, samples * count * 1000 / (event.time_ms - starts.pop(number)), count))
    return out


def parse_output(text: str) -> list[Metric]:
    streams = t.rank_lines(text)
    lines = t.all_lines(streams)
    events = sorted(_events(lines), key=lambda e: e.time_ms)
    if not events:
        raise ParseError("no MLPerf log events found (no ':::MLLOG {...}' or ':::MLL' lines)")
    head = t.header(streams)
    first = {e.key: e for e in reversed(events)}
    last = {e.key: e for e in events}
    out: list[Metric] = []
    stop = last.get("run_stop")
    success = stop is not None and str(stop.metadata.get("status", "")).lower() == "success"
    if success and stop is not None and "run_start" in first:
        out.append(t.metric(TIME_TO_TRAIN, (stop.time_ms - first["run_start"].time_ms) / 60000))
    accuracy = last.get("eval_accuracy")
    accuracy_value = _number(accuracy.value) if accuracy is not None else None
    if accuracy is not None and accuracy_value is not None:
        out.append(t.metric(EVAL_ACCURACY, accuracy_value))
        epoch = _int(accuracy.metadata.get("epoch_num"))
        if success and epoch is not None:
            out.append(t.metric(EPOCHS, epoch))
    samples = _number(last["train_samples"].value) if "train_samples" in last else None
    rates = _epoch_rates(events, samples or IMAGENET_TRAIN_SAMPLES)
    out += [t.metric(t.THROUGHPUT, rate, **labels) for labels, rate, _ in rates]
    covered = sum(count for _, _, count in rates)
    total = sum(rate * count for _, rate, count in rates) / covered if covered else None
    if total is not None:
        out.append(t.metric(t.THROUGHPUT, total))
    gpus = _system_gpus(lines) or t.header_number(head, "gpus")
    return out + t.derived(total, int(gpus) if gpus else None, t.header_number(head, "record_size_bytes"))


def run_status(text: str) -> str | None:
    """run_stop's status in an output, None without run_stop."""
    stops = [e for e in _events(t.all_lines(t.rank_lines(text))) if e.key == "run_stop"]
    return str(stops[-1].metadata.get("status", "")) if stops else None


@register
class MlperfResnet(t.TrainingBenchmark):
    kind = "mlperf_resnet"
    description = "MLPerf Training ResNet-50 (MXNet/DALI/Horovod reference) under mpirun: time to train, images/s"
    metrics = (*t.TRAINING_METRICS, TIME_TO_TRAIN, EVAL_ACCURACY, EPOCHS)
    required_metrics = ("time_to_train_min", "eval_accuracy", "images_per_sec")
    version_argv = ["python", "-c", "import mxnet; print(mxnet.__version__)"]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """MLPerf reads ImageNet RecordIO files (train.rec, val.rec): data_source is storage, whether given or not."""
        return t.checked({"data_source": "storage", **params}, CHECKS, required=("script",))

    def command(self, params: dict[str, Any], values: dict[str, Any], host: HostContext) -> HostCommand:
        location = t.data_location(values, host)
        data = [arg for flag, name in DATA_FILES for arg in (flag, f"{location.directory}/{name}")]
        program = [values.get("python", "python"), "-u", values["script"], *t.option_argv(OPTIONS, values), *data]
        gpus = values.get("gpus_per_rank", 1)
        return t.launch(self.kind, params, values, host, [*location.prefix, *program], gpus_per_rank=gpus)

    def output(self, text: str) -> list[Metric]:
        return parse_output(text)

    def missing_reason(self, name: str) -> str:
        if name == "time_to_train_min":
            return " (it is only reported when run_stop has status success)"
        return super().missing_reason(name)

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        problems = super().check(params, metrics, logs)
        for host, text in logs.items():
            status = run_status(text)
            if status is not None and status.lower() != "success":
                problems.append(f"{host}: MLPerf run_stop status is {status!r}: the target accuracy was not reached")
        return problems
