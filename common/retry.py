"""The retry policy for transient failures: exponential backoff with jitter, bounded by a ceiling."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Wait ``base * 2**attempt`` seconds, stretched by up to ``jitter`` (so that retries of many tasks that failed
    together do not come back together), never more than ``ceiling``. ``attempt`` counts from 0."""

    base: float
    ceiling: float = 300.0
    jitter: float = 0.5

    def delay(self, attempt: int) -> float:
        return min(self.ceiling, self.base * 2**attempt * (1 + random.random() * self.jitter))
