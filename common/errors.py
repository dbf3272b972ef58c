"""One error root for every domain error.

Every error a user can cause (a bad value, an action the current state forbids, something that does not exist, a
node that cannot be reached) derives from :class:`ApplicationError` and carries the field it is about, so the API,
the pages and the CLI map it once: ``kind`` picks the HTTP status, ``field`` and ``extra`` go into the one error shape
``{"message": ..., "extra": {...}}``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ApplicationError(Exception):
    """A domain error: ``message`` for people, ``field`` for forms and API clients, ``kind`` for the status."""

    kind: ClassVar[str] = "invalid"  # invalid (400), conflict (409), not_found (404), unavailable (503)

    def __init__(self, message: str, *, field: str = "", conflict: bool = False, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.conflict = conflict or self.kind == "conflict"
        self.extra = extra

    @property
    def status(self) -> int:
        if self.conflict:
            return 409
        return {"invalid": 400, "not_found": 404, "unavailable": 503}.get(self.kind, 400)

    def payload(self) -> dict[str, Any]:
        """The ``extra`` part of the error shape."""
        extra = dict(self.extra)
        if self.field:
            extra["field"] = self.field
        return extra


class FieldError(ApplicationError, ValueError):
    """A value is invalid; the message reads ``field: what is wrong``. Raised as ``FieldError(field, message)``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)
        self.message = message


class ParamError(FieldError):
    """A benchmark (or other plug-in) parameter is invalid."""


class ParseError(ApplicationError, ValueError):
    """A tool's output could not be read."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message, field=field)


class NotFound(ApplicationError, LookupError):
    kind = "not_found"


class Unavailable(ApplicationError):
    """Something the action needs cannot be reached now (a node, a service); trying later may work."""

    kind = "unavailable"
