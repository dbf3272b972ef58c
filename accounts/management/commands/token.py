"""API tokens for automation: create (the secret is printed once), list, revoke."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services
from accounts.models import ApiToken, Team, TokenScope


class Command(BaseCommand):
    help = "Manage API tokens: create --user U --team T [--scope launch] [--expires-days N] --name N | list | revoke"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a token and print its secret (shown once)")
        create.add_argument("--user", required=True)
        create.add_argument("--team", required=True)
        create.add_argument("--name", required=True, help="what the token is for")
        create.add_argument("--scope", default=TokenScope.READ, choices=TokenScope.values)
        create.add_argument("--expires-days", type=int, default=None, help="default: never expires")
        listing = sub.add_parser("list", help="tokens (never their secrets)")
        listing.add_argument("--user")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, f"do_{opts['action']}")(opts)
        except services.AccountError as exc:
            raise CommandError(exc.message) from None

    def do_create(self, opts: dict[str, Any]) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first()
        team = Team.objects.filter(name=opts["team"]).first()
        if user is None or team is None:
            raise CommandError(f"no user {opts['user']!r}" if user is None else f"no team {opts['team']!r}")
        expires = services.token_expires_at(days=opts["expires_days"])
        issued = services.token_create(user=user, team=team, name=opts["name"], scope=opts["scope"],
                                       expires_at=expires)  # fmt: skip
        self.stdout.write(issued.secret)

    def do_list(self, opts: dict[str, Any]) -> None:
        tokens = ApiToken.objects.select_related("user", "team")
        if opts["user"]:
            tokens = tokens.filter(user__username=opts["user"])
        for t in tokens:
            state = "revoked" if t.revoked_at else f"expires {t.expires_at:%Y-%m-%d}" if t.expires_at else "no expiry"
            self.stdout.write(f"{t.prefix}  {t.name}  {t.user}@{t.team}  {t.scope}  {state}")

    def do_revoke(self, opts: dict[str, Any]) -> None:
        token = ApiToken.objects.filter(prefix=opts["prefix"]).first()
        if token is None:
            raise CommandError(f"no token with prefix {opts['prefix']!r}")
        self.stdout.write("revoked" if services.token_revoke(token=token) else "already revoked")
