"""The API's request rate: counted per token (each pipeline its own budget), else per signed-in user."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import UserRateThrottle

from accounts.models import ApiToken


class TokenOrUserThrottle(UserRateThrottle):
    """``RACKBENCH_API_RATE`` (DRF's ``user`` rate) for each token, and for each user's session requests."""

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if isinstance(token, ApiToken):
            return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
        return super().get_cache_key(request, view)
