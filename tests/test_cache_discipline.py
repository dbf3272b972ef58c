"""Provable cache discipline: fio's data laid out before the flush, the page cache recorded around each flush, and
runs that read from the wrong place (page cache vs storage) flagged on the run, in the API and in verdicts."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from campaigns import baselines, selectors, services
from campaigns.models import CampaignStatus, Run, RunStatus
from inventory.services import node_upsert
from plugins import cache
from plugins.benchmarks.base import HostContext, HostInfo, get_benchmark
from tests.conftest import finished

TELEMETRY = Path(__file__).parent / "fixtures" / "telemetry"
FIO = Path(__file__).parent / "fixtures" / "fio"
MIB = 1024**2


def snapshot_text(*, meminfo: str, diskstats: str, mountstats: str, blocks: str) -> str:
    """SNAPSHOT_COMMAND's output, made of real /proc files."""
    parts = {
        "/proc/sys/kernel/random/boot_id": "c011b868-f929-408b-98e1-4ba137704465\n",
        "/proc/meminfo": (TELEMETRY / meminfo).read_text(),
        "/proc/diskstats": (TELEMETRY / diskstats).read_text(),
        "/proc/self/mountstats": (TELEMETRY / mountstats).read_text(),
        "/sys/block": blocks,
    }
    files = "\n".join(f"==> {name} <==\n{text}" for name, text in parts.items() if name != "/sys/block")  # tail's heads
    return f"{files}==> /sys/block\n{parts['/sys/block']}"


def test_a_snapshot_reads_the_page_cache_less_shared_memory_and_the_whole_disks_and_nfs_reads() -> None:
    text = snapshot_text(
        meminfo="proc_meminfo_local_vm.txt",
        diskstats="proc_diskstats_local_vm.txt",
        mountstats="mountstats_nfs4_prometheus_procfs.txt",
        blocks="loop0\nloop1\nvda\nzram0\n",
    )
    found = cache.parse_snapshot(text)
    assert found.boot_id == "c011b868-f929-408b-98e1-4ba137704465"
    assert found.cached == (511756 - 84272) * 1024  # Cached less Shmem: the page cache of files
    assert found.droppable == found.cached - found.mapped > 0  # what a flush can drop: not mapped by a process
    assert found.dirty == 2204 * 1024 and found.writeback == 0
    assert found.disk_read == 72926370 * 512  # vda's sectors read; loop and zram devices left out
    assert found.nfs_read == 1210214218  # the server-read bytes of the NFS mount
    assert cache.Snapshot.from_dict(found.as_dict()) == found


def test_a_snapshot_without_meminfo_is_refused() -> None:
    with pytest.raises(ValueError, match="Cached"):
        cache.parse_snapshot("==> /proc/meminfo\n")


def snap(cached: int = 0, disk_read: int = 0, boot_id: str = "k1", mapped: int = 0) -> cache.Snapshot:
    return cache.Snapshot(boot_id=boot_id, cached=cached, mapped=mapped, dirty=0, writeback=0, disk_read=disk_read,
                          nfs_read=0)  # fmt: skip


def test_a_flush_that_left_most_of_the_page_cache_is_flagged_and_one_that_emptied_it_is_not() -> None:
    assert cache.flush_flags("n1", snap(cached=4096 * MIB), snap(cached=40 * MIB)) == []
    [flag] = cache.flush_flags("n1", snap(cached=4096 * MIB), snap(cached=3900 * MIB))
    assert flag["code"] == "flush-left-cache"
    assert "on n1 did not take effect: 3.81 GiB cached after it, 4.00 GiB before" in flag["message"]
    assert cache.flush_flags("n1", snap(cached=200 * MIB), snap(cached=190 * MIB)) == []  # too little to matter
    # what running processes map stays whatever the flush does (351 MiB here, on a busy development machine)
    assert (
        cache.flush_flags("n1", snap(cached=555 * MIB, mapped=500 * MIB), snap(cached=351 * MIB, mapped=500 * MIB))
        == []
    )


