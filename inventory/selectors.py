"""Reads of the inventory used by views and the API, and the one rule for who may change it."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from accounts.models import Membership
from inventory.models import AllowedCommand, Credential, Node, StorageSystem
from plugins.benchmarks.command import AllowedProgram


def node_list() -> QuerySet[Node]:
    """Every node with what its lists show; filtering is inventory.filters' and api.filters' (django-filter)."""
    return Node.objects.select_related("site", "credential", "team").prefetch_related("tags")


def storage_list() -> QuerySet[StorageSystem]:
    return StorageSystem.objects.select_related("site", "admin_credential", "team")


def inventory_can_change(*, user: Any, obj: Node | StorageSystem) -> bool:
    """Whether ``user`` may change ``obj`` (create, edit or delete it, collect its facts). The API, the node page and
    its "Collect facts" ask this; ``obj`` may be unsaved (a creation, its team set).

    - A team's node or storage system: any member of the team, whatever their role. A member already launches
      campaigns that run benchmarks over SSH on the team's nodes; keeping the record of the hardware they benchmark
      up to date (a new node from a CI pipeline, a node in maintenance, its facts after a driver bump) is less than
      that, and reserving it to the team's admins would only stall the engineers who own that hardware.
    - Shared inventory (no team, e.g. the built-in lab): every team uses it, so no team changes it.
    - Staff holding the admin's permission to change that kind of object (``inventory.change_node``, ...) and
      superusers change any of it, shared or not: whom the admin, which is not per team, lets change it there.
    """
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if user.is_superuser or (user.is_staff and user.has_perm(f"inventory.change_{obj._meta.model_name}")):
        return True
    return obj.team_id is not None and Membership.objects.filter(team_id=obj.team_id, user=user).exists()


def storage_can_set_commands(*, user: Any, storage: StorageSystem) -> bool:
    """Whether ``user`` may set the flush and statistics commands of ``storage`` (possibly unsaved): they run on
    infrastructure every user of the storage shares, so a member who may otherwise change a team's storage may not.

    Superusers and staff holding ``inventory.change_storagesystem`` may; for a team's storage system, so may the
    team's admins (``Membership.Role.ADMIN``).
    """
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if user.is_superuser or (user.is_staff and user.has_perm("inventory.change_storagesystem")):
        return True
    return (
        storage.team_id is not None
        and Membership.objects.filter(team_id=storage.team_id, user=user, role=Membership.Role.ADMIN).exists()
    )


def credential_usable(*, user: Any, team_ids: list[int] | None) -> QuerySet[Credential]:
    """The credentials a node or storage system of one of ``team_ids`` (None: any team) may use: the team's own and
    those staff shared on purpose (``shared``). Staff and superusers may also use unshared credentials without a
    team, for shared inventory."""
    rows = Credential.objects.all()
    if getattr(user, "is_superuser", False) or team_ids is None:
        return rows
    usable = Q(team_id__in=team_ids) | Q(team=None, shared=True)
    if getattr(user, "is_staff", False):
        usable |= Q(team=None)
    return rows.filter(usable)


def allowed_command(name: str) -> AllowedProgram | None:
    """The command step's allow-list entry of that name (the plug-in's port, set in ``InventoryConfig.ready``)."""
    row = AllowedCommand.objects.filter(name=name).first()
    if row is None:
        return None
    return AllowedProgram(
        name=row.name, argv=(row.program, *row.fixed_args), max_args=row.max_args, arg_pattern=row.arg_pattern
    )


def allowed_command_names() -> list[str]:
    return list(AllowedCommand.objects.order_by("name").values_list("name", flat=True))
