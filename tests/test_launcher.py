"""The detached job's launcher (runners.remote.LAUNCHER), run by the real shells of this machine: it waits for its
start instant, with bash timing out a read on the job's FIFO, or with one sleep where there is no FIFO, and records
when its command really started."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from runners.remote import LAUNCHER


@pytest.mark.parametrize("fifo", [True, False], ids=["bash-wait-on-the-fifo", "sleep-without-a-fifo"])
def test_the_command_starts_at_its_instant_and_records_it(tmp_path: Path, fifo: bool) -> None:
    (tmp_path / "launch.sh").write_text(LAUNCHER)
    (tmp_path / "command.sh").write_text("echo started-once\n")
    if fifo:
        os.mkfifo(tmp_path / "ended")
    at = time.time_ns() + 400_000_000
    subprocess.run(["sh", str(tmp_path / "launch.sh"), str(at)], timeout=60)  # its own status is not used
    done = time.time_ns()

    started = int((tmp_path / "started").read_text())
    tick = 10_000_000  # the file's timestamp is a clock tick's (up to one behind the clock)
    assert at - tick <= started <= done, (started - at) / 1e6
    assert (tmp_path / "exit_code").read_text().strip() == "0"
    assert (tmp_path / "stdout").read_text() == "started-once\n"


def test_an_instant_already_past_starts_at_once(tmp_path: Path) -> None:
    (tmp_path / "launch.sh").write_text(LAUNCHER)
    (tmp_path / "command.sh").write_text("true\n")
    os.mkfifo(tmp_path / "ended")
    began = time.monotonic()
    subprocess.run(["sh", str(tmp_path / "launch.sh"), str(time.time_ns() - 60_000_000_000)], timeout=120)
    # no wait for an instant a minute ago: one that waited its distance from the instant would take 60 s (30: generous,
    # a loaded machine forks slowly)
    assert time.monotonic() - began < 30
    assert (tmp_path / "exit_code").read_text().strip() == "0"
