"""runners.prepare on the lab: what preparing a run costs its hosts in round trips."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from campaigns import services
from campaigns.models import Run
from plugins import cache
from runners import execution, remote
from runners.prepare import Fold
from tests.test_campaign_e2e import fio_campaign

pytestmark = pytest.mark.lab


def launched(name: str, nodes: list[str], *, repetitions: int) -> Any:
    data = fio_campaign(name, nodes, repetitions=repetitions, cache={"flush_clients": False})
    # Prepared by the test, not by a worker: nothing is enqueued (the session's worker, alive once any test has used
    # it, would advance the campaign and start the run itself, racing the test and its database's teardown).
    with mock.patch.object(services, "campaign_advance_soon"):
        return services.campaign_launch(campaign=services.campaign_apply(data=data))


def prepare(runs: Any, scripts: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """Prepare the runs one after the other; returns every command run on a host, with the host (and adds what each
    command read on its standard input to ``scripts``)."""
    commands: list[tuple[str, str]] = []
    run_command = remote.Target.run

    def counted(target: remote.Target, command: str, **options: Any) -> Any:
        commands.append((target.endpoint.name, command))
        if scripts is not None:
            scripts.append((target.endpoint.name, (options.get("stdin") or b"").decode()))
        return run_command(target, command, **options)

    with mock.patch.object(remote.Target, "run", counted), mock.patch.object(remote.Target, "put") as put:
        for run in runs:
            execution.run_prepare(Run.objects.select_related("campaign").get(pk=run.pk))
    assert not put.called  # no SFTP session: the files go with the command that makes the directories
    return commands


def started(run: Any, *, hosts: int, wave_s: float) -> None:
    """Record in the run's provenance a start attempt that reached its ``hosts`` in time, as submit_mains does."""
    provenance = Run.objects.get(pk=run.pk).provenance
    provenance["start"] = {**provenance.get("start", {}), "attempts": [{"hosts": hosts, "wave_s": wave_s, "late": {}}]}
    Run.objects.filter(pk=run.pk).update(provenance=provenance)


def test_versions_are_read_once_per_campaign_and_node_and_recorded_in_every_run(lab: dict[str, Any]) -> None:
    first, *later = launched("versions-once", ["lab1", "lab2"], repetitions=3).runs.order_by("sequence")
    campaign = first.campaign
    scripts: list[tuple[str, str]] = []

    commands = prepare([first], scripts)
    started(first, hosts=2, wave_s=0.02)
    commands += prepare(later, scripts)

    reads = sorted(host for host, command in commands if command.startswith("uname"))
    assert reads == ["lab1", "lab2"]
    recorded = [run.provenance["hosts"] for run in campaign.runs.order_by("sequence")]
    assert len(recorded) == 3 and all(hosts == recorded[0] for hosts in recorded)
    assert recorded[0]["lab1"]["tool_version"].startswith("fio-") and recorded[0]["lab1"]["kernel"]
    # Preparing a host is one round trip per run once the campaign has a submit wave to reckon the start margin from
    # (no flush follows here): its directories and files written, then the layout pass, then its cache counters
    # read as the job will start. Before (the first run), the counters are read in a round trip of their own, timed.
    lab1 = [command for host, command in commands if host == "lab1" and not command.startswith("uname")]
    assert lab1 == ["sh -s", cache.SNAPSHOT_COMMAND, "sh -s", "sh -s"]
    first_script, *later_scripts = [text for host, text in scripts if host == "lab1" and text]
    assert first_script.index("printf") < first_script.index("--create_only=1")
    assert cache.SNAPSHOT_COMMAND not in first_script
    for script in later_scripts:
        written, layout, counters = (script.index(x) for x in ("printf", "--create_only=1", cache.SNAPSHOT_COMMAND))
        assert written < layout < counters
    assert all(run.provenance["cache"]["start"]["lab1"]["cached"] > 0 for run in campaign.runs.all())
    assert "probe_s" in Run.objects.get(pk=first.pk).provenance["start"]


def test_a_node_changed_under_its_name_has_its_versions_read_again(lab: dict[str, Any]) -> None:
    first, second = launched("versions-changed", ["lab1"], repetitions=2).runs.order_by("sequence")
    prepare([first])
    provenance = Run.objects.get(pk=first.pk).provenance
    provenance["hosts"]["lab1"]["node"]["address"] = "192.0.2.1"  # another machine had this name then
    Run.objects.filter(pk=first.pk).update(provenance=provenance)

    commands = prepare([second])

    assert [host for host, command in commands if command.startswith("uname")] == ["lab1"]


