"""Django admin for campaigns: campaigns and runs to look at (read-only: they change through the services, from the
pages, the API and the CLI), and node leases, the operator's way to give back a node kept for a kill that is not
confirmed."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from campaigns import services
from campaigns.models import Campaign, NodeLease, Run


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


class ReadOnly(admin.ModelAdmin):
    """Rows that only services change: viewable, searchable, never edited, added or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Campaign)
class CampaignAdmin(ReadOnly):
    list_display = ["name", "team", "kind", "status", "launched_at", "finished_at"]
    list_filter = ["status", "kind", "team"]
    list_select_related = ["team"]
    search_fields = ["name", "family"]
    date_hierarchy = "created_at"


@admin.register(Run)
class RunAdmin(ReadOnly):
    list_display = ["pk", "campaign", "sequence", "point", "repetition", "status", "started_at", "finished_at"]
    list_filter = ["status", "is_warmup"]
    list_select_related = ["campaign"]
    search_fields = ["campaign__name", "error"]
