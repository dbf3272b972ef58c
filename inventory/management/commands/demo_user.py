"""Create the demo login (a superuser) and its team, so that it can make API tokens from its first visit."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts import services
from accounts.models import Membership, Team

TEAM = "demo"


class Command(BaseCommand):
    help = (
        "Create the superuser 'demo' (password from RACKBENCH_DEMO_PASSWORD, default 'rackbench') if missing, "
        f"and make it an admin of the team '{TEAM}'."
    )

    def handle(self, *args: Any, **opts: Any) -> None:
        users = get_user_model().objects
        user = users.filter(username="demo").first()
        if user is None:
            password = os.environ.get("RACKBENCH_DEMO_PASSWORD", "rackbench")
            user = users.create_superuser("demo", "demo@localhost", password)
            self.stdout.write("created the superuser 'demo'")
        team = Team.objects.filter(name=TEAM).first() or services.team_create(name=TEAM)
        if not Membership.objects.filter(team=team, user=user).exists():
            services.team_add_member(team=team, user=user, role=Membership.Role.ADMIN)
            self.stdout.write(f"'demo' is an admin of the team '{TEAM}'")
        self.stdout.write(
            "API token for scripts and CI: the 'API tokens' page, or\n"
            f"  .venv/bin/python manage.py token create --user demo --team {TEAM} --name my-pipeline --scope launch"
        )