def test_a_jobs_own_io_accounting_is_preferred_to_the_hosts_counters_with_nfs_reads_added() -> None:
    text = "rchar: 335614911\nwchar: 1975\nsyscr: 149\nsyscw: 3\nread_bytes: 81133568\nwrite_bytes: 0\n"
    io = cache.parse_proc_io(text)  # as cat /proc/<pid>/io prints it (Linux 6.x)
    assert io["rchar"] == 335614911 and io["read_bytes"] == 81133568
    assert cache.parse_proc_io("cat: /proc/1/io: Permission denied") == {}
    start = {"lab1": snap(disk_read=100 * MIB), "lab2": snap(disk_read=100 * MIB)}
    end = {"lab1": snap(disk_read=9000 * MIB), "lab2": snap(disk_read=9000 * MIB)}  # another process read a lot
    processes = {"lab1": {"read_bytes": 48 * MIB}, "lab2": {"read_bytes": 50 * MIB}}
    assert cache.storage_reads(start, end, processes) == (98 * MIB, "the job's own I/O accounting")
    end = {h: replace(s, nfs_read=s.nfs_read + 10 * MIB) for h, s in end.items()}  # one kernel, counted once
    assert cache.storage_reads(start, end, processes)[0] == 108 * MIB
    assert cache.storage_reads(start, end, None) == (8910 * MIB, "the hosts' disk and NFS counters")


def test_hosts_that_share_a_kernel_count_its_storage_reads_once() -> None:
    start = {"lab1": snap(disk_read=100 * MIB), "lab2": snap(disk_read=100 * MIB)}
    end = {"lab1": snap(disk_read=164 * MIB), "lab2": snap(disk_read=164 * MIB)}
    assert cache.storage_read_between(start, end) == 64 * MIB
    end["lab2"] = snap(disk_read=164 * MIB, boot_id="k2")  # rebooted meanwhile: the counters say nothing
    assert cache.storage_read_between(start, end) is None


@pytest.mark.parametrize(
    ("expect", "storage_read", "code"),
    [
        ("storage", 64 * MIB, ""),  # read it all from storage
        ("storage", 8 * MIB, "cache-hits"),  # 12.5% from storage: the rest came from a cache
        ("cache", 1 * MIB, ""),
        ("cache", 32 * MIB, "storage-reads"),  # half from storage in a run meant to read the page cache
        ("", 0, ""),  # intent unknown: recorded, never flagged
    ],
)
def test_reads_are_judged_against_where_the_run_was_meant_to_read(expect: str, storage_read: int, code: str) -> None:
    found = cache.judge_reads(expect, 64 * MIB, storage_read)
    assert [f["code"] for f in found["flags"]] == ([code] if code else [])
    assert found["storage_fraction"] == pytest.approx(storage_read / (64 * MIB))


def test_a_run_that_read_too_little_is_not_judged() -> None:
    found = cache.judge_reads("storage", 4 * MIB, 0)
    assert not found["judged"] and found["flags"] == [] and "less than 32.0 MiB" in found["why"]


def test_the_intent_follows_the_campaigns_cache_policy() -> None:
    assert cache.expectation(flush_clients=True, warmup_runs=0, is_warmup=False) == "storage"
    assert cache.expectation(flush_clients=False, warmup_runs=2, is_warmup=False) == "cache"  # seed 000's Linux cache
    assert cache.expectation(flush_clients=False, warmup_runs=2, is_warmup=True) == ""  # a warm-up fills the cache
    assert cache.expectation(flush_clients=False, warmup_runs=0, is_warmup=False) == ""


HOST = HostContext(node="n1", index=0, run_dir="/srv/run", data_dir="/scratch/n1")


def test_fio_lays_out_a_reading_jobs_files_with_the_same_job_file_and_nothing_for_a_writing_job() -> None:
    fio = get_benchmark("fio")
    params = {"rw": "randread", "bs": "4k", "size": "1G", "numjobs": 4, "nrfiles": 2}
    main = fio.build(params, HOST)
    layout = fio.layout(params, HOST)
    assert layout is not None and not isinstance(main, list)
    assert layout.argv == ["fio", "--create_only=1", "--eta=never", "layout.fio"]
    assert layout.files["layout.fio"] == main.files["job.fio"]
    assert fio.layout({"rw": "write", "bs": "1M"}, HOST) is None
    assert fio.layout({"rw": "randwrite", "bs": "4k"}, HOST) is None


