from django.contrib import admin

from scheduling.models import Firing, Schedule


class FiringInline(admin.TabularInline):
    model = Firing
    fields = ("due_at", "fired_at", "campaign", "error")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """Read mostly: a schedule and its beat entry change together through the pages (scheduling.services)."""

    list_display = ("campaign", "kind", "run_at", "cron", "enabled", "created_by", "created_at")
    list_filter = ("kind", "enabled")
    search_fields = ("campaign__name",)
    readonly_fields = ("campaign", "kind", "run_at", "cron", "enabled", "periodic_task", "created_by", "created_at")
    inlines = [FiringInline]

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(Firing)
class FiringAdmin(admin.ModelAdmin):
    list_display = ("schedule", "due_at", "fired_at", "campaign", "error")
    list_filter = ("schedule__kind",)
    readonly_fields = ("schedule", "due_at", "fired_at", "campaign", "error")

    def has_add_permission(self, request: object) -> bool:
        return False
