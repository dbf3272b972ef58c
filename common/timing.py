"""Where a step's time goes: named laps, kept in a run's provenance (``timing``) so that a slow run shows which
part of its preparation, start or collect took the time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """Seconds per named part of a step (a part timed twice adds up), rounded to the millisecond."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}

    @contextmanager
    def lap(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.laps[name] = round(self.laps.get(name, 0.0) + time.monotonic() - began, 3)
