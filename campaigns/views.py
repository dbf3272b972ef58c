"""Dashboard, campaign, builder and run pages. Each live region is a partial that the page's own view renders
alone for htmx requests; it polls only while something it shows is still running."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, Subquery
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.crypto import constant_time_compare
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_POST
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from accounts.selectors import user_teams, visible
from campaigns import selectors, services
from campaigns.forms import BuilderForm, CampaignForm
from campaigns.metrics import RackbenchCollector
from campaigns.models import (
    RUN_ACTIVE,
    Campaign,
    CampaignStatus,
    NodeLease,
    Run,
    RunHost,
    RunStatus,
    Verdict,
)
from campaigns.presets import preset_list
from campaigns.run_results import run_sections
from campaigns.spec import SpecError, to_yaml
from common.errors import ApplicationError
from inventory.models import Node, NodeStatus, StorageSystem
from plugins.benchmarks.base import ParamError, get_benchmark

TAIL_CHARS = 8_000  # of each host's stdout/stderr shown on the run page; the full log is a download
FAILED = (RunStatus.FAILED, RunStatus.TIMED_OUT)
BLANK = {
    "name": "my-campaign",
    "kind": "fio",
    "nodes": [],
    "repetitions": 3,
    "cache": {"flush_clients": True, "flush_storage": False},
    "timeout": 600,
    "fixed": {"bs": "1M", "size": "64M", "runtime": 10, "time_based": 1},
    "matrix": {"rw": ["read", "write"], "numjobs": [1, 4]},
}


def _is_htmx(request: HttpRequest) -> bool:
    return bool(request.headers.get("HX-Request"))


def _yaml_download(text: str, name: str) -> HttpResponse:
    response = HttpResponse(text, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = content_disposition_header(True, f"{name or 'campaign'}.yaml") or ""
    return response


# --- dashboard --------------------------------------------------------------------------------------------


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    running = visible(selectors.with_live_counts(selectors.campaign_list()), request=request)
    context: dict[str, Any] = {"running": running.filter(status=CampaignStatus.RUNNING).select_related("owner")}
    if _is_htmx(request):
        response = render(request, "campaigns/_dashboard_live.html", context)
        if not context["running"]:
            response["HX-Refresh"] = "true"  # the last one ended: reload once for current results and failures
        return response
    return render(request, "campaigns/dashboard.html", {**context, **_dashboard_rest(request)})


def _dashboard_rest(request: HttpRequest) -> dict[str, Any]:
    """The dashboard's still parts: recently finished campaigns with their verdict, failures, nodes by status."""
    ended = selectors.campaign_list().filter(status__in=[CampaignStatus.SUCCEEDED, CampaignStatus.FAILED])
    verdicts = Verdict.objects.filter(campaign=OuterRef("pk")).order_by("-created_at", "-id")
    ended = ended.annotate(verdict_outcome=Subquery(verdicts.values("outcome")[:1])).order_by("-finished_at")
    failures = Run.objects.filter(status__in=FAILED).select_related("campaign").order_by("-finished_at")
    statuses = dict(visible(Node.objects.all(), request=request).values_list("status").annotate(n=Count("id")))
    return {
        "recent": visible(ended, request=request)[:8],
        "failures": visible(failures, request=request, field="campaign__team")[:8],
        "node_statuses": [(value, label, statuses.get(value, 0)) for value, label in NodeStatus.choices],
        "nodes_busy": visible(NodeLease.objects.all(), request=request, field="node__team").count(),
    }


# --- campaigns ----------------------------------------------------------------------------------------------


@login_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    campaigns = visible(selectors.campaign_list().select_related("owner", "team"), request=request)
    return render(request, "campaigns/campaign_list.html", {"campaigns": campaigns})


@login_required
def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(
        visible(Campaign.objects.select_related("storage", "owner", "team"), request=request), pk=pk
    )
    context = _live_context(campaign, request.GET.get("page"))
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


RUNS_PER_PAGE = 50


