"""Facts discovery: the parsers on real tool output (tests/fixtures/facts/SOURCES.md), the script on this
machine and over SSH on a lab node, and the Celery task's retry policy."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from django.conf import settings

from inventory import services
from inventory.models import Interface, InterfaceRole
from runners import facts, lab, remote, ssh
from runners.tasks import collect_facts_task

FIXTURES = Path(__file__).parent / "fixtures" / "facts"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- nvidia-smi -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capture, name, memory_mb, driver, bus_id",
    [
        (
            "nvidia_smi_exporter_h100_80gb_hbm3_590.48.01.csv",
            "NVIDIA H100 80GB HBM3",
            81559,
            "590.48.01",
            "00000000:00:09.0",
        ),
        ("nvidia_smi_exporter_h200_590.48.01.csv", "NVIDIA H200", 143771, "590.48.01", "00000000:83:00.0"),
        ("nvidia_smi_exporter_l40s_595.80.csv", "NVIDIA L40S", 46068, "595.80", "00000000:01:00.0"),
    ],
)
def test_it_reads_gpus_from_real_nvidia_smi_csv_by_column_name(
    capture: str, name: str, memory_mb: int, driver: str, bus_id: str
) -> None:
    gpus = facts.parse_nvidia_smi(fixture(capture))
    assert gpus == [{"name": name, "memory_mb": memory_mb, "driver_version": driver, "pci_bus_id": bus_id}]


def test_it_summarises_a_two_gpu_host_whatever_the_column_order() -> None:
    summary = facts.gpu_summary(facts.parse_nvidia_smi(fixture("nvidia_smi_2x_rtx_5060_ti.csv")))
    assert [gpu["pci_bus_id"] for gpu in summary["gpus"]] == ["00000000:02:00.0", "00000000:03:00.0"]
    assert summary["gpu_model"] == "NVIDIA GeForce RTX 5060 Ti"
    assert (summary["gpu_count"], summary["gpu_memory_mb"], summary["driver_version"]) == (2, 16311, "580.173.02")


# The --query-gpu argument of the command that printed nvidia_smi_noheader_nounits_rtx_2080.csv.
GPU_UTILS_QUERY = (
    "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,gpu_uuid,"
    "power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,utilization.gpu,"
    "utilization.memory,fan.speed,pcie.link.width.current,pstate"
)


def test_it_reads_headerless_unitless_output_given_the_queried_fields() -> None:
    fields = tuple(GPU_UTILS_QUERY.split(","))
    gpus = facts.parse_nvidia_smi(fixture("nvidia_smi_noheader_nounits_rtx_2080.csv"), fields=fields)
    assert gpus == [{"name": "GeForce RTX 2080", "memory_mb": 7979, "driver_version": "440.64", "pci_bus_id": ""}]


def test_it_reports_a_failing_nvidia_smi_instead_of_inventing_gpus() -> None:
    output = fixture("script_output_local_vm.txt").replace(
        f"{facts.MARKER}nvidia-smi@@\n", f"{facts.MARKER}nvidia-smi@@\n{fixture('nvidia_smi_driver_failure.txt')}"
    )
    found = facts.parse_facts(output)
    assert (found["gpus"], found["gpu_count"], found["gpu_model"]) == ([], 0, "")
    assert "couldn't communicate with the NVIDIA driver" in found["errors"]["nvidia-smi"]
    assert found["hostname"] == "vm" and found["ram_mb"], "the other sections are still read"


# --- CPU, memory, network, HCAs, mounts --------------------------------------------------------


def test_it_reads_flat_lscpu_json_and_plain_lscpu_alike() -> None:
    from_json = facts.parse_lscpu(facts.split_sections(fixture("script_output_local_vm.txt"))["lscpu"])
    from_text = facts.parse_lscpu(fixture("lscpu_text_local_vm.txt"))
    assert from_json == from_text == {"model": "Intel(R) Xeon(R) Processor", "cores": 2, "threads": 2, "sockets": 1}


def test_it_reads_nested_lscpu_json_of_newer_util_linux() -> None:
    cpu = facts.parse_lscpu(fixture("lscpu_json_nested_xeon_gold_6430.json"))
    assert cpu == {"model": "Intel(R) Xeon(R) Gold 6430", "cores": 64, "threads": 64, "sockets": 2}


def test_it_parses_the_whole_script_output_of_this_development_machine() -> None:
    found = facts.parse_facts(fixture("script_output_local_vm.txt"))

    assert (found["hostname"], found["kernel"]) == ("vm", "6.18.44-fc-v657")
    assert (found["cpu_model"], found["cpu_cores"], found["ram_mb"]) == ("Intel(R) Xeon(R) Processor", 2, 24152)
    assert [nic["name"] for nic in found["nics"]] == ["ifb0", "ifb1", "eth0"], "loopback is left out"
    eth0 = found["nics"][2]
    assert (eth0["mtu"], eth0["state"], eth0["speed_mbps"]) == (1400, "UP", None)  # speed -1: not reported
    assert eth0["addresses"] == ["192.0.2.2/24", "fd00::2/64", "fe80::fc:ff:fe00:1/64"]
    assert found["mounts"] == [
        {
            "source": "/dev/vda",
            "target": "/",
            "fstype": "ext4",
            "options": "rw,relatime,discard,resv_strict,resuid=65534,resgid=65534",
        }
    ]
    assert (found["gpus"], found["ib_devices"], found["container_runtimes"]) == ([], [], ["docker"])
    assert found["errors"] == {}


def test_it_reads_the_software_the_drift_gate_compares() -> None:
    sections = {
        "gpu-clocks": "1980\n1980\n[N/A]\n",
        # grep -o of nvidia-smi's banner: "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |"
        "cuda": "CUDA Version: 12.4",
        # readlink -f of each libnccl path ldconfig -p lists
        "nccl": "/usr/lib/x86_64-linux-gnu/libnccl.so.2.9.9\n/usr/lib/x86_64-linux-gnu/libnccl.so.2.21.5",
        "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0:",  # ofed_info -s
    }
    output = fixture("script_output_local_vm.txt").replace(
        f"{facts.MARKER}end@@",
        "".join(f"{facts.MARKER}{k}@@\n{v}\n" for k, v in sections.items()) + f"{facts.MARKER}end@@",
    )
    found = facts.parse_facts(output)

    assert found["gpu_max_sm_clocks_mhz"] == [1980, 1980]
    assert (found["cuda_version"], found["nccl_version"]) == ("12.4", "2.21.5")
    assert found["ofed_version"] == "MLNX_OFED_LINUX-23.10-1.1.9.0"


def test_it_refuses_output_that_was_cut_short() -> None:
    truncated = fixture("script_output_local_vm.txt").split(f"{facts.MARKER}mounts@@")[0]
    with pytest.raises(facts.FactsError):
        facts.parse_facts(truncated)


def test_it_takes_link_speeds_in_mbits_and_drops_unknown_ones() -> None:
    # Lines as the script prints them: NAME and the content of /sys/class/net/NAME/speed (Mbit/s per the
    # kernel's sysfs-class-net ABI; -1 or unreadable when the link has no speed).
    assert facts.parse_link_speeds("eth0 -1\nib0 200000\nlo \n") == {"eth0": None, "ib0": 200000, "lo": None}


def test_it_reads_hcas_and_ports_from_ibv_devinfo() -> None:
    devices = facts.parse_ibv_devinfo(fixture("ibv_devinfo_3_hcas.txt"))

    assert [d["name"] for d in devices] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert (devices[0]["fw_ver"], devices[0]["vendor_part_id"], devices[0]["transport"]) == (
        "22.39.3004",
        "4125",
        "InfiniBand (0)",
    )
    ports = [d["ports"][0] for d in devices]
    assert [(p["port"], p["state"], p["link_layer"]) for p in ports] == [
        (1, "PORT_ACTIVE (4)", "Ethernet"),
        (1, "PORT_DOWN (1)", "Ethernet"),
        (1, "PORT_ACTIVE (4)", "InfiniBand"),
    ]
    assert (ports[2]["active_mtu"], ports[2]["port_lid"]) == ("4096 (5)", "7")
    assert "state" not in devices[0], "port attributes stay with their port"


def run_mount_filter(name: str) -> str:
    result = subprocess.run(
        ["awk", facts.MOUNT_FILTER, str(FIXTURES / name)], capture_output=True, text=True, check=True
    )
    return result.stdout


def test_it_keeps_only_storage_file_systems_from_proc_mounts() -> None:
    local = facts.parse_mounts(run_mount_filter("proc_mounts_local_vm.txt"))
    assert [(m["target"], m["fstype"]) for m in local] == [("/", "ext4")]

    nfs = facts.parse_mounts(run_mount_filter("proc_mounts_ltp_nfslock01.txt"))
    assert [m["fstype"] for m in nfs] == ["ext4", "nfs4"]
    assert nfs[1]["source"] == "10.0.0.2:/tmp/LTP_nfslock01.8VNHIljpxG/mntpoint/4/tcp"
    assert nfs[1]["options"].startswith("rw,relatime,vers=4.2,rsize=262144")


def test_it_unescapes_spaces_in_mount_points() -> None:
    [mount] = facts.parse_mounts(fixture("proc_mounts_escaped_local_vm.txt"))
    assert mount["target"] == "/tmp/rb mount test"


def test_the_script_runs_on_this_machine_and_describes_it() -> None:
    result = subprocess.run(["sh", "-c", facts.SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    found = facts.parse_facts(result.stdout)

    assert found["hostname"] == socket.gethostname()
    assert found["kernel"] == os.uname().release
    assert found["ram_mb"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert found["cpu_threads"] == os.cpu_count()
    assert found["errors"] == {}


# --- storing facts -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_storing_facts_fills_empty_fields_and_keeps_what_users_set() -> None:
    node = services.node_upsert(name="n1", address="10.0.0.1", cpu_model="Xeon as the user wrote it")
    found = facts.parse_facts(fixture("script_output_local_vm.txt"))

    services.node_store_facts(node=node, facts=found)

    node.refresh_from_db()
    assert (node.cpu_model, node.cpu_cores, node.ram_mb) == ("Xeon as the user wrote it", 2, 24152)
    assert (node.container_runtime, node.facts["hostname"]) == ("docker", "vm")
    assert node.facts_collected_at is not None


@pytest.mark.django_db
def test_a_runtime_that_facts_filled_in_and_that_no_longer_answers_is_taken_back() -> None:
    node = services.node_upsert(name="n1", address="10.0.0.1")
    services.node_store_facts(node=node, facts=facts.parse_facts(fixture("script_output_local_vm.txt")))
    assert node.container_runtime == "docker"
    silent = facts.parse_facts(fixture("script_output_local_vm.txt").replace("\ndocker\n", f"\ndocker{facts.SILENT}\n"))
    assert silent["container_runtimes"] == [] and silent["container_runtimes_silent"] == ["docker"]
    services.node_store_facts(node=node, facts=silent)
    node.refresh_from_db()
    assert node.container_runtime == ""
    chosen = services.node_upsert(name="n2", address="10.0.0.2", container_runtime="docker")  # a user's choice
    services.node_store_facts(node=chosen, facts=silent)
    assert chosen.container_runtime == "docker"


@pytest.mark.django_db
def test_syncing_interfaces_updates_discovered_values_and_keeps_user_roles() -> None:
    node = services.node_upsert(name="n1", address="10.0.0.1")
    Interface.objects.create(node=node, name="eth0", role=InterfaceRole.STORAGE, mtu=9000, addresses=["10.9.9.9/24"])
    Interface.objects.create(node=node, name="ib0", role=InterfaceRole.FABRIC)
    nics = facts.parse_facts(fixture("script_output_local_vm.txt"))["nics"]

    services.node_sync_interfaces(node=node, nics=nics)

    rows = {i.name: i for i in node.interfaces.all()}
    assert sorted(rows) == ["eth0", "ib0", "ifb0", "ifb1"], "an interface not discovered this time is kept"
    assert (rows["eth0"].role, rows["eth0"].mtu, rows["eth0"].addresses[0]) == ("storage", 1400, "192.0.2.2/24")
    assert (rows["ifb0"].role, rows["ifb0"].mtu) == ("other", 1500)


# --- over SSH, on a real lab node ----------------------------------------------------------------

# A lab of its own (directory, addresses, port), so this module never collides with the shared test lab
# or with a lab someone runs by hand or in another test session on the same machine.
LAB_BASE_ADDRESS = "127.0.98.0"
LAB_PORT = int(os.environ.get("RACKBENCH_TEST_FACTS_LAB_PORT", "2298"))


@pytest.fixture(scope="module")
def facts_lab() -> Iterator[tuple[lab.LabAccount, lab.LabNode]]:
    # Not under pytest's tmp dir: sshd reads authorized_keys as the lab user, who cannot enter a 0700 dir.
    lab_dir = Path(tempfile.mkdtemp(prefix="rackbench-facts-lab-"))
    lab_dir.chmod(0o755)
    try:
        [node] = lab.lab_up(1, base_address=LAB_BASE_ADDRESS, port=LAB_PORT, lab_dir=lab_dir)
        yield lab.lab_account(lab_dir=lab_dir), node
    finally:
        remote.reset_pool()
        lab.lab_down(lab_dir=lab_dir)
        shutil.rmtree(lab_dir, ignore_errors=True)


@pytest.mark.lab
@pytest.mark.django_db
def test_it_collects_real_facts_from_a_lab_node_over_ssh(facts_lab: tuple[lab.LabAccount, lab.LabNode]) -> None:
    account, started = facts_lab
    credential = services.credential_create(
        name="facts-lab", username=account.user, private_key=account.private_key.read_text()
    )
    key_type, key_base64 = started.host_public_key.split()[:2]
    services.hostkey_pin(address=started.address, port=started.port, key_type=key_type, key_base64=key_base64)
    node = services.node_upsert(
        name="facts-lab1", address=started.address, ssh_port=started.port, credential=credential
    )
    assert (node.cpu_model, node.cpu_cores, node.ram_mb) == ("", None, None)

    found = facts.collect_facts(node)
    first_nic = node.interfaces.order_by("name").first()
    assert first_nic is not None, "the lab node's interfaces were recorded"
    Interface.objects.filter(pk=first_nic.pk).update(role=InterfaceRole.MANAGEMENT)
    facts.collect_facts(node)

    node.refresh_from_db()
    assert found["hostname"] == socket.gethostname()  # the lab's sshd runs on this machine
    assert found["kernel"] == os.uname().release
    assert node.ram_mb == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    assert node.cpu_cores and node.cpu_model
    assert node.facts["hostname"] == found["hostname"] and node.facts_collected_at is not None
    assert node.interfaces.get(pk=first_nic.pk).role == InterfaceRole.MANAGEMENT
    # a docker binary with no daemon behind it (as on this machine) makes no container runtime
    assert "docker" not in node.facts["container_runtimes"] and node.container_runtime != "docker"
    if shutil.which("docker"):
        assert node.facts["container_runtimes_silent"] == ["docker"]


def test_a_runtime_counts_only_when_it_answers() -> None:
    text = f"docker{facts.SILENT}\npodman\nenroot\n"
    assert facts.parse_runtimes(text) == ["podman", "enroot"]
    assert facts.parse_runtimes(text, silent=True) == ["docker"]


# --- the task ------------------------------------------------------------------------------------


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(settings.RACKBENCH, "RETRY_BACKOFF", 0.0)


@pytest.mark.django_db
def test_the_task_retries_transient_ssh_errors_a_bounded_number_of_times(
    no_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    node = services.node_upsert(name="n1", address="10.0.0.1")
    reset = ssh.TransientSSHError(None, "connection reset")
    with mock.patch.object(facts, "collect_facts", side_effect=reset) as collect, caplog.at_level(logging.WARNING):
        collect_facts_task.apply(args=(node.pk,))
    assert collect.call_count == 1 + collect_facts_task.max_retries
    assert "facts of n1 not collected: connection reset" in caplog.text


@pytest.mark.django_db
def test_the_task_logs_permanent_ssh_errors_without_retrying(caplog: pytest.LogCaptureFixture) -> None:
    node = services.node_upsert(name="n1", address="10.0.0.1")
    refused = ssh.PermanentSSHError(None, "authentication failed for user 'root'")
    with mock.patch.object(facts, "collect_facts", side_effect=refused) as collect, caplog.at_level(logging.ERROR):
        collect_facts_task.apply(args=(node.pk,))
    assert collect.call_count == 1
    assert "facts of n1 not collected: authentication failed" in caplog.text


@pytest.mark.django_db
def test_the_task_ignores_a_node_that_was_deleted() -> None:
    with mock.patch.object(facts, "collect_facts") as collect:
        collect_facts_task.apply(args=(999_999,))
    collect.assert_not_called()
