"""Telemetry in the admin, read-only: series are written by the samplers through telemetry.services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from telemetry.models import Chunk, Series


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Series)
class SeriesAdmin(ReadOnlyAdmin):
    list_display = ["run", "host", "name", "labels", "kind", "unit", "interval_ns", "sample_count"]
    list_filter = ["kind"]
    search_fields = ["host", "name"]
    list_select_related = ["run__campaign"]
    raw_id_fields = ["run"]


@admin.register(Chunk)
class ChunkAdmin(ReadOnlyAdmin):
    list_display = ["series", "seq", "t0_ns", "t1_ns", "count", "min", "max", "sum"]
    exclude = ["data"]
    list_select_related = ["series"]
    raw_id_fields = ["series"]
