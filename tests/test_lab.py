"""The built-in lab, for real: sshd daemons on loopback that accept the lab key, run fio and serve SFTP.

Every lab here lives in its own directory, on its own loopback addresses and on a port the kernel reports
free, so the suite never touches a user's lab (127.0.1.N:2222) or another run of itself.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.models import Credential, HostKey, Node, StorageSystem
from inventory.services import hostkey_forget, hostkey_pin, node_upsert
from runners import lab

pytestmark = pytest.mark.lab

AS_ROOT = os.geteuid() == 0


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    """A zombie counts as gone: the init process of this machine reaps late."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def ssh(node: lab.LabNode, account: lab.LabAccount, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(account.private_key),
            "-p",
            str(node.port),
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            f"{account.user}@{node.address}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def make_lab_dir() -> Path:
    # Not pytest's tmp_path: its 0700 parents would keep the lab user from reading authorized_keys.
    path = Path(tempfile.mkdtemp(prefix="rackbench-lab-test-"))
    path.chmod(0o755)
    return path


def remove_lab(path: Path) -> None:
    lab.lab_down(lab_dir=path)
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def lab_dir() -> Iterator[Path]:
    path = make_lab_dir()
    yield path
    remove_lab(path)


@pytest.fixture(scope="module")
def nodes(lab_dir: Path) -> list[lab.LabNode]:
    return lab.lab_up(2, base_address="127.0.91.0", port=free_port("127.0.91.1"), lab_dir=lab_dir)


@pytest.fixture(scope="module")
def account(lab_dir: Path, nodes: list[lab.LabNode]) -> lab.LabAccount:
    return lab.lab_account(lab_dir=lab_dir)


@pytest.fixture
def fresh_lab_dir() -> Iterator[Path]:
    path = make_lab_dir()
    yield path
    remove_lab(path)


# --- the daemons ------------------------------------------------------------------------------


def test_it_runs_one_sshd_per_node_on_its_own_loopback_address(nodes: list[lab.LabNode]) -> None:
    assert [(n.name, n.address) for n in nodes] == [("lab1", "127.0.91.1"), ("lab2", "127.0.91.2")]
    assert len({n.port for n in nodes}) == 1
    assert all(n.running and n.pid and alive(n.pid) for n in nodes)
    assert all(n.host_public_key.startswith("ssh-ed25519 ") for n in nodes)


def test_it_logs_in_as_the_lab_user_with_the_generated_key_and_runs_fio(
    nodes: list[lab.LabNode], account: lab.LabAccount
) -> None:
    for node in nodes:
        result = ssh(node, account, "id -un; fio --version")
        assert result.returncode == 0, result.stderr
        user, version = result.stdout.split()
        assert user == account.user
        assert version.startswith("fio-")


def test_it_logs_in_as_a_dedicated_user_with_a_light_shell_when_root(account: lab.LabAccount) -> None:
    if not AS_ROOT:
        pytest.skip("unprivileged, the lab logs in as the user running it")
    assert account.user == "rackbench-lab"
    assert account.home == Path("/var/lib/rackbench-lab")
    assert pwd.getpwnam("rackbench-lab").pw_shell == "/bin/sh"


def test_it_lets_the_lab_user_flush_the_page_cache_when_root(nodes: list[lab.LabNode], account: lab.LabAccount) -> None:
    if not AS_ROOT:
        pytest.skip("unprivileged, flushing caches needs the user's own sudo rights")
    result = ssh(nodes[0], account, "sync; echo 3 | sudo -n tee /proc/sys/vm/drop_caches")
    assert (result.returncode, result.stdout.strip()) == (0, "3"), result.stderr


def test_it_allows_the_lab_user_nothing_else_through_sudo(nodes: list[lab.LabNode], account: lab.LabAccount) -> None:
    if not AS_ROOT:
        pytest.skip("no sudoers rule is written when unprivileged")
    result = ssh(nodes[0], account, "echo 1 | sudo -n tee /proc/sys/vm/compact_memory")
    assert result.returncode != 0


