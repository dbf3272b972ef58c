"""List or forget pinned SSH host keys."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from inventory.models import HostKey
from inventory.services import hostkey_forget


class Command(BaseCommand):
    help = "List pinned SSH host keys, or forget one after a node was reinstalled on purpose."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        p = sub.add_parser("forget")
        p.add_argument("address")
        p.add_argument("port", type=int)

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["action"] == "list":
            for key in HostKey.objects.all():
                self.stdout.write(
                    f"{key.address}:{key.port} {key.key_type} {key.fingerprint} since {key.first_seen:%F}"
                )
            return
        count = hostkey_forget(address=opts["address"], port=opts["port"])
        self.stdout.write(f"forgot {count} key(s) for {opts['address']}:{opts['port']}")
