"""The preview of a campaign: the paths its runs will use, and for a plug-in that runs a helper (iperf3) each
host's real commands first, the helper's files folded and given once, no mpirun wording without MPI."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from campaigns.selectors import campaign_preview
from campaigns.services import campaign_apply
from inventory.services import node_upsert
from plugins.benchmarks.base import get_benchmark
from runners import remote
from runners.hosts import host_jobs


@pytest.mark.django_db
def test_the_iperf3_preview_shows_the_real_commands_and_each_helper_file_once(owner: Any, team: Any) -> None:
    for i in (1, 2):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}", team=team)
    data = {"name": "pairs", "kind": "iperf3", "nodes": ["n1", "n2"], "fixed": {"topology": "pairs", "duration": 3},
            "matrix": {"parallel": [1, 4, 16]}}  # fmt: skip
    campaign = campaign_apply(data=data, team=team)
    client = Client()
    client.force_login(owner)
    page = client.get(f"/campaigns/{campaign.pk}/preview/").content.decode()

    first_host = page[page.index('<div class="host-head">') :]
    assert first_host.index("iperf3 ") < first_host.index("python3 ")  # the real command before the helper's
    assert 'data-testid="planned"' in page and "-c 10.0.0." in page  # the client's own iperf3 command
    assert page.count("import subprocess") == 1  # the helper's source, once for the whole preview
    assert "the same as point 0 on" in page and "<details" in page
    assert "mpirun" not in page


@pytest.mark.django_db
def test_the_perftest_preview_shows_each_hosts_server_and_client_commands(owner: Any, team: Any) -> None:
    for i in (1, 2):
        node_upsert(name=f"n{i}", address=f"10.0.0.{i}", team=team)
    data = {"name": "rdma", "kind": "perftest", "nodes": ["n1", "n2"], "fixed": {"device": "mlx5_0", "gid_index": 3},
            "matrix": {"test": ["ib_write_bw", "ib_send_lat"]}}  # fmt: skip
    campaign = campaign_apply(data=data, team=team)
    client = Client()
    client.force_login(owner)
    page = client.get(f"/campaigns/{campaign.pk}/preview/").content.decode()

    assert "ib_write_bw -d mlx5_0 -x 3 --report_gbits -F -p 18515 10.0.0.2" in page  # n1, the client
    assert "ib_write_bw -d mlx5_0 -x 3 --report_gbits -F -p 18515\n" in page  # n2, its server
    assert "ib_send_lat -d mlx5_0 -x 3 --report_gbits -F -p 18515 10.0.0.2" in page
    assert "mpirun" not in page


@pytest.mark.lab
def test_the_preview_shows_the_paths_the_runs_use_on_the_lab(lab: dict[str, Any]) -> None:
    data = {"name": "where", "kind": "fio", "nodes": ["lab1"], "repetitions": 1, "fixed": {"bs": "64k", "size": "8M"},
            "matrix": {"rw": ["read"]}}  # fmt: skip
    campaign = campaign_apply(data=data)
    root = remote.remote_root(remote.node_target(lab["nodes"]["lab1"]))  # what a run finds over SSH
    command = campaign_preview(campaign=campaign)["shown"][0]["hosts"][0]["command"]
    assert command.startswith(f"cd {root}/lab1/run-ID && "), (root, command)
    # a run records the home it found, so the preview follows a node whose home moved
    lab1 = lab["nodes"]["lab1"]
    lab1.facts = {**lab1.facts, "home": "/somewhere/else"}
    lab1.save(update_fields=["facts"])
    assert "/somewhere/else/" in campaign_preview(campaign=campaign)["shown"][0]["hosts"][0]["command"]
    run = campaign.runs.create(sequence=1, point=0, params={"rw": "read"}, repetition=1)
    run.hosts.create(node=lab1, host="lab1", address=lab1.address, command="", remote_dir="")
    host_jobs(run, get_benchmark("fio"))
    assert campaign_preview(campaign=campaign)["shown"][0]["hosts"][0]["command"].startswith(f"cd {root}/lab1/")
