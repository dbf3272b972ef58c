"""Campaign and run pages. Each live region is a partial that the page's own view renders alone for htmx."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.crypto import constant_time_compare
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_POST
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from accounts.selectors import Scope, visible
from campaigns import selectors, services
from campaigns.forms import CampaignForm
from campaigns.metrics import RackbenchCollector
from campaigns.models import Campaign, CampaignStatus, Run, RunHost
from runners.benchmarks.base import ParamError
from telemetry import charts

TAIL_CHARS = 8_000  # of each host's stdout/stderr shown on the run page; the full log is a download


def _is_htmx(request: HttpRequest) -> bool:
    return bool(request.headers.get("HX-Request"))


@login_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    campaigns = visible(selectors.campaign_list().select_related("owner", "team"), request=request)
    return render(request, "campaigns/campaign_list.html", {"campaigns": campaigns})


@login_required
def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.select_related("storage", "owner"), request=request), pk=pk)
    context = {
        "campaign": campaign,
        "progress": selectors.campaign_progress(campaign=campaign),
        "runs": selectors.campaign_runs(campaign=campaign),
    }
    if _is_htmx(request):
        response = render(request, "campaigns/_runs.html", context)
        if campaign.status != CampaignStatus.RUNNING:
            # The campaign ended while the page was open: reload it once so its buttons and statistics
            # are current; the reloaded page's region no longer polls.
            response["HX-Refresh"] = "true"
        return response
    context["summary"] = selectors.campaign_summary(campaign=campaign)
    context["verdict"] = campaign.verdicts.select_related("baseline_campaign").first()
    return render(request, "campaigns/campaign_detail.html", context)


@login_required
def campaign_preview(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    context: dict[str, Any] = {"campaign": campaign}
    try:
        context["preview"] = selectors.campaign_preview(campaign=campaign)
    except ParamError as exc:  # a definition the benchmark plug-in no longer accepts
        context["error"] = str(exc)
    return render(request, "campaigns/campaign_preview.html", context)


@login_required
def campaign_new(request: HttpRequest) -> HttpResponse:
    form = CampaignForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        campaign = form.save(owner=request.user, team=Scope(user=request.user).team)
        if campaign is not None:
            messages.success(request, f"Campaign {campaign.name} created.")
            if "launch" in request.POST:
                _launch(request, campaign)
            return redirect("campaigns:campaign-detail", pk=campaign.pk)
    return render(request, "campaigns/campaign_new.html", {"form": form})


@login_required
@require_POST
def campaign_launch(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    _launch(request, campaign)
    return redirect("campaigns:campaign-detail", pk=campaign.pk)


def _launch(request: HttpRequest, campaign: Campaign) -> None:
    try:
        services.campaign_launch(campaign=campaign, user=request.user)
    except services.CampaignError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Campaign {campaign.name} launched.")


@login_required
@require_POST
def campaign_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    try:
        services.campaign_cancel(campaign=campaign)
    except services.CampaignError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Campaign {campaign.name} cancelled.")
    return redirect("campaigns:campaign-detail", pk=campaign.pk)


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        run = selectors.run_detail(run_id=pk)
    except Run.DoesNotExist:
        raise Http404("no such run") from None
    if not visible(Campaign.objects.filter(pk=run.campaign_id), request=request).exists():
        raise Http404("no such run")
    context = {
        "run": run,
        "tail_chars": TAIL_CHARS,
        "tail_slice": f"-{TAIL_CHARS}:",
        "flushes": run.provenance.get("flush") or [],
        "provenance_json": json.dumps(run.provenance, indent=2, sort_keys=True),
    }
    if _is_htmx(request):
        return render(request, "campaigns/_run.html", context)
    context.update(run_charts(run, request.GET.get("t0"), request.GET.get("t1")))
    return render(request, "campaigns/run_detail.html", context)


def _seconds(text: str | None) -> float | None:
    try:
        return max(0.0, float(text)) if text not in (None, "") else None
    except ValueError:
        return None  # a hand-edited URL: show the whole run


def run_charts(run: Run, t0: str | None, t1: str | None) -> dict[str, Any]:
    """The run's telemetry drawn over one window (seconds from the first sample), grouped by host."""
    series = list(run.series.order_by("host", "name", "labels_key"))
    if not series:
        return {}
    drawn = [s for s in series if s.name not in charts.HIDDEN]
    first, start, end = charts.run_window(drawn or series, _seconds(t0), _seconds(t1))
    by_host: dict[str, list[charts.Chart]] = {}
    for s in drawn:
        by_host.setdefault(s.host, []).append(charts.chart(s, start_ns=start, end_ns=end))
    last = max(s.last_ns or first for s in series)
    return {
        "hosts": list(by_host.items()), "hidden": len(series) - len(drawn), "width": charts.WIDTH,
        "height": charts.HEIGHT, "t0": (start - first) / 1e9, "t1": (end - first) / 1e9,
        "duration": (last - first) / 1e9, "zoomed": (start, end) != (first, last),
    }  # fmt: skip


@login_required
def run_host_log(request: HttpRequest, pk: int, host_pk: int) -> HttpResponse:
    hosts = visible(RunHost.objects.select_related("run__campaign"), request=request, field="run__campaign__team")
    host = get_object_or_404(hosts, pk=host_pk, run_id=pk)
    text = (
        f"# {host.run} on {host.host} ({host.address}), exit code {host.exit_code}\n"
        f"# command: {host.command}\n\n"
        f"===== stdout =====\n{host.stdout}\n\n===== stderr =====\n{host.stderr}\n"
    )
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(False, f"run-{pk}-{host.host}.log.txt") or ""
    return response


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition of rackbench's own state; with RACKBENCH_METRICS_TOKEN set, a bearer token is needed."""
    token = settings.RACKBENCH["METRICS_TOKEN"]
    if token and not constant_time_compare(request.headers.get("Authorization", ""), f"Bearer {token}"):
        return HttpResponse("a bearer token is needed\n", status=401, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RackbenchCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
