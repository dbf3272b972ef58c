"""Pausing Python's cyclic garbage collector around bulk construction of small, acyclic objects.

Building a fleet view of 1,000 nodes x 20 metrics allocates some 150,000 tuples, lists and dataclass instances.
Each 700 allocations start a young-generation collection, and the survivors soon start full collections that walk
every object of the (large, long-lived) web process: measured in the fleet page, about 150 ms of its 190 ms of
building the view. None of these objects form reference cycles, so nothing is lost by collecting later: reference
counting frees them as usual, and the collector runs again once it is re-enabled. The collector's switch is
process-wide; another thread's work during the pause is only collected later too.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside the block (it was enabled before: it is enabled again after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
