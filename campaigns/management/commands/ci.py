"""``manage.py ci run ...``: the standalone CI client (clients/rackbench_ci.py), from a rackbench checkout."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from clients.rackbench_ci import main


class Command(BaseCommand):
    help = "Run a campaign from CI and judge it against its baseline: `manage.py ci run --help` lists the options."
    # The client talks to a rackbench server over HTTP and never touches this project's database or apps.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        # Everything after `ci` goes to the client's own parser untouched, so both take the same arguments.
        parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="run ...", help="the client's arguments")

    def handle(self, *args: Any, argv: list[str], **options: Any) -> None:
        code = main(argv, prog="manage.py ci")
        if code:
            raise SystemExit(code)
