"""The netns lab, for real: each node in its own network namespace with a 198.18.0.0/15 address, joined to a bridge
by a veth pair, reached over that bridge; faults put on a node's link with tc, or on its CPU, and healed."""

from __future__ import annotations

import io
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from runners import lab
from tests.conftest import NETNS_LAB_PORT, wait_for
from tests.test_lab import ssh

pytestmark = pytest.mark.lab


def nodes_of(lab_dir: Path) -> dict[str, lab.LabNode]:
    return {n.name: n for n in lab.lab_status(lab_dir=lab_dir)}


def netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True).returncode == 0


def iperf3_mbits(lab_dir: Path, sender: str, receiver: str) -> float:
    """Mbit/s from sender to receiver, each iperf3 started over SSH in its node."""
    nodes, account = nodes_of(lab_dir), lab.lab_account(lab_dir=lab_dir)
    server = nodes[receiver]
    started = ssh(server, account, f"iperf3 -s -1 -D -p 5999 -B {server.address}")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: "LISTEN" in ssh(server, account, "ss -ltn sport = :5999 || true").stdout or True, timeout=5)
    time.sleep(0.3)
    client = ssh(nodes[sender], account, f"iperf3 -c {server.address} -p 5999 -t 1 -J")
    assert client.returncode == 0, client.stdout[-500:] + client.stderr
    return json.loads(client.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6


def test_each_node_has_its_own_namespace_and_a_benchmark_address(netns_lab_dir: Path) -> None:
    nodes = nodes_of(netns_lab_dir)
    subnet = lab.netns_subnet(NETNS_LAB_PORT)

    assert subnet.subnet_of(ipaddress.IPv4Network("198.18.0.0/15"))
    assert [n.address for n in nodes.values()] == [str(subnet.network_address + i) for i in range(1, 7)]
    own = netns_inode(os.getpid())
    inodes = {name: netns_inode(n.pid) for name, n in nodes.items() if n.pid}
    assert len(set(inodes.values())) == 6 and own not in inodes.values()
    for name, node in nodes.items():  # each listener lives in the namespace named after its lab's port
        assert inodes[name] == os.stat(f"/run/netns/{node.namespace}").st_ino
        assert node.namespace == f"rbl{NETNS_LAB_PORT}-{name}"


def test_a_node_sees_only_its_own_link_and_reaches_its_peers_over_the_bridge(netns_lab_dir: Path) -> None:
    nodes, account = nodes_of(netns_lab_dir), lab.lab_account(lab_dir=netns_lab_dir)

    seen = ssh(
        nodes["lab1"], account, f"ip -4 -o addr show; ssh -p {NETNS_LAB_PORT} {nodes['lab3'].address} hostname -I"
    )

    assert seen.returncode == 0, seen.stderr
    lines = seen.stdout.splitlines()
    assert [line.split()[1] for line in lines if " inet " in line] == ["lo", "eth0"]
    assert f"inet {nodes['lab1'].address}/24" in seen.stdout
    assert lines[-1].split() == [nodes["lab3"].address]  # mpirun's hop: lab1 -> lab3 over the bridge


def test_iperf3_through_a_degraded_link_gets_the_rate_tc_allows_until_healed(netns_lab_dir: Path) -> None:
    healthy = iperf3_mbits(netns_lab_dir, "lab1", "lab2")
    lab.lab_degrade("lab2", rate="100mbit", lab_dir=netns_lab_dir)
    try:
        into = iperf3_mbits(netns_lab_dir, "lab1", "lab2")
        out_of = iperf3_mbits(netns_lab_dir, "lab2", "lab3")
        elsewhere = iperf3_mbits(netns_lab_dir, "lab3", "lab1")
    finally:
        lab.lab_heal("lab2", lab_dir=netns_lab_dir)
    healed = iperf3_mbits(netns_lab_dir, "lab1", "lab2")

    assert healthy > 400
    assert 70 < into < 101 and 70 < out_of < 101  # both directions of the node's link
    assert elsewhere > 400 and healed > 400


BUSY = (
    'python3 -c "import time\nt, c = time.monotonic(), time.process_time()\n'
    'while time.monotonic() - t < 1.5: pass\nprint(time.process_time() - c, time.monotonic() - t)"'
    "; cat /proc/self/cgroup"
)


def busy_share(node: lab.LabNode, account: lab.LabAccount) -> tuple[float, str]:
    """A 1.5 s busy loop started over SSH in the node: the share of a core it got, and its cgroups."""
    done = ssh(node, account, BUSY)
    assert done.returncode == 0, done.stderr
    first, *cgroups = done.stdout.splitlines()
    cpu, wall = (float(x) for x in first.split())
    return cpu / wall, "\n".join(cgroups)


def test_a_cpu_fault_caps_the_node_alone_until_healed(netns_lab_dir: Path) -> None:
    nodes, account = nodes_of(netns_lab_dir), lab.lab_account(lab_dir=netns_lab_dir)
    namespace = nodes["lab3"].namespace
    degraded = lab.lab_degrade("lab3", cpu="2%", lab_dir=netns_lab_dir)
    try:
        assert degraded.cpu_fault == "cgroup cap 2% of a core", "this machine has a writable cpu cgroup controller"
        share, cgroups = busy_share(nodes["lab3"], account)
        _, elsewhere = busy_share(nodes["lab1"], account)
        group = Path("/sys/fs/cgroup/cpu") / namespace
        throttled = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
        assert nodes_of(netns_lab_dir)["lab3"].cpu_fault == "cgroup cap 2% of a core"  # lab status says so
    finally:
        lab.lab_heal("lab3", lab_dir=netns_lab_dir)
    assert f"/{namespace}" in cgroups and namespace not in elsewhere  # its sessions in its group, others not
    assert share < 0.05, f"the capped node's busy loop got {share:.0%} of a core"
    assert int(throttled["nr_throttled"]) > 0
    assert not group.exists() and nodes_of(netns_lab_dir)["lab3"].cpu_fault == ""
    _, healed = busy_share(nodes["lab3"], account)
    assert namespace not in healed


def test_without_a_cpu_cgroup_the_cpu_fault_is_a_hog_pinned_in_the_node(
    netns_lab_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lab, "_cpu_controller", lambda: None)  # as on a machine whose cgroups are read-only
    degraded = lab.lab_degrade("lab3", cpu=True, lab_dir=netns_lab_dir)
    pid_file = netns_lab_dir / "nodes" / "lab3" / "cpuhog.pid"
    try:
        assert degraded.cpu_fault == "busy loop pinned to one core"
        pid = int(pid_file.read_text())
        # ip netns exec, then taskset, exec into the loop with the same pid
        wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh\0"), timeout=5)
        assert netns_inode(pid) == os.stat(f"/run/netns/{nodes_of(netns_lab_dir)['lab3'].namespace}").st_ino
        affinity = os.sched_getaffinity(pid)
        assert len(affinity) == 1
    finally:
        lab.lab_heal("lab3", lab_dir=netns_lab_dir)
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text(), timeout=10)
    assert not pid_file.exists()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"rate": "300mbit; reboot"}, "--rate"),
        ({"rate": "-1mbit"}, "--rate"),
        ({"delay": "2 ms"}, "--delay"),
        ({"loss": "150%"}, "--loss"),
        ({"cpu": "0%"}, "--cpu"),
        ({"cpu": "150%"}, "--cpu"),
        ({"cpu": "half"}, "--cpu"),
        ({}, "--rate"),
    ],
)
def test_bad_fault_values_are_refused_naming_the_option(
    netns_lab_dir: Path, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(lab.LabError, match=named):
        lab.lab_degrade("lab1", lab_dir=netns_lab_dir, **options)


def test_faults_need_a_node_of_a_netns_lab(netns_lab_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(lab.LabError, match="not a node"):
        lab.lab_degrade("lab99", rate="1mbit", lab_dir=netns_lab_dir)
    with pytest.raises(lab.LabError, match="not a node"):
        lab.lab_degrade("../lab1", rate="1mbit", lab_dir=netns_lab_dir)
    with pytest.raises(lab.LabError, match="netns lab"):
        lab.lab_degrade("lab1", rate="1mbit", lab_dir=tmp_path)


def test_a_second_lab_on_another_port_gets_its_own_subnet_and_down_removes_only_its_own(netns_lab_dir: Path) -> None:
    other_dir = Path(tempfile.mkdtemp(prefix="rackbench-test-netlab2-"))
    other_dir.chmod(0o755)
    try:
        other = lab.lab_up(1, port=NETNS_LAB_PORT + 1, lab_dir=other_dir, network=lab.NETNS)
        assert other[0].address == str(lab.netns_subnet(NETNS_LAB_PORT + 1).network_address + 1)
        assert lab.netns_subnet(NETNS_LAB_PORT + 1) != lab.netns_subnet(NETNS_LAB_PORT)
        assert link_exists(f"rbl{NETNS_LAB_PORT + 1}")
    finally:
        lab.lab_down(lab_dir=other_dir)
        shutil.rmtree(other_dir, ignore_errors=True)

    assert not link_exists(f"rbl{NETNS_LAB_PORT + 1}")
    assert not Path(f"/run/netns/rbl{NETNS_LAB_PORT + 1}-lab1").exists()
    assert link_exists(f"rbl{NETNS_LAB_PORT}") and all(n.running for n in nodes_of(netns_lab_dir).values())


@pytest.mark.django_db
def test_the_command_degrades_and_heals_and_refuses_a_loopback_lab(netns_lab_dir: Path, settings: Any) -> None:
    settings.RACKBENCH = {**settings.RACKBENCH, "LAB_DIR": netns_lab_dir}
    out = io.StringIO()
    call_command("lab", "degrade", "lab4", "--rate", "200mbit", stdout=out)
    shown = subprocess.run(["tc", "qdisc", "show", "dev", f"rbl{NETNS_LAB_PORT}v4"], capture_output=True, text=True)
    call_command("lab", "heal", stdout=out)
    after = subprocess.run(["tc", "qdisc", "show", "dev", f"rbl{NETNS_LAB_PORT}v4"], capture_output=True, text=True)

    assert "tbf" in shown.stdout and "200Mbit" in shown.stdout
    assert "tbf" not in after.stdout
    loopback = Path(tempfile.mkdtemp(prefix="rackbench-test-lab-"))
    settings.RACKBENCH = {**settings.RACKBENCH, "LAB_DIR": loopback}
    with pytest.raises(CommandError, match="netns lab"):
        call_command("lab", "degrade", "lab1", "--rate", "1mbit", stdout=out)
    shutil.rmtree(loopback)
