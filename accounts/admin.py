from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest

from accounts import services
from accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]


class ApiTokenForm(forms.ModelForm):
    """Refuses here, on the form, what ``token_create`` would refuse: the admin saves and logs only a valid form."""

    class Meta:
        model = ApiToken
        fields = ["user", "team", "name", "scope", "expires_at"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data  # a missing or invalid field is already reported
        try:
            services.token_check(user=data["user"], team=data["team"], name=data["name"], scope=data["scope"],
                                 expires_at=data.get("expires_at"))  # fmt: skip
        except services.AccountError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created here (the secret is shown once, in a message) and revoked; never edited."""

    form = ApiTokenForm
    list_display = ["name", "prefix", "user", "team", "scope", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["scope", "team"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "last_used_at", "revoked_at", "created_at"]
    actions = ["revoke"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        issued = services.token_create(
            user=obj.user, team=obj.team, name=obj.name, scope=obj.scope, expires_at=obj.expires_at
        )
        # The admin goes on with ``obj`` (log entry, redirect): make it the row the service created.
        obj.pk = issued.token.pk
        obj.refresh_from_db()
        messages.warning(request, f"Copy the token now, it is not shown again: {issued.secret}")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        count = sum(services.token_revoke(token=t) for t in queryset)
        messages.info(request, f"{count} token(s) revoked")
