"""runners.ssh and runners.remote against real lab sshd nodes."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from inventory.models import HostKey
from runners import remote, ssh
from tests.conftest import group_alive, wait_for

pytestmark = pytest.mark.lab


@pytest.fixture
def targets(lab: dict[str, Any]) -> Iterator[list[remote.Target]]:
    remote.reset_pool()
    yield [remote.node_target(node) for node in sorted(lab["nodes"].values(), key=lambda n: n.name)]
    remote.reset_pool()


def test_it_runs_a_command_and_returns_its_output_and_exit_code(targets: list[remote.Target]) -> None:
    result = targets[0].run("echo out; echo err >&2; exit 3")

    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")


def test_it_runs_commands_on_descriptors_past_fd_setsize(targets: list[remote.Target]) -> None:
    """A worker holding ~1,000 connections gets descriptors above 1024, which select() refuses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files ({hard}) is below 1200: no descriptor can pass 1024 here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        remote.reset_pool()  # the next connection (and its channel's pipe) gets descriptors above 1100
        result = targets[0].run("echo past-1024")
    finally:
        for fd in held:
            os.close(fd)
        remote.reset_pool()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.stdout == "past-1024\n"


def test_it_reuses_one_connection_with_tcp_nodelay(targets: list[remote.Target]) -> None:
    target = targets[0]
    target.run("true")
    client = remote.pool().client(target.endpoint, target.pkey)
    sock = client.get_transport().sock

    for _ in range(5):
        target.run("true")

    assert remote.pool().client(target.endpoint, target.pkey) is client
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_an_open_connection_s_thread_wakes_seldom_and_ends_as_soon_as_the_connection_is_closed(
    targets: list[remote.Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transport thread reads with IDLE_CHECK_S as its timeout once connected; closing must not wait for it (a
    descriptor closed under a waiting read would keep the thread, and the TCP connection, until the read times out)."""
    monkeypatch.setattr(ssh, "IDLE_CHECK_S", 600.0)
    target = targets[0]
    target.run("true")
    transport = remote.pool().client(target.endpoint, target.pkey).get_transport()
    assert transport is not None and transport.sock.gettimeout() == 600.0
    wchan = Path(f"/proc/self/task/{transport.native_id}/wchan")
    wait_for(lambda: "poll" in wchan.read_text(), what="the transport thread waiting on its socket")

    remote.pool().discard(target.endpoint)
    transport.join(60)

    assert not transport.is_alive()


def test_it_pins_the_host_key_at_first_contact(targets: list[remote.Target], lab: dict[str, Any]) -> None:
    node = lab["nodes"]["lab1"]
    HostKey.objects.filter(address=node.address, port=node.ssh_port).delete()

    targets[0].run("true")

    pinned = HostKey.objects.get(address=node.address, port=node.ssh_port)
    assert pinned.key_type == "ssh-ed25519" and pinned.fingerprint.startswith("SHA256:")


def test_it_refuses_a_changed_host_key_permanently(targets: list[remote.Target], lab: dict[str, Any]) -> None:
    lab1, lab2 = lab["nodes"]["lab1"], lab["nodes"]["lab2"]
    other = HostKey.objects.get(address=lab2.address, port=lab2.ssh_port)
    HostKey.objects.filter(address=lab1.address, port=lab1.ssh_port).update(key_base64=other.key_base64)

    with pytest.raises(ssh.HostKeyMismatch) as caught:
        targets[0].run("true")

    assert not caught.value.transient
    assert "host key changed" in str(caught.value) and "lab1" in str(caught.value)


def test_it_classes_a_refused_connection_as_transient(lab: dict[str, Any]) -> None:
    endpoint = ssh.Endpoint(address="127.0.1.251", port=lab["nodes"]["lab1"].ssh_port, username="x", name="ghost")
    pool = ssh.Pool(remote.DatabaseHostKeys(), ssh.Timeouts(connect=2))

    with pytest.raises(ssh.TransientSSHError, match="ghost .*cannot connect"):
        pool.run(endpoint, remote.node_target(lab["nodes"]["lab1"]).pkey, "true")


def test_it_times_out_a_command_that_hangs(targets: list[remote.Target]) -> None:
    started = time.monotonic()
    with pytest.raises(ssh.CommandTimeout):
        targets[0].run("sleep 5", timeout=0.5)
    assert time.monotonic() - started < 5  # cut short: not waited for until the command ended


def test_it_fans_a_command_out_to_every_node_at_once(targets: list[remote.Target]) -> None:
    results = ssh.fan_out(targets, lambda t: t.run("date +%s.%N; sleep 1; date +%s.%N"))

    assert all(isinstance(r, ssh.CommandResult) and r.ok for r in results)
    spans = [tuple(map(float, r.stdout.split())) for r in results if isinstance(r, ssh.CommandResult)]
    # all four ran at once: every command had started before any of them ended
    assert max(start for start, _ in spans) < min(end for _, end in spans)


def test_it_passes_arguments_with_shell_metacharacters_literally(targets: list[remote.Target], tmp_path: Any) -> None:
    marker = tmp_path / "pwned"
    value = f"a; touch {marker} $(touch {marker}) `touch {marker}` | & > <"

    result = targets[0].run(shlex.join(["printf", "%s", value]))

    assert result.stdout == value
    assert not marker.exists()


def test_it_runs_a_detached_job_that_survives_a_dropped_connection(targets: list[remote.Target]) -> None:
    target = targets[0]
    job_dir = f"{remote.remote_root(target)}/test/detached-{time.monotonic_ns()}"
    remote.job_prepare(
        target,
        job_dir,
        extra_dirs=[],
        files={"command.sh": remote.command_script(["sh", "-c", "sleep 1; echo done"], {})},
    )
    remote.job_submit(target, job_dir)
    remote.job_submit(target, job_dir)  # a redelivered submit starts nothing
    remote.reset_pool()  # drop every connection while the job runs

    state = remote.job_state(target, job_dir)
    assert state.submitted and state.alive and not state.finished
    final = _wait_finished(target, job_dir)
    assert final.exit_code == 0
    assert remote.job_output(target, job_dir) == ("done\n", "")


def test_it_writes_a_job_s_files_exactly_and_with_their_modes_in_one_round_trip(targets: list[remote.Target]) -> None:
    target = targets[0]
    job_dir = f"{remote.remote_root(target)}/test/files-{time.monotonic_ns()}"
    data_dir = f"{job_dir}-data/it's $HOME"
    files = {
        "command.sh": remote.command_script(["echo", "it's $HOME `id`"], {"A": "b c"}),
        "job.fio": "[global]\nname=x\nRACKBENCH_FILE_END\n'EOF'\n\u00e9" + "x" * 200_000,  # past a command line's limit
        "empty": "",
    }
    commands: list[str] = []
    run_command = remote.Target.run

    def counted(self: remote.Target, command: str, **options: Any) -> Any:
        commands.append(command)
        return run_command(self, command, **options)

    with mock.patch.object(remote.Target, "run", counted):
        remote.job_prepare(target, job_dir, extra_dirs=[data_dir], files=files)

    assert len(commands) == 1
    for name, content in files.items():
        assert target.get(f"{job_dir}/{name}") == content.encode()
    listing = target.run(shlex.join(["stat", "-c", "%a %n", *(f"{job_dir}/{n}" for n in [*files, "launch.sh"])]))
    assert [line.split()[0] for line in listing.stdout.splitlines()] == ["644", "644", "644", "755"]
    assert target.run(shlex.join(["test", "-d", data_dir])).ok


def test_it_kills_the_whole_process_group_of_a_job(targets: list[remote.Target]) -> None:
    target = targets[0]
    job_dir = f"{remote.remote_root(target)}/test/kill-{time.monotonic_ns()}"
    script = remote.command_script(["sh", "-c", "sleep 60 & sleep 60; wait"], {})
    remote.job_prepare(target, job_dir, extra_dirs=[], files={"command.sh": script})
    remote.job_submit(target, job_dir)
    pid = _wait_pid(target, job_dir)

    remote.job_kill(target, job_dir, grace=1)

    assert not group_alive(pid)  # the lab node runs on this machine
    assert remote.job_state(target, job_dir).exit_code is None


def _wait_finished(target: remote.Target, job_dir: str) -> remote.JobState:
    for _ in range(100):
        state = remote.job_state(target, job_dir)
        if state.finished:
            return state
        time.sleep(0.1)
    raise AssertionError("job did not finish")


WATCH_S = 60.0  # a watch that only ran out takes this long: returning sooner is the end (or the job gone) seen


def _watched(target: remote.Target, job_dir: str) -> tuple[remote.JobState, float]:
    began = time.monotonic()
    state = remote.job_state(target, job_dir, wait=WATCH_S)
    return state, time.monotonic() - began


def test_a_watched_job_s_end_is_seen_through_its_fifo_and_without_one(targets: list[remote.Target]) -> None:
    for target, fifo in zip(targets[:2], [True, False], strict=True):
        job_dir = f"{remote.remote_root(target)}/test/watch-{time.monotonic_ns()}"
        script = remote.command_script(["sh", "-c", "sleep 1; exit 7"], {})
        remote.job_prepare(target, job_dir, extra_dirs=[], files={"command.sh": script})
        assert target.run(f"test -p {shlex.quote(job_dir)}/ended").ok
        if not fifo:  # a job prepared by an earlier version: looked at every WATCH_TICK instead
            target.check(f"rm {shlex.quote(job_dir)}/ended", what="removing the FIFO")
        remote.job_submit(target, job_dir)

        state, took = _watched(target, job_dir)

        assert state.exit_code == 7 and took < WATCH_S, (fifo, took)


def test_a_watched_job_killed_from_outside_is_seen_gone_before_the_watch_runs_out(
    targets: list[remote.Target],
) -> None:
    target = targets[0]
    job_dir = f"{remote.remote_root(target)}/test/watch-killed-{time.monotonic_ns()}"
    script = remote.command_script(["sleep", "300"], {})
    remote.job_prepare(target, job_dir, extra_dirs=[], files={"command.sh": script})
    remote.job_submit(target, job_dir)
    pid = _wait_pid(target, job_dir)
    killer = threading.Timer(1.0, os.killpg, (pid, signal.SIGKILL))  # no exit code is ever written, no FIFO woken
    killer.start()

    state, took = _watched(target, job_dir)

    killer.join()
    assert state.vanished and took < WATCH_S


def _wait_pid(target: remote.Target, job_dir: str) -> int:
    for _ in range(100):
        state = remote.job_state(target, job_dir)
        if state.pid:
            return state.pid
        time.sleep(0.05)
    raise AssertionError("job did not start")


def test_mpirun_reaches_every_lab_node_over_its_sshd(targets: list[remote.Target], lab: dict[str, Any]) -> None:
    from campaigns.plan import host_infos
    from plugins.launchers.mpi import MpiOptions, mpirun_argv

    hosts = host_infos([lab["nodes"]["lab1"], lab["nodes"]["lab2"]])
    # SSH_CONNECTION is "client-ip client-port server-ip server-port": which node's sshd started the rank
    rank = ["sh", "-c", 'set -- $SSH_CONNECTION; echo "rank $OMPI_COMM_WORLD_RANK via $3:$4"']
    argv = mpirun_argv(hosts, rank, MpiOptions(slots=2, report_bindings=False))

    result = targets[0].run(shlex.join(argv), timeout=60)

    assert result.ok, result.stderr
    assert f"-p {hosts[0].ssh_port}" in argv  # the nodes' own sshd port, not 22
    lines = sorted(result.stdout.split("\n")[:-1])
    port = hosts[0].ssh_port
    assert lines == [f"rank {r} via {hosts[r // 2].address}:{port}" for r in range(4)]


def test_a_pooled_connection_past_its_age_is_reopened_and_its_host_key_checked_again(lab: dict[str, Any]) -> None:
    lab1, lab2 = lab["nodes"]["lab1"], lab["nodes"]["lab2"]
    target = remote.node_target(lab1)
    pool = ssh.Pool(remote.DatabaseHostKeys(), ssh.Timeouts(connect=3, command=5, max_age=1.0))
    try:
        pool.run(target.endpoint, target.pkey, "true")
        first = pool.client(target.endpoint, target.pkey)
        # The node's key changes (reinstalled, or someone in the middle): as rackbench sees it, the pinned key and
        # the one the node offers now differ.
        other = HostKey.objects.get(address=lab2.address, port=lab2.ssh_port)
        HostKey.objects.filter(address=lab1.address, port=lab1.ssh_port).update(key_base64=other.key_base64)
        assert pool.run(target.endpoint, target.pkey, "true").exit_code == 0  # still young: reused
        assert pool.client(target.endpoint, target.pkey) is first
        time.sleep(1.2)
        with pytest.raises(ssh.HostKeyMismatch, match="host key changed"):
            pool.run(target.endpoint, target.pkey, "true")
    finally:
        pool.close_all()


def test_the_pool_takes_its_connection_age_from_the_settings(settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "SSH_MAX_AGE": 42.0}
    remote.reset_pool()
    try:
        assert remote.pool().timeouts.max_age == 42.0
    finally:
        remote.reset_pool()


@pytest.mark.django_db(transaction=True)
def test_fan_out_threads_open_no_database_connection_and_hand_database_work_to_the_pool() -> None:
    """A fan-out thread cannot open a connection of its own (a 64-node run once held a hundred of them, past
    PostgreSQL's limit): direct use fails at once with a clear error, work passed to database.call is done."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    from inventory.models import Node
    from runners import database

    used: list[Any] = []

    def directly(_: int) -> int:
        used.append(connections["default"])
        return Node.objects.count()

    failures = remote.fan_out(list(range(8)), directly)
    answers = remote.fan_out(list(range(8)), lambda _: database.call(Node.objects.count))

    assert all(isinstance(f, database.DatabaseInSSHThread) for f in failures)
    assert "runners.database.call" in str(failures[0]) and "fan-out-" in str(failures[0])
    assert used and not any(isinstance(c, BaseDatabaseWrapper) for c in used)  # stand-ins, never a connection
    assert answers == [0] * 8


def test_fan_out_runs_the_thread_exit_hook_in_every_pool_thread_before_it_returns() -> None:
    import threading

    worked: set[str] = set()
    exited: list[str] = []

    def work(item: int) -> int:
        worked.add(threading.current_thread().name)
        return item * 2

    results = ssh.fan_out(
        range(10), work, workers=3, on_thread_exit=lambda: exited.append(threading.current_thread().name)
    )

    assert results == [item * 2 for item in range(10)]
    assert len(exited) == 3 and set(exited) >= worked and threading.main_thread().name not in exited


def test_fan_out_keeps_each_failure_in_its_slot() -> None:
    def work(item: int) -> int:
        if item == 2:
            raise ValueError("two")
        return item

    results = ssh.fan_out(range(4), work, workers=2, on_thread_exit=lambda: None)

    assert results[:2] == [0, 1] and isinstance(results[2], ValueError) and results[3] == 3
