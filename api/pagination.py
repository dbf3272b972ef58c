"""Pagination that answers 400 for a bad ``limit`` or ``offset`` (DRF's ignores them and serves the default page)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination, LimitOffsetPagination
from rest_framework.request import Request

MAX_LIMIT = 1000


def whole_number(request: Request, name: str, *, low: int, high: int) -> int | None:
    """The query parameter ``name`` as a whole number from ``low`` to ``high``; None when absent."""
    text = request.query_params.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValidationError({name: [f"must be a whole number from {low} to {high}"]})
    return value


class StrictLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int | None:
        limit = whole_number(request, self.limit_query_param, low=1, high=MAX_LIMIT)
        return self.default_limit if limit is None else limit

    def get_offset(self, request: Request) -> int:
        return whole_number(request, self.offset_query_param, low=0, high=2**31 - 1) or 0


class StrictCursorPagination(CursorPagination):
    """A cursor page whose ``limit`` (when the view takes one) is checked like the other lists'."""

    max_page_size = MAX_LIMIT

    def decode_cursor(self, request: Request) -> Any:
        """A cursor that cannot be read is bad input (400 naming it), not a missing page (DRF answers 404)."""
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError(
                {self.cursor_query_param: ["not a cursor this API gave: follow next/previous"]}
            ) from None

    def get_page_size(self, request: Request) -> Any:
        if self.page_size_query_param:
            size = whole_number(request, self.page_size_query_param, low=1, high=self.max_page_size)
            if size is not None:
                return size
        return self.page_size