def test_fio_says_how_many_bytes_its_jobs_read_in_every_version_and_mode() -> None:
    fio = get_benchmark("fio")
    read = (FIO / "fio-3.33-read.json").read_text()
    assert fio.bytes_read([], {"n1": read}) == 16 * MIB
    assert fio.bytes_read([], {"n1": read, "n2": read}) == 32 * MIB
    assert fio.bytes_read([], {"n1": (FIO / "fio-3.33-write.json").read_text()}) == 0
    old = (FIO / "fio-2.1.4-pkb-sample.json").read_text()  # io_bytes in KiB before fio 2.21
    assert fio.bytes_read([], {"n1": old}) == (361984 + 36244 + 36244) * 1024
    client = (FIO / "fio-3.33-client-2servers.txt").read_text()
    assert fio.bytes_read([], {"n1": client}) == fio.bytes_read([], {"n1": client.replace("All clients", "x")}) / 2


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_storage_read_lays_out_its_synthetic_dataset_with_the_same_ranks_and_reads_nothing(tmp_path: Path) -> None:
    bench = get_benchmark("storage_read")
    mounts = (str(tmp_path / "m1"), str(tmp_path / "m2"))
    host = HostContext(node="local", index=0, run_dir=str(tmp_path), data_dir=str(tmp_path / "data"),
                       hosts=(HostInfo("local", "127.0.0.1", 2),), mounts=mounts)  # fmt: skip
    params = {"create_files": 4, "record_size": "64k", "batches": 2, "sync": True, "mpi_bind_to": "none"}
    layout = bench.layout(params, host)
    main = bench.build(params, host)
    assert layout is not None and main is not None and layout.files == main.files
    assert "--create-only" in layout.argv and "--sync" not in layout.argv  # no barrier: every rank writes and exits
    for name, content in layout.files.items():
        (tmp_path / name).write_text(content)
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    argv = [layout.argv[0], "--oversubscribe", *layout.argv[1:]]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "m1").iterdir()) == ["rbsr-000000.rec", "rbsr-000002.rec"]
    assert '"type": "layout"' in done.stdout and '"summary"' not in done.stdout
    assert bench.layout({"batches": 2}, host) is None  # an existing dataset: nothing to lay out


@pytest.mark.django_db
def test_the_preview_shows_the_layout_before_the_command(owner: Any, team: Any) -> None:
    for i in (1, 2):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}", team=team)
    data = {"name": "layout", "kind": "fio", "nodes": ["n1", "n2"], "fixed": {"bs": "1M"},
            "matrix": {"rw": ["read", "write"]}}  # fmt: skip
    campaign = services.campaign_apply(data=data, team=team)
    preview = selectors.campaign_preview(campaign=campaign)
    read, write = preview["shown"]
    assert all(h["layout"].endswith("fio --create_only=1 --eta=never layout.fio") for h in read["hosts"])
    assert all(h["layout"] == "" for h in write["hosts"])
    client = Client()
    client.force_login(owner)
    page = client.get(f"/campaigns/{campaign.pk}/preview/").content.decode()
    assert page.count('data-testid="layout"') == 2
    assert page.index("before the caches are flushed") < page.index("--output-format=json job.fio")
    assert APIClient().get(f"/api/v1/campaigns/{campaign.pk}/preview/").status_code in (401, 403)
    api = APIClient()
    api.force_login(owner)
    hosts = api.get(f"/api/v1/campaigns/{campaign.pk}/preview/").json()["shown"][0]["hosts"]
    assert [h["layout"] for h in hosts] == [h["layout"] for h in read["hosts"]]


# --- on the lab, with real fio -----------------------------------------------------------------------------------


def fio_read(name: str, **fixed: Any) -> dict[str, Any]:
    return {
        "name": name,
        "family": "cache-discipline",
        "kind": "fio",
        "nodes": ["lab1", "lab2"],
        "repetitions": 1,
        "cache": {"flush_clients": True, "flush_storage": False},
        "timeout": 120,
        "fixed": {"rw": "read", "bs": "1M", "size": "48M", "invalidate": 1, **fixed},
        "matrix": {"numjobs": [1]},
    }


def run_of(data: dict[str, Any]) -> Run:
    campaign = finished(services.campaign_launch(campaign=services.campaign_apply(data=data)), timeout=240)
    assert campaign.status == CampaignStatus.SUCCEEDED, list(campaign.runs.values_list("error", flat=True))
    run = campaign.runs.get()
    assert run.status == RunStatus.SUCCEEDED
    return run


