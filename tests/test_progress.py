"""Progress where work is long: `campaign run --wait` and `lab up` draw a bar with an ETA on a terminal, plain lines
in a log."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import OutputWrapper
from django.utils import timezone

from campaigns.management.commands.campaign import Command
from campaigns.models import RunStatus
from campaigns.services import campaign_apply, campaign_finish, campaign_launch
from common import progress
from inventory.services import node_upsert


def test_the_bar_shows_share_done_and_eta() -> None:
    assert progress.bar(12, 40, eta_s=200) == f"[{'#' * 9}{'.' * 21}]  12/40 runs  30%  ETA 3 min 20 s"
    assert progress.bar(0, 40) == f"[{'.' * 30}]  0/40 runs  0%  ETA unknown"
    assert progress.bar(40, 40, eta_s=0) == f"[{'#' * 30}]  40/40 runs  100%"
    assert progress.bar(3, 256, what="nodes", eta_s=7300).endswith("3/256 nodes  1%  ETA 2 h 01 min")


def test_the_plain_line_says_the_same_for_a_log() -> None:
    assert progress.line(12, 40, eta_s=4, detail="running=2") == "12/40 runs done (30%), ETA 4 s; running=2"
    assert progress.line(40, 40) == "40/40 runs done (100%)"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def finished(team: Any) -> Any:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "waited", "kind": "fio", "nodes": ["n1"], "repetitions": 2, "fixed": {"rw": "read", "bs": "4k"}}
    campaign = campaign_launch(campaign=campaign_apply(data=data, team=team))
    now = timezone.now()
    campaign.runs.update(status=RunStatus.SUCCEEDED, started_at=now - timedelta(seconds=30), finished_at=now)
    campaign_finish(campaign=campaign)
    return campaign


@pytest.mark.django_db
@pytest.mark.parametrize("tty", [True, False])
def test_waiting_draws_a_bar_on_a_terminal_and_lines_in_a_log(finished: Any, tty: bool) -> None:
    out = Terminal() if tty else io.StringIO()
    command = Command(stdout=out)
    command.stdout = OutputWrapper(out)
    command._wait(finished, timeout=5)
    text = out.getvalue()
    if tty:
        assert text.startswith("\r[" + "#" * 30 + "]  2/2 runs  100%  succeeded") and text.endswith("\n")
    else:
        assert text == "succeeded: 2/2 runs done (100%); succeeded=2\n"


def test_a_log_gets_a_line_per_step_and_the_last_not_one_per_item() -> None:
    written: list[str] = []
    printer = progress.Printer(written.append, tty=False, what="nodes", step=25)
    for done in range(1, 257):
        printer.show(done, 256, eta_s=progress.rate_eta(done * 0.5, done, 256))
    assert len(written) == 12 and written[-1] == "256/256 nodes done (100%)\n"
    assert written[0] == "1/256 nodes done (0%), ETA 2 min 07 s\n"
    assert progress.rate_eta(10, 0, 5) is None and progress.rate_eta(10.0, 2, 4) == 10.0


@pytest.mark.lab
@pytest.mark.parametrize("tty", [True, False])
def test_lab_up_shows_its_nodes_coming_up(lab: dict[str, Any], tty: bool) -> None:
    from tests.conftest import LAB_NODES, LAB_PORT

    out = Terminal() if tty else io.StringIO()
    call_command("lab", "up", "--nodes", str(LAB_NODES), "--port", str(LAB_PORT), stdout=out)
    text = out.getvalue()
    if tty:
        assert text.startswith("\r[") and f"\r[{'#' * 30}]  {LAB_NODES}/{LAB_NODES} nodes  100%\x1b[K\n" in text
        assert "ETA" in text.split("\r")[1]
    else:
        lines = text.splitlines()
        assert lines[0].startswith(f"1/{LAB_NODES} nodes done") and "ETA" in lines[0]
        assert f"{LAB_NODES}/{LAB_NODES} nodes done (100%)" in lines and "\r" not in text
