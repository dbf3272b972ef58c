"""Django admin for node leases: the operator's way to give back a node kept for a kill that is not confirmed."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from campaigns import services
from campaigns.models import NodeLease


@admin.register(NodeLease)
class NodeLeaseAdmin(admin.ModelAdmin):
    list_display = ["node", "campaign", "acquired_at", "held_for", "held_reason", "held_since"]
    list_filter = [("held_for", admin.EmptyFieldListFilter)]
    list_select_related = ["node", "campaign"]
    readonly_fields = ["node", "campaign", "acquired_at", "held_for", "held_reason", "held_since"]
    actions = ["release_by_hand"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # leases are taken by campaigns, never by hand

    @admin.action(description="Release: the kill is not confirmed, but the node is known to run nothing of it")
    def release_by_hand(self, request: HttpRequest, queryset: QuerySet[NodeLease]) -> None:
        released = [
            str(lease.node) for lease in queryset if services.lease_release_by_hand(lease=lease, user=request.user)
        ]
        if released:
            self.message_user(request, f"Released {', '.join(released)}.", messages.SUCCESS)
        else:
            self.message_user(request, "None of these leases was kept for an unconfirmed kill.", messages.WARNING)
