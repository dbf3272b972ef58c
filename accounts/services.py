"""Teams, memberships and API tokens: every change to them goes through here."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken, Membership, Team, TokenScope
from common.errors import ApplicationError

TOKEN_PREFIX = "rbk"
TOKEN_MAX_DAYS = 3650  # ten years; a timedelta of far more overflows


class AccountError(ApplicationError, ValueError):
    pass


def team_create(*, name: str) -> Team:
    name = name.strip()
    if not name:
        raise AccountError("a team needs a name", field="name")
    if Team.objects.filter(name=name).exists():
        raise AccountError(f"a team named {name!r} already exists", field="name")
    return Team.objects.create(name=name)


def team_add_member(*, team: Team, user: Any, role: str = Membership.Role.MEMBER) -> Membership:
    if role not in Membership.Role.values:
        raise AccountError(f"role must be one of {', '.join(Membership.Role.values)}", field="role")
    membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership


def digest(secret: str) -> str:
    """Tokens are 256-bit random strings, so one SHA-256 is enough: there is nothing to brute-force."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # shown once, never stored


def token_expires_at(*, days: int | None) -> datetime | None:
    """When a token created now to last ``days`` days stops working; no number of days: never."""
    if days is None:
        return None
    if not 1 <= days <= TOKEN_MAX_DAYS:
        raise AccountError(f"a token lasts from 1 to {TOKEN_MAX_DAYS} days", field="expires_days")
    return timezone.now() + timedelta(days=days)


def token_check(*, user: Any, team: Team, name: str, scope: str, expires_at: datetime | None) -> None:
    """Raise AccountError unless ``token_create`` would issue this token (forms check before they save)."""
    if scope not in TokenScope.values:
        raise AccountError(f"scope must be one of {', '.join(TokenScope.values)}", field="scope")
    if not name.strip():
        raise AccountError("a token needs a name (what it is for)", field="name")
    if not Membership.objects.filter(team=team, user=user).exists():
        raise AccountError(f"{user} is not a member of team {team}", field="team")
    if expires_at is not None and expires_at <= timezone.now():
        raise AccountError("the expiry must be in the future", field="expires_at")


def token_create(
    *, user: Any, team: Team, name: str, scope: str = TokenScope.READ, expires_at: datetime | None = None
) -> IssuedToken:
    """A new token for ``user`` acting in ``team``; the secret is returned once and only its digest is kept."""
    token_check(user=user, team=team, name=name, scope=scope, expires_at=expires_at)
    with transaction.atomic():
        prefix = secrets.token_hex(6)
        secret = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
        token = ApiToken.objects.create(
            user=user, team=team, name=name.strip(), scope=scope, prefix=prefix, digest=digest(secret),
            expires_at=expires_at,
        )  # fmt: skip
    return IssuedToken(token=token, secret=secret)


def token_revoke(*, token: ApiToken) -> bool:
    """Revoke a token; False when it already was."""
    return bool(ApiToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=timezone.now()))


def token_authenticate(*, secret: str) -> ApiToken | None:
    """The live token behind ``secret``: None when unknown, revoked, expired or its user is inactive."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    token = ApiToken.objects.select_related("user", "team").filter(prefix=parts[1]).first()
    if token is None or not secrets.compare_digest(token.digest, digest(secret)):
        return None
    now = timezone.now()
    if token.revoked_at or (token.expires_at and token.expires_at <= now) or not token.user.is_active:
        return None
    if not token.user.memberships.filter(team=token.team).exists():
        return None  # left the team since: the token no longer speaks for it
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)  # at most once a minute: no write per call
    return token
