"""API tokens of the signed-in user: create (the secret is shown once), list, revoke."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts import services
from accounts.forms import TokenForm
from accounts.selectors import user_teams


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None, user=request.user)
    secret = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            secret = services.token_create(
                user=request.user, team=data["team"], name=data["name"], scope=data["scope"],
                expires_at=services.token_expires_at(days=data["expires_days"]),
            ).secret  # fmt: skip
        except services.AccountError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
    context = {
        "form": form,
        "secret": secret,
        "tokens": request.user.api_tokens.select_related("team"),  # type: ignore[union-attr]
        "teams": user_teams(user=request.user),
    }
    return render(request, "accounts/token_list.html", context)


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(request.user.api_tokens, pk=pk)  # type: ignore[union-attr]
    if services.token_revoke(token=token):
        messages.success(request, f"Token {token.name} revoked.")
    return redirect("accounts:token-list")
