"""The remote work inventory asks for: nodes' facts collected over SSH (connected by runners at ready())."""

from __future__ import annotations

from collections.abc import Callable

from common.ports import Port

collect_facts: Port[Callable[[int], None]] = Port("inventory.dispatch.collect_facts", provider="runners")

# Collect these nodes' facts now, in parallel, and store them; returns {node id: why it failed} for those that failed
# (the drift gate waits for fresh facts before a launch, so this one does not go through the queue).
refresh_facts: Port[Callable[[list[int]], dict[int, str]]] = Port(
    "inventory.dispatch.refresh_facts", provider="runners"
)
