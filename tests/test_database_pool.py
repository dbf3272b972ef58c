"""runners.database: a wide SSH fan-out over real lab nodes holds no more database connections than the pool's size."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.db import connection

from inventory.models import HostKey, Node
from runners import database, dispatch, remote, ssh
from tests.conftest import WIDE_LAB_NODES, wait_for

pytestmark = pytest.mark.lab


class Connections:
    """Counts, every 20 ms from a connection of its own, the test database's connections named ``name``
    (libpq takes a connection's application_name from PGAPPNAME): those this process opens from now on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peak = 0
        self.samples = 0
        self.stop = threading.Event()
        db = connection.settings_dict
        self.params = {
            "host": db["HOST"] or "127.0.0.1",
            "port": db["PORT"] or 5432,
            "user": db["USER"],
            "password": db["PASSWORD"] or None,
            "dbname": db["NAME"],
            "application_name": "rackbench-connection-counter",
            "autocommit": True,  # pg_stat_activity is a snapshot taken once per transaction
        }
        self.conn = psycopg.connect(**self.params)
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [self.name],
        ).fetchone()
        return int(row[0]) if row else 0

    def _sample(self) -> None:
        with psycopg.connect(**self.params) as conn:
            while not self.stop.wait(0.02):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s",
                    [self.name],
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)
                self.samples += 1

    def __enter__(self) -> Connections:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.fixture
def named_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[Connections]:
    name = f"rackbench-test-{uuid.uuid4().hex[:8]}"
    database.pool_close()  # the pool's next connections are opened under the name
    monkeypatch.setenv("PGAPPNAME", name)
    counter = Connections(name)
    yield counter
    counter.conn.close()
    database.pool_close()


def test_first_contact_and_facts_over_many_nodes_stay_within_the_pool(
    wide_lab: dict[str, Any], named_connections: Connections, settings: Any
) -> None:
    """Every node is new (no pinned key): each of the fan-out's threads looks its host key up, pins it, and stores
    the node's facts. Through runners.database that is at most RACKBENCH_DB_POOL_SIZE connections, not one per
    thread, and they close once the pool has been idle."""
    pool_size = 2
    settings.RACKBENCH = {**settings.RACKBENCH, "DB_POOL_SIZE": pool_size, "SSH_FANOUT": WIDE_LAB_NODES}
    remote.reset_pool()
    HostKey.objects.all().delete()
    nodes = list(wide_lab["nodes"].values())
    assert len(nodes) == WIDE_LAB_NODES

    try:
        with named_connections as counted:
            errors = dispatch.refresh_facts([n.pk for n in nodes])
    finally:
        remote.reset_pool()

    assert errors == {}
    assert HostKey.objects.count() == WIDE_LAB_NODES  # pinned at first contact, from the fan-out's threads
    assert Node.objects.filter(pk__in=[n.pk for n in nodes], facts_collected_at__isnull=True).count() == 0
    assert counted.samples > 10
    assert 1 <= counted.peak <= pool_size, f"{counted.peak} connections for a pool of {pool_size}"
    wait_for(lambda: named_connections.now() == 0, timeout=60, what="the idle pool to close its connections")


def test_a_fan_out_looks_up_the_pinned_keys_of_its_new_connections_in_one_query(wide_lab: dict[str, Any]) -> None:
    """Keys pinned already: a fan-out over nodes it has no connection to reads their keys in one query, not one per
    host from its threads; one over open connections reads none; a key that no longer matches is still refused."""
    nodes = list(wide_lab["nodes"].values())
    remote.reset_pool()
    targets = [remote.node_target(n) for n in nodes]
    remote.fan_out(targets, lambda t: t.run("true"))  # every key pinned (first contact)
    remote.reset_pool()
    wrong = HostKey.objects.get(address=nodes[1].address, port=nodes[1].ssh_port)
    other = HostKey.objects.get(address=nodes[2].address, port=nodes[2].ssh_port)
    HostKey.objects.filter(pk=wrong.pk).update(key_type=other.key_type, key_base64=other.key_base64)
    try:
        with (
            mock.patch.object(remote, "_pinned", wraps=remote._pinned) as one,
            mock.patch.object(remote, "_pinned_many", wraps=remote._pinned_many) as many,
        ):
            first = remote.fan_out(targets, lambda t: t.run("true").exit_code)
            assert (one.call_count, many.call_count) == (0, 1)
            assert len(many.call_args.args[0]) == len(nodes)
            again = remote.fan_out(targets, lambda t: t.run("true").exit_code)
            assert many.call_count == 1  # the good connections are open: nothing to look up; the refused one alone
    finally:
        remote.reset_pool()

    assert isinstance(first[1], ssh.HostKeyMismatch) and "host key changed" in str(first[1])
    assert [r for i, r in enumerate(first) if i != 1] == [0] * (len(nodes) - 1)
    assert isinstance(again[1], ssh.HostKeyMismatch) and one.call_count == 1
