"""The fleet view per device: GPU x metric and NIC x metric, each device against the fleet's devices of its kind at
the same point (NICs within their link speed), the outlier named ``node/gpu5``, its node ``suspect``. GPU results
are the nvidia_smi parser's own, from real nvidia-smi dmon output (tests/fixtures/nvidia_smi); NIC results are the
telemetry summaries telemetry.services records from stored counter series. tests/test_fleet_devices_lab.py
measures NICs for real on the namespaced lab."""

from __future__ import annotations

import csv
import io
import json
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.test import Client
from rest_framework.test import APIClient

from analysis import fleet, selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from inventory.models import Interface, Node
from plugins.benchmarks.base import Metric, get_benchmark
from telemetry import services as telemetry

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia_smi"
_sequence = count(1)


def eight_gpus(*, slow: int | None = None) -> str:
    """A real H200 ``nvidia-smi dmon`` recording (one GPU at full load), as a node of eight such GPUs prints it:
    each sample line once per GPU index. GPU ``slow`` runs its processor clock (pclk) at a third of the others':
    the A100 that DCGM's diagnostics passed."""
    lines = (FIXTURES / "dmon-h200-load-590.48.01.txt").read_text().splitlines()
    header, samples = [line for line in lines if line.startswith("#")], [line for line in lines if line.strip()]
    out = list(header)
    for line in (s for s in samples if not s.startswith("#")):
        for gpu in range(8):
            fields = line.split()
            fields[0] = str(gpu)
            if gpu == slow:
                fields[-1] = str(int(fields[-1]) // 3)
            out.append("  ".join(f"{f:>5}" for f in fields))
    return "\n".join(out) + "\n"


def store(run: Run, metrics: list[Metric]) -> None:
    Result.objects.bulk_create(
        Result(run=run, name=m.name, value=m.value, unit=m.unit, host=m.host, labels=m.labels) for m in metrics
    )


def gpu_campaign(team: Any, *, slow: tuple[str, int] | None = ("lab3", 5), nodes: int = 4) -> Campaign:
    """Two repetitions of nvidia-smi dmon on ``nodes`` nodes of eight H200s, parsed by the nvidia_smi plug-in."""
    campaign = Campaign.objects.create(name="gpu-fleet", kind="nvidia_smi", team=team, status=CampaignStatus.SUCCEEDED,
                                       matrix=[["load", ["full"]]])  # fmt: skip
    bench = get_benchmark("nvidia_smi")
    for repetition in (1, 2):
        run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params={"load": "full"},
                                 repetition=repetition, status=RunStatus.SUCCEEDED)  # fmt: skip
        for i in range(1, nodes + 1):
            node = f"lab{i}"
            text = eight_gpus(slow=slow[1] if slow and slow[0] == node else None)
            store(run, bench.parse(text, host=node))
    return campaign


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


# --- which device a result is -------------------------------------------------------------------------------------


def test_a_results_device_is_read_from_its_labels_and_virtual_nics_are_none_of_the_fleets() -> None:
    assert fleet.device_key("gpu.util.mean", {"gpu": 3}) == fleet.DeviceKey("gpu", "gpu3", {})
    assert fleet.device_key("net.rx_bytes.mean", {"nic": "eth1"}) == fleet.DeviceKey("nic", "eth1", {})
    hca = fleet.device_key("rdma.rx_bytes.mean", {"device": "mlx5_0", "port": 1})
    assert hca == fleet.DeviceKey("nic", "mlx5_0:1", {})
    assert fleet.device_key("throughput_bps", {"peer": "lab2"}) is None
    assert fleet.device_key("disk.read_bytes.mean", {"device": "sda"}) is None  # a disk, not an HCA
    perftest = fleet.device_key("bw_avg_bps", {"hca": "mlx5_0", "port": 1, "peer": "lab2", "size": 65536})
    assert perftest == fleet.DeviceKey("nic", "mlx5_0:1", {"peer": "lab2", "size": 65536})  # the same port's name
    for name in ("lo", "veth1a2b", "docker0", "br-5f3a", "virbr0", "cali12", "flannel.1", "vxlan.calico"):
        assert fleet.DeviceKey("nic", name, {}).virtual, name
    for name in ("eth0", "ens1f0np0", "ib0", "bond0", "enp65s0f1"):
        assert not fleet.DeviceKey("nic", name, {}).virtual, name


