"""One meaning per YAML value: the shared validators (common/parameters.py), and every plug-in reading a boolean, an
integer and a size by the same rule."""

from __future__ import annotations

from typing import Any

import pytest

from common import parameters
from plugins.benchmarks.base import ParamError, get_benchmark

TF_CNN = "/opt/benchmarks/tf_cnn_benchmarks.py"

# kind -> (parameters that make a valid run, a boolean parameter, an integer parameter)
PLUGINS: dict[str, tuple[dict[str, Any], str, str]] = {
    "fio": ({"rw": "read"}, "direct", "numjobs"),
    "iperf3": ({}, "reverse", "parallel"),
    "iperf2": ({}, "reverse", "parallel"),
    "ior": ({}, "file_per_proc", "iterations"),
    "mdtest": ({}, "unique_dir", "files_per_rank"),
    "storage_read": ({}, "drop_cache", "batch_size"),
    "tf_cnn_benchmarks": ({"script": TF_CNN}, "use_fp16", "batch_size"),
    "pytorch_resnet": ({"script": "/opt/resnet/main.py"}, "amp", "batch_size"),
    "nccl": ({}, "mpi_tag_output", "iters"),
    "perftest": ({}, "rdma_cm", "iterations"),
    "mlperf_resnet": ({"script": "/opt/mlperf/train.py", "data_dir": "/data"}, "mpi_tag_output", "batch_size"),
}
BOOLEANS_ACCEPTED = [(True, True), (False, False), ("true", True), ("false", False), (1, True), (0, False)]
BOOLEANS_REFUSED = ["TRUE", "True", "yes", "no", "on", 2, -1, 1.0, "", None]
INTEGERS_ACCEPTED = [(20, 20), ("20", 20), ("+20", 20)]
INTEGERS_REFUSED = [20.0, 20.5, "20.0", "twenty", "20k", True, False, "", None]


@pytest.mark.parametrize(("value", "expected"), BOOLEANS_ACCEPTED)
def test_it_reads_the_same_booleans(value, expected):
    assert parameters.boolean(value) is expected


@pytest.mark.parametrize("value", BOOLEANS_REFUSED)
def test_it_refuses_every_other_boolean(value):
    with pytest.raises(ValueError, match="true or false"):
        parameters.boolean(value)


@pytest.mark.parametrize(("value", "expected"), INTEGERS_ACCEPTED)
def test_it_reads_the_same_integers(value, expected):
    assert parameters.integer(1, 100)(value) == expected


@pytest.mark.parametrize("value", INTEGERS_REFUSED)
def test_it_refuses_every_other_integer(value):
    with pytest.raises(ValueError, match="whole number"):
        parameters.integer(1, 100)(value)


def test_sizes_and_durations_mean_the_same_bytes_and_seconds():
    assert [parameters.size_bytes(parameters.size()(v)) for v in (4096, "4k", "4K", "1m", "1G")] == [
        4096,
        4096,
        4096,
        2**20,
        2**30,
    ]
    assert parameters.size(units="kmg", iec=True)("4KiB") == "4KiB"
    with pytest.raises(ValueError, match="size in bytes"):
        parameters.size(units="kmg")("4KiB")
    with pytest.raises(ValueError, match="from 1 to"):
        parameters.size()(0)
    assert [parameters.duration_seconds(v) for v in (30, "30s", "500ms", "2m")] == [30, 30, 0.5, 120]
    with pytest.raises(ValueError, match="duration"):
        parameters.duration(units=("s",))("2m")


def test_checked_names_the_field():
    with pytest.raises(ParamError) as caught:
        parameters.checked("numjobs", parameters.integer(1, 4), 9)
    assert caught.value.field == "numjobs"
    assert "from 1 to 4" in caught.value.message


@pytest.mark.parametrize("kind", sorted(PLUGINS))
def test_every_plugin_reads_booleans_by_the_one_rule(kind):
    base, flag, _ = PLUGINS[kind]
    benchmark = get_benchmark(kind)
    for value, _expected in BOOLEANS_ACCEPTED:
        benchmark.validate({**base, flag: value})
    for value in BOOLEANS_REFUSED:
        if value is None:
            continue
        with pytest.raises(ParamError) as caught:
            benchmark.validate({**base, flag: value})
        assert caught.value.field == flag, (kind, value)


@pytest.mark.parametrize("kind", sorted(PLUGINS))
def test_every_plugin_reads_integers_by_the_one_rule(kind):
    base, _, number = PLUGINS[kind]
    benchmark = get_benchmark(kind)
    for value, _expected in INTEGERS_ACCEPTED:
        benchmark.validate({**base, number: value})
    for value in INTEGERS_REFUSED:
        if value is None:
            continue
        with pytest.raises(ParamError) as caught:
            benchmark.validate({**base, number: value})
        assert caught.value.field == number, (kind, value)


def test_the_plugins_keep_no_validators_of_their_own():
    """The per-plug-in Check aliases and boolean/integer readers are gone: each reads values through the one module."""
    from plugins.benchmarks import fio, iperf, training

    for module in (fio, iperf, training):
        assert not hasattr(module, "Check"), module.__name__
    assert not hasattr(training, "boolean") and not hasattr(training, "integer")
