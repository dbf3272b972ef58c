"""Django admin for the inventory. Credentials and host keys change only through inventory.services.

Staff change here what Django's model permissions allow them, in every team: that is the staff part of
``inventory.selectors.inventory_can_change``, the rule the API and the pages follow.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.timezone import localtime

from common import numbers
from inventory import importers, services
from inventory.forms import CredentialForm, NodeImportForm
from inventory.models import (
    AllowedCommand,
    Credential,
    HostKey,
    Interface,
    Node,
    NodeRole,
    NodeStatus,
    NodeStatusChange,
    Site,
    StorageCommandChange,
    StorageSystem,
    Tag,
)


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ["name", "description"]
    search_fields = ["name", "description"]


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    list_display = ["name"]
    search_fields = ["name"]


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    """The private key is write-only; the encrypted field is never part of any form or page."""

    form = CredentialForm
    list_display = ["name", "username", "team", "shared", "fingerprint", "created_at"]
    search_fields = ["name", "username", "fingerprint"]
    readonly_fields = ["public_key", "fingerprint", "created_at"]

    def get_fields(self, request: HttpRequest, obj: Credential | None = None) -> list[Any]:
        fields: list[Any] = ["name", "username", "team", "shared", "private_key"]
        return fields + self.readonly_fields if obj else fields

    def save_model(self, request: HttpRequest, obj: Credential, form: ModelForm, change: bool) -> None:
        key = form.cleaned_data["private_key"]
        if change:
            services.credential_update(
                credential=obj, name=obj.name, username=obj.username, team=obj.team, shared=obj.shared
            )
            if key.strip():
                services.credential_set_key(credential=obj, private_key=key)
            return
        created = services.credential_create(
            name=obj.name, username=obj.username, private_key=key, team=obj.team, shared=obj.shared
        )
        # The admin goes on with ``obj`` (log entry, redirect): make it the row the service created.
        obj.pk = created.pk
        obj.refresh_from_db()


class InterfaceInline(admin.TabularInline):
    model = Interface
    extra = 0
    fields = ["name", "role", "speed_mbps", "mtu", "addresses"]


class NodeStatusChangeInline(admin.TabularInline):
    """The node's status history as services wrote it (a health suite's maintenance and return); read-only."""

    model = NodeStatusChange
    extra = 0
    fields = readonly_fields = ("changed_at", "old", "new", "reason", "source", "changed_by")
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    change_list_template = "admin/inventory/node/change_list.html"
    # Short columns, so that the list fits beside its filters at 1400 px: SSH as address:port, GPUs as "8 × A100",
    # RAM in GiB through the one formatter, the facts' date without its seconds.
    list_display = ["name", "ssh", "role", "status", "site", "gpus", "cpu_cores", "ram", "facts_when"]
    list_filter = ["status", "role", "site", "tags", "gpu_model"]
    list_select_related = ["site"]
    search_fields = ["name", "address", "gpu_model", "cpu_model"]
    filter_horizontal = ["tags"]
    inlines = [InterfaceInline, NodeStatusChangeInline]
    readonly_fields = ["facts_pretty", "facts_collected_at", "created_at"]
    fieldsets = [
        (None, {"fields": ["name", "site", "role", "status", "tags"]}),
        ("SSH", {"fields": ["address", "ssh_port", "ssh_user", "credential"]}),
        ("Hardware", {"fields": list(Node.HARDWARE_FIELDS)}),
        ("Discovered facts", {"fields": ["facts_collected_at", "facts_pretty", "created_at"]}),
    ]
    actions = ["collect_facts"]

    class Media:
        css = {"all": ["admin-nodes.css"]}

    @admin.display(description="SSH", ordering="address")
    def ssh(self, obj: Node) -> str:
        return f"{obj.address}:{obj.ssh_port}"

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpus(self, obj: Node) -> str:
        if not obj.gpu_count:
            return "—"
        return f"{obj.gpu_count} × {obj.gpu_model}" if obj.gpu_model else str(obj.gpu_count)

    @admin.display(description="RAM", ordering="ram_mb")
    def ram(self, obj: Node) -> str:
        return numbers.quantity(obj.ram_mb, "MiB")

    @admin.display(description="Facts collected", ordering="facts_collected_at")
    def facts_when(self, obj: Node) -> str:
        when = obj.facts_collected_at
        return localtime(when).strftime("%Y-%m-%d %H:%M") if when else "never"

    @admin.display(description="Facts")
    def facts_pretty(self, obj: Node) -> str:
        if not obj.facts:
            return "Not collected yet: use the action “Collect facts” on the node list."
        return format_html("<pre>{}</pre>", json.dumps(obj.facts, indent=2, sort_keys=True))

    @admin.action(description="Collect facts", permissions=["change"])
    def collect_facts(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        node_ids = list(queryset.values_list("pk", flat=True))
        services.node_collect_facts(node_ids=node_ids)
        self.message_user(request, f"Queued fact collection for {len(node_ids)} node(s).", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        urls = [path("import/", self.admin_site.admin_view(self.import_view), name="inventory_node_import")]
        return urls + super().get_urls()

    def import_view(self, request: HttpRequest) -> HttpResponse:
        if not (self.has_add_permission(request) and self.has_change_permission(request)):
            raise PermissionDenied
        form = NodeImportForm(request.POST or None, request.FILES or None)
        errors: list[tuple[int, str]] = []
        if request.method == "POST" and form.is_valid():
            try:
                nodes = importers.nodes_import(text=form.cleaned_data["content"], fmt=form.cleaned_data["fmt"])
            except importers.NodeImportError as exc:
                errors = exc.errors
            else:
                self.message_user(request, f"Imported {len(nodes)} node(s).", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:inventory_node_changelist"))
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "title": "Import nodes",
            "opts": self.model._meta,
            "form": form,
            "import_errors": errors,
            "columns": importers.COLUMNS,
            "roles": NodeRole.values,
            "statuses": NodeStatus.values,
        }
        return TemplateResponse(request, "admin/inventory/node/import.html", context)


@admin.register(StorageSystem)
class StorageSystemAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "site", "export_path", "admin_address", "node_count", "rated_read_mbps"]
    list_filter = ["kind", "site"]
    list_select_related = ["site"]
    search_fields = ["name", "export_path", "admin_address"]

    def save_model(self, request: HttpRequest, obj: StorageSystem, form: ModelForm, change: bool) -> None:
        before = services.storage_commands(StorageSystem.objects.get(pk=obj.pk)) if change else {}
        super().save_model(request, obj, form, change)
        services.storage_commands_audit(storage=obj, before=before, user=request.user, note="admin")


@admin.register(StorageCommandChange)
class StorageCommandChangeAdmin(admin.ModelAdmin):
    """Who changed which command of which storage system, when: a record, never edited."""

    list_display = ["changed_at", "storage", "field", "old", "new", "changed_by", "note"]
    list_filter = ["field"]
    list_select_related = ["storage", "changed_by"]
    search_fields = ["storage__name", "old", "new"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: StorageCommandChange | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: StorageCommandChange | None = None) -> bool:
        return False


@admin.register(AllowedCommand)
class AllowedCommandAdmin(admin.ModelAdmin):
    """The command step's allow-list: what campaigns may run on nodes. Only superusers change it; staff read it."""

    list_display = ["name", "program", "fixed_args", "max_args", "arg_pattern", "changed_by", "changed_at"]
    search_fields = ["name", "program", "description"]
    readonly_fields = ["changed_by", "changed_at"]

    def has_view_permission(self, request: HttpRequest, obj: AllowedCommand | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_change_permission(self, request: HttpRequest, obj: AllowedCommand | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_delete_permission(self, request: HttpRequest, obj: AllowedCommand | None = None) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def save_model(self, request: HttpRequest, obj: AllowedCommand, form: ModelForm, change: bool) -> None:
        obj.changed_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)


@admin.register(HostKey)
class HostKeyAdmin(admin.ModelAdmin):
    """Pinned keys are recorded by SSH, never typed in. Deleting one forgets it (after a reinstall)."""

    list_display = ["address", "port", "key_type", "fingerprint", "first_seen"]
    search_fields = ["address", "fingerprint"]
    list_filter = ["key_type"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: HostKey | None = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: HostKey) -> None:
        services.hostkey_forget(address=obj.address, port=obj.port)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[HostKey]) -> None:
        for key in queryset:
            services.hostkey_forget(address=key.address, port=key.port)
