"""``manage.py lab up|status|down|degrade|heal``: the built-in lab of real sshd nodes, on loopback or each in its own
network namespace (``--network netns``), see runners/lab.py. ``degrade``/``heal`` put faults on a netns lab's nodes.

``up`` also registers the lab in the inventory: credential "lab", nodes ``labN`` (tag "lab") with their host
keys pinned, and storage "lab-local". ``down`` stops the daemons and leaves the inventory alone, so results
stay linked to their nodes; the next ``up`` makes them active again.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from common import progress
from inventory.models import Credential, Node, NodeRole, NodeStatus, StorageKind
from inventory.services import (
    credential_create,
    credential_set_key,
    hostkey_forget,
    hostkey_pin,
    node_note_home,
    node_upsert,
    storage_upsert,
)
from runners import lab

CREDENTIAL_NAME = "lab"
STORAGE_NAME = "lab-local"


class Command(BaseCommand):
    help = (
        "Start (up), list (status) or stop (down) the built-in lab: real sshd nodes on loopback addresses or in their "
        "own network namespaces; degrade or heal a netns node's link or CPU."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{up,status,down,degrade,heal}")
        up = actions.add_parser("up", help="start lab1..labN where not running, and register them")
        up.add_argument("--nodes", type=int, default=4, help="how many nodes (default 4); up never stops any")
        up.add_argument("--port", type=int, help=f"port of every node (default: the lab's, else {lab.DEFAULT_PORT})")
        up.add_argument(
            "--base-address",
            help=f"labN listens on BASE+N (default: the lab's, else {lab.DEFAULT_BASE_ADDRESS}, or for netns the "
            "port's /24 of 198.18.0.0/15)",
        )
        up.add_argument(
            "--network",
            choices=lab.NETWORKS,
            help="loopback: nodes share this machine's network stack; netns: each node in its own network namespace "
            "on a bridge (root; falls back to loopback where namespaces cannot be made). Default: the lab's, else "
            "loopback",
        )
        status = actions.add_parser("status", help="list the lab's nodes")
        status.add_argument("--json", action="store_true", help="print JSON instead of a table")
        actions.add_parser("down", help="stop every lab sshd and its sessions; the inventory is kept")
        degrade = actions.add_parser("degrade", help="shape a netns node's link (tc) or load its CPU")
        degrade.add_argument("node", help="the node, e.g. lab2")
        degrade.add_argument("--rate", help="link rate, e.g. 300mbit (tbf)")
        degrade.add_argument("--delay", help="added delay, e.g. 2ms (netem)")
        degrade.add_argument("--loss", help="packet loss, e.g. 0.5%% (netem)")
        degrade.add_argument(
            "--cpu",
            nargs="?",
            const=True,
            default=False,
            metavar="SHARE",
            help="cap the node's processes at SHARE of one core (default 25%%) with a cpu cgroup, as if a hog took "
            "the rest; a busy loop pinned to one core where no cgroup can be made",
        )
        heal = actions.add_parser("heal", help="remove the faults of one node, or of every node")
        heal.add_argument("node", nargs="?", help="the node (default: every node)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            action = options["action"]
            if action == "up":
                self.up(
                    nodes=options["nodes"],
                    port=options["port"],
                    base_address=options["base_address"],
                    network=options["network"],
                )
            elif action == "status":
                self.status(as_json=options["json"])
            elif action == "degrade":
                node = lab.lab_degrade(
                    options["node"],
                    rate=options["rate"],
                    delay=options["delay"],
                    loss=options["loss"],
                    cpu=options["cpu"],
                )
                fault = f" (CPU: {node.cpu_fault})" if node.cpu_fault else ""
                self.stdout.write(f"{node.name} degraded{fault}.")
            elif action == "heal":
                healed = lab.lab_heal(options["node"])
                self.stdout.write(f"Healed {', '.join(healed) or 'nothing'}.")
            else:
                self.down()
        except lab.LabError as exc:
            raise CommandError(str(exc)) from exc

    def up(self, *, nodes: int, port: int | None, base_address: str | None, network: str | None) -> None:
        """Start the nodes with a progress bar and ETA on a terminal (plain lines in a log), then register them."""
        printer = progress.Printer(self._write, tty=self.stdout.isatty(), what="nodes", step=max(nodes // 10, 1))
        began = time.monotonic()

        def shown(done: int, total: int) -> None:
            printer.show(done, total, eta_s=progress.rate_eta(time.monotonic() - began, done, total))

        started = lab.lab_up(nodes, port=port, base_address=base_address, network=network, on_progress=shown)
        printer.end()
        if network == lab.NETNS and started[0].network != lab.NETNS:
            self.stderr.write("Network namespaces cannot be made here; the nodes run on loopback addresses instead.")
        account = lab.lab_account()
        with transaction.atomic():
            credential = self._register_credential(account)
            for node in started:
                self._register_node(node, account, credential)
            storage_upsert(
                name=STORAGE_NAME,
                kind=StorageKind.LOCAL,
                export_path=str(account.scratch),
                flush_command="sync",
                admin_address=started[0].address,
                admin_port=started[0].port,
                admin_user=account.user,
                admin_credential=credential,
                node_count=1,
            )
        self._print_table(started)
        first = started[0]
        self.stdout.write(
            f"\nLog in as {account.user}: ssh -i {account.private_key} -p {first.port} {account.user}@{first.address}"
        )

    def status(self, *, as_json: bool) -> None:
        nodes = lab.lab_status()
        if as_json:
            rows = [
                {
                    "name": n.name,
                    "address": n.address,
                    "port": n.port,
                    "pid": n.pid,
                    "running": n.running,
                    "network": n.network,
                    "namespace": n.namespace,
                    "cpu_fault": n.cpu_fault,
                }
                for n in nodes
            ]
            self.stdout.write(json.dumps(rows, indent=2))
        elif nodes:
            self._print_table(nodes)
        else:
            self.stdout.write("No lab nodes; start some with: manage.py lab up --nodes N")

    def down(self) -> None:
        stopped = lab.lab_down()
        self.stdout.write(f"Stopped {stopped} lab sshd daemon(s); the lab's inventory rows are kept.")

    def _write(self, text: str) -> None:
        self.stdout.write(text, ending="")
        self.stdout.flush()

    def _register_credential(self, account: lab.LabAccount) -> Credential:
        private_key = account.private_key.read_text()
        public_key = account.private_key.with_suffix(".pub").read_text().split()[1]
        credential = Credential.objects.filter(name=CREDENTIAL_NAME).first()
        if credential is None:
            return credential_create(name=CREDENTIAL_NAME, username=account.user, private_key=private_key)
        if credential.public_key.split()[1] != public_key:
            credential = credential_set_key(credential=credential, private_key=private_key)
        if credential.username != account.user:
            # No service changes a credential's user; nodes and storage name the user explicitly instead.
            self.stderr.write(
                f"Credential {CREDENTIAL_NAME!r} names user {credential.username!r}; "
                f"lab nodes log in as {account.user!r} through their own ssh_user."
            )
        return credential

    def _register_node(self, node: lab.LabNode, account: lab.LabAccount, credential: Credential) -> Node:
        registered = node_upsert(
            name=node.name,
            address=node.address,
            ssh_port=node.port,
            ssh_user=account.user,
            credential=credential,
            role=NodeRole.COMPUTE,
            status=NodeStatus.ACTIVE,
            tags=["lab"],
            cpu_cores=os.cpu_count(),
            ram_mb=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20,
        )
        self._pin_host_key(node)
        node_note_home(node=registered, home=os.path.realpath(account.home))  # previews show the runs' paths
        return registered

    def _pin_host_key(self, node: lab.LabNode) -> None:
        """Pin the key the lab generated, so even a first contact is verified rather than trusted.

        A different pinned key means the lab directory was recreated: the lab owns that endpoint, so it re-pins.
        """
        key_type, key_base64 = node.host_public_key.split()[:2]
        address, port = node.address, node.port
        pinned = hostkey_pin(address=address, port=port, key_type=key_type, key_base64=key_base64)
        if pinned.key_base64 != key_base64:
            hostkey_forget(address=address, port=port)
            hostkey_pin(address=address, port=port, key_type=key_type, key_base64=key_base64)
            self.stderr.write(f"{node.name}: its host key changed (lab directory recreated?); pinned the new one.")

    def _print_table(self, nodes: list[lab.LabNode]) -> None:
        self.stdout.write(f"{'NODE':<8} {'ADDRESS':<15} {'PORT':>5} {'PID':>8}  RUNNING")
        for n in nodes:
            pid = str(n.pid) if n.pid else "-"
            self.stdout.write(f"{n.name:<8} {n.address:<15} {n.port:>5} {pid:>8}  {'yes' if n.running else 'no'}")
