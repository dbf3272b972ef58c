"""With no configuration at all: SQLite, Celery's filesystem transport and a real worker run a campaign."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LAB_PORT, ROOT, Worker

pytestmark = [pytest.mark.lab, pytest.mark.worker]


def embedded_env(data_dir: Path, lab_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "RACKBENCH_"))}
    env.update(RACKBENCH_DATA_DIR=str(data_dir), RACKBENCH_LAB_DIR=str(lab_dir), RACKBENCH_POLL_INTERVAL="0.3")
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_it_runs_a_campaign_on_sqlite_and_the_filesystem_queue(tmp_path: Path, lab_dir: Path) -> None:
    env = embedded_env(tmp_path / "var", lab_dir)
    assert manage(env, "migrate", "-v0").returncode == 0
    up = manage(env, "lab", "up", "--nodes", "2", "--port", str(LAB_PORT))
    assert up.returncode == 0, up.stderr
    campaign = tmp_path / "c.yaml"
    campaign.write_text(
        "name: embedded\nkind: fio\nnodes: [lab1, lab2]\nstorage: lab-local\nrepetitions: 2\n"
        "cache: {flush_clients: true, flush_storage: true}\nfixed: {bs: 64k, size: 4M}\n"
        "matrix: {rw: [read, randread]}\n"
    )
    assert manage(env, "campaign", "apply", str(campaign)).returncode == 0

    worker = Worker("embedded", env)
    try:
        result = manage(env, "campaign", "run", "embedded", "--wait", "--timeout", "150", timeout=180)
    finally:
        worker.stop()

    assert result.returncode == 0, result.stdout + result.stderr
    assert "succeeded: 4/4 runs done" in result.stdout
    assert "read_bw_bytes" in result.stdout and "randread" in result.stdout
    assert (tmp_path / "var" / "rackbench.sqlite3").exists()
    assert (tmp_path / "var" / "queue" / "control").is_dir()
    assert not (ROOT / "control").exists()  # nothing of the queue lands in the working directory


def test_campaign_run_wait_exits_non_zero_when_a_run_fails(tmp_path: Path, lab_dir: Path) -> None:
    env = embedded_env(tmp_path / "var", lab_dir)
    assert manage(env, "migrate", "-v0").returncode == 0
    assert manage(env, "lab", "up", "--nodes", "1", "--port", str(LAB_PORT)).returncode == 0
    campaign = tmp_path / "c.yaml"
    campaign.write_text(
        "name: broken\nkind: fio\nnodes: [lab1]\nfixed: {bs: 64k, size: 4M, directory: /tmp/rackbench-missing}\n"
        "matrix: {rw: [read]}\n"
    )
    assert manage(env, "campaign", "apply", str(campaign)).returncode == 0

    worker = Worker("embedded-fail", env)
    try:
        result = manage(env, "campaign", "run", "broken", "--wait", "--timeout", "100", timeout=150)
    finally:
        worker.stop()

    assert result.returncode == 1
    assert "failed" in result.stdout and "/tmp/rackbench-missing is not a directory" in result.stdout
