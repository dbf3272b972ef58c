"""The fio plug-in: parameters, job file, parsing of real fio outputs (see fixtures/fio/SOURCES.md), aggregation,
and one real fio run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks.base import HostContext, Metric, ParamError, ParseError, get_benchmark

FIXTURES = Path(__file__).parent / "fixtures" / "fio"
HOST = HostContext(node="n1", index=0, run_dir="/srv/rackbench/runs/7/n1", data_dir="/scratch/rackbench/n1")


@pytest.fixture
def fio():
    return get_benchmark("fio")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_bytes().decode()  # bytes first: keeps CRLF line endings as they are


def fixture_json(name: str) -> dict[str, Any]:
    text = fixture_text(name)
    doc, _ = json.JSONDecoder().raw_decode(text, re.search(r"^\{", text, re.MULTILINE).start())
    return doc


def value(metrics: list[Metric], name: str, host: str = "h1", **labels: Any) -> float:
    found = [m.value for m in metrics if m.name == name and m.host == host and m.labels == labels]
    assert len(found) == 1, (name, host, labels, found)
    return found[0]


def names(metrics: list[Metric], host: str = "h1", **labels: Any) -> set[str]:
    return {m.name for m in metrics if m.host == host and m.labels == labels}


def job_labels(metrics: list[Metric]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for m in metrics:
        if m.labels and m.labels not in seen:
            seen.append(m.labels)
    return seen


# --- registration and metric specs ---------------------------------------------------------------------------


def test_it_is_registered_as_fio_with_its_version_command(fio):
    assert fio.kind == "fio"
    assert fio.version_argv == ["fio", "--version"]


def test_it_declares_units_and_directions_of_its_metrics(fio):
    assert fio.spec("bw_bytes").unit == "B/s"
    assert fio.spec("read_iops").unit == "IOPS"
    assert fio.spec("write_lat_p99_9_ns").unit == "ns"
    assert fio.spec("read_lat_mean_ns").higher_is_better is False
    assert fio.spec("write_bw_bytes").higher_is_better is True
    assert all(fio.spec(name) for name in fio.required_metrics)


def test_it_gives_every_parsed_metric_its_declared_unit(fio):
    for name in sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".json", ".txt")):
        for metric in fio.parse(fixture_text(name), host="h1"):
            assert metric.unit == fio.spec(metric.name).unit, (name, metric)


# --- validation and the job file -----------------------------------------------------------------------------


def test_it_builds_a_job_file_for_a_minimal_campaign(fio):
    params = {"rw": "read", "bs": "1M", "numjobs": 1}
    fio.validate(params)
    command = fio.build(params, HOST)
    assert command.argv == ["fio", "--eta=never", "--output-format=json", "job.fio"]
    assert command.files["job.fio"].splitlines()[1:] == [
        "[global]",
        "size=64M",
        "directory=/scratch/rackbench/n1",
        "",
        "[rackbench]",
        "rw=read",
        "bs=1M",
        "numjobs=1",
    ]
    assert command.files["job.fio"].startswith(";")


def test_it_writes_the_users_size_job_name_and_file_name(fio):
    params = {"rw": "randrw", "size": "16M", "name": "mixed-70", "filename": "data.bin", "directory": "/mnt/ssd"}
    text = fio.build(params, HOST).files["job.fio"]
    assert "\ndirectory=/mnt/ssd\nfilename=data.bin\n" in text
    assert "\n[mixed-70]\nrw=randrw\nsize=16M\n" in text


def test_it_normalises_flags_and_integers(fio):
    params = {"rw": "write", "direct": True, "end_fsync": "false", "time_based": 1, "runtime": "30s", "iodepth": "08"}
    text = fio.build(params, HOST).files["job.fio"]
    assert "\ndirect=1\nend_fsync=0\ntime_based=1\nruntime=30s\niodepth=8\n" in text


def test_it_writes_shell_metacharacters_literally_and_runs_no_shell(fio):
    directory = "/tmp/x && touch /tmp/pwned `id` | tee /tmp/y || echo 'q' \"d\" > /tmp/z * (a) !b \\c"
    command = fio.build({"rw": "read", "directory": directory}, HOST)
    assert command.argv[0] == "fio"
    assert f"\ndirectory={directory}\n" in command.files["job.fio"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"bs": "4k"}, "rw"),
        ({"rw": "trim"}, "rw"),
        ({"rw": "read", "exec_prerun": "touch /tmp/pwned"}, "exec_prerun"),
        ({"rw": "read", "exec_postrun": "touch /tmp/pwned"}, "exec_postrun"),
        ({"rw": "read", "ioengine": "exec"}, "ioengine"),
        ({"rw": "read", "ioengine": "external:/tmp/evil.so"}, "ioengine"),
        ({"rw": "read", "group_reporting": 1}, "group_reporting"),
        ({"rw": "read", "write_iolog": "/etc/cron.d/x"}, "write_iolog"),
        ({"rw": "read", "include": "/etc/passwd"}, "include"),
        ({"rw": "read", "directory": "/tmp/x\nexec_prerun=touch /tmp/pwned"}, "directory"),
        ({"rw": "read", "directory": "/tmp/x\rexec_prerun=touch /tmp/pwned"}, "directory"),
        ({"rw": "read", "directory": "/tmp/x\x00y"}, "directory"),
        ({"rw": "read", "directory": "/tmp/$(id)"}, "directory"),
        ({"rw": "read", "directory": "/tmp/x; touch /tmp/pwned"}, "directory"),
        ({"rw": "read", "directory": "/tmp/x#1"}, "directory"),
        ({"rw": "read", "directory": "/tmp/${HOME}"}, "directory"),
        ({"rw": "read", "bs": "$pagesize"}, "bs"),
        ({"rw": "read", "directory": "/tmp/" + "a" * 8200 + "exec_prerun=touch /tmp/pwned"}, "directory"),
        ({"rw": "read", "directory": "relative/dir"}, "directory"),
        ({"rw": "read", "directory": "/mnt/a:/mnt/b"}, "directory"),
        ({"rw": "read", "directory": "/dev"}, "directory"),
        ({"rw": "read", "directory": "/tmp/x "}, "directory"),
        ({"rw": "read", "filename": "../../etc/passwd"}, "filename"),
        ({"rw": "read", "filename": "/dev/sda"}, "filename"),
        ({"rw": "read", "name": "global-read"}, "name"),
        ({"rw": "read", "name": "job]\n[global"}, "name"),
        ({"rw": "read", "numjobs": 0}, "numjobs"),
        ({"rw": "read", "numjobs": "4; rm -rf /"}, "numjobs"),
        ({"rw": "read", "numjobs": True}, "numjobs"),
        ({"rw": "read", "numjobs": "\u00b2"}, "numjobs"),
        ({"rw": "read", "iodepth": 1.5}, "iodepth"),
        ({"rw": "read", "bs": "4 k"}, "bs"),
        ({"rw": "read", "size": "lots"}, "size"),
        ({"rw": "read", "direct": 2}, "direct"),
        ({"rw": "read", "runtime": "10 minutes"}, "runtime"),
        ({"rw": "read", "rwmixread": 101}, "rwmixread"),
        ({"rw": "read", "time_based": True}, "runtime"),
    ],
)
def test_it_refuses_a_bad_parameter_naming_it(fio, params, field):
    with pytest.raises(ParamError) as caught:
        fio.validate(params)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    with pytest.raises(ParamError):
        fio.build(params, HOST)


def test_it_says_why_group_reporting_is_refused(fio):
    with pytest.raises(ParamError, match="per-job"):
        fio.validate({"rw": "read", "group_reporting": 1})


def test_it_refuses_a_node_data_dir_fio_would_expand(fio):
    host = HostContext(node="n1", index=0, run_dir="/srv/run", data_dir="/scratch/${USER}")
    with pytest.raises(ParamError) as caught:
        fio.build({"rw": "read"}, host)
    assert caught.value.field == "directory"


# --- parsing fio 3.33 output made here ------------------------------------------------------------------------


def test_it_reads_bandwidth_iops_and_latency_of_a_read_job(fio):
    read = fixture_json("fio-3.33-read.json")["jobs"][0]["read"]
    metrics = fio.parse(fixture_text("fio-3.33-read.json"), host="h1")
    job = {"job": "rackbench", "jobnum": 0}
    assert value(metrics, "read_bw_bytes", **job) == read["bw_bytes"] == 838860800
    assert value(metrics, "read_iops", **job) == read["iops"]
    assert value(metrics, "read_lat_mean_ns", **job) == read["lat_ns"]["mean"]
    assert value(metrics, "read_lat_p50_ns", **job) == read["clat_ns"]["percentile"]["50.000000"]
    assert value(metrics, "read_lat_p99_ns", **job) == read["clat_ns"]["percentile"]["99.000000"]
    assert value(metrics, "read_lat_p99_9_ns", **job) == read["clat_ns"]["percentile"]["99.900000"]
    assert value(metrics, "bw_bytes") == value(metrics, "read_bw_bytes") == read["bw_bytes"]
    assert value(metrics, "iops") == read["iops"]
    assert not any(name.startswith("write_") for name in names(metrics))


def test_it_reports_only_write_metrics_for_a_write_job(fio):
    write = fixture_json("fio-3.33-write.json")["jobs"][0]["write"]
    metrics = fio.parse(fixture_text("fio-3.33-write.json"), host="h1")
    assert value(metrics, "write_bw_bytes") == write["bw_bytes"]
    assert value(metrics, "bw_bytes") == write["bw_bytes"]
    assert not any(name.startswith("read_") for name in names(metrics))
    assert {"bw_bytes", "iops"} <= names(metrics)


def test_it_reports_both_directions_of_a_mixed_job(fio):
    job = fixture_json("fio-3.33-randrw-libaio.json")["jobs"][0]
    metrics = fio.parse(fixture_text("fio-3.33-randrw-libaio.json"), host="h1")
    assert value(metrics, "read_bw_bytes") == job["read"]["bw_bytes"]
    assert value(metrics, "write_bw_bytes") == job["write"]["bw_bytes"]
    assert value(metrics, "bw_bytes") == job["read"]["bw_bytes"] + job["write"]["bw_bytes"]
    assert value(metrics, "iops") == pytest.approx(job["read"]["iops"] + job["write"]["iops"])
    assert value(metrics, "write_lat_p99_ns") == job["write"]["clat_ns"]["percentile"]["99.000000"]


def test_it_numbers_the_processes_of_numjobs_and_totals_them(fio):
    jobs = fixture_json("fio-3.33-randread-4jobs.json")["jobs"]
    metrics = fio.parse(fixture_text("fio-3.33-randread-4jobs.json"), host="h1")
    assert job_labels(metrics) == [{"job": "rackbench", "jobnum": n} for n in range(4)]
    for n, job in enumerate(jobs):
        assert value(metrics, "read_bw_bytes", job="rackbench", jobnum=n) == job["read"]["bw_bytes"]
    reads = [job["read"] for job in jobs]
    assert value(metrics, "read_bw_bytes") == sum(r["bw_bytes"] for r in reads)
    assert value(metrics, "read_iops") == pytest.approx(sum(r["iops"] for r in reads))
    weighted = sum(r["lat_ns"]["mean"] * r["total_ios"] for r in reads) / sum(r["total_ios"] for r in reads)
    assert value(metrics, "read_lat_mean_ns") == pytest.approx(weighted)
    assert value(metrics, "read_lat_p99_ns") == max(r["clat_ns"]["percentile"]["99.000000"] for r in reads)


def test_it_skips_warnings_before_the_json_and_crlf_line_endings(fio):
    text = fixture_text("fio-3.33-noisy-pty-crlf.txt")
    assert text.startswith("note: both iodepth >= 1") and "\r\n" in text
    jobs = fixture_json("fio-3.33-noisy-pty-crlf.txt")["jobs"]
    metrics = fio.parse(text, host="h1")
    assert job_labels(metrics) == [{"job": "rackbench", "jobnum": 0}, {"job": "rackbench", "jobnum": 1}]
    assert value(metrics, "write_bw_bytes") == sum(job["write"]["bw_bytes"] for job in jobs)


# --- parsing other fio versions -------------------------------------------------------------------------------


def test_it_reads_fio_2_1_output_in_kib_and_microseconds(fio):
    jobs = fixture_json("fio-2.1.4-pkb-sample.json")["jobs"]
    metrics = fio.parse(fixture_text("fio-2.1.4-pkb-sample.json"), host="h1")
    first = {"job": "sequential_write", "jobnum": 0}
    write = jobs[0]["write"]
    assert value(metrics, "write_bw_bytes", **first) == write["bw"] * 1024 == 68118 * 1024
    assert value(metrics, "write_lat_mean_ns", **first) == pytest.approx(write["lat"]["mean"] * 1000)
    assert value(metrics, "write_lat_p99_9_ns", **first) == write["clat"]["percentile"]["99.900000"] * 1000
    assert "read_bw_bytes" not in names(metrics, **first)
    assert len(job_labels(metrics)) == 5
    assert value(metrics, "read_bw_bytes") == sum(job["read"]["bw"] for job in jobs) * 1024


def test_it_weights_fio_2_17_latency_by_io_count(fio):
    jobs = fixture_json("fio-2.17-pkb-hist.json")["jobs"]
    metrics = fio.parse(fixture_text("fio-2.17-pkb-hist.json"), host="h1")
    read = jobs[0]["read"]
    assert value(metrics, "read_iops") == read["iops"]
    assert value(metrics, "read_lat_mean_ns") == pytest.approx(read["lat"]["mean"] * 1000)
    assert value(metrics, "read_lat_p50_ns") == read["clat"]["percentile"]["50.000000"] * 1000
    assert value(metrics, "write_bw_bytes") == jobs[1]["write"]["bw"] * 1024


def test_it_reads_fio_3_1_nanoseconds_without_bw_bytes(fio):
    write = fixture_json("fio-3.1-fioplot-randwrite.json")["jobs"][0]["write"]
    assert "bw_bytes" not in write
    metrics = fio.parse(fixture_text("fio-3.1-fioplot-randwrite.json"), host="h1")
    assert value(metrics, "write_bw_bytes") == write["bw"] * 1024
    assert value(metrics, "write_lat_mean_ns") == write["lat_ns"]["mean"]
    assert value(metrics, "write_lat_p99_ns") == write["clat_ns"]["percentile"]["99.000000"]


def test_it_numbers_fio_3_6_jobs_that_share_a_name(fio):
    jobs = fixture_json("fio-3.6-fioplot-randread-2jobs.json")["jobs"]
    metrics = fio.parse(fixture_text("fio-3.6-fioplot-randread-2jobs.json"), host="h1")
    assert job_labels(metrics) == [{"job": "random-io", "jobnum": 0}, {"job": "random-io", "jobnum": 1}]
    assert value(metrics, "read_bw_bytes", job="random-io", jobnum=1) == jobs[1]["read"]["bw_bytes"]
    assert value(metrics, "bw_bytes") == jobs[0]["read"]["bw_bytes"] + jobs[1]["read"]["bw_bytes"]


def test_it_reads_fio_3_34_output_after_a_signal_message(fio):
    text = fixture_text("fio-3.34-fioplot-randread-signal-noise.json")
    assert "fio: terminating on signal 2" in text.split("{")[0]
    read = fixture_json("fio-3.34-fioplot-randread-signal-noise.json")["jobs"][0]["read"]
    assert value(fio.parse(text, host="h1"), "read_bw_bytes") == read["bw_bytes"]


# --- client/server output -------------------------------------------------------------------------------------


def test_it_reads_client_stats_of_one_server_under_its_address(fio):
    entries = fixture_json("fio-3.33-client-1server.txt")["client_stats"]
    metrics = fio.parse(fixture_text("fio-3.33-client-1server.txt"), host="ignored")
    assert {m.host for m in metrics} == {"127.0.0.1:8766", ""}
    second = {"job": "rackbench", "jobnum": 1}
    assert value(metrics, "read_bw_bytes", "127.0.0.1:8766", **second) == entries[1]["read"]["bw_bytes"]
    all_clients = entries[2]
    assert all_clients["jobname"] == "All clients"
    assert value(metrics, "write_bw_bytes", "") == all_clients["write"]["bw_bytes"]
    assert value(metrics, "read_lat_mean_ns", "") == all_clients["read"]["lat_ns"]["mean"]


def test_it_names_client_hosts_by_address_and_non_default_port(fio):
    entries = fixture_json("fio-3.33-client-2servers.txt")["client_stats"]
    metrics = fio.parse(fixture_text("fio-3.33-client-2servers.txt"))
    assert {m.host for m in metrics} == {"localhost", "127.0.0.1:8766", ""}
    for host, own in (("localhost", entries[0:2]), ("127.0.0.1:8766", entries[2:4])):
        assert value(metrics, "read_bw_bytes", host) == sum(e["read"]["bw_bytes"] for e in own)
        assert [m.labels for m in metrics if m.host == host and m.name == "iops" and m.labels] == [
            {"job": "rackbench", "jobnum": 0},
            {"job": "rackbench", "jobnum": 1},
        ]
    assert value(metrics, "bw_bytes", "") == entries[4]["read"]["bw_bytes"] + entries[4]["write"]["bw_bytes"]


def test_it_adds_only_the_missing_percentiles_to_fios_client_aggregate(fio):
    metrics = fio.parse(fixture_text("fio-3.33-client-2servers.txt"))
    assert not any(name.endswith(("p50_ns", "p99_ns", "p99_9_ns")) for name in names(metrics, ""))
    added = fio.aggregate(metrics)
    assert {m.name for m in added} == {f"{d}_lat_{p}_ns" for d in ("read", "write") for p in ("p50", "p99", "p99_9")}
    assert all(m.host == "" and m.labels == {"across_hosts": "max"} for m in added)
    p99 = max(value(metrics, "read_lat_p99_ns", host) for host in ("localhost", "127.0.0.1:8766"))
    assert value(added, "read_lat_p99_ns", "", across_hosts="max") == p99


# --- parse errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fio: /scratch/x is not a directory\nfio: failed parsing directory=/scratch/x\nfio: job global dropped\n",
        fixture_text("fio-3.33-read.json")[:2000],
    ],
)
def test_it_raises_parse_error_without_fio_json(fio, text):
    with pytest.raises(ParseError, match="no fio JSON output"):
        fio.parse(text)


def test_it_raises_parse_error_for_json_without_jobs(fio):
    doc = fixture_json("fio-3.33-read.json")
    doc["jobs"] = []
    with pytest.raises(ParseError, match="'jobs'"):
        fio.parse(json.dumps(doc, indent=2))


# --- aggregation ----------------------------------------------------------------------------------------------


def test_it_aggregates_host_totals_across_hosts(fio):
    a = fio.parse(fixture_text("fio-3.33-randrw-libaio.json"), host="a")
    b = fio.parse(fixture_text("fio-3.33-randread-4jobs.json"), host="b")
    out = fio.aggregate(a + b)
    assert all(m.host == "" for m in out)
    assert value(out, "read_bw_bytes", "") == value(a, "read_bw_bytes", "a") + value(b, "read_bw_bytes", "b")
    assert value(out, "write_bw_bytes", "") == value(a, "write_bw_bytes", "a")
    assert value(out, "bw_bytes", "") == value(a, "bw_bytes", "a") + value(b, "bw_bytes", "b")
    assert value(out, "iops", "") == pytest.approx(value(a, "iops", "a") + value(b, "iops", "b"))
    iops = {h: value(m, "read_iops", h) for h, m in (("a", a), ("b", b))}
    lat = {h: value(m, "read_lat_mean_ns", h) for h, m in (("a", a), ("b", b))}
    weighted = (lat["a"] * iops["a"] + lat["b"] * iops["b"]) / (iops["a"] + iops["b"])
    assert value(out, "read_lat_mean_ns", "") == pytest.approx(weighted)
    p99 = max(value(a, "read_lat_p99_ns", "a"), value(b, "read_lat_p99_ns", "b"))
    assert value(out, "read_lat_p99_ns", "", across_hosts="max") == p99
    assert not any("job" in m.labels for m in out)


def test_it_aggregates_nothing_from_nothing(fio):
    assert fio.aggregate([]) == []


# --- real fio runs --------------------------------------------------------------------------------------------

needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


def run_fio(fio, params: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Write the built files into a run directory and start the argv there, as the runner does (no shell)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    host = HostContext(node="local", index=0, run_dir=str(run_dir), data_dir=str(tmp_path / "default-data"))
    command = fio.build(params, host)
    for name, content in command.files.items():
        (run_dir / name).write_text(content)
    return subprocess.run(command.argv, cwd=run_dir, capture_output=True, text=True, timeout=120)


@needs_fio
def test_it_runs_fio_in_a_directory_named_with_shell_metacharacters(fio, tmp_path):
    weird = tmp_path / "data && touch pwned-and `touch pwned-tick` | touch pwned-pipe & 'q' \"d\" > pwned-gt * (x)"
    weird.mkdir()  # the runner creates the data directory before the run
    params = {"rw": "randrw", "bs": "4k", "size": "1M", "numjobs": 2, "directory": str(weird)}

    done = run_fio(fio, params, tmp_path)

    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("pwned-*"))
    assert sorted(p.name for p in weird.iterdir()) == ["rackbench.0.0", "rackbench.1.0"]
    metrics = fio.parse(done.stdout, host="local")
    assert job_labels(metrics) == [{"job": "rackbench", "jobnum": 0}, {"job": "rackbench", "jobnum": 1}]
    assert set(fio.required_metrics) <= names(metrics, "local")
    assert value(metrics, "bw_bytes", "local") > 0
    assert {"read_bw_bytes", "write_bw_bytes", "read_lat_p99_ns"} <= names(metrics, "local")


@needs_fio
def test_it_lets_fio_refuse_a_directory_that_does_not_exist(fio, tmp_path):
    missing = tmp_path / "not-mounted"

    done = run_fio(fio, {"rw": "write", "bs": "64k", "size": "1M", "directory": str(missing)}, tmp_path)

    assert done.returncode != 0
    assert f"{missing} is not a directory" in done.stdout + done.stderr
    assert not missing.exists()
    with pytest.raises(ParseError):
        fio.parse(done.stdout)


def test_it_spreads_its_files_over_the_campaign_mount_points(fio):
    host = HostContext(node="n1", index=0, run_dir="/r", data_dir="/mnt/a/0/n1", mounts=("/mnt/a/0", "/mnt/a/1"))

    command = fio.build({"rw": "read", "bs": "1M", "kb_base": 1000, "create_serialize": 0, "sync": 0}, host)

    job_file = command.files["job.fio"]
    assert "directory=/mnt/a/0/n1:/mnt/a/1/n1" in job_file
    assert "kb_base=1000" in job_file and "create_serialize=0" in job_file


def test_client_mode_serves_on_every_host_and_drives_them_all_from_the_primary(fio):
    from plugins.benchmarks.base import HostInfo

    hosts = (HostInfo("n1", "10.0.0.1"), HostInfo("n2", "10.0.0.2"))
    params = {"rw": "read", "bs": "1M", "client_mode": True}
    primary = HostContext(node="n1", index=0, run_dir="/r", data_dir="/scratch/n1", hosts=hosts)
    other = HostContext(node="n2", index=1, run_dir="/r", data_dir="/scratch/n2", hosts=hosts)

    main, service = fio.build(params, primary)
    (only,) = fio.build(params, other)

    assert service.service and service.argv == ["fio", "--server=ip:10.0.0.1,8765"]
    assert only.service and only.argv == ["fio", "--server=ip:10.0.0.2,8765"]
    assert main.argv[-4:] == ["--client=ip:10.0.0.1,8765", "job-n1.fio", "--client=ip:10.0.0.2,8765", "job-n2.fio"]
    assert "directory=/scratch/n2" in main.files["job-n2.fio"]


def test_client_mode_names_metrics_after_the_nodes(fio):
    text = (FIXTURES / "fio-3.33-client-2servers.txt").read_text()
    header = 'rackbench-fio-clients: {"localhost": "n1", "127.0.0.1:8766": "n2"}\n'

    hosts = {m.host for m in fio.parse(header + text)}

    assert hosts == {"n1", "n2", ""}


@pytest.mark.parametrize("params", [{"client_mode": "yes"}, {"client_mode": True, "client_port": 80}])
def test_client_mode_options_are_checked(fio, params):
    with pytest.raises(ParamError):
        fio.validate({"rw": "read", **params})


def test_it_places_the_options_named_in_global_options_in_the_global_section(fio):
    params = {"rw": "read", "name": "job1", "iodepth": 32, "kb_base": 1000, "global_options": "iodepth,kb_base"}
    lines = fio.build(params, HOST).files["job.fio"].splitlines()[1:]
    assert lines == [
        "[global]",
        "name=job1",
        "size=64M",
        "directory=/scratch/rackbench/n1",
        "iodepth=32",
        "kb_base=1000",
        "",
        "[job1]",
        "rw=read",
    ]
    for bad in ("iodepth,bogus", "numjobs"):
        with pytest.raises(ParamError) as caught:
            fio.validate({**params, "global_options": bad})
        assert caught.value.field == "global_options"


def test_it_writes_no_default_size_when_the_campaign_gives_one(fio):
    text = fio.build({"rw": "read", "size": "458GB", "fallocate": "none"}, HOST).files["job.fio"]
    assert "size=64M" not in text and "\nsize=458GB\n" in text and "\nfallocate=none\n" in text