def _live_context(campaign: Campaign, page: str | None = None) -> dict[str, Any]:
    """Progress, ETA, the grid of run statuses, the active run's log tail and one page of the runs table with
    their results: the campaign page's live part. A 10,000-run campaign loads its results 50 runs at a time."""
    cells = selectors.campaign_run_cells(campaign=campaign)
    runs = Paginator(selectors.campaign_runs(campaign=campaign), RUNS_PER_PAGE).get_page(page)
    progress = selectors.progress_of(dict(Counter(r.status for r in cells)))  # a Counter answers 0 to .items
    active = next((r for r in cells if r.status in RUN_ACTIVE), None)
    if active is not None:
        services.run_live_log_watch(run_id=active.pk)
    return {
        "campaign": campaign,
        "progress": progress,
        "runs": runs,
        "grid": selectors.campaign_grid(campaign=campaign, runs=cells),
        "run_base": reverse("campaigns:run-detail", args=[0]).removesuffix("0/"),  # one reverse for 10,000 cells
        "eta": selectors.campaign_eta(runs=cells, progress=progress),
        "remaining": progress["total"] - progress["done"],
        "active": active,
        "log": selectors.run_live_log(run=active) if active else None,
        "can_rerun_failed": campaign.status == CampaignStatus.FAILED,  # it has runs that never succeeded
    }


@login_required
def campaign_preview(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    context: dict[str, Any] = {"campaign": campaign}
    try:
        context["preview"] = selectors.campaign_preview(campaign=campaign)
    except ApplicationError as exc:  # a definition the plug-in no longer builds (the API answers the same 400)
        context["error"] = str(exc)
    return render(request, "campaigns/campaign_preview.html", context)


@login_required
def campaign_yaml(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.select_related("storage"), request=request), pk=pk)
    return _yaml_download(to_yaml(selectors.campaign_spec(campaign=campaign)), campaign.name)


# --- the builder --------------------------------------------------------------------------------------------


def _builder_form(request: HttpRequest, data: Any = None) -> BuilderForm:
    nodes = visible(Node.objects.filter(status=NodeStatus.ACTIVE), request=request)
    return BuilderForm(
        data,
        nodes=nodes.select_related("team").prefetch_related("tags").order_by("name"),
        teams=user_teams(user=request.user),
    )


def _starting_point(request: HttpRequest) -> dict[str, Any]:
    """The builder's first definition: ``?preset=SLUG[:PART]``, ``?clone=ID`` (in its campaign's team) or blank."""
    if request.GET.get("preset"):
        slug, _, part = request.GET["preset"].partition(":")
        data = selectors.preset_spec(slug=slug, suffix=part)
        if data is None:
            raise Http404("no such preset")
        return {"definition": to_yaml(data)}
    if request.GET.get("clone", "").isdigit():
        source = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=request.GET["clone"])
        return {"definition": to_yaml(selectors.clone_spec(campaign=source)), "team": source.team_id or ""}
    return {"definition": to_yaml({**BLANK, "name": selectors.unused_name(str(BLANK["name"]))})}


@login_required
def campaign_new(request: HttpRequest) -> HttpResponse:
    """The builder. A GET opens a starting point, bound like a post of it so its preview shows at once."""
    form = _builder_form(request, request.POST if request.method == "POST" else _starting_point(request))
    if request.method == "POST" and form.is_valid():
        if "download" in request.POST:
            data = form.spec()
            text = to_yaml(data) if form.cleaned_data["picked"] else form.data["definition"]
            return _yaml_download(text, str(data.get("name") or ""))
        if "create" in request.POST or "launch" in request.POST:
            campaign = form.save(owner=request.user)
            if campaign is not None:
                messages.success(request, f"Campaign {campaign.name} created.")
                if "launch" in request.POST:
                    _launch(request, campaign)
                return redirect("campaigns:campaign-detail", pk=campaign.pk)
    return render(request, "campaigns/campaign_builder.html", _builder_context(request, form))


def _preset_options(loaded: str) -> list[dict[str, Any]]:
    """Each preset campaign as an option (``SLUG`` or ``SLUG:SUFFIX``), the one loaded selected."""
    options = []
    for preset in preset_list():
        for i, part in enumerate(preset.campaigns):
            suffix = part.get("suffix", "")
            value = f"{preset.slug}:{suffix}" if suffix else preset.slug
            label = f"{preset.title[:89]}…" if len(preset.title) > 90 else preset.title
            options.append({"value": value, "label": f"{label} — {suffix}" if suffix else label,
                            "selected": loaded == value or (loaded == preset.slug and i == 0)})  # fmt: skip
    return options


