"""One error shape for every API error: {"message": ..., "extra": {...}}.

The services' own errors map here too, so views call services and never translate errors themselves:
a bad definition is a 400 naming its field, an invalid state transition a 409, a missing baseline a 404.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DataError
from django.db.models import ProtectedError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import ApplicationError

log = logging.getLogger(__name__)


def error(message: str, status: int, **extra: Any) -> Response:
    return Response({"message": message, "extra": extra}, status=status)


def service_error(exc: Exception) -> Response | None:
    if isinstance(exc, ApplicationError):
        return error(str(exc), exc.status, **exc.payload())
    if isinstance(exc, DataError):  # a value the database cannot hold (a NUL in a query parameter, ...)
        return error("invalid input: the database refused one of the values", 400)
    if isinstance(exc, ProtectedError):
        used_by = sorted({str(o) for o in exc.protected_objects})[:10]
        return error("still in use; remove what uses it first", 409, used_by=used_by)
    return None


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's 404 (no URL pattern matched): JSON in the one error shape under /api/, the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"message": "not found: no such resource or action", "extra": {}}, status=404)
    return defaults.page_not_found(request, exception)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    mapped = service_error(exc)
    if mapped is not None:
        return mapped
    response = drf_exception_handler(exc, context)
    if response is None:  # a bug: logged with its traceback, answered in the one shape (never an HTML page)
        log.exception("unhandled error in %s", context.get("view"), exc_info=exc)
        return error("internal error: the server logged the details", 500)
    data = response.data
    if isinstance(data, dict) and "detail" in data and len(data) == 1:
        response.data = {"message": str(data["detail"]), "extra": {}}
    else:
        response.data = {"message": "invalid input", "extra": data if isinstance(data, dict) else {"errors": data}}
    return response
