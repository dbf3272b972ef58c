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
    list_display = ["name", "team", "kind", "statistic", "status", "launched_at", "finished_at"]
    list_filter = ["status", "kind", "statistic", "team"]
    list_select_related = ["team"]
    search_fields = ["name", "family"]
    actions = ["sum_up_by_mean", "sum_up_by_median"]

    @admin.action(description="Sum points up by the mean of their repetitions")
    def sum_up_by_mean(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._statistic(request, queryset, "mean")

    @admin.action(description="Sum points up by the median of their repetitions")
    def sum_up_by_median(self, request: HttpRequest, queryset: QuerySet[Campaign]) -> None:
        self._statistic(request, queryset, "median")

    def _statistic(self, request: HttpRequest, queryset: QuerySet[Campaign], statistic: str) -> None:
        for campaign in queryset:
            services.campaign_set_statistic(campaign=campaign, statistic=statistic)
        self.message_user(
            request, f"{queryset.count()} campaign(s) now summed up by the {statistic}.", messages.SUCCESS
        )

    date_hierarchy = "created_at"


@admin.register(Run)
class RunAdmin(ReadOnly):
    list_display = ["pk", "campaign", "sequence", "point", "repetition", "status", "started_at", "finished_at"]
    list_filter = ["status", "is_warmup"]
    list_select_related = ["campaign"]
    search_fields = ["campaign__name", "error"]
