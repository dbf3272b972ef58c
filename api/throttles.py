"""The API's request rates: per token (each pipeline its own budget), else per signed-in user; per address for
requests without credentials. The rates are read at each request, from RACKBENCH_API_RATE and
RACKBENCH_API_ANON_RATE (through REST_FRAMEWORK's DEFAULT_THROTTLE_RATES)."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle

from accounts.models import ApiToken


def _rate(scope: str | None) -> str | None:
    rate = api_settings.DEFAULT_THROTTLE_RATES.get(scope) if scope else None
    return str(rate) if rate else None


class TokenOrUserThrottle(UserRateThrottle):
    def get_rate(self) -> str | None:
        return _rate(self.scope)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if isinstance(token, ApiToken):
            return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
        return super().get_cache_key(request, view)


class AnonThrottle(AnonRateThrottle):
    def get_rate(self) -> str | None:
        return _rate(self.scope)
