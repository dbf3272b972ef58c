"""Scheduling pages: a campaign's schedule form, the schedules, one schedule, and the node timeline."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.selectors import scope_for, visible
from campaigns.models import Campaign
from campaigns.services import CampaignError
from campaigns.spec import SpecError
from scheduling import selectors, services
from scheduling.forms import NOW, ScheduleForm
from scheduling.models import Schedule


def _with_next_runs(schedules: Any, count: int = 3) -> list[Schedule]:
    rows = list(schedules)
    for schedule in rows:
        schedule.next_runs = selectors.next_runs(schedule, count=count)
    return rows


def _submit(request: HttpRequest, form: ScheduleForm, campaign: Campaign) -> HttpResponse | None:
    """Launch now or create the schedule; None (with the error on the form) when the input is refused."""
    data = form.cleaned_data
    try:
        if data["when"] == NOW:
            launched = services.campaign_launch_now(campaign=campaign, user=request.user)
            messages.success(request, f"Campaign {launched.name} launched.")
            return redirect("campaigns:campaign-detail", pk=launched.pk)
        schedule = services.schedule_create(
            campaign=campaign, kind=data["when"], run_at=data["run_at"], at=data["time"], weekday=data["weekday"],
            cron=data["cron"], user=request.user,
        )  # fmt: skip
    except services.ScheduleError as exc:
        form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        return None
    except (CampaignError, SpecError) as exc:
        form.add_error(None, exc.message)
        return None
    messages.success(request, f"Scheduled {campaign.name}: {schedule.describe()}.")
    return redirect("scheduling:schedule-detail", pk=schedule.pk)


def _page(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    context.update(time_zone=settings.TIME_ZONE, now=timezone.localtime(timezone.now(), services.display_tz()))
    return render(request, template, context)


@login_required
def campaign_schedule(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    form = ScheduleForm(request.POST or None)
    if request.method == "POST" and form.is_valid() and (done := _submit(request, form, campaign)):
        return done
    schedules = _with_next_runs(selectors.schedule_list(scope=scope_for(request)).filter(campaign=campaign))
    return _page(request, "scheduling/campaign_schedule.html", {"campaign": campaign, "form": form,
                                                                "schedules": schedules})  # fmt: skip


@login_required
def schedule_list(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    form = ScheduleForm(request.POST or None, campaigns=scope.filter(Campaign.objects.all()))
    if request.method == "POST" and form.is_valid() and (done := _submit(request, form, form.cleaned_data["campaign"])):
        return done
    schedules = _with_next_runs(selectors.schedule_list(scope=scope))
    return _page(request, "scheduling/schedule_list.html", {"schedules": schedules, "form": form})


def _schedule(request: HttpRequest, pk: int) -> Schedule:
    return get_object_or_404(selectors.schedule_list(scope=scope_for(request)), pk=pk)


@login_required
def schedule_detail(request: HttpRequest, pk: int) -> HttpResponse:
    schedule = _schedule(request, pk)
    context = {
        "schedule": schedule,
        "next_runs": selectors.next_runs(schedule, count=5),
        "firings": selectors.schedule_firings(schedule=schedule),
    }
    return _page(request, "scheduling/schedule_detail.html", context)


@login_required
@require_POST
def schedule_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    schedule = _schedule(request, pk)
    try:
        services.schedule_set_enabled(schedule=schedule, enabled=not schedule.enabled)
    except services.ScheduleError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Schedule {'enabled' if schedule.enabled else 'disabled'}.")
    return redirect("scheduling:schedule-detail", pk=schedule.pk)


@login_required
@require_POST
def schedule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    schedule = _schedule(request, pk)
    services.schedule_delete(schedule=schedule)
    messages.success(request, f"Schedule of {schedule.campaign.name} deleted; the campaigns it launched stay.")
    return redirect("scheduling:schedule-list")


@login_required
def timeline(request: HttpRequest) -> HttpResponse:
    rows = selectors.timeline(scope=scope_for(request))
    # each tick's label under it: the first starts at its tick, the last ends at its, the others centred on theirs
    ticks = [{"x": h * selectors.TIMELINE_WIDTH / 24, "h": h, "label": f"+{h} h" if h else "now",
              "anchor": "start" if h == 0 else "end" if h == 24 else "middle"} for h in range(0, 25, 6)]  # fmt: skip
    return _page(request, "scheduling/timeline.html", {"rows": rows, "width": selectors.TIMELINE_WIDTH,
                                                       "ticks": ticks})  # fmt: skip