def _builder_context(request: HttpRequest, form: BuilderForm) -> dict[str, Any]:
    return {
        "form": form,
        "preset_options": _preset_options(request.GET.get("preset", "")),
        "previous": visible(Campaign.objects.order_by("-created_at"), request=request).only("pk", "name")[:100],
        "node_tags": sorted({t.name for n in form.nodes for t in n.tags.all()}),
        "gpu_models": sorted({n.gpu_model for n in form.nodes if n.gpu_model}),
        **_preview(form),
    }


@login_required
@require_POST
def campaign_new_preview(request: HttpRequest) -> HttpResponse:
    """The builder's live preview: the definition checked and expanded as "Create" would, nothing saved."""
    return render(request, "campaigns/_builder_preview.html", _preview(_builder_form(request, request.POST)))


def _preview(form: BuilderForm) -> dict[str, Any]:
    if not form.is_valid():
        return {"preview_errors": [f"{name}: {e}" for name, errs in form.errors.items() for e in errs]}
    data = form.spec()
    try:
        form.check_name(data)
        return {"preview": selectors.spec_preview(data=data, team=form.cleaned_data["team"])}
    except (SpecError, ParamError) as exc:
        return {"preview_errors": [str(exc)], "error_field": exc.field}
    except services.CampaignError as exc:
        return {"preview_errors": [exc.message], "error_field": exc.field}


@login_required
def campaign_new_fio(request: HttpRequest) -> HttpResponse:
    """The quick fio form: a few inputs instead of YAML."""
    form = CampaignForm(
        request.POST or None,
        teams=user_teams(user=request.user),
        nodes=visible(Node.objects.all(), request=request),
        storage=visible(StorageSystem.objects.all(), request=request),
    )
    if request.method == "POST" and form.is_valid():
        campaign = form.save(owner=request.user)
        if campaign is not None:
            messages.success(request, f"Campaign {campaign.name} created.")
            if "launch" in request.POST:
                _launch(request, campaign)
            return redirect("campaigns:campaign-detail", pk=campaign.pk)
    return render(request, "campaigns/campaign_new.html", {"form": form})


# --- actions ------------------------------------------------------------------------------------------------


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
@require_POST
def campaign_rerun_failed(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(visible(Campaign.objects.all(), request=request), pk=pk)
    try:
        runs = services.campaign_rerun(campaign=campaign, failed=True)
    except services.CampaignError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{len(runs)} run{'s' if len(runs) != 1 else ''} of {campaign.name} queued again.")
    return redirect("campaigns:campaign-detail", pk=campaign.pk)


# --- runs ---------------------------------------------------------------------------------------------------


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(visible(selectors.run_details(), request=request, field="campaign__team"), pk=pk)
    try:
        benchmark = get_benchmark(run.campaign.kind)
        headline, totals = benchmark.headline, benchmark.totals
    except ParamError:  # a kind no longer installed: its results still show, unranked
        headline, totals = (), {}
    context = {
        "run": run,
        "sections": run_sections(run.results.all(), headline=headline, totals=totals),
        "tail_chars": TAIL_CHARS,
        "tail_slice": f"-{TAIL_CHARS}:",
        "flushes": run.provenance.get("flush") or [],
        "layout": run.provenance.get("layout") or {},
        "reads": (run.provenance.get("cache") or {}).get("reads") or {},
        "provenance_json": json.dumps(run.provenance, indent=2, sort_keys=True),
        "start": selectors.run_start_summary(run.provenance),
    }
    template = "campaigns/_run.html" if _is_htmx(request) else "campaigns/run_detail.html"
    return render(request, template, context)


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
    """Prometheus exposition of rackbench's own state (every team's counts): it needs the bearer token
    RACKBENCH_METRICS_TOKEN, or RACKBENCH_METRICS_OPEN=1 to be read by anyone."""
    token = settings.RACKBENCH["METRICS_TOKEN"]
    if not token and not settings.RACKBENCH["METRICS_OPEN"]:
        return HttpResponse("/metrics is off: set RACKBENCH_METRICS_TOKEN\n", status=403, content_type="text/plain")
    if token and not constant_time_compare(request.headers.get("Authorization", ""), f"Bearer {token}"):
        return HttpResponse("a bearer token is needed\n", status=401, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RackbenchCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
