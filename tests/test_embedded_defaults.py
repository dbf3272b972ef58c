"""With no configuration at all: SQLite, Celery's filesystem transport and a real worker run a campaign."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LAB_PORT, ROOT, Worker, sqlite_data_dir, without_configuration

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def embedded(
    tmp_path_factory: pytest.TempPathFactory, lab_dir: Path, migrated_sqlite: Path
) -> Iterator[dict[str, str]]:
    """One embedded installation for this module's campaigns: the migrated SQLite database (migrated with no
    configuration, see conftest), the filesystem queue, the lab's first two nodes registered by ``lab up``, and a
    worker of its own. Yields its environment."""
    data_dir = sqlite_data_dir(migrated_sqlite, tmp_path_factory.mktemp("embedded") / "var")
    env = without_configuration(data_dir)
    env.update(RACKBENCH_LAB_DIR=str(lab_dir), RACKBENCH_POLL_INTERVAL="0.3")
    up = manage(env, "lab", "up", "--nodes", "2", "--port", str(LAB_PORT))
    assert up.returncode == 0, up.stderr
    worker = Worker("embedded", env)
    yield env
    worker.stop()


def test_it_runs_a_campaign_on_sqlite_and_the_filesystem_queue(tmp_path: Path, embedded: dict[str, str]) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(
        "name: embedded\nkind: fio\nnodes: [lab1, lab2]\nstorage: lab-local\nrepetitions: 2\n"
        "cache: {flush_clients: true, flush_storage: true}\nfixed: {bs: 64k, size: 4M}\n"
        "matrix: {rw: [read, randread]}\n"
    )
    assert manage(embedded, "campaign", "apply", str(campaign)).returncode == 0

    result = manage(embedded, "campaign", "run", "embedded", "--wait", "--timeout", "150", timeout=180)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "succeeded: 4/4 runs done" in result.stdout
    assert "read_bw_bytes" in result.stdout and "randread" in result.stdout
    data_dir = Path(embedded["RACKBENCH_DATA_DIR"])
    assert (data_dir / "rackbench.sqlite3").exists()
    assert (data_dir / "queue" / "control").is_dir()
    assert not (ROOT / "control").exists()  # nothing of the queue lands in the working directory


def test_campaign_run_wait_exits_non_zero_when_a_run_fails(tmp_path: Path, embedded: dict[str, str]) -> None:
    campaign = tmp_path / "c.yaml"
    campaign.write_text(
        "name: broken\nkind: fio\nnodes: [lab1]\nfixed: {bs: 64k, size: 4M, directory: /tmp/rackbench-missing}\n"
        "matrix: {rw: [read]}\n"
    )
    assert manage(embedded, "campaign", "apply", str(campaign)).returncode == 0

    result = manage(embedded, "campaign", "run", "broken", "--wait", "--timeout", "100", timeout=150)

    assert result.returncode == 1
    assert "failed" in result.stdout and "/tmp/rackbench-missing is not a directory" in result.stdout
