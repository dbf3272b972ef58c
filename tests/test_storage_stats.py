"""A storage system's statistics command during runs: the parser on real ``isi statistics`` output, and a real fio
run on the lab while a lab node, standing in for the storage system's admin endpoint, prints that output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from campaigns import services
from campaigns.models import CampaignStatus
from plugins.tools import isi_statistics
from runners import remote
from runners.samplers import storage_dir, storage_script
from telemetry.models import Series, SeriesSource
from tests.conftest import finished, group_alive

# Real output of `isi statistics system --nodes all --format top` (seed 001, Dell EMC's Isilon/DGX-2 appendix),
# blank lines of the document's extraction included.
SAMPLE = Path(__file__).parent / "data" / "isi_statistics_system_top.txt"


def test_it_reads_isi_statistics_system_top_output() -> None:
    table = isi_statistics.parse_system_top(SAMPLE.read_text())
    assert len(table) == 11 * 5  # 11 columns for All and nodes 1-4
    assert table[("CPU", "All")] == 72.7 and table[("CPU", "4")] == 59.2
    assert table[("NetOut", "1")] == 2.9e9 and table[("NetIn", "2")] == pytest.approx(3.2e6)
    assert table[("Total", "All")] == 10.0e9 and table[("SMB", "3")] == 0.0


def test_it_cuts_the_loops_output_into_series_per_column_and_node() -> None:
    text = SAMPLE.read_text()
    stream = f"{isi_statistics.MARKER} 1700000000\n{text}{isi_statistics.MARKER} 1700000005\n{text}"
    stream += f"{isi_statistics.MARKER} 1700000010\nNode   CPU   SMB\n  1 12.0%"  # cut off when stopped
    series = {(s.name, s.labels["node"]): s for s in isi_statistics.parse_stream(stream)}
    cpu = series[("storage.cpu", "All")]
    assert (cpu.unit, cpu.timestamps_ns, cpu.values) == (
        "%",
        [1_700_000_000 * 10**9, 1_700_000_005 * 10**9],
        [72.7] * 2,
    )
    assert series[("storage.disk_out", "4")].unit == "B/s" and series[("storage.disk_out", "4")].values == [2.9e9] * 2
    assert len(series) == 55


def test_it_says_why_output_in_another_format_cannot_be_read() -> None:
    with pytest.raises(isi_statistics.StatsParseError, match="no 'Node CPU ...' header"):
        isi_statistics.parse_stream(f"{isi_statistics.MARKER} 1700000000\nNFS3 Operations Per Second\n")
    with pytest.raises(isi_statistics.StatsParseError, match="no @@rackbench-sample line"):
        isi_statistics.parse_stream(SAMPLE.read_text())


def test_the_loop_is_plain_sh_and_quotes_the_command() -> None:
    script = storage_script("isi statistics system --nodes 'all'", 2.5, 900)
    assert "  isi statistics system --nodes all\n  sleep 2.5\n" in script and "$(date +%s)" in script
    assert "%N" not in script  # FreeBSD's date has no nanoseconds


@pytest.mark.lab
@pytest.mark.worker
def test_a_run_records_the_storage_systems_statistics(lab: dict[str, Any], worker: Any) -> None:
    # An Isilon cannot exist here: lab1 (the lab storage's admin endpoint) runs a fake `isi` that prints the real
    # sample; rackbench's loop stamps each output with the time, as it would on a real cluster.
    fake = lab["dir"] / "isi"
    (lab["dir"] / "isi_sample.txt").write_text(SAMPLE.read_text())
    fake.write_text(f"#!/bin/sh\ncat {lab['dir'] / 'isi_sample.txt'}\n")
    fake.chmod(0o755)
    storage = lab["storage"]
    storage.stats_command = f"{fake} statistics system --nodes all --format top"
    storage.stats_interval_s = 1.0
    storage.save()
    data = {
        "name": "isi-fio", "kind": "fio", "nodes": ["lab1"], "storage": storage.name, "repetitions": 1,
        "timeout": 120, "fixed": {"rw": "read", "bs": "64k", "size": "8M", "runtime": 4, "time_based": 1},
        "telemetry": {"interval": "1s", "groups": ["cpu"]},
    }  # fmt: skip
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    run = campaign.runs.get()
    stored = Series.objects.filter(run=run, source=SeriesSource.STORAGE)
    assert stored.count() == 55 and set(stored.values_list("host", flat=True)) == {storage.name}
    cpu = stored.get(name="storage.cpu", labels={"node": "All"})
    assert cpu.unit == "%" and cpu.interval_ns == 10**9 and cpu.sample_count >= 3  # 4 s of fio, every second
    assert run.started_at and run.finished_at
    assert run.started_at.timestamp() - 1 <= cpu.first_ns / 1e9 and cpu.last_ns / 1e9 <= run.finished_at.timestamp()
    out = run.results.get(name="storage.net_out.max", host=storage.name, labels={"node": "1"})
    assert (out.value, out.unit) == (2.9e9, "B/s")
    assert run.provenance["telemetry"]["collected"]["storage"]["series"] == 55
    assert not run.provenance["telemetry"]["warnings"]
    assert Series.objects.filter(run=run, source=SeriesSource.SAMPLER, name="cpu.util").exists()

    pid = remote.storage_target(storage).get(f"{storage_dir(run)}/pid")
    assert pid and not group_alive(int(pid))  # the loop was stopped with the run


@pytest.mark.lab
@pytest.mark.worker
def test_statistics_that_cannot_be_read_are_a_warning_not_a_failure(lab: dict[str, Any], worker: Any) -> None:
    storage = lab["storage"]
    storage.stats_command = "echo NFS3 Operations Per Second"  # a format rackbench does not read
    storage.save()
    data = {
        "name": "isi-unreadable", "kind": "fio", "nodes": ["lab1"], "storage": storage.name, "repetitions": 1,
        "timeout": 120, "fixed": {"rw": "read", "bs": "64k", "size": "8M"}, "telemetry": {"groups": ["cpu"]},
    }  # fmt: skip
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    (warning,) = campaign.runs.get().provenance["telemetry"]["warnings"]
    assert warning.startswith("storage: 'echo NFS3 Operations Per Second' on lab-local: no 'Node CPU ...' header")
