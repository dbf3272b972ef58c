"""Ports: how a lower layer asks a higher one for work without importing it.

``campaigns`` and ``inventory`` sit below ``runners`` (which calls their services); when they must trigger remote
work ("run queued", "kill requested", "collect this node's facts") they call a port, and the app that does the
work connects its implementation in ``AppConfig.ready()``. Calling a port nobody connected is a wiring bug and
says which app is missing.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Port(Generic[T]):
    def __init__(self, name: str, provider: str) -> None:
        self.name = name
        self.provider = provider  # the app expected to connect it, for the error message
        self._impl: T | None = None

    def connect(self, impl: T) -> None:
        self._impl = impl

    def __call__(self) -> T:
        if self._impl is None:
            raise RuntimeError(f"port {self.name!r} is not connected: is {self.provider!r} in INSTALLED_APPS?")
        return self._impl
