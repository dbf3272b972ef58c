"""The training plug-ins (tf_cnn_benchmarks, horovod_synthetic, pytorch_resnet, mlperf_resnet): parameters, the mpirun
command lines, parsing of real outputs (see fixtures/training/SOURCES.md), derived metrics, and one real mpirun."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks import training
from plugins.benchmarks.base import HostContext, HostInfo, Metric, ParamError, ParseError, get_benchmark

FIXTURES = Path(__file__).parent / "fixtures" / "training"
TF_CNN = "/mnt/isilon/data/tensorflow-benchmarks/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py"
DGX2 = tuple(HostInfo(name=f"dgx2-{i}", address=f"dgx2-{i}", slots=16) for i in (1, 2, 3))
MOUNTS = tuple(f"/mnt/isilon{i}" for i in range(1, 17))
NCCL_ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_HCA": "mlx5",
    "NCCL_IB_SL": "4",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_NET_GDR_READ": "1",
    "NCCL_SOCKET_IFNAME": "^docker0,lo",
}


def context(index: int = 0, hosts: tuple[HostInfo, ...] = DGX2, **kwargs: Any) -> HostContext:
    return HostContext(
        node=hosts[index].name if hosts else "n1",
        index=index,
        run_dir="/srv/rackbench/runs/7",
        data_dir="/scratch/rackbench/n1",
        hosts=hosts,
        **kwargs,
    )


def fixture(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_bytes().decode()  # bytes first: keeps CRLF line ends as they are


def parse(kind: str, name: str) -> list[Metric]:
    return get_benchmark(kind).parse(fixture(kind, name), host="dgx2-1")


def value(metrics: list[Metric], name: str, **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == "" and m.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def names(metrics: list[Metric]) -> set[str]:
    return {m.name for m in metrics if not m.labels}


def header_line(**fields: Any) -> str:
    """The first line of every training run's output, as training.launch's sh preamble prints it."""
    return f"{training.HEADER_TAG}: {json.dumps(fields, sort_keys=True)}\n"


# --- registration and metric specs ---------------------------------------------------------------------------

KINDS = ("tf_cnn_benchmarks", "horovod_synthetic", "pytorch_resnet", "mlperf_resnet")


@pytest.mark.parametrize("kind", KINDS)
def test_it_registers_each_training_kind_with_units_and_directions(kind):
    bench = get_benchmark(kind)
    assert bench.kind == kind
    assert bench.spec("images_per_sec").unit == "img/s"
    assert bench.spec("images_per_sec_per_gpu").unit == "img/s"
    assert bench.spec("storage_mb_per_sec").unit == "MB/s"
    assert all(bench.spec(name).higher_is_better for name in ("images_per_sec", "storage_mb_per_sec"))
    assert all(bench.spec(name) for name in bench.required_metrics)


def test_it_declares_mlperf_time_to_train_in_minutes_lower_is_better():
    mlperf = get_benchmark("mlperf_resnet")
    assert mlperf.spec("time_to_train_min").unit == "min"
    assert mlperf.spec("time_to_train_min").higher_is_better is False
    assert mlperf.spec("epochs").higher_is_better is False
    assert mlperf.spec("eval_accuracy").higher_is_better is True
    assert set(mlperf.required_metrics) == {"time_to_train_min", "eval_accuracy", "images_per_sec"}


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_every_parsed_metric_its_declared_unit_and_the_run_host(kind):
    bench = get_benchmark(kind)
    for path in sorted((FIXTURES / kind).iterdir()):
        try:
            metrics = bench.parse(path.read_bytes().decode(), host="dgx2-1")
        except ParseError:
            continue
        assert metrics, path
        for m in metrics:
            assert m.unit == bench.spec(m.name).unit and m.host == "", (path.name, m)


# --- reading mpirun output -------------------------------------------------------------------------------------


def test_it_rebuilds_each_ranks_lines_from_interleaved_tag_output_chunks():
    streams = training.rank_lines(fixture("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-tag-output.out"))
    assert set(streams) == {0, 1, None}
    for rank in (0, 1):
        assert "NUMA bind:   False" in streams[rank]
        assert "Data format: NHWC" in streams[rank]
        assert "Variables:   parameter_server" in streams[rank]
    assert streams[0][-2] == "total images/sec: 2.50"
    assert streams[1][-2] == "total images/sec: 3.12"


def test_it_drops_carriage_returns_and_control_bytes():
    streams = training.rank_lines(fixture("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-pty-crlf.out"))
    assert "total images/sec: 493.15" in streams[0]
    assert not any("\r" in line for lines in streams.values() for line in lines)
    assert training.clean("a\x1b[0mb\x00c\td\r\n") == "abc\td\n"


# --- tf_cnn_benchmarks: parsing ----------------------------------------------------------------------------------


def test_it_reads_a_single_process_tf_cnn_log_with_its_gpu_count_from_the_batch_header():
    metrics = parse("tf_cnn_benchmarks", "tf2.1-rocm-2gpu-replicated-lambda.log")
    assert value(metrics, "images_per_sec") == 634.88
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(634.88 / 2)  # 384 global / 192 per device
    assert names(metrics) == {"images_per_sec", "images_per_sec_per_gpu"}


def test_it_reads_horovod_tf_cnn_output_whose_ranks_interleave_without_tags():
    metrics = parse("tf_cnn_benchmarks", "tf1.14-horovod-2gpu-mpi-operator-readme.txt")
    assert value(metrics, "images_per_sec") == 308.27
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(308.27 / 2)  # horovod/gpu:0, horovod/gpu:1
    assert not [m for m in metrics if m.labels]  # untagged step lines cannot be told apart


def test_it_reads_per_rank_rates_from_tagged_tf_cnn_output():
    metrics = parse("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-tag-output.out")
    assert value(metrics, "images_per_sec", rank=0) == 2.5  # each rank's last step line
    assert value(metrics, "images_per_sec", rank=1) == 3.1
    assert value(metrics, "images_per_sec") == pytest.approx((2.50 + 3.12) / 2)  # the mean of the ranks' totals
    assert "images_per_sec_per_gpu" not in names(metrics)  # Devices: ['/cpu:0'] and no launch header


def test_it_reads_tf_cnn_output_written_through_a_pseudo_terminal():
    metrics = parse("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-pty-crlf.out")
    assert value(metrics, "images_per_sec", rank=0) == 497.9
    assert value(metrics, "images_per_sec", rank=1) == 441.9
    assert value(metrics, "images_per_sec") == pytest.approx((493.15 + 436.96) / 2)


def test_it_fails_an_interrupted_tf_cnn_run_for_its_missing_total():
    bench = get_benchmark("tf_cnn_benchmarks")
    metrics = parse("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-interrupted.out")
    assert value(metrics, "images_per_sec", rank=0) == 2.2
    assert "images_per_sec" not in names(metrics)
    problems = bench.missing(metrics, ["dgx2-1"])
    assert len(problems) == 1 and "images_per_sec" in problems[0] and "interrupted" in problems[0]


def test_it_refuses_output_without_any_tf_cnn_result():
    with pytest.raises(ParseError, match="total images/sec"):
        get_benchmark("tf_cnn_benchmarks").parse("Traceback (most recent call last):\nImportError: tensorflow\n")


def test_it_derives_storage_demand_from_the_launch_headers_record_size():
    text = header_line(kind="tf_cnn_benchmarks", ranks=2, gpus=2, record_size_bytes=115_000)
    text += fixture("tf_cnn_benchmarks", "tf2.1-rocm-2gpu-replicated-lambda.log")
    metrics = get_benchmark("tf_cnn_benchmarks").parse(text)
    assert value(metrics, "storage_mb_per_sec") == pytest.approx(634.88 * 115_000 / 1e6)  # 73.01 MB/s
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(317.44)


def test_it_divides_by_the_launch_headers_gpu_count_when_the_output_names_none():
    text = header_line(kind="tf_cnn_benchmarks", ranks=2, gpus=16)
    text += fixture("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-tag-output.out")
    metrics = get_benchmark("tf_cnn_benchmarks").parse(text)
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(2.81 / 16)


# --- horovod_synthetic: parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "total", "per_gpu"),
    [
        ("tf2-8gpu-tag-output-ocitutorials.txt", 4801.4, 600.2),
        ("tf2-16gpu-2nodes-ocitutorials.txt", 9279.7, 580.0),
        ("pytorch-4gpu-horovod-issue-712.txt", 432.8, 108.2),
    ],
)
def test_it_reads_horovod_synthetic_totals_and_the_printed_per_gpu_rate(name, total, per_gpu):
    metrics = parse("horovod_synthetic", name)
    assert value(metrics, "images_per_sec") == total
    assert value(metrics, "images_per_sec_per_gpu") == per_gpu
    assert names(metrics) == {"images_per_sec", "images_per_sec_per_gpu"}


def test_it_refuses_a_horovod_run_cut_before_its_result():
    lines = fixture("horovod_synthetic", "tf2-16gpu-2nodes-ocitutorials.txt").splitlines(keepends=True)
    with pytest.raises(ParseError, match="interrupted"):
        get_benchmark("horovod_synthetic").parse("".join(lines[:-2]))


# --- pytorch_resnet: parsing -------------------------------------------------------------------------------------


def test_it_reads_a_recent_dllogger_summary_with_world_size_and_epochs():
    metrics = parse("pytorch_resnet", "dle-4xh100-amp-2023-lambda.txt")
    assert value(metrics, "images_per_sec") == 10403.96  # Summary: train.total_ips
    assert value(metrics, "compute_images_per_sec") == 10406.84
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(10403.96 / 4)  # world_size : 4
    assert value(metrics, "images_per_sec", epoch=0) == 10340.62
    assert value(metrics, "images_per_sec", epoch=1) == 10467.29


def test_it_reads_the_2020_dllogger_format_with_img_per_s_units():
    metrics = parse("pytorch_resnet", "dle-8xa100-fp16-2020-lambda.txt")
    assert value(metrics, "images_per_sec") == 8344.18
    assert value(metrics, "compute_images_per_sec") == 8481.58  # from the second Summary line
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(8344.18 / 8)
    single = parse("pytorch_resnet", "dle-1080ti-amp-2020-lambda.txt")
    assert value(single, "images_per_sec_per_gpu") == value(single, "images_per_sec") == 248.10


def test_it_refuses_dllogger_output_that_stops_mid_epoch():
    with pytest.raises(ParseError, match="12 iterations.*interrupted"):
        parse("pytorch_resnet", "dle-4n8g-interrupted-dlperf-readme.txt")


def test_it_refuses_a_crashed_pytorch_run():
    with pytest.raises(ParseError, match="no DLLogger output"):
        parse("pytorch_resnet", "dle-p3.2xlarge-failed-2020-lambda.txt")


# --- mlperf_resnet: parsing --------------------------------------------------------------------------------------


def test_it_reads_an_mlperf_v07_run_from_its_mllog_events():
    metrics = parse("mlperf_resnet", "v0.7-nvidia-dgxa100-mxnet.txt")
    assert value(metrics, "time_to_train_min") == pytest.approx((1592671579019 - 1592669212356) / 60000)
    assert value(metrics, "eval_accuracy") == 0.76146
    assert value(metrics, "epochs") == 41
    # no throughput logged in v0.7: train_samples / (epoch_stop - epoch_start)
    assert value(metrics, "images_per_sec", epoch=1) == pytest.approx(1281167 * 1000 / (1592669278705 - 1592669215245))
    epochs = [m.value for m in metrics if m.name == "images_per_sec" and "epoch" in m.labels]
    assert len(epochs) == 41
    assert value(metrics, "images_per_sec") == pytest.approx(sum(epochs) / 41)
    assert "images_per_sec_per_gpu" not in names(metrics)  # the log does not say how many GPUs ran


def test_it_reads_the_v06_mll_format_through_mpirun_tags():
    metrics = parse("mlperf_resnet", "v0.6-nvidia-dgx2-mxnet-tag-output.txt")
    assert value(metrics, "time_to_train_min") == pytest.approx((1560852530.921 - 1560849031.334) / 60)
    assert value(metrics, "eval_accuracy") == 0.76322
    assert value(metrics, "epochs") == 60
    # v0.6 logs no train_samples: ImageNet's 1,281,167 training images
    assert value(metrics, "images_per_sec", epoch=1) == pytest.approx(1281167 / (1560849106.687 - 1560849034.730))


def test_it_takes_logged_per_epoch_throughput_when_mlperf_prints_it():
    v1 = parse("mlperf_resnet", "v1.0-nvidia-mxnet-pkb.txt")
    assert value(v1, "images_per_sec", epoch=1) == 18824.00323782711  # uncached first epoch (seed 002)
    assert value(v1, "images_per_sec", epoch=2) == 23765.156098491076
    assert value(v1, "time_to_train_min") == pytest.approx((1627332194930 - 1627330265629) / 60000)
    assert value(v1, "epochs") == 35
    v4 = parse("mlperf_resnet", "v4.0-nvidia-eos-mxnet.txt")
    assert value(v4, "images_per_sec", epoch=1) == 39026.39776853063  # tracked_stats {"throughput": ...}
    assert value(v4, "eval_accuracy") == 0.75936
    # :::SYSJSON: number_of_nodes 1 x accelerators_per_node 8
    assert value(v4, "images_per_sec_per_gpu") == pytest.approx(value(v4, "images_per_sec") / 8)


def test_it_times_blocks_of_epochs_when_a_log_has_no_epoch_events():
    metrics = parse("mlperf_resnet", "v0.7-google-gpu-v100-8-tf2.txt")
    first = value(metrics, "images_per_sec", epoch=1, epoch_count=3)
    assert first == pytest.approx(1281167 * 3 * 1000 / (1593155188793 - 1593154759901))
    assert value(metrics, "eval_accuracy") == pytest.approx(0.7595199942588806)
    assert value(metrics, "time_to_train_min") == pytest.approx((1593160053801 - 1593154759901) / 60000)


def test_it_fails_an_aborted_mlperf_run_and_says_why():
    bench = get_benchmark("mlperf_resnet")
    text = fixture("mlperf_resnet", "v0.7-nvidia-dgx1-mxnet-aborted.txt")
    metrics = bench.parse(text)
    assert value(metrics, "eval_accuracy") == 0.75886
    assert "time_to_train_min" not in names(metrics) and "epochs" not in names(metrics)
    assert value(metrics, "images_per_sec", epoch=1) > 0  # throughput still tells how the storage kept up
    problems = bench.missing(metrics, ["dgx1"])
    assert problems == ["expected metric time_to_train_min is missing from the run's output (it is only reported when "
                        "run_stop has status success)"]  # fmt: skip
    assert any("'aborted'" in p for p in bench.check({}, metrics, {"dgx1": text}))


def test_it_refuses_output_without_mlperf_events():
    with pytest.raises(ParseError, match="MLLOG"):
        get_benchmark("mlperf_resnet").parse("ENDING TIMING RUN AT 2020-06-20 09:46:35 AM\n")


# --- missing() and check() ---------------------------------------------------------------------------------------


def test_it_checks_the_runs_aggregate_not_each_host():
    bench = get_benchmark("tf_cnn_benchmarks")
    metrics = parse("tf_cnn_benchmarks", "tf2.1-rocm-2gpu-replicated-lambda.log")
    assert bench.missing(metrics, ["dgx2-1", "dgx2-2", "dgx2-3"]) == []
    assert bench.missing([], ["dgx2-1"]) == [
        "expected metric images_per_sec is missing from the run's output (was the run interrupted before it printed "
        "its result?)"
    ]


def test_it_reports_derived_metrics_it_could_not_compute():
    bench = get_benchmark("tf_cnn_benchmarks")
    metrics = parse("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-tag-output.out")
    problems = bench.check({"record_size_bytes": 115_000}, metrics, {})
    assert any("images_per_sec_per_gpu" in p for p in problems)
    assert any("storage_mb_per_sec" in p for p in problems)
    assert bench.check({"device": "cpu"}, metrics, {}) == []  # a CPU run has no per-GPU rate to miss
    complete = parse("tf_cnn_benchmarks", "tf2.1-rocm-2gpu-replicated-lambda.log")
    assert bench.check({}, complete, {}) == []


# --- building commands -------------------------------------------------------------------------------------------

SEED_000 = {
    "script": TF_CNN,
    "model": "resnet50",
    "batch_size": 256,
    "batch_group_size": 20,
    "num_batches": 1000,
    "distortions": False,
    "num_gpus": 1,
    "device": "gpu",
    "force_gpu_compatible": True,
    "data_format": "NCHW",
    "use_fp16": True,
    "use_tf_layers": True,
    "data_name": "imagenet",
    "use_datasets": True,
    "num_intra_threads": 1,
    "num_inter_threads": 40,
    "datasets_prefetch_buffer_size": 40,
    "datasets_num_private_threads": 4,
    "train_dir": "/mnt/isilon/data/train_dir/2019-10-24-14-53-59-resnet50",
    "sync_on_finish": True,
    "summary_verbosity": 1,
    "save_summaries_steps": 100,
    "save_model_secs": 600,
    "variable_update": "horovod",
    "horovod_device": "gpu",
    "data_source": "storage",
    "data_dirs_round_robin": True,
    "data_subdir": "data/imagenet-scratch/tfrecords-150x",
    "record_size_bytes": 115_000,
    "mpi_ssh_port": 2222,
    "mpi_pml": "ob1",
    "mpi_btl": "^openib",
    "mpi_btl_tcp_if_include": "enp53s0",
}


def split_launch(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """(the header, the mpirun argv) of a training command."""
    assert argv[:4] == ["sh", "-c", training.HEADER_SCRIPT, training.HEADER_TAG]
    assert argv[5] == "mpirun"
    return json.loads(argv[4]), argv[5:]


def test_it_builds_seed_000s_mpirun_command_on_the_primary_host():
    command = get_benchmark("tf_cnn_benchmarks").build(SEED_000, context(env=NCCL_ENV, mounts=MOUNTS))
    head, mpirun = split_launch(command.argv)
    assert head == {"kind": "tf_cnn_benchmarks", "ranks": 48, "gpus": 48, "record_size_bytes": 115_000}
    assert mpirun[: mpirun.index("python3")] == [
        "mpirun", "-n", "48", "--allow-run-as-root", "--host", "dgx2-1:16,dgx2-2:16,dgx2-3:16", "--report-bindings",
        "--bind-to", "none", "--map-by", "slot", "-x", "LD_LIBRARY_PATH", "-x", "PATH",
        "-mca", "plm_rsh_agent", "ssh", "-mca", "plm_rsh_args", "-p 2222",
        "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-mca", "btl_tcp_if_include", "enp53s0",
        "-x", "NCCL_DEBUG=INFO", "-x", "NCCL_IB_GID_INDEX=3", "-x", "NCCL_IB_HCA=mlx5", "-x", "NCCL_IB_SL=4",
        "-x", "NCCL_NET_GDR_READ=1", "-x", "NCCL_SOCKET_IFNAME=^docker0,lo",
    ]  # fmt: skip
    rank = mpirun[mpirun.index("python3") :]
    dirs = [f"/mnt/isilon{i}/data/imagenet-scratch/tfrecords-150x" for i in range(1, 17)]
    assert rank == [
        "python3", "./round_robin_mpi.py", "--dirs", *dirs, "--",
        "python", "-u", TF_CNN, "--model=resnet50", "--batch_size=256", "--batch_group_size=20",
        "--num_batches=1000", "--nodistortions", "--num_gpus=1", "--device=gpu", "--force_gpu_compatible=True",
        "--data_format=NCHW", "--use_fp16=True", "--use_tf_layers=True", "--data_name=imagenet",
        "--use_datasets=True", "--num_intra_threads=1", "--num_inter_threads=40",
        "--datasets_prefetch_buffer_size=40", "--datasets_num_private_threads=4",
        "--train_dir=/mnt/isilon/data/train_dir/2019-10-24-14-53-59-resnet50", "--sync_on_finish=True",
        "--summary_verbosity=1", "--save_summaries_steps=100", "--save_model_secs=600",
        "--variable_update=horovod", "--horovod_device=gpu", "--data_dir={data_dir}",
    ]  # fmt: skip
    assert set(command.files) == {"round_robin_mpi.py"} and command.env == {}


def test_it_runs_nothing_on_the_other_hosts():
    for kind, params in [
        ("tf_cnn_benchmarks", SEED_000),
        ("horovod_synthetic", {"script": "/horovod/examples/pytorch/pytorch_synthetic_benchmark.py"}),
        ("pytorch_resnet", {"script": "/workspace/rn50/main.py"}),
        ("mlperf_resnet", {"script": "/workspace/image_classification/train_imagenet.py", "data_dir": "/data"}),
    ]:
        assert get_benchmark(kind).build(params, context(index=1, mounts=MOUNTS)) is None, kind


def test_it_passes_no_data_dir_for_synthetic_data_and_one_for_a_single_mount():
    bench = get_benchmark("tf_cnn_benchmarks")
    synthetic = bench.build({"script": TF_CNN}, context()).argv
    assert synthetic[synthetic.index("python") :] == [
        "python", "-u", TF_CNN, "--model=resnet50", "--batch_size=64", "--num_batches=100", "--num_gpus=1",
        "--device=gpu", "--variable_update=horovod",
    ]  # fmt: skip
    cached = bench.build({"script": TF_CNN, "data_source": "storage", "data_dir": "/mnt/isilon1/tfrecords"}, context())
    assert cached.argv[-1] == "--data_dir=/mnt/isilon1/tfrecords"
    assert "./round_robin_mpi.py" not in cached.argv


def test_it_counts_gpus_as_ranks_times_gpus_per_rank():
    params = {"script": TF_CNN, "num_gpus": 4, "mpi_slots": 2}
    head, mpirun = split_launch(get_benchmark("tf_cnn_benchmarks").build(params, context()).argv)
    assert head["ranks"] == 6 and head["gpus"] == 24
    assert mpirun[:3] == ["mpirun", "-n", "6"] and "--num_gpus=4" in mpirun


def test_it_builds_the_horovod_synthetic_benchmark_command():
    params = {
        "script": "/horovod/examples/pytorch/pytorch_synthetic_benchmark.py",
        "python": "python3",
        "model": "resnet50",
        "batch_size": 64,
        "num_iters": 10,
        "fp16_allreduce": True,
        "use_adasum": False,
        "mpi_tag_output": True,
    }
    head, mpirun = split_launch(get_benchmark("horovod_synthetic").build(params, context(env=NCCL_ENV)).argv)
    assert head == {"kind": "horovod_synthetic", "ranks": 48, "gpus": 48}
    assert "--tag-output" in mpirun
    assert mpirun[mpirun.index("python3") :] == [
        "python3", "-u", "/horovod/examples/pytorch/pytorch_synthetic_benchmark.py",
        "--model", "resnet50", "--batch-size", "64", "--num-iters", "10", "--fp16-allreduce",
    ]  # fmt: skip


# DLLogger's JSON records (DLLL lines): NVIDIA/dllogger's own example log (2019, before "elapsedtime"), and the same
# records written again by dllogger 1.1.0 to /dev/stdout, as json_log makes main.py do (fixtures' SOURCES.md).


@pytest.mark.parametrize("name", ["dllogger-example-resnet-log-2019.json", "dllogger-1.1.0-replay-dev-stdout.txt"])
def test_it_reads_dllogger_json_records_unrounded_per_epoch_and_summary(name):
    metrics = parse("pytorch_resnet", name)
    assert value(metrics, "images_per_sec") == 661.9801574510492  # step []: the Summary
    assert value(metrics, "compute_images_per_sec") == 663.9765207522363  # its second record
    assert value(metrics, "images_per_sec", epoch=0) == 648.9330897795348  # step [0]
    assert value(metrics, "images_per_sec", epoch=1) == 675.0272251225636
    assert value(metrics, "images_per_sec_per_gpu") == 661.9801574510492  # PARAMETER world_size 1


def test_it_prefers_the_json_records_to_the_rounded_stdout_lines():
    text = fixture("pytorch_resnet", "dle-1080ti-amp-2020-lambda.txt")
    text += fixture("pytorch_resnet", "dllogger-example-resnet-log-2019.json")
    metrics = get_benchmark("pytorch_resnet").parse(text, host="dgx2-1")
    assert value(metrics, "images_per_sec") == 661.9801574510492


def test_it_refuses_json_records_that_stop_mid_epoch():
    lines = fixture("pytorch_resnet", "dllogger-example-resnet-log-2019.json").splitlines(keepends=True)
    with pytest.raises(ParseError, match="4 iterations.*interrupted"):
        get_benchmark("pytorch_resnet").parse("".join(lines[:11]), host="dgx2-1")


def test_it_asks_main_py_for_its_json_records_on_stdout():
    params = {"script": "/workspace/rn50/main.py", "json_log": True}
    _, mpirun = split_launch(get_benchmark("pytorch_resnet").build(params, context()).argv)
    assert mpirun[-2:] == ["--raport-file", "/dev/stdout"]
    _, plain = split_launch(get_benchmark("pytorch_resnet").build({"script": "/w/main.py"}, context()).argv)
    assert "--raport-file" not in plain


def test_it_builds_the_pytorch_resnet_command_with_torch_distributed_environment():
    params = {
        "script": "/workspace/rn50/main.py",
        "data_source": "storage",
        "data_dir": "/mnt/nfs/imagenet",
        "batch_size": 256,
        "epochs": 1,
        "prof": 100,
        "amp": True,
        "training_only": True,
    }
    head, mpirun = split_launch(get_benchmark("pytorch_resnet").build(params, context()).argv)
    assert head["gpus"] == 48
    assert mpirun[mpirun.index("MASTER_ADDR=dgx2-1") - 1 :][:2] == ["-x", "MASTER_ADDR=dgx2-1"]
    assert "MASTER_PORT=29500" in mpirun
    rank = mpirun[mpirun.index("sh") :]
    assert rank[:4] == ["sh", "-c", "export WORLD_SIZE=\"$OMPI_COMM_WORLD_SIZE\" RANK=\"$OMPI_COMM_WORLD_RANK\" "
                        "LOCAL_RANK=\"$OMPI_COMM_WORLD_LOCAL_RANK\"; exec \"$@\"", "rackbench-rank"]  # fmt: skip
    assert rank[4:] == [
        "python", "-u", "/workspace/rn50/main.py", "/mnt/nfs/imagenet", "--data-backend", "dali-cpu",
        "--epochs", "1", "--batch-size", "256", "--prof", "100", "--amp", "--training-only",
    ]  # fmt: skip


def test_it_builds_the_mlperf_command_reading_recordio_files_round_robin():
    params = {
        "script": "/workspace/image_classification/train_imagenet.py",
        "data_dirs_round_robin": True,
        "batch_size": 408,
        "kv_store": "horovod",
        "num_epochs": 37,
        "accuracy_threshold": 0.759,
        "dtype": "float16",
        "use_dali": True,
    }
    hosts = tuple(HostInfo(name=f"dgxa100-{i}", address=f"10.0.0.{i}", slots=8) for i in (1, 2, 3, 4))
    command = get_benchmark("mlperf_resnet").build(params, context(hosts=hosts, mounts=MOUNTS[:2]))
    head, mpirun = split_launch(command.argv)
    assert head == {"kind": "mlperf_resnet", "ranks": 32, "gpus": 32}
    assert mpirun[mpirun.index("python3") :] == [
        "python3", "./round_robin_mpi.py", "--dirs", "/mnt/isilon1", "/mnt/isilon2", "--",
        "python", "-u", "/workspace/image_classification/train_imagenet.py", "--batch-size", "408",
        "--kv-store", "horovod", "--num-epochs", "37", "--accuracy-threshold", "0.759", "--dtype", "float16",
        "--use-dali", "--data-train", "{data_dir}/train.rec", "--data-train-idx", "{data_dir}/train.idx",
        "--data-val", "{data_dir}/val.rec", "--data-val-idx", "{data_dir}/val.idx",
    ]  # fmt: skip


# --- validation --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("tf_cnn_benchmarks", {}, "script"),
        ("tf_cnn_benchmarks", {"script": "tf_cnn_benchmarks.py"}, "script"),
        ("tf_cnn_benchmarks", {"script": "/opt/../etc/tf.py"}, "script"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "model": "resnet50; rm -rf /"}, "model"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "batch_size": "256.5"}, "batch_size"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "batch_size": True}, "batch_size"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "use_fp16": "yes"}, "use_fp16"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "data_format": "nchw"}, "data_format"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "python": "bash"}, "python"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "eval": True}, "eval"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "data_source": "storage"}, "data_dir"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "data_dir": "/mnt/isilon1"}, "data_dir"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "data_source": "cache"}, "data_source"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "data_dirs_round_robin": True}, "data_dirs_round_robin"),
        (
            "tf_cnn_benchmarks",
            {"script": TF_CNN, "data_source": "storage", "data_dirs_round_robin": True, "data_subdir": "../etc"},
            "data_subdir",
        ),
        (
            "tf_cnn_benchmarks",
            {"script": TF_CNN, "data_dir": "/d", "data_source": "storage", "data_name": "cifar10"},
            "data_name",
        ),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "record_size_bytes": 0}, "record_size_bytes"),
        ("tf_cnn_benchmarks", {"script": TF_CNN, "mpi_pml": "ob1 --foo"}, "mpi_pml"),
        ("horovod_synthetic", {"script": "/horovod/examples/run.sh"}, "script"),
        ("horovod_synthetic", {"script": "/b.py", "data_source": "storage"}, "data_source"),
        ("horovod_synthetic", {"script": "/b.py", "model": "-h"}, "model"),
        ("pytorch_resnet", {"script": "/rn50/main.py", "data_backend": "dali-gpu"}, "data_backend"),
        ("pytorch_resnet", {"script": "/rn50/main.py", "master_port": 80}, "master_port"),
        ("mlperf_resnet", {"script": "/ic/train_imagenet.py"}, "data_dir"),
        ("mlperf_resnet", {"script": "/ic.py", "data_dir": "/d", "data_source": "synthetic"}, "data_source"),
        ("mlperf_resnet", {"script": "/ic.py", "data_dir": "/d", "lr_step_epochs": "30;60"}, "lr_step_epochs"),
    ],
)
def test_it_names_the_field_of_an_invalid_parameter(kind, params, field):
    with pytest.raises(ParamError) as caught:
        get_benchmark(kind).validate(params)
    assert caught.value.field == field


def test_it_refuses_several_ranks_without_horovod():
    with pytest.raises(ParamError) as caught:
        get_benchmark("tf_cnn_benchmarks").build({"script": TF_CNN, "variable_update": "replicated"}, context())
    assert caught.value.field == "variable_update"
    single = (HostInfo(name="n1", address="n1", slots=1),)
    params = {"script": TF_CNN, "variable_update": "replicated"}
    assert get_benchmark("tf_cnn_benchmarks").build(params, context(hosts=single)) is not None


def test_it_refuses_round_robin_without_mount_points():
    params = {"script": TF_CNN, "data_source": "storage", "data_dirs_round_robin": True}
    with pytest.raises(ParamError) as caught:
        get_benchmark("tf_cnn_benchmarks").build(params, context(mounts=()))
    assert caught.value.field == "data_dirs_round_robin"


def test_it_refuses_a_run_without_hosts():
    with pytest.raises(ParamError) as caught:
        get_benchmark("horovod_synthetic").build({"script": "/b.py"}, context(hosts=()))
    assert caught.value.field == "nodes"


# --- a real mpirun ------------------------------------------------------------------------------------------------

REPLAY = """\
import os, sys, time
for line in open(sys.argv[1] + "/rank" + os.environ["OMPI_COMM_WORLD_RANK"] + ".txt"):
    print(line, end="")
    time.sleep(0.001)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_it_launches_through_a_real_mpirun_and_reads_its_tagged_output(tmp_path):
    """The built command run for real (header preamble, mpirun and its options, 2 local ranks), with each rank
    replaying its own lines of the real 2-rank tf_cnn_benchmarks output in place of TensorFlow."""
    streams = training.rank_lines(fixture("tf_cnn_benchmarks", "tf2.21-cpu-mpirun-2ranks-tag-output.out"))
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.txt").write_text("".join(f"{line}\n" for line in streams[rank]))
    (tmp_path / "replay.py").write_text(REPLAY)
    params = {"script": TF_CNN, "mpi_tag_output": True, "record_size_bytes": 110_000, "device": "cpu"}
    local = (HostInfo(name="local", address="127.0.0.1", slots=2),)
    command = get_benchmark("tf_cnn_benchmarks").build(params, context(hosts=local, env={"NCCL_DEBUG": "INFO"}))
    argv = command.argv[: command.argv.index("python")] + [sys.executable, str(tmp_path / "replay.py"), str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{training.HEADER_TAG}: ")
    assert "[1,1]<stdout>:" in done.stdout
    metrics = get_benchmark("tf_cnn_benchmarks").parse(done.stdout, host="local")
    assert value(metrics, "images_per_sec", rank=0) == 2.5
    assert value(metrics, "images_per_sec", rank=1) == 3.1
    assert value(metrics, "images_per_sec") == pytest.approx(2.81)
    assert value(metrics, "images_per_sec_per_gpu") == pytest.approx(2.81 / 2)  # 2 ranks x 1 GPU, from the header
    assert value(metrics, "storage_mb_per_sec") == pytest.approx(2.81 * 110_000 / 1e6)


WRAPPER = Path(__file__).parent.parent / "plugins" / "tools" / "round_robin_mpi.py"


@pytest.mark.skipif(shutil.which("mpirun") is None or not WRAPPER.exists(), reason="needs mpirun and the wrapper")
def test_it_gives_each_rank_its_round_robin_data_directory_through_the_real_wrapper(tmp_path):
    shutil.copy(WRAPPER, tmp_path / "round_robin_mpi.py")
    params = {"script": TF_CNN, "data_source": "storage", "data_dirs_round_robin": True, "data_subdir": "tfrecords"}
    params["mpi_tag_output"] = True
    local = (HostInfo(name="local", address="127.0.0.1", slots=2),)
    argv = get_benchmark("tf_cnn_benchmarks").build(params, context(hosts=local, mounts=("/mnt/a", "/mnt/b"))).argv
    program = argv.index("python")  # the wrapper's command: python -u tf_cnn_benchmarks.py ... --data_dir={data_dir}
    argv[program : program + 3] = [sys.executable, "-c", "import sys; print(sys.argv[-1])"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    streams = training.rank_lines(done.stdout)
    assert streams[0] == ["--data_dir=/mnt/a/tfrecords"]
    assert streams[1] == ["--data_dir=/mnt/b/tfrecords"]


def test_the_round_robin_wrapper_travels_with_the_run() -> None:
    from plugins.benchmarks.base import HostContext, HostInfo, get_benchmark

    host = HostContext(
        node="n1",
        index=0,
        run_dir="/r",
        data_dir="/d",
        hosts=(HostInfo("n1", "10.0.0.1", 8),),
        mounts=("/mnt/a/0", "/mnt/a/1"),
    )
    params = {
        "script": "/opt/tf_cnn_benchmarks.py",
        "data_source": "storage",
        "data_dirs_round_robin": True,
        "data_subdir": "imagenet",
    }

    command = get_benchmark("tf_cnn_benchmarks").build(params, host)

    assert "./round_robin_mpi.py" in command.argv
    assert "execvp" in command.files["round_robin_mpi.py"]


def test_a_training_run_can_check_the_nccl_transport_like_seed_000() -> None:
    from pathlib import Path

    from plugins.benchmarks.base import HostContext, HostInfo, get_benchmark

    nccl = Path(__file__).parent / "fixtures" / "nccl"
    tf = get_benchmark("tf_cnn_benchmarks")
    params = {"script": "/opt/tf_cnn_benchmarks.py", "expect_transport": "NET/IB/GDRDMA"}
    hosts = (HostInfo("a", "10.0.0.1", 8), HostInfo("b", "10.0.0.2", 8))
    tf.validate(params)

    command = tf.build(params, HostContext(node="a", index=0, run_dir="/r", data_dir="/d", hosts=hosts))

    assert "NCCL_DEBUG=INFO" in command.argv
    socket_log = {"a": (nccl / "issue-nccl-tests-166-socket-and-shm.txt").read_text()}
    gdrdma_log = {"a": (nccl / "issue-nccl-1357-ibext-gdrdma-p2p-cumem.txt").read_text()}
    assert any("NET/Socket" in p for p in tf.check(params, [], socket_log))
    assert not [p for p in tf.check(params, [], gdrdma_log) if "NET/" in p]
