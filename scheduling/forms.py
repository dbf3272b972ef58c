"""The schedule form: launch now, once at a given time, nightly, weekly or on a cron expression."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet

from campaigns.models import Campaign
from scheduling import recurrence
from scheduling.models import ScheduleKind

NOW = "now"
WHEN_CHOICES = [(NOW, "now"), *[(k.value, k.label) for k in ScheduleKind]]


class ScheduleForm(forms.Form):
    """Field checks only; the rules (a time in the future, a cron expression that fires) are the service's, and
    the view puts its ScheduleError on the field it names. With ``campaigns``, the form also asks which campaign
    (by name, among those the user may see)."""

    campaign = forms.CharField(label="Campaign", max_length=100, help_text="the name of the campaign to launch")
    when = forms.ChoiceField(label="When", choices=WHEN_CHOICES, widget=forms.RadioSelect, initial=NOW)
    run_at = forms.DateTimeField(
        label="At", required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text="once: the date and time",
    )  # fmt: skip
    time = forms.TimeField(
        label="Time of day", required=False, widget=forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
        help_text="nightly and weekly: HH:MM",
    )  # fmt: skip
    weekday = forms.TypedChoiceField(
        label="Day", required=False, coerce=int, empty_value=None,
        choices=[("", "—"), *[(i, day) for i, day in enumerate(recurrence.WEEKDAYS)]], help_text="weekly",
    )  # fmt: skip
    cron = forms.CharField(
        label="Cron expression", required=False, max_length=100,
        widget=forms.TextInput(attrs={"placeholder": "0 2 * * 1-5", "spellcheck": "false"}),
        help_text="minute hour day-of-month month day-of-week (0 = Sunday); a day must match all three day fields",
    )  # fmt: skip

    def __init__(self, *args: Any, campaigns: QuerySet[Campaign] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.campaigns = campaigns
        if campaigns is None:
            del self.fields["campaign"]

    def clean_campaign(self) -> Campaign:
        name = self.cleaned_data["campaign"].strip()
        assert self.campaigns is not None
        campaign = self.campaigns.filter(name=name).first()
        if campaign is None:
            raise forms.ValidationError(f"no campaign named {name!r}")
        return campaign