@pytest.mark.lab
@pytest.mark.worker
def test_fio_data_is_laid_out_before_the_flush_which_records_the_page_cache_and_a_clean_run_is_not_flagged(
    lab: dict[str, Any], worker: Any, owner: Any
) -> None:
    run = run_of(fio_read("cache-clean"))
    provenance = run.provenance
    flushes = {f["target"]: f for f in provenance["flush"]}
    assert set(provenance["layout"]) == set(flushes) == {"lab1", "lab2"}
    for host, step in provenance["layout"].items():
        assert "fio --create_only=1" in step["command"]
        assert parse_datetime(step["ended_at"]) <= min(parse_datetime(f["at"]) for f in flushes.values())
        job_file = Path(run.hosts.get(host=host).remote_dir) / "layout.fio"
        data_dir = next(x for x in job_file.read_text().splitlines() if x.startswith("directory="))[10:]
        laid_out = Path(data_dir) / "rackbench.0.0"
        assert laid_out.stat().st_size == 48 * MIB
        assert laid_out.stat().st_mtime <= parse_datetime(flushes[host]["at"]).timestamp()  # not written after it
    for flush in flushes.values():
        before, after = flush["page_cache"]["before"], flush["page_cache"]["after"]
        assert {"cached", "dirty", "writeback", "disk_read", "boot_id"} <= set(before) & set(after)
        assert flush["flags"] == []
    reads = provenance["cache"]["reads"]
    assert reads["expect"] == "storage" and reads["judged"]
    assert reads["benchmark_read"] == 2 * 48 * MIB  # both hosts read their file once
    assert reads["storage_read"] >= 0.5 * reads["benchmark_read"]
    assert reads["source"] == "the job's own I/O accounting"
    assert set(provenance["cache"]["processes"]) == {"lab1", "lab2"}
    assert run.cache_flags == []

    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Data laid out before the flush" in page and 'data-testid="flushes"' in page
    assert " MiB</span>" in page or " GiB</span>" in page  # page-cache sizes in human units
    assert 'data-testid="cache-flags"' not in page
    api = APIClient()
    api.force_login(owner)
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert body["cache_flags"] == []
    assert body["provenance"]["flush"][0]["page_cache"]["after"]["cached"] >= 0


@pytest.mark.lab
@pytest.mark.worker
def test_a_run_meant_to_read_storage_that_reads_cached_data_is_flagged_on_the_run_and_in_its_verdict(
    lab: dict[str, Any], worker: Any, owner: Any
) -> None:
    baseline = run_of(fio_read("cache-baseline")).campaign
    # The page cache is flushed, but the job reads its file ten times without dropping it: nine reads are hits.
    # (what it changes on purpose is accepted, so that the verdict's only doubt is the cache's)
    run = run_of({**fio_read("cache-hits", loops=10, invalidate=0), "verdict": {"differs_in": ["loops", "invalidate"]}})

    reads = run.provenance["cache"]["reads"]
    assert reads["benchmark_read"] == 2 * 10 * 48 * MIB
    [flag] = run.cache_flags
    assert flag["code"] == "cache-hits" and "meant to read from storage, but served from a cache" in flag["message"]

    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="cache-flags"' in page and "served from a cache" in page
    api = APIClient()
    api.force_login(owner)
    assert [f["code"] for f in api.get(f"/api/v1/runs/{run.pk}/").json()["cache_flags"]] == ["cache-hits"]

    verdict = baselines.verdict_compute(campaign=run.campaign, baseline_campaign=baseline)
    item = next(i for i in verdict.items if i["metric"] == "read_bw_bytes")
    assert item["outcome"] == "inconclusive"
    assert item["cache_flags"] == [f"candidate run {run.pk}: {flag['message']}"]
    assert item["reason"].startswith("cache discipline in doubt: candidate run")


@pytest.mark.lab
@pytest.mark.worker
def test_a_layout_that_fails_fails_the_run_before_the_flush_with_fios_reason(lab: dict[str, Any], worker: Any) -> None:
    missing = "/tmp/rackbench-no-such-directory"  # fio does not create a directory it is given
    data = fio_read("cache-layout-fails", directory=missing)
    campaign = finished(services.campaign_launch(campaign=services.campaign_apply(data=data)))
    assert campaign.status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert "laying out the benchmark's data failed" in run.error and f"{missing} is not a directory" in run.error
    assert run.hosts.filter(exit_code__isnull=False).count() == 0  # the measured job never started
