"""Create the demo login (a superuser) when it does not exist yet."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the superuser 'demo' (password from RACKBENCH_DEMO_PASSWORD, default 'rackbench') if missing."

    def handle(self, *args: Any, **opts: Any) -> None:
        users = get_user_model().objects
        if users.filter(username="demo").exists():
            return
        users.create_superuser("demo", "demo@localhost", os.environ.get("RACKBENCH_DEMO_PASSWORD", "rackbench"))
        self.stdout.write("created the superuser 'demo'")
