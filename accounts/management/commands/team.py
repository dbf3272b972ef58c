"""Teams from the command line: create, add a member, list."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts import services
from accounts.models import Membership, Team


class Command(BaseCommand):
    help = "Manage teams: create NAME | add NAME USER [--role admin] | list"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a team")
        create.add_argument("name")
        add = sub.add_parser("add", help="add a user to a team (or change their role)")
        add.add_argument("name")
        add.add_argument("user")
        add.add_argument("--role", default=Membership.Role.MEMBER, choices=Membership.Role.values)
        sub.add_parser("list", help="teams and their members")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, f"do_{opts['action']}")(opts)
        except services.AccountError as exc:
            raise CommandError(exc.message) from None

    def do_create(self, opts: dict[str, Any]) -> None:
        team = services.team_create(name=opts["name"])
        self.stdout.write(f"created team {team.name}")

    def do_add(self, opts: dict[str, Any]) -> None:
        team = Team.objects.filter(name=opts["name"]).first()
        user = get_user_model().objects.filter(username=opts["user"]).first()
        if team is None or user is None:
            raise CommandError(f"no team {opts['name']!r}" if team is None else f"no user {opts['user']!r}")
        services.team_add_member(team=team, user=user, role=opts["role"])
        self.stdout.write(f"{user} is a {opts['role']} of {team}")

    def do_list(self, opts: dict[str, Any]) -> None:
        for team in Team.objects.prefetch_related("memberships__user"):
            members = ", ".join(f"{m.user} ({m.role})" for m in team.memberships.all()) or "no members"
            self.stdout.write(f"{team.name}: {members}")
