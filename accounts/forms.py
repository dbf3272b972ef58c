from __future__ import annotations

from typing import Any

from django import forms

from accounts.models import Team, TokenScope
from accounts.selectors import user_teams
from accounts.services import TOKEN_MAX_DAYS


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="what the token is for, e.g. the pipeline that uses it")
    team = forms.ModelChoiceField(queryset=Team.objects.none(), help_text="the token sees and creates in this team")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_days = forms.IntegerField(min_value=1, max_value=TOKEN_MAX_DAYS, required=False, initial=90,
                                      help_text="days until it stops working; empty: never")  # fmt: skip

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        teams = user_teams(user=user)
        team = self.fields["team"]
        team.queryset = teams  # type: ignore[attr-defined]
        if len(teams) == 1:  # the only choice is chosen: no "---------" to pick first
            team.empty_label = None  # type: ignore[attr-defined]
            team.initial = teams[0].pk
