"""One error shape for every API error: {"message": ..., "extra": {...}}."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    data = response.data
    if isinstance(data, dict) and "detail" in data and len(data) == 1:
        response.data = {"message": str(data["detail"]), "extra": {}}
    else:
        response.data = {"message": "invalid input", "extra": data if isinstance(data, dict) else {"errors": data}}
    return response
