"""Content negotiation that names a format it does not offer (DRF answers a bare 404 "Not found." to
``?format=xml``, which reads like a missing object)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.exceptions import NotAcceptable
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request


class FormatNotOffered(NotAcceptable):
    pass


class Negotiation(DefaultContentNegotiation):
    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> Any:
        renderers = list(renderers)
        wanted = format_suffix or request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)
        formats = [renderer.format for renderer in renderers]
        if wanted and wanted not in formats:
            offered = ", ".join(f for f in formats if f != "api")  # "api" is the browsable page, not an export
            raise FormatNotOffered(f"format {wanted!r} is not offered here; this endpoint answers {offered}")
        return super().select_renderer(request, renderers, format_suffix)