def test_a_gpu_is_judged_against_every_gpu_of_the_fleet_not_only_its_index() -> None:
    column = fleet.Column(0, "sm_clock_mhz", "", "", "MHz", True)
    samples = [(column, f"n{n}", f"gpu{g}", [1980.0]) for n in range(1, 3) for g in range(8)]
    samples.append((column, "n3", "gpu0", [660.0]))
    view = fleet.device_view("gpu", samples)
    # three nodes' gpu0 alone would be too few to judge; among the 17 GPUs it is plain
    assert [o.device.title for o in view.outliers] == ["n3/gpu0"]


# --- GPUs, from the nvidia_smi parser ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_gpu_at_a_third_of_its_siblings_clock_is_named_and_its_node_is_suspect(team: Any) -> None:
    data = selectors.campaign_fleet_data(campaign=gpu_campaign(team))
    (gpus,) = fleet.device_views(data.devices, groups=data.groups)
    nodes = fleet.fleet_view(data.nodes)

    assert gpus.kind == "gpu" and len(gpus.devices) == 32
    assert [o.device.title for o in gpus.outliers] == ["lab3/gpu5"]
    column, cell = gpus.outliers[0].evidence[0]
    assert column.name == "sm_clock_mhz" and cell.score.value == 660 and cell.score.median == 1980
    assert cell.samples == (660.0, 660.0)  # both repetitions
    # the node's own figure, the mean over its eight GPUs, is 92 % of the fleet's: the node view alone misses it
    assert nodes.outliers == []
    payload = fleet.devices_payload(fleet.fleet_payload(nodes), [gpus])
    lab3 = next(n for n in payload["nodes"] if n["node"] == "lab3")
    assert lab3["verdict"] == "suspect" and [d["device"] for d in lab3["devices"]] == ["lab3/gpu5"]
    assert payload["suspects"] == ["lab3"] and payload["device_outliers"] == ["lab3/gpu5"]
    assert {n["verdict"] for n in payload["nodes"] if n["node"] != "lab3"} == {"ok"}


@pytest.mark.django_db
def test_healthy_gpus_name_nothing(team: Any) -> None:
    data = selectors.campaign_fleet_data(campaign=gpu_campaign(team, slow=None))
    (gpus,) = fleet.device_views(data.devices)
    assert gpus.outliers == [] and len(gpus.devices) == 32


@pytest.mark.django_db
def test_the_fleet_page_shows_gpu_x_metric_and_exports_every_gpu(owner: Any, team: Any) -> None:
    campaign = gpu_campaign(team)
    url = f"/analysis/campaigns/{campaign.pk}/fleet/"
    page = logged_in(owner).get(url).content.decode()

    assert 'id="fleet-gpu"' in page and "GPU x metric" in page and 'id="fleet-nic"' not in page
    assert "Suspect nodes, for an outlier GPU" in page and "<strong>lab3/gpu5</strong>" in page
    assert "sm_clock_mhz load=full: 660 MHz, 33% of the fleet&#x27;s GPUs&#x27; median 1.98 GHz" in page
    cells = list(csv.reader(io.StringIO(logged_in(owner).get(url, {"format": "csv", "table": "gpu_cells"})
                                        .content.decode())))  # fmt: skip
    assert cells[0][:4] == ["device", "node", "gpu", "group"]
    assert {row[0] for row in cells[1:]} == {f"lab{n}/gpu{g}" for n in range(1, 5) for g in range(8)}
    outliers = json.loads(logged_in(owner).get(url, {"format": "json", "table": "gpu_outliers"}).content)
    assert {r["device"] for r in outliers["rows"]} == {"lab3/gpu5"}


