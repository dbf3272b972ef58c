"""The nvidia_smi telemetry parser, on real nvidia-smi --query-gpu and dmon recordings (fixtures/nvidia_smi/SOURCES.md;
two files of fixtures/facts are read, not changed)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest

from plugins.benchmarks.base import HostContext, Metric, ParamError, ParseError, get_benchmark
from plugins.benchmarks.nvidia_smi import parse_query

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
FACTS = Path(__file__).parent / "fixtures" / "facts"


@pytest.fixture
def smi():
    return get_benchmark("nvidia_smi")


def text(name: str, where: Path = FIXTURES) -> str:
    return (where / name).read_bytes().decode()


def value(metrics: list[Metric], name: str, host: str = "h1", **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == host and m.labels == labels]
    assert len(found) == 1, (name, host, labels, found)
    return found[0]


def names(metrics: list[Metric], **labels: Any) -> set[str]:
    return {m.name for m in metrics if m.labels == labels}


def column(csv_text: str, header: str, unit: str) -> list[float]:
    """One column of a --query-gpu CSV, read independently of the parser: csv module, unit suffix removed."""
    rows = list(csv.DictReader(io.StringIO(csv_text), skipinitialspace=True))
    return [float(row[header].removesuffix(unit).strip()) for row in rows]


def test_it_is_a_parser_only_kind_that_no_campaign_can_run(smi):
    with pytest.raises(ParamError) as caught:
        smi.validate({})
    assert caught.value.field == "kind" and "telemetry sampler" in caught.value.message
    with pytest.raises(ParamError):
        smi.build({}, HostContext(node="n1", index=0, run_dir="/r", data_dir="/d"))


def test_it_gives_every_parsed_metric_its_declared_unit(smi):
    for path in sorted(FIXTURES.iterdir()):
        if path.name.startswith(("query-gpu", "dmon")):  # the nvlink files are the telemetry sampler's
            for metric in smi.parse(text(path.name), host="h1"):
                assert metric.unit == smi.spec(metric.name).unit, (path.name, metric)


# --- --query-gpu --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "query-gpu-h100-80gb-hbm3-load-590.48.01.csv",
            {"gpu_util_percent": 100, "mem_util_percent": 11, "memory_used_mib": 19818, "power_w": 631.95},
        ),
        (
            "query-gpu-h200-load-590.48.01.csv",
            {"gpu_util_percent": 100, "memory_used_mib_max": 32362, "sm_clock_mhz": 1980, "temperature_c": 52},
        ),
    ],
)
def test_it_finds_its_columns_by_name_in_a_212_column_capture(smi, name, expected):
    metrics = smi.parse(text(name), host="h1")
    assert {key: value(metrics, key, gpu=0) for key in expected} == pytest.approx(expected)
    assert value(metrics, "samples", gpu=0) == 1


def test_it_reads_clocks_sm_under_its_printed_name_clocks_current_sm(smi):
    metrics = smi.parse(text("query-gpu-h100-80gb-hbm3-load-590.48.01.csv"), host="h1")
    assert value(metrics, "sm_clock_mhz_max", gpu=0) == 1980


def test_it_leaves_out_what_a_mig_gpu_reports_as_not_available(smi):
    metrics = smi.parse(text("query-gpu-h100-mig-load-590.48.01.csv"), host="h1")
    assert "gpu_util_percent" not in names(metrics, gpu=0)
    assert "mem_util_percent" not in names(metrics, gpu=0)
    assert value(metrics, "power_w", gpu=0) == pytest.approx(433.78)
    assert value(metrics, "memory_used_mib", gpu=0) == 11125


def test_it_averages_a_one_second_loop_per_gpu(smi):
    csv_text = text("query-gpu-loop-v100s-miris.csv")
    metrics = smi.parse(csv_text, host="h1")
    util = column(csv_text, "utilization.gpu [%]", "%")
    memory = column(csv_text, "memory.used [MiB]", "MiB")
    assert value(metrics, "samples", gpu=0) == len(util) == 107
    assert value(metrics, "gpu_util_percent", gpu=0) == pytest.approx(fmean(util))
    assert value(metrics, "gpu_util_percent_max", gpu=0) == max(util) == 19
    assert value(metrics, "memory_used_mib_max", gpu=0) == max(memory) == 1094
    assert value(metrics, "temperature_c_max", gpu=0) == 29
    assert "power_w" not in names(metrics, gpu=0)  # not queried


def test_it_takes_a_recording_without_an_index_column_as_one_gpu(smi):
    csv_text = text("query-gpu-loop-rtx4090-vlm-head.csv")
    metrics = smi.parse(csv_text, host="h1")
    power = column(csv_text, "power.draw [W]", "W")
    assert value(metrics, "power_w", gpu=0) == pytest.approx(fmean(power))
    assert value(metrics, "power_w_max", gpu=0) == pytest.approx(max(power))
    assert value(metrics, "power_w_total") == pytest.approx(fmean(power))
    assert value(metrics, "mem_util_percent_max") == 87


# The --query-gpu argument of the command that printed facts/nvidia_smi_noheader_nounits_rtx_2080.csv.
RTX_2080_QUERY = (
    "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,gpu_uuid,"
    "power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,"
    "utilization.gpu,utilization.memory,fan.speed,pcie.link.width.current,pstate"
)


def test_it_reads_noheader_nounits_output_with_the_fields_it_was_asked_for():
    gpus = parse_query(text("nvidia_smi_noheader_nounits_rtx_2080.csv", FACTS), RTX_2080_QUERY.split(","))
    [(key, series)] = gpus.items()
    assert key == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"  # no index column: the UUID names the GPU
    assert dict(series.values) == {
        "power_w": [176.98],
        "temperature_c": [45.0],
        "sm_clock_mhz": [1965.0],
        "gpu_util_percent": [86.0],
        "mem_util_percent": [55.0],
    }


def test_it_starts_over_at_a_header_printed_again(smi):
    both = text("query-gpu-h100-80gb-hbm3-load-590.48.01.csv") + text("query-gpu-loop-v100s-miris.csv")
    metrics = smi.parse(both, host="h1")
    assert value(metrics, "samples", gpu=0) == 108
    assert value(metrics, "memory_used_mib_max", gpu=0) == 19818


# --- dmon ---------------------------------------------------------------------------------------------------------


def test_it_reads_dmon_of_a_loaded_h100(smi):
    metrics = smi.parse(text("dmon-h100-80gb-hbm3-load-590.48.01.txt"), host="h1")
    assert value(metrics, "samples", gpu=0) == 5
    assert value(metrics, "gpu_util_percent", gpu=0) == 100
    assert value(metrics, "mem_util_percent", gpu=0) == pytest.approx(fmean([10, 10, 9, 9, 9]))
    assert value(metrics, "power_w", gpu=0) == pytest.approx(fmean([631, 634, 633, 634, 636]))
    assert value(metrics, "power_w_max", gpu=0) == 636
    assert value(metrics, "sm_clock_mhz", gpu=0) == 1980  # pclk
    assert value(metrics, "temperature_c_max", gpu=0) == 65  # gtemp, not mtemp


def test_it_leaves_out_dmon_dashes(smi):
    metrics = smi.parse(text("dmon-h100-mig-load-590.48.01.txt"), host="h1")
    assert "gpu_util_percent" not in names(metrics, gpu=0)
    assert value(metrics, "power_w", gpu=0) == pytest.approx(fmean([438, 440, 437, 439, 439]))


def test_it_reads_dmon_with_date_and_time_columns_and_a_blank_line(smi):
    metrics = smi.parse(text("dmon-o-TD-mutc-xuesongtap.txt"), host="h1")
    assert value(metrics, "samples", gpu=0) == 6
    assert value(metrics, "memory_used_mib_max", gpu=0) == 478  # fb
    assert value(metrics, "gpu_util_percent", gpu=0) == pytest.approx(fmean([6, 0, 3, 13, 0, 3]))
    assert "power_w" not in names(metrics, gpu=0)  # -s mutc has no pwr column


def test_it_reads_each_gpu_of_a_two_gpu_dmon_and_the_host_over_both(smi):
    metrics = smi.parse(text("dmon-2gpu-k40m-hekun.txt"), host="h1")
    assert value(metrics, "gpu_util_percent", gpu=0) == 0
    assert value(metrics, "gpu_util_percent", gpu=1) == 97
    assert value(metrics, "gpu_util_percent") == pytest.approx(48.5)
    assert value(metrics, "gpu_util_percent_max") == 97
    assert value(metrics, "power_w_total") == 43 + 42
    assert value(metrics, "samples") == 2


def test_it_starts_over_at_a_dmon_header_printed_again(smi):
    both = text("dmon-h100-80gb-hbm3-load-590.48.01.txt") + text("dmon-o-TD-mutc-xuesongtap.txt")
    metrics = smi.parse(both, host="h1")
    assert value(metrics, "samples", gpu=0) == 11
    assert value(metrics, "memory_used_mib_max", gpu=0) == 478


# --- failures and aggregation -------------------------------------------------------------------------------------


def test_it_refuses_what_nvidia_smi_prints_without_a_driver(smi):
    with pytest.raises(ParseError, match="couldn't communicate with the NVIDIA driver"):
        smi.parse(text("nvidia_smi_driver_failure.txt", FACTS), host="h1")
    with pytest.raises(ParseError):
        smi.parse("", host="h1")


def test_it_requires_samples_from_every_host(smi):
    metrics = smi.parse(text("dmon-2gpu-k40m-hekun.txt"), host="h1")
    assert smi.missing(metrics, ["h1"]) == []
    assert smi.missing(metrics, ["h1", "h2"]) == ["h2: expected metric samples is missing from the output"]


def test_it_aggregates_hosts_into_means_maxima_and_summed_power(smi):
    per_host = smi.parse(text("query-gpu-h100-80gb-hbm3-load-590.48.01.csv"), host="h1") + smi.parse(
        text("query-gpu-h200-load-590.48.01.csv"), host="h2"
    )
    run = smi.aggregate(per_host)
    assert value(run, "power_w_total", host="") == pytest.approx(631.95 + 627.4)
    assert value(run, "memory_used_mib", host="") == pytest.approx((19818 + 32362) / 2)
    assert value(run, "memory_used_mib_max", host="") == 32362
    assert value(run, "samples", host="") == 2
    assert all(m.labels == {} for m in run)
