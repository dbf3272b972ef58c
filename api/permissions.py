"""Who may change what through the API, beyond seeing it (the scope) and the token's scope."""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request

from inventory.models import Node, StorageSystem
from inventory.selectors import inventory_can_change


def refusal(obj: Node | StorageSystem) -> str:
    if obj.team_id is None:
        return "shared inventory is created and changed by staff, in the admin; join a team to add your own"
    return f"only staff or a member of team {obj.team} change its inventory"


class InventoryChangePermission(permissions.BasePermission):
    """Nodes and storage systems are changed by whoever ``inventory_can_change`` names; reading is the scope's."""

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        if request.method in permissions.SAFE_METHODS or inventory_can_change(user=request.user, obj=obj):
            return True
        raise PermissionDenied(refusal(obj))


def inventory_check_create(*, user: Any, obj: Node | StorageSystem) -> None:
    """Refuse the creation of ``obj`` (unsaved, its team set) unless ``user`` may change it once it exists."""
    if not inventory_can_change(user=user, obj=obj):
        raise PermissionDenied(refusal(obj))