@pytest.mark.django_db
def test_the_api_names_the_gpu_and_the_outsider_is_refused(owner: Any, outsider: Any, team: Any) -> None:
    campaign = gpu_campaign(team)
    answer = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/fleet/").json()

    assert answer["suspects"] == ["lab3"] and answer["device_outliers"] == ["lab3/gpu5"]
    lab3 = next(n for n in answer["nodes"] if n["node"] == "lab3")
    assert lab3["devices"][0]["evidence"][0]["metric"] == "sm_clock_mhz"
    assert len([d for d in answer["devices"] if d["kind"] == "gpu"]) == 32
    assert api_for(outsider).get(f"/api/v1/campaigns/{campaign.pk}/fleet/").status_code == 404


@pytest.mark.django_db
def test_a_campaign_without_device_results_has_no_device_sections(owner: Any, team: Any) -> None:
    campaign = Campaign.objects.create(name="plain", kind="fio", team=team, status=CampaignStatus.SUCCEEDED)
    run = Run.objects.create(campaign=campaign, sequence=1, point=0, params={}, repetition=1,
                             status=RunStatus.SUCCEEDED)  # fmt: skip
    store(run, [Metric("read_bw_bytes", 1e9, "B/s", f"lab{i}") for i in range(1, 5)])

    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/fleet/").content.decode()
    answer = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/fleet/").json()

    assert "x metric" in page and "GPU x metric" not in page and "NIC x metric" not in page
    assert answer["devices"] == [] and answer["suspects"] == [] and len(answer["nodes"]) == 4


# --- NICs, from telemetry summaries ------------------------------------------------------------------------------

T0 = 1_764_000_000_000_000_000
SECOND = 1_000_000_000


def counter(run: Run, host: str, name: str, nic: str, rate: float) -> None:
    """A byte counter sampled every second for 20 s, rising at ``rate`` B/s."""
    t = T0 + np.arange(21, dtype=np.int64) * SECOND
    telemetry.series_append(run=run, host=host, name=name, labels={"nic": nic}, unit="B", kind="counter",
                            timestamps_ns=t, values=(np.arange(21) * rate).astype(np.int64))  # fmt: skip


def nic_campaign(team: Any) -> Campaign:
    """Seven nodes' telemetry during a network test: lab1-lab4 with a 100G eth0 (lab2's at 30 % of the others'),
    lab5-lab7 with a 25G one at a quarter of the 100G rate; every node's lo and docker0 busy in its own way."""
    campaign = Campaign.objects.create(name="nic-fleet", kind="iperf3", team=team, status=CampaignStatus.SUCCEEDED,
                                       matrix=[["parallel", [4]]])  # fmt: skip
    run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params={"parallel": 4},
                             repetition=1, status=RunStatus.SUCCEEDED)  # fmt: skip
    for i in range(1, 8):
        host = f"lab{i}"
        node = Node.objects.create(name=host, address=f"198.18.0.{i}", team=team)
        Interface.objects.create(node=node, name="eth0", speed_mbps=100_000 if i <= 4 else 25_000)
        rate = 11e9 * (0.3 if i == 2 else 1.0) * (1.0 if i <= 4 else 0.25) * (1 + i / 200)
        for name in ("net.rx_bytes", "net.tx_bytes"):
            counter(run, host, name, "eth0", rate)
            counter(run, host, name, "lo", 1e6 * i)
            counter(run, host, name, "docker0", 1e3 * i * i)
    telemetry.run_telemetry_summarize(run=run)
    return campaign


@pytest.mark.django_db
def test_a_slow_nic_is_named_against_nics_of_its_speed_and_loopback_is_left_out(owner: Any, team: Any) -> None:
    campaign = nic_campaign(team)
    data = selectors.campaign_fleet_data(campaign=campaign)
    (nics,) = fleet.device_views(data.devices, groups=data.groups)

    assert {d.title for d in nics.devices} == {f"lab{i}/eth0" for i in range(1, 8)}  # no lo, no docker0
    assert {d.group for d in nics.devices} == {"100 Gbit/s", "25.0 Gbit/s"}
    assert [c.name for c in nics.columns] == ["net.rx_bytes.mean", "net.tx_bytes.mean"]  # the mean rate, judged
    assert [o.device.title for o in nics.outliers] == ["lab2/eth0"]  # the 25G NICs are not held against 100G ones
    assert fleet.fleet_view(data.nodes).nodes == []  # every result here is a device's

    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/fleet/").content.decode()
    assert "NIC x metric" in page and "<th>link speed</th>" in page and "<strong>lab2/eth0</strong>" in page
    assert "of the fleet&#x27;s 100 Gbit/s NICs&#x27; median 88.9 Gbit/s" in page and "26.7 Gbit/s<br>" in page
    answer = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/fleet/").json()
    assert answer["suspects"] == ["lab2"] and answer["device_outliers"] == ["lab2/eth0"]