def data_file(run: Run, host: str) -> Path:
    """The file fio lays out for ``host`` (the lab's nodes share this machine's filesystem)."""
    job_file = Path(run.hosts.get(host=host).remote_dir) / "layout.fio"
    directory = next(x for x in job_file.read_text().splitlines() if x.startswith("directory="))[len("directory=") :]
    return Path(directory) / "rackbench.0.0"


def test_a_layout_is_not_run_again_on_the_data_it_left_and_is_once_that_data_changed(lab: dict[str, Any]) -> None:
    first, second, third = launched("layout-kept", ["lab1", "lab2"], repetitions=3).runs.order_by("sequence")
    prepare([first])
    laid_out = data_file(first, "lab1")
    before = laid_out.stat()

    prepare([second])

    layout = Run.objects.get(pk=second.pk).provenance["layout"]
    assert layout["lab1"]["kept"] and layout["lab2"]["kept"]  # fio would have found every file as it left them
    assert "fio --create_only=1" in layout["lab1"]["command"]  # what the layout is, as the run page shows it
    assert laid_out.stat().st_mtime_ns == before.st_mtime_ns and laid_out.stat().st_ino == before.st_ino
    laid_out.unlink()  # what any change to the data does: the listing the layout left no longer matches

    prepare([third])

    layout = Run.objects.get(pk=third.pk).provenance["layout"]
    assert "kept" not in layout["lab1"] and layout["lab2"]["kept"]
    assert laid_out.stat().st_size == 8 * 1024**2  # laid out again, whole


def test_a_later_run_is_started_in_the_round_trip_that_prepares_it(lab: dict[str, Any]) -> None:
    first, second = launched("folded-once", ["lab1", "lab2"], repetitions=2).runs.order_by("sequence")
    prepare([first])
    started(first, hosts=2, wave_s=0.02)
    scripts: list[tuple[str, str]] = []
    fold = Fold(attempt="fold1", margin_s=1.0, tolerance_s=0.05)
    commands: list[tuple[str, str]] = []
    run_command = remote.Target.run

    def counted(target: remote.Target, command: str, **options: Any) -> Any:
        commands.append((target.endpoint.name, command))
        scripts.append((target.endpoint.name, (options.get("stdin") or b"").decode()))
        return run_command(target, command, **options)

    with mock.patch.object(remote.Target, "run", counted):
        jobs = execution.run_prepare(Run.objects.select_related("campaign").get(pk=second.pk), fold=fold)

    # One command per host: files, layout, cache counters, then the submit carrying the instant chosen as it was sent.
    assert sorted(commands) == [("lab1", "sh -s"), ("lab2", "sh -s")]
    (script,) = [text for host, text in scripts if host == "lab1"]
    written, layout, counters, submit = (
        script.index(x) for x in ("printf", "--create_only=1", cache.SNAPSHOT_COMMAND, "setsid sh ./launch.sh")
    )
    assert written < layout < counters < submit and f"at={fold.start_at_ns};" in script
    assert fold.jobs == jobs and fold.answers == [None, None] and fold.wave_s > 0
    second.refresh_from_db()
    assert all(h.remote_dir for h in second.hosts.all())  # recorded before any host could start
    assert all("error" not in s for s in second.provenance["cache"]["start"].values())
    for job in jobs:
        state = remote.job_state(job.target, job.context.run_dir)
        assert state.submitted and state.attempt == "fold1"
        remote.job_kill(job.target, job.context.run_dir)


def test_a_run_with_a_flush_or_without_a_measured_wave_is_not_started_while_prepared(lab: dict[str, Any]) -> None:
    first, second = launched("folded-not", ["lab1", "lab2"], repetitions=2).runs.order_by("sequence")
    fold = Fold(attempt="fold1", margin_s=1.0, tolerance_s=0.05)

    execution.run_prepare(Run.objects.select_related("campaign").get(pk=first.pk), fold=fold)
    assert fold.jobs == []  # no submit wave of the campaign to reckon a margin from yet
    started(first, hosts=2, wave_s=0.02)
    second.campaign.flush_clients = True
    second.campaign.save(update_fields=["flush_clients"])
    execution.run_prepare(Run.objects.select_related("campaign").get(pk=second.pk), fold=fold)
    assert fold.jobs == []  # a flush comes between preparing and starting
    assert not any(remote.job_state(j.target, j.row.remote_dir).submitted for j in execution.run_targets(second))
