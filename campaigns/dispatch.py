"""The remote work campaigns asks for: runs to start, poll, collect and kill, campaigns to tear down; the task that
advances a campaign; and the API's document of a verdict, which its webhook sends.

``campaigns`` never imports ``runners``; ``runners`` connects its Celery tasks to this port at ready()
(runners/apps.py). Each call enqueues one step; callers wrap it in ``transaction.on_commit``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from common.ports import Port


class Runner(Protocol):
    def start(self, run_id: int) -> None: ...
    def poll(self, run_id: int, token: str) -> None: ...
    def collect(self, run_id: int) -> None: ...
    def kill(self, run_id: int, *, once: bool = False) -> None:
        """Kill what the run started; ``once``: a single try (the retry of a kill that was not confirmed)."""
        ...

    def teardown(self, campaign_id: int) -> None: ...
    def teardown_time_limit(self) -> float:
        """The longest a teardown step may run (its hard time limit), in seconds."""
        ...

    def reprobe_suspect_nodes(self) -> None:
        """Probe the nodes marked suspect (the circuit breaker) and clear those that answer again."""
        ...


runner: Port[Runner] = Port("campaigns.dispatch.runner", provider="runners")


# A verdict as the API shows it (api connects its serializer at ready): the webhook sends the same document.
verdict_document: Port[Callable[[Any], dict[str, Any]]] = Port("campaigns.dispatch.verdict_document", provider="api")


# Advance a campaign in a task (campaigns connects its own Celery task at ready: the services sit below the tasks,
# which call them).
advance: Port[Callable[[int], None]] = Port("campaigns.dispatch.advance", provider="campaigns")


# A health suite's step ended (analysis connects the task that takes the run's actions once its last step has ended;
# the verdicts it needs are analysis's).
suite_step_ended: Port[Callable[[int], None]] = Port("campaigns.dispatch.suite_step_ended", provider="analysis")
