"""Who sees what: every list and lookup of team-owned objects goes through ``visible``."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet

from accounts.models import ApiToken, Team

M = TypeVar("M", bound=Model)


class Scope:
    """The teams a request acts for: a token's one team, a user's teams, or every team for a superuser.

    ``team`` is where new objects go: the token's team, or the user's only team (None when they have
    several or none: the caller must then say which).
    """

    def __init__(self, *, user: Any, token: ApiToken | None = None) -> None:
        self.user = user
        self.token = token
        if token is not None:
            self.team_ids: list[int] | None = [token.team_id]
        elif getattr(user, "is_superuser", False):
            self.team_ids = None
        elif getattr(user, "is_authenticated", False):
            self.team_ids = list(user.memberships.values_list("team_id", flat=True))
        else:
            self.team_ids = []

    @property
    def team(self) -> Team | None:
        if self.token is not None:
            return self.token.team
        ids = self.team_ids
        if ids is None:  # a superuser sees every team; new objects still go to their own only team, if any
            ids = list(self.user.memberships.values_list("team_id", flat=True))
        return Team.objects.get(pk=ids[0]) if len(ids) == 1 else None

    def sees(self, team_id: int | None) -> bool:
        """Whether an object of this team (None: shared) is visible: the rule ``filter`` applies to querysets."""
        return self.team_ids is None or team_id is None or team_id in self.team_ids

    def filter(self, queryset: QuerySet[M], field: str = "team") -> QuerySet[M]:
        if self.team_ids is None:
            return queryset
        return queryset.filter(Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__in": self.team_ids}))


def scope_for(request: Any) -> Scope:
    """The scope of an HTTP request (a DRF request carries its token in ``auth``), built once per request and
    user: a page lists several team-owned things, each through ``visible``."""
    token = getattr(request, "auth", None)
    token = token if isinstance(token, ApiToken) else None
    scope = getattr(request, "_rackbench_scope", None)
    if scope is None or scope.user is not request.user or scope.token is not token:
        scope = Scope(user=request.user, token=token)
        request._rackbench_scope = scope
    return scope


def visible(queryset: QuerySet[M], *, request: Any, field: str = "team") -> QuerySet[M]:
    return scope_for(request).filter(queryset, field)


def user_teams(*, user: Any) -> QuerySet[Team]:
    return Team.objects.filter(memberships__user=user).order_by("name")


def may_share(*, user: Any) -> bool:
    """Whether ``user`` may create, replace or delete campaigns that belong to no team (shared with every signed-in
    user): staff and superusers, who manage what is shared in the admin anyway. Shared inventory has its own, finer
    rule (``inventory.selectors.inventory_can_change``)."""
    return bool(getattr(user, "is_authenticated", False) and user.is_active and (user.is_staff or user.is_superuser))
