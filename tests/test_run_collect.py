"""runners.lifecycle.run_collect on the lab: one round trip per host, and output of any shape kept as it was."""

from __future__ import annotations

import shlex
from typing import Any
from unittest import mock

import pytest

from campaigns.models import Run, RunHost, RunStatus
from inventory.models import Node
from runners import execution, remote
from tests.conftest import wait_for
from tests.test_run_prepare import launched

pytestmark = pytest.mark.lab


def ended_run(name: str, nodes: list[str]) -> Run:
    """A run of one repetition prepared, started and ended on ``nodes``, and collecting (no worker takes part)."""
    run = launched(name, nodes, repetitions=1).runs.get()
    run = Run.objects.select_related("campaign").get(pk=run.pk)
    execution.run_submit(execution.run_prepare(run))
    wait_for(lambda: execution.run_poll(run, wait=5).finished, timeout=60, what="the job's end")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COLLECTING)
    return Run.objects.select_related("campaign").get(pk=run.pk)


def collect(run: Run) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    """Collect the run; returns its outcome and every command run on a host, with the host (no SFTP allowed)."""
    commands: list[tuple[str, str]] = []
    run_command = remote.Target.run

    def counted(target: remote.Target, command: str, **options: Any) -> Any:
        commands.append((target.endpoint.name, command))
        return run_command(target, command, **options)

    with (
        mock.patch.object(remote.Target, "run", counted),
        mock.patch.object(remote.Target, "get") as get,
        mock.patch.object(remote.Target, "put") as put,
    ):
        outcome = execution.run_collect(run)
    assert not get.called and not put.called  # no SFTP session
    return outcome, commands


def test_collecting_a_run_is_one_command_per_host(lab: dict[str, Any]) -> None:
    run = ended_run("collect-once", ["lab1", "lab2", "lab3"])

    (status, error), commands = collect(run)

    assert (status, error) == (RunStatus.SUCCEEDED, "")
    assert sorted(commands) == [("lab1", "sh -s"), ("lab2", "sh -s"), ("lab3", "sh -s")]
    for host in RunHost.objects.filter(run=run):
        assert host.exit_code == 0 and '"jobname"' in host.stdout
    provenance = Run.objects.get(pk=run.pk).provenance["cache"]
    assert set(provenance["end"]) == {"lab1", "lab2", "lab3"}  # the counters came with the output
    assert set(provenance["processes"]) == {"lab1", "lab2", "lab3"}  # and the job's own I/O accounting
    assert all(p["rchar"] > 0 for p in provenance["processes"].values())


def test_output_of_any_shape_is_kept_byte_for_byte_and_its_tail_cut_as_before(lab: dict[str, Any]) -> None:
    run = ended_run("collect-awkward", ["lab1"])
    host = RunHost.objects.get(run=run)
    big = b"".join(b"line %06d of a long output\n" % i for i in range(20_000))  # 540 kB, past the 4,000 tail
    odd = b"\x00\xff\xfe binary, a header look-alike:\n--rackbench-file end\nno newline at the end"
    target = remote.node_target(Node.objects.get(name="lab1"))
    script = "\n".join(
        f"printf %s {shlex.quote(content.hex())} | xxd -r -p > {shlex.quote(f'{host.remote_dir}/{name}')}"
        for name, content in [("stdout", big + odd), ("stderr", odd), ("exit_code", b"3")]
    )
    target.check("sh -s", what="writing awkward output", stdin=script.encode())

    (status, error), _ = collect(run)

    host.refresh_from_db()
    text = (big + odd).decode(errors="replace").replace("\0", "\ufffd")  # PostgreSQL's text holds no NUL
    assert status == RunStatus.FAILED and "exited with code 3" in error  # no trailing newline on the exit code
    assert host.exit_code == 3
    assert host.stdout == text  # all of it: the collect reads whole files
    assert host.stderr == text[len(big) :]
    stored = Run.objects.get(pk=run.pk)
    assert stored.stdout_tail == host.stdout[-execution.TAIL :]
    assert stored.stderr_tail == host.stderr[-execution.TAIL :]


def test_a_job_directory_read_in_one_command_splits_into_its_files(lab: dict[str, Any]) -> None:
    target = remote.node_target(Node.objects.get(name="lab2"))
    job_dir = f"{target.home()}/collect-split"
    target.check(
        f"rm -rf {shlex.quote(job_dir)} && mkdir -p {shlex.quote(job_dir)} && cd {shlex.quote(job_dir)} && "
        "printf 'abcdef' > stdout && : > stderr",
        what="making a job directory",
    )

    found = remote.job_collect(target, job_dir, ["exit_code", "stdout", "stderr"], limit=4)
    missing = remote.job_collect(target, f"{job_dir}/none", ["stdout"])

    assert found.files == {"exit_code": None, "stdout": b"cdef", "stderr": b""}  # the last 4 bytes, as get did
    assert found.exit_code is None
    assert missing.files == {"stdout": None}
    assert remote.job_output(target, job_dir) == ("abcdef", "")