def test_it_serves_sftp_for_writing_job_files(nodes: list[lab.LabNode], account: lab.LabAccount) -> None:
    name = f"sftp-{uuid.uuid4().hex}"
    source = account.private_key.parent.parent / name
    source.write_text("written over sftp\n")
    target = account.scratch / name
    try:
        put = subprocess.run(
            [
                "sftp",
                "-F",
                "/dev/null",
                "-i",
                str(account.private_key),
                "-P",
                str(nodes[1].port),
                "-b",
                "-",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                f"{account.user}@{nodes[1].address}",
            ],
            input=f"put {source} {target}\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert put.returncode == 0, put.stderr
        assert ssh(nodes[0], account, f"cat {target}").stdout == "written over sftp\n"
    finally:
        source.unlink()
        target.unlink(missing_ok=True)


def test_it_keeps_the_client_key_private(account: lab.LabAccount) -> None:
    assert account.private_key.stat().st_mode & 0o777 == 0o600


def test_it_leaves_running_nodes_alone_when_up_again(lab_dir: Path, nodes: list[lab.LabNode]) -> None:
    again = lab.lab_up(2, lab_dir=lab_dir)
    assert [n.pid for n in again] == [n.pid for n in nodes]
    assert lab.lab_status(lab_dir=lab_dir) == again


def test_it_starts_only_the_missing_nodes_when_grown(fresh_lab_dir: Path) -> None:
    (first,) = lab.lab_up(1, base_address="127.0.92.0", port=free_port("127.0.92.1"), lab_dir=fresh_lab_dir)
    grown = lab.lab_up(3, lab_dir=fresh_lab_dir)
    assert [n.name for n in grown] == ["lab1", "lab2", "lab3"]
    assert grown[0].pid == first.pid
    assert all(n.running for n in grown)


def test_it_refuses_to_move_running_nodes(fresh_lab_dir: Path) -> None:
    (node,) = lab.lab_up(1, base_address="127.0.92.0", port=free_port("127.0.92.1"), lab_dir=fresh_lab_dir)
    with pytest.raises(lab.LabError, match="lab down"):
        lab.lab_up(1, port=node.port + 1, lab_dir=fresh_lab_dir)


def test_it_keeps_host_and_client_keys_across_down_and_up(fresh_lab_dir: Path) -> None:
    (before,) = lab.lab_up(1, base_address="127.0.92.0", port=free_port("127.0.92.1"), lab_dir=fresh_lab_dir)
    client_key = lab.lab_account(lab_dir=fresh_lab_dir).private_key.read_text()
    assert lab.lab_down(lab_dir=fresh_lab_dir) == 1
    (after,) = lab.lab_up(1, lab_dir=fresh_lab_dir)
    assert after.pid != before.pid
    assert after.host_public_key == before.host_public_key
    assert lab.lab_account(lab_dir=fresh_lab_dir).private_key.read_text() == client_key


def test_down_leaves_no_process_of_the_lab_behind(fresh_lab_dir: Path) -> None:
    nodes = lab.lab_up(2, base_address="127.0.92.0", port=free_port("127.0.92.1"), lab_dir=fresh_lab_dir)
    account = lab.lab_account(lab_dir=fresh_lab_dir)
    detached = ssh(nodes[0], account, "nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $!")
    session = subprocess.Popen(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(account.private_key),
            "-p",
            str(nodes[1].port),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            f"{account.user}@{nodes[1].address}",
            "echo $$; exec sleep 300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert session.stdout is not None
        in_session = int(session.stdout.readline())
        pids = [int(detached.stdout), in_session, *(n.pid for n in nodes if n.pid)]
        assert all(alive(pid) for pid in pids)

        assert lab.lab_down(lab_dir=fresh_lab_dir) == 2

        assert not [pid for pid in pids if alive(pid)]
        assert not any(n.running for n in lab.lab_status(lab_dir=fresh_lab_dir))
        assert session.wait(timeout=10) != 0  # the node hung up on it
    finally:
        session.kill()


def test_down_without_a_lab_does_nothing(tmp_path: Path) -> None:
    assert lab.lab_down(lab_dir=tmp_path / "none") == 0
    assert lab.lab_status(lab_dir=tmp_path / "none") == []


# --- the management command and the inventory -------------------------------------------------


@pytest.fixture
def command_lab(settings, fresh_lab_dir: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    settings.RACKBENCH = {**settings.RACKBENCH, "LAB_DIR": fresh_lab_dir}
    return {"base": "127.0.93.0", "port": str(free_port("127.0.93.1"))}


def manage(*args: str) -> str:
    out = io.StringIO()
    call_command("lab", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_up_registers_the_nodes_the_credential_the_storage_and_the_host_keys(command_lab: dict[str, str]) -> None:
    output = manage("up", "--nodes", "2", "--port", command_lab["port"], "--base-address", command_lab["base"])
    account = lab.lab_account()
    nodes = lab.lab_status()

    assert "lab2" in output and "yes" in output
    credential = Credential.objects.get(name="lab")
    assert credential.username == account.user
    assert credential.public_key.split()[1] == account.private_key.with_suffix(".pub").read_text().split()[1]
    registered = Node.objects.filter(tags__name="lab").order_by("name")
    assert [(n.name, n.address, n.ssh_port, n.ssh_user, n.credential, n.status) for n in registered] == [
        (n.name, n.address, n.port, account.user, credential, "active") for n in nodes
    ]
    storage = StorageSystem.objects.get(name="lab-local")
    assert (storage.kind, storage.export_path, storage.flush_command) == ("local", str(account.scratch), "sync")
    assert (storage.admin_address, storage.admin_port, storage.admin_credential) == (
        nodes[0].address,
        nodes[0].port,
        credential,
    )
    for node in nodes:
        assert HostKey.objects.get(address=node.address, port=node.port).key_base64 == node.host_public_key.split()[1]


@pytest.mark.django_db
def test_up_again_changes_nothing(command_lab: dict[str, str]) -> None:
    manage("up", "--nodes", "2", "--port", command_lab["port"], "--base-address", command_lab["base"])
    pids = [n.pid for n in lab.lab_status()]
    credential = Credential.objects.get(name="lab")

    manage("up", "--nodes", "2")

    assert [n.pid for n in lab.lab_status()] == pids
    assert Credential.objects.get().private_key_encrypted == credential.private_key_encrypted
    assert (Node.objects.count(), StorageSystem.objects.count(), HostKey.objects.count()) == (2, 1, 2)


@pytest.mark.django_db
def test_down_keeps_the_inventory_and_up_reactivates_it(command_lab: dict[str, str]) -> None:
    manage("up", "--nodes", "1", "--port", command_lab["port"], "--base-address", command_lab["base"])
    assert "Stopped 1 " in manage("down")
    assert Node.objects.get(name="lab1").status == "active"
    node_upsert(name="lab1", status="retired")

    manage("up", "--nodes", "1")

    assert Node.objects.get(name="lab1").status == "active"


@pytest.mark.django_db
def test_up_repins_a_host_key_the_lab_replaced(command_lab: dict[str, str]) -> None:
    manage("up", "--nodes", "1", "--port", command_lab["port"], "--base-address", command_lab["base"])
    (node,) = lab.lab_status()
    hostkey_forget(address=node.address, port=node.port)
    hostkey_pin(address=node.address, port=node.port, key_type="ssh-ed25519", key_base64="AAAAC3NzaC1lZDI1NTE5AAAAIA==")

    manage("up", "--nodes", "1")

    assert HostKey.objects.get(address=node.address, port=node.port).key_base64 == node.host_public_key.split()[1]


@pytest.mark.django_db
def test_status_prints_json(command_lab: dict[str, str]) -> None:
    manage("up", "--nodes", "2", "--port", command_lab["port"], "--base-address", command_lab["base"])
    rows = json.loads(manage("status", "--json"))
    assert [(r["name"], r["address"], r["port"], r["running"]) for r in rows] == [
        ("lab1", "127.0.93.1", int(command_lab["port"]), True),
        ("lab2", "127.0.93.2", int(command_lab["port"]), True),
    ]
    assert all(isinstance(r["pid"], int) for r in rows)


@pytest.mark.django_db
def test_status_says_so_when_there_is_no_lab(command_lab: dict[str, str]) -> None:
    assert json.loads(manage("status", "--json")) == []
    assert "No lab nodes" in manage("status")


def test_a_lab_error_becomes_a_command_error(command_lab: dict[str, str]) -> None:
    with pytest.raises(CommandError, match="at least one node"):
        manage("up", "--nodes", "0")
