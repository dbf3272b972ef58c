"""The remote work inventory asks for: a node's facts collected over SSH (connected by runners at ready())."""

from __future__ import annotations

from collections.abc import Callable

from common.ports import Port

collect_facts: Port[Callable[[int], None]] = Port("inventory.dispatch.collect_facts", provider="runners")
