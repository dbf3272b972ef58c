"""End to end on real components: a Celery worker on the broker, lab sshd nodes, real fio, the test DB."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from django.utils.dateparse import parse_datetime

from campaigns import selectors, services
from campaigns.models import CampaignStatus, Run, RunStatus
from inventory.models import HostKey, Node
from inventory.services import node_upsert
from tests.conftest import LAB_PORT, finished, group_alive, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def fio_campaign(name: str, nodes: list[str], **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "kind": "fio",
        "nodes": nodes,
        "repetitions": 1,
        "cache": {"flush_clients": True, "flush_storage": False},
        "timeout": 120,
        "fixed": {"bs": "64k", "size": "8M"},
        "matrix": {"rw": ["read"]},
    }
    data.update(overrides)
    return data


def test_it_runs_a_fio_campaign_end_to_end(lab: dict[str, Any], worker: Any) -> None:
    data = fio_campaign(
        "e2e",
        ["lab1", "lab2"],
        storage="lab-local",
        repetitions=2,
        cache={"flush_clients": True, "flush_storage": True},
        matrix={"rw": ["read", "randread"], "numjobs": [1, 2]},
    )
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    finished(campaign, timeout=240)
    assert campaign.status == CampaignStatus.SUCCEEDED, list(campaign.runs.values_list("error", flat=True))
    runs = list(campaign.runs.order_by("sequence"))
    assert len(runs) == 8
    for run in runs:
        assert run.status == RunStatus.SUCCEEDED
        hosts = {h.host: h for h in run.hosts.all()}
        assert set(hosts) == {"lab1", "lab2"}
        for host in hosts.values():
            assert host.exit_code == 0
            assert "fio" in host.command and host.remote_dir in host.command
            assert f'"rw" : "{run.params["rw"]}"' in host.stdout  # fio's JSON echoes the job's options
        per_host = {r.host: r.value for r in run.results.filter(name="read_bw_bytes", labels={})}
        assert set(per_host) == {"lab1", "lab2", ""}
        assert per_host["lab1"] > 0 and per_host["lab2"] > 0
        assert per_host[""] == pytest.approx(per_host["lab1"] + per_host["lab2"])
        flushed = run.provenance["flush"]
        assert [f["target"] for f in flushed] == ["storage lab-local", "lab1", "lab2"]
        assert all(parse_datetime(f["at"]) <= run.finished_at for f in flushed)
        assert "drop_caches" in flushed[1]["command"]
        assert run.provenance["hosts"]["lab1"]["tool_version"].startswith("fio-")
        assert run.provenance["hosts"]["lab1"]["kernel"]
    summary = selectors.campaign_summary(campaign=campaign)
    bw = [row for row in summary if row["metric"] == "read_bw_bytes"]
    assert len(bw) == 4 and all(row["n"] == 2 for row in bw)


def test_it_fails_the_runs_of_an_unreachable_node_and_other_campaigns_go_on(lab: dict[str, Any], worker: Any) -> None:
    credential = lab["nodes"]["lab1"].credential
    node_upsert(name="ghost", address="127.0.1.250", ssh_port=LAB_PORT, ssh_user="nobody", credential=credential)
    ghost = services.campaign_apply(data=fio_campaign("ghost", ["ghost"], repetitions=2))
    healthy = services.campaign_apply(data=fio_campaign("healthy", ["lab3"]))

    services.campaign_launch(campaign=ghost)
    services.campaign_launch(campaign=healthy)

    assert finished(healthy).status == CampaignStatus.SUCCEEDED
    assert finished(ghost).status == CampaignStatus.FAILED
    errors = list(ghost.runs.values_list("status", "error"))
    assert len(errors) == 2
    for status, error in errors:
        assert status == RunStatus.FAILED
        assert "ghost" in error and "cannot connect" in error
    # The first run finds the node down (a 2 s probe after its transient failure) and marks it suspect; the
    # second fails at once, without SSH, instead of another round of retries.
    assert "marked suspect" in errors[0][1] or "marked suspect" in errors[1][1]
    assert Node.objects.get(name="ghost").suspect_reason


def test_it_refuses_a_node_whose_host_key_changed(lab: dict[str, Any], worker: Any) -> None:
    lab1 = lab["nodes"]["lab1"]
    other = HostKey.objects.get(address=lab["nodes"]["lab2"].address, port=LAB_PORT)
    HostKey.objects.filter(address=lab1.address, port=LAB_PORT).update(
        key_type=other.key_type, key_base64=other.key_base64, fingerprint=other.fingerprint
    )
    # A new inventory entry for the same host: the worker opens a new connection, as after a reinstall.
    node_upsert(name="lab1-reinstalled", address=lab1.address, ssh_port=LAB_PORT, ssh_user=lab1.ssh_user,
                credential=lab1.credential)  # fmt: skip
    data = fio_campaign("hostkey", ["lab1-reinstalled"])
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert "host key changed" in run.error and other.fingerprint in run.error
    assert "gave up" not in run.error  # permanent: never retried


def test_it_keeps_stderr_when_fio_exits_non_zero(lab: dict[str, Any], worker: Any) -> None:
    missing = "/tmp/rackbench-no-such-directory"  # fio does not create a directory it is given
    # a writing job: a reading one would fail earlier, laying out its files (test_cache_discipline)
    data = fio_campaign("fio-fails", ["lab1"], fixed={"bs": "64k", "size": "8M", "directory": missing})
    data["matrix"] = {"rw": ["write"]}
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.FAILED
    run = campaign.runs.get()
    host = run.hosts.get()
    assert host.exit_code not in (0, None)
    assert "exited with code" in run.error and "lab1" in run.error
    assert f"{missing} is not a directory" in run.stderr_tail
    assert f"{missing} is not a directory" in run.error  # the last line of stderr, in the run's error


def test_it_cancels_a_running_run_and_kills_fio(lab: dict[str, Any], worker: Any) -> None:
    data = fio_campaign(
        "cancel-me", ["lab1", "lab2"], fixed={"bs": "4k", "size": "8M", "runtime": 120, "time_based": 1}
    )
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))
    run = campaign.runs.get()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.RUNNING, what="the run to be running")
    pids = wait_for(lambda: list(run.hosts.exclude(pid=None).values_list("pid", flat=True)), what="remote pids")
    assert all(group_alive(pid) for pid in pids)

    services.campaign_cancel(campaign=campaign)

    wait_for(lambda: not any(group_alive(pid) for pid in pids), timeout=120, what="remote fio to be killed")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.error == "cancelled by the user"
    assert finished(campaign).status == CampaignStatus.CANCELLED


def test_it_times_out_a_run_that_runs_too_long(lab: dict[str, Any], worker: Any) -> None:
    data = fio_campaign(
        "too-long", ["lab1"], timeout=2, fixed={"bs": "4k", "size": "8M", "runtime": 60, "time_based": 1}
    )
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign, timeout=180).status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert run.status == RunStatus.TIMED_OUT and "timeout of 2 s" in run.error
    pid = run.hosts.get().pid
    wait_for(lambda: not group_alive(pid), timeout=120, what="the timed-out fio to be killed")


def test_it_never_runs_two_campaigns_on_one_node_at_once(lab: dict[str, Any], worker: Any) -> None:
    fixed = {"bs": "4k", "size": "8M", "runtime": 2, "time_based": 1}
    first = services.campaign_apply(data=fio_campaign("first", ["lab4"], fixed=fixed, repetitions=2))
    second = services.campaign_apply(data=fio_campaign("second", ["lab4"], fixed=fixed, repetitions=2))
    services.campaign_launch(campaign=first)
    services.campaign_launch(campaign=second)

    assert finished(first).status == CampaignStatus.SUCCEEDED
    assert finished(second).status == CampaignStatus.SUCCEEDED
    spans = sorted((r.started_at, r.finished_at) for r in Run.objects.filter(campaign__in=[first, second]))
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, "two runs overlapped on lab4"


def test_it_passes_parameter_values_with_shell_metacharacters_literally(lab: dict[str, Any], worker: Any) -> None:
    scratch = Path(lab["storage"].export_path)
    marker = f"pwned-{os.getpid()}"  # a shell would create it in the run's directory (its working directory)
    directory = scratch / f"meta && touch {marker} `touch {marker}` | cat > {marker} (x) 'q' \"dq\""
    directory.mkdir()
    shutil.chown(directory, user=lab["nodes"]["lab1"].ssh_user)
    try:
        data = fio_campaign("metachars", ["lab1"], fixed={"bs": "64k", "size": "4M", "directory": str(directory)})
        campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

        assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
        run_dir = Path(campaign.runs.get().hosts.get().remote_dir)
        assert sorted(p.name for p in run_dir.iterdir() if marker in p.name) == []
        assert [p for p in scratch.iterdir() if p.name.startswith(marker)] == []
        assert sorted(p.name for p in directory.iterdir()) == ["rackbench.0.0"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_fio_client_mode_drives_every_nodes_fio_server_from_one_node(lab: dict[str, Any], worker: Any) -> None:
    fixed = {"bs": "64k", "size": "4M", "client_mode": True, "client_port": 8865}
    data = fio_campaign("fio-clients", ["lab1", "lab2"], fixed=fixed)
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, campaign.runs.get().error
    run = campaign.runs.get()
    lab1, lab2 = run.hosts.get(host="lab1"), run.hosts.get(host="lab2")
    assert "--client=ip:127.0.1.1,8865" in lab1.command and "job-lab2.fio" in lab1.command
    assert "--server=ip:" in lab1.service_command and "--server=ip:" in lab2.service_command
    assert not lab2.command  # lab2 only serves
    per_host = {r.host: r.value for r in run.results.filter(name="read_bw_bytes", labels={})}
    assert set(per_host) == {"lab1", "lab2", ""} and per_host["lab1"] > 0 and per_host["lab2"] > 0
    # fio's own "All clients" figure: all bytes over the longest client's runtime. Both clients move the same bytes,
    # so it is twice the slower one's rate (not at least the faster one's: a loaded node is slower)
    assert per_host[""] == pytest.approx(2 * min(per_host["lab1"], per_host["lab2"]), rel=0.05)
    assert set(run.provenance["services"]) == {"lab1", "lab2"}


def test_a_benchmark_killed_from_outside_fails_its_run_with_the_reason(lab: dict[str, Any], worker: Any) -> None:
    fixed = {"bs": "4k", "size": "8M", "runtime": 60, "time_based": 1}
    campaign = services.campaign_launch(
        campaign=services.campaign_apply(data=fio_campaign("vanish", ["lab1"], fixed=fixed))
    )
    run = campaign.runs.get()
    pid = wait_for(lambda: run.hosts.exclude(pid=None).values_list("pid", flat=True).first(), what="the remote pid")

    os.killpg(pid, signal.SIGKILL)  # as an OOM killer or a reboot would: no exit code is ever written

    assert finished(campaign, timeout=180).status == CampaignStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "disappeared without an exit code on lab1" in run.error
