"""API tokens: ``Authorization: Bearer rbk_...`` (``Token rbk_...`` is accepted too)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from accounts.models import ApiToken, TokenScope
from accounts.services import token_authenticate


class TokenAuthentication(authentication.BaseAuthentication):
    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("the Authorization header must be 'Bearer <token>'")
        token = token_authenticate(secret=parts[1].decode(errors="replace"))
        if token is None:
            raise exceptions.AuthenticationFailed("invalid, expired or revoked token")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class TokenScopePermission(permissions.BasePermission):
    """A read-only token may only read; a session or a launch token may also act."""

    message = "this token is read-only: create one with the launch scope"

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth
        if isinstance(token, ApiToken) and token.scope == TokenScope.READ:
            return request.method in permissions.SAFE_METHODS
        return True


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "an API token (rbk_...)"}
