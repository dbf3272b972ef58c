"""Every state change of the inventory."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import Any

import paramiko
from django.db import transaction
from django.utils import timezone

from common.errors import ApplicationError, FieldError
from common.names import name_check
from common.sshkeys import UnreadableKey, load_private_key
from common.sshkeys import fingerprint as ssh_fingerprint
from inventory import dispatch
from inventory.commands import PROGRAMS
from inventory.crypto import encrypt
from inventory.models import (
    Credential,
    HostKey,
    Interface,
    Node,
    NodeStatus,
    NodeStatusChange,
    Site,
    StorageCommandChange,
    StorageSystem,
    Tag,
)


class InventoryError(ApplicationError, ValueError):
    """Bad inventory input; ``field`` names the offending field when there is one."""

    def __init__(self, message: str, *, field: str = "", line: int | None = None) -> None:
        super().__init__(message, field=field)
        self.line = line


def _load_private_key(private_key: str) -> paramiko.PKey:
    try:
        return load_private_key(private_key.strip() + "\n")
    except UnreadableKey:
        raise InventoryError(
            "not a private key paramiko can read (OpenSSH or PEM; ed25519, ECDSA or RSA, without a passphrase)",
            field="private_key",
        ) from None


def key_fingerprint(key: paramiko.PKey) -> str:
    return ssh_fingerprint(key.get_name(), key.get_base64())


def credential_create(
    *, name: str, username: str, private_key: str, team: Any = None, shared: bool = False
) -> Credential:
    key = _load_private_key(private_key)
    return Credential.objects.create(
        name=name,
        username=username,
        team=team,
        shared=shared and team is None,
        private_key_encrypted=encrypt(private_key.strip() + "\n"),
        public_key=f"{key.get_name()} {key.get_base64()} {name}",
        fingerprint=key_fingerprint(key),
    )


def credential_set_key(*, credential: Credential, private_key: str) -> Credential:
    key = _load_private_key(private_key)
    credential.private_key_encrypted = encrypt(private_key.strip() + "\n")
    credential.public_key = f"{key.get_name()} {key.get_base64()} {credential.name}"
    credential.fingerprint = key_fingerprint(key)
    credential.save(update_fields=["private_key_encrypted", "public_key", "fingerprint"])
    return credential


def _name_check(name: str) -> None:
    try:
        name_check("name", name)
    except FieldError as exc:
        raise InventoryError(f"name {name!r}: {exc.message}", field="name") from None


def tags_from_names(names: list[str]) -> list[Tag]:
    return [Tag.objects.get_or_create(name=n.strip())[0] for n in names if n.strip()]


def node_upsert(*, name: str, tags: list[str] | None = None, **fields: Any) -> Node:
    """Create the node or update the given fields of an existing one with that name."""
    _name_check(name)
    node, _ = Node.objects.update_or_create(name=name, defaults=fields)
    if tags is not None:
        node.tags.set(tags_from_names(tags))
    return node


def storage_upsert(*, name: str, **fields: Any) -> StorageSystem:
    _name_check(name)
    storage, _ = StorageSystem.objects.update_or_create(name=name, defaults=fields)
    return storage


def storage_commands_audit(*, storage: StorageSystem, before: dict[str, str], user: Any, note: str = "") -> int:
    """Record each command of ``storage`` that differs from ``before`` (field -> command; a new storage system:
    empty), by ``user``. Every path that changes them (API, admin) calls this after saving. Returns the changes."""
    changes = [
        StorageCommandChange(
            storage=storage,
            field=field,
            old=before.get(field, ""),
            new=getattr(storage, field),
            changed_by=user if getattr(user, "pk", None) else None,
            note=note,
        )  # fmt: skip
        for field in PROGRAMS
        if getattr(storage, field) != before.get(field, "")
    ]
    StorageCommandChange.objects.bulk_create(changes)
    return len(changes)


def storage_commands(storage: StorageSystem) -> dict[str, str]:
    return {field: getattr(storage, field) for field in PROGRAMS}


def hostkey_pin(*, address: str, port: int, key_type: str, key_base64: str) -> HostKey:
    """Record the key seen at first contact. Returns the pinned key, which may differ from the one given."""
    fingerprint = ssh_fingerprint(key_type, key_base64)
    with transaction.atomic():
        pinned, _ = HostKey.objects.get_or_create(
            address=address,
            port=port,
            defaults={"key_type": key_type, "key_base64": key_base64, "fingerprint": fingerprint},
        )
    return pinned


def hostkey_forget(*, address: str, port: int) -> int:
    """Forget a pinned key (after a node was reinstalled, by an administrator's decision)."""
    deleted, _ = HostKey.objects.filter(address=address, port=port).delete()
    return deleted


def node_collect_facts(*, node_ids: Iterable[int]) -> None:
    """Queue the collection of these nodes' facts, one task each, once the current transaction commits."""
    for node_id in node_ids:
        transaction.on_commit(partial(dispatch.collect_facts(), node_id))


def node_facts_refresh(*, nodes: Iterable[Node], max_age_s: float) -> dict[str, str]:
    """Collect now, and wait for, the facts of those ``nodes`` whose facts are older than ``max_age_s`` seconds (or
    were never collected); reloads them into the given objects. Returns {node name: why it failed}."""
    nodes = list(nodes)
    cutoff = timezone.now() - timedelta(seconds=max_age_s)
    stale = [n for n in nodes if n.facts_collected_at is None or n.facts_collected_at < cutoff]
    if not stale:
        return {}
    errors = dispatch.refresh_facts()([n.pk for n in stale])
    fresh = Node.objects.in_bulk([n.pk for n in stale])
    for node in stale:
        if node.pk in fresh:
            node.facts, node.facts_collected_at = fresh[node.pk].facts, fresh[node.pk].facts_collected_at
    return {node.name: errors[node.pk] for node in stale if node.pk in errors}


def node_store_facts(*, node: Node, facts: dict[str, Any]) -> Node:
    """Store discovered facts and fill the inventory fields that are still empty. A container runtime that earlier
    facts filled in (a docker binary was found) and that does not answer now (no daemon) is taken back."""
    earlier = node.facts.get("container_runtimes") or []
    if node.container_runtime in earlier and node.container_runtime in facts.get("container_runtimes_silent", []):
        node.container_runtime = ""
    node.facts = facts
    node.facts_collected_at = timezone.now()
    found = {**facts, "container_runtime": (facts.get("container_runtimes") or [None])[0]}
    fill = {field: found.get(field) for field in Node.HARDWARE_FIELDS}
    for field, value in fill.items():
        if value and not getattr(node, field):
            setattr(node, field, value)
    node.save()
    return node


def node_note_home(*, node: Node, home: str) -> None:
    """Remember the login directory a worker found on the node (facts["home"]), so that a campaign's preview shows
    the very paths its runs use. Writes only when it changed."""
    if node.facts.get("home") == home:
        return
    node.facts = {**node.facts, "home": home}
    Node.objects.filter(pk=node.pk).update(facts=node.facts)


def credential_key_check(*, private_key: str) -> None:
    """Raise InventoryError unless the text is a private key paramiko can use (for forms, before saving)."""
    _load_private_key(private_key)


def credential_update(
    *, credential: Credential, name: str, username: str, team: Any = None, shared: bool = False
) -> Credential:
    """Rename a credential, change its user, team or sharing; the key is changed only by ``credential_set_key``.
    Only a credential without a team is shared (with every team)."""
    credential.name = name
    credential.username = username
    credential.team = team
    credential.shared = shared and team is None
    credential.save(update_fields=["name", "username", "team", "shared"])
    return credential


def site_ensure(*, name: str) -> Site:
    site, _ = Site.objects.get_or_create(name=name)
    return site


def node_sync_interfaces(*, node: Node, nics: list[dict[str, Any]]) -> list[Interface]:
    """Create or update one Interface per discovered NIC.

    Discovery owns speed, MTU and addresses; the role is the user's and is never changed here. Interfaces
    that were not discovered this time are kept (a NIC may be down or renamed; an administrator decides).
    """
    interfaces = []
    for nic in nics:
        interface, _ = Interface.objects.update_or_create(
            node=node,
            name=nic["name"],
            defaults={
                "speed_mbps": nic.get("speed_mbps"),
                "mtu": nic.get("mtu"),
                "addresses": nic.get("addresses") or [],
            },
        )
        interfaces.append(interface)
    return interfaces


def node_mark_suspect(*, node: Node, reason: str) -> bool:
    """The node did not answer a short SSH probe: runs on it fail at once from now on (see ``suspect_since``).
    Keeps the first time and reason of an outage; False when it was suspect already."""
    return bool(
        Node.objects.filter(pk=node.pk, suspect_since__isnull=True).update(
            suspect_since=timezone.now(), suspect_reason=reason[:2000]
        )
    )


def node_clear_suspect(*, node: Node) -> bool:
    """The node answers again."""
    return bool(
        Node.objects.filter(pk=node.pk, suspect_since__isnull=False).update(suspect_since=None, suspect_reason="")
    )


def node_set_status(
    *, node: Node, status: str, reason: str, source: str = "", user: Any = None, only_from: str | None = None
) -> bool:
    """Set the node's status and record the change in its history (``status_changes``). With ``only_from``, only a
    node in that status changes (a conditional update): a node an administrator has retired meanwhile stays so.
    False when nothing changed."""
    if status not in NodeStatus.values:
        raise FieldError("status", f"must be one of {', '.join(NodeStatus.values)}, got {status!r}")
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        old = locked.status
        if old == status or (only_from is not None and old != only_from):
            return False
        locked.status = status
        locked.save(update_fields=["status"])  # a save: campaigns waiting for the node wake up (campaigns.signals)
        NodeStatusChange.objects.create(
            node=locked, old=old, new=status, reason=reason[:500], source=source[:200], changed_by=user
        )
    node.status = status
    return True