# --- HCA ports, from perftest's own output -----------------------------------------------------------------------

PERFTEST = Path(__file__).parent / "fixtures" / "perftest" / "doca-write-bw-gbits.txt"


def perftest_client(peer: str, share: float = 1.0) -> str:
    """A ring step's client output through rackbench's helper: DOCA's real ib_write_bw run on mlx5_0 (392 Gb/s at
    64 KiB), its peak, average and message rate at ``share`` of it."""
    text = PERFTEST.read_text()
    row = next(line for line in text.splitlines() if line.startswith(" 65536 "))
    size, iterations, *numbers = row.split()
    scaled = f" {size}      {iterations}             " + "   ".join(f"{float(n) * share:.6f}" for n in numbers)
    header = {"role": "client", "peer": peer, "step": 0, "round": 0, "ib_port": 1, "exit_code": 0, "stderr": ""}
    return "#rackbench-perftest " + json.dumps(header) + "\n" + text.replace(row, scaled)


def hca_campaign(team: Any) -> Campaign:
    """perftest ib_write_bw in a ring of six nodes, lab3's HCA at 30 % of the others'; beside it telemetry's
    transmit rate of the same HCA port (rdma.tx_bytes {device, port})."""
    campaign = Campaign.objects.create(name="hca-fleet", kind="perftest", team=team, status=CampaignStatus.SUCCEEDED,
                                       matrix=[["topology", ["ring"]]])  # fmt: skip
    run = Run.objects.create(campaign=campaign, sequence=next(_sequence), point=0, params={"topology": "ring"},
                             repetition=1, status=RunStatus.SUCCEEDED)  # fmt: skip
    bench = get_benchmark("perftest")
    for i in range(1, 7):
        host, share = f"lab{i}", 0.3 if i == 3 else 1.0
        store(run, bench.parse(perftest_client(f"lab{i % 6 + 1}", share), host=host))
        store(run, [Metric("rdma.tx_bytes.mean", 49e9 * share, "B/s", host, {"device": "mlx5_0", "port": 1})])
    return campaign


@pytest.mark.django_db
def test_a_slow_hca_port_in_perftest_is_named_as_a_nic_beside_its_counters(owner: Any, team: Any) -> None:
    campaign = hca_campaign(team)
    data = selectors.campaign_fleet_data(campaign=campaign)
    (nics,) = fleet.device_views(data.devices, groups=data.groups)

    assert [d.title for d in nics.devices] == [f"lab{i}/mlx5_0:1" for i in range(1, 7)]  # one row per HCA port
    perftest = {(name, "size=65536") for name in ("bw_avg_bps", "bw_peak_bps", "msg_rate")}
    assert {(c.name, c.labels) for c in nics.columns} == perftest | {("rdma.tx_bytes.mean", "")}
    assert [o.device.title for o in nics.outliers] == ["lab3/mlx5_0:1"]
    assert fleet.fleet_view(data.nodes).nodes == []  # every result here is an HCA port's

    page = logged_in(owner).get(f"/analysis/campaigns/{campaign.pk}/fleet/").content.decode()
    assert "NIC x metric" in page and "<th>lab3/mlx5_0:1</th>" in page and "<strong>lab3/mlx5_0:1</strong>" in page
    assert "118 Gbit/s<br>" in page  # lab3's average, 30 % of 392 Gbit/s
    answer = api_for(owner).get(f"/api/v1/campaigns/{campaign.pk}/fleet/").json()
    assert answer["suspects"] == ["lab3"] and answer["device_outliers"] == ["lab3/mlx5_0:1"]
    lab3 = next(n for n in answer["nodes"] if n["node"] == "lab3")
    assert {e["metric"] for e in lab3["devices"][0]["evidence"]} >= {"bw_avg_bps", "rdma.tx_bytes.mean"}
