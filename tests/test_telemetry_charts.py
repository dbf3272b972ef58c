"""The run page draws its telemetry on the server: one min/max band per series, zoomable to full resolution."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from django.test import Client

from campaigns.services import campaign_apply, campaign_launch
from inventory.services import node_upsert
from telemetry.services import series_append

T0 = 1_700_000_000_000_000_000  # ns


@pytest.fixture
def sampled_run(team: Any) -> Any:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "sampled", "kind": "fio", "nodes": ["n1"], "fixed": {"rw": "read", "bs": "4k", "size": "1M"}}
    run = campaign_launch(campaign=campaign_apply(data=data, team=team)).runs.get()
    t = T0 + np.arange(600_000, dtype=np.int64) * 1_000_000  # 600 s at 1 ms
    rx = np.cumsum(np.where(np.arange(600_000) % 1000 < 5, 10_000_000, 375_000)).astype(np.int64)  # 1 ms bursts
    series_append(run=run, host="n1", name="net.rx_bytes", labels={"nic": "eth0"}, unit="B", kind="counter",
                  timestamps_ns=t, values=rx)  # fmt: skip
    cores = T0 + np.arange(600, dtype=np.int64) * 1_000_000_000
    series_append(run=run, host="n1", name="cpu.busiest_util", labels={}, unit="%", kind="gauge",
                  timestamps_ns=cores, values=np.full(600, 87.0))  # fmt: skip
    series_append(run=run, host="n1", name="cpu.core_util", labels={"core": 0}, unit="%", kind="gauge",
                  timestamps_ns=cores, values=np.full(600, 87.0))  # fmt: skip
    return run


@pytest.mark.django_db
def test_it_draws_every_series_downsampled_with_its_bursts_visible(owner: Any, sampled_run: Any) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{sampled_run.pk}/").content.decode()
    assert page.count("<polygon") == 2 and "net.rx_bytes{nic=eth0}" in page and "cpu.busiest_util" in page
    assert "1 per-core series are stored but not drawn" in page
    assert "3.00 Gbit/s – 80.0 Gbit/s" in page  # the 1 ms bursts survive (a NIC's bytes read as bits)
    band = re.search(r'<polygon points="([^"]+)"', page)
    assert band is not None and len(band.group(1).split()) <= 2 * 300


@pytest.mark.django_db
def test_it_zooms_into_a_window_at_full_resolution(owner: Any, sampled_run: Any, outsider: Any) -> None:
    client = Client()
    client.force_login(owner)
    page = client.get(f"/runs/{sampled_run.pk}/", {"t0": "100", "t1": "100.2"}).content.decode()
    assert "Window 100–100.200 s" in page and "every sample" in page
    assert client.get(f"/runs/{sampled_run.pk}/", {"t0": "abc"}).status_code == 200  # a bad value: the whole run
    other = Client()
    other.force_login(outsider)
    assert other.get(f"/runs/{sampled_run.pk}/").status_code == 404
