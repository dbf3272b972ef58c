"""Comparison and analysis pages: GET forms (they work without JavaScript), a table and a chart each, and their
exports (``?format=csv|json|svg``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.safestring import mark_safe

from accounts.selectors import scope_for, user_teams
from analysis import calculations, charts, exports, fleet, forms, health, reports, selectors
from campaigns import selectors as campaign_selectors
from campaigns import suites
from campaigns.models import Campaign
from common.errors import ApplicationError, ParamError

STATISTICS = selectors.STATISTICS

SCALING_METRICS = ("images_per_sec", "read_mb_per_sec", "bw_bytes", "read_bw_bytes", "busbw_avg_gbps", "throughput_bps")
SWEEP_METRICS = ("bw_bytes", "read_bw_bytes", "iops", "throughput_bps", "busbw_gbps", "read_mb_per_sec")
SWEEP_X = ("size_bytes", "numjobs", "bs", "parallel", "iodepth", "nodes")
HOSTS = ("aggregate", "per-node", "both")
LOG = ("auto", "on", "off")


def _render(request: HttpRequest, template: str, context: dict[str, Any], *, name: str,
            tables: list[exports.Table], figure: Any = None) -> HttpResponse:  # fmt: skip
    """The page, or the export ``?format=`` asks for (a format it cannot give becomes a message on the page)."""
    download = exports.export(request, name=name, tables=tables, figure=figure)
    if isinstance(download, HttpResponse):
        return download
    if download:
        context["errors"].append(download)
    context.update(tables=tables, figure=figure)
    if figure is not None:
        context.update(chart_svg=mark_safe(charts.svg(figure)), chart_data=figure.as_json())  # every text escaped
    return render(request, template, context)


def _choice(query: Any, key: str, allowed: list[str] | tuple[str, ...], preferred: tuple[str, ...],
            errors: list[str], what: str) -> str | None:  # fmt: skip
    """The value asked for when it is one of ``allowed``, else a message and the first preferred that is allowed."""
    raw = query.get(key, "").strip()
    if raw and raw in allowed:
        return raw
    if raw:
        errors.append(f"{what} {raw!r} is not one of: {', '.join(allowed) or 'none yet'}")
    return next((p for p in preferred if p in allowed), allowed[0] if allowed else None)


def _picked(request: HttpRequest, errors: list[str], key: str = "campaign") -> list[Campaign]:
    ids, bad = forms.ids(request.GET, key)
    errors += bad
    return selectors.campaigns_by_id(request=request, ids=ids)


def _scaling_x(request: HttpRequest, stats: list[selectors.PointStat], campaigns: list[Campaign],
               context: dict[str, Any]) -> tuple[list[str], str | None]:  # fmt: skip
    """The x axes the points have values along (no GPUs on GPU-less nodes) and the one drawn: the one asked for
    where the points have values along it, else the default (reports.default_x), saying so."""
    axes = reports.x_axes(stats, campaigns)
    asked = request.GET.get("x", "").strip()
    if asked in axes:
        return axes, asked
    chosen = reports.default_x(stats, axes)
    known = [*reports.MACHINE_X, *(a for c in campaigns for a, _ in c.matrix)]
    if asked and asked not in known:
        context["errors"].append(f"x axis {asked!r} is not one of: {', '.join(axes) or 'none yet'}")
    elif asked and chosen and not _is_htmx(request):
        context["notes"].append(f"No point of the chosen campaigns has a value for {reports.x_title(asked)}: "
                                f"drawn against {reports.x_title(chosen)}.")  # fmt: skip
    return axes, chosen


def _is_htmx(request: HttpRequest) -> bool:
    return bool(request.headers.get("HX-Request"))


def _base(request: HttpRequest, campaigns: list[Campaign], errors: list[str]) -> dict[str, Any]:
    selected = [c.pk for c in campaigns]
    return {"errors": errors, "notes": [], "campaigns": campaigns, "selected": selected,
            "choices": selectors.campaign_choices(request=request, selected=selected)}  # fmt: skip


def _empty_text(stats: list[selectors.PointStat], metric: str | None, x: str | None) -> str:
    """Why a table has no rows, in the terms of what was found: never "no succeeded runs" when there are some."""
    if not stats:
        return f"No succeeded run of the chosen campaigns has reported {metric or 'a metric'} yet."
    axis = reports.x_title(x or "")
    return f"None of the {len(stats)} points with {metric} has a value for {axis}: pick another axis."


@login_required
def index(request: HttpRequest) -> HttpResponse:
    return render(request, "analysis/index.html", {"count": selectors.visible_campaigns(request=request).count()})


@login_required
def compare(request: HttpRequest) -> HttpResponse:
    picks, problems = forms.picks(request.META.get("QUERY_STRING", ""))
    policy = forms.policy(request.GET, problems)
    statistic = forms.statistic(request.GET, problems)
    sets = selectors.compare_sets(request=request, picks=picks)
    tables, result = [], None
    if len(sets) >= 2:
        # the page and its exports show each cell's value, stdev and n: no median for a comparison by mean
        result = campaign_selectors.compare(sets=sets, policy=policy, statistic=statistic, every_statistic=False)
        rows, table = reports.compare_report(result)
        tables.append(table)
    download = exports.export(request, name="compare", tables=tables)
    if isinstance(download, HttpResponse):  # an export: none of the page's pickers
        return download
    context = _base(request, list(dict.fromkeys(c for _, c, _ in sets)), [str(p) for p in problems])
    picked = {f"{p.id}:{p.point}" for p in picks if p.kind == "point"}
    points = selectors.point_choices(campaign_ids=context["selected"])
    groups = [(c, [{**p, "value": f"{c.pk}:{p['point']}", "checked": f"{c.pk}:{p['point']}" in picked}
                   for p in points[c.pk]]) for c in context["campaigns"]]  # fmt: skip
    context.update(sets=sets, policy=policy, rows=[], columns=[], point_groups=groups, statistics=STATISTICS,
                   stat=statistic or (sets[0][1].statistic if sets else "mean"), stat_asked=statistic)  # fmt: skip
    if result is not None:
        context.update(rows=rows, columns=result["columns"], differences=selectors.set_differences(sets))
    return _render(request, "analysis/compare.html", context, name="compare", tables=tables)


@login_required
def scaling(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    campaigns = _picked(request, errors)
    context = _base(request, campaigns, errors)
    metrics = selectors.metric_names(campaign_ids=context["selected"])
    metric = _choice(request.GET, "metric", metrics, SCALING_METRICS, errors, "metric")
    where = forms.where(request.GET, errors)
    own = campaigns[0].statistic if campaigns else "mean"  # the first campaign's, unless the view overrides it
    statistic = _choice(request.GET, "stat", selectors.STATISTICS, (own,), errors, "statistic") or own
    stats = reports.scaling_stats(campaigns=campaigns, metric=metric, where=where) if campaigns and metric else []
    x_choices, x = _scaling_x(request, stats, campaigns, context)
    reference = _choice(request.GET, "reference", calculations.REFERENCES, ("smallest",), errors, "reference")
    context.update(metrics=metrics, metric=metric, x_choices=x_choices, x=x, where=where, stat=statistic,
                   stat_own=own, reference=reference or "smallest", statistics=selectors.STATISTICS,
                   references=calculations.REFERENCES)  # fmt: skip
    if _is_htmx(request):  # campaigns ticked: their metrics and axes
        return render(request, "analysis/_scaling_options.html", context)
    figure, tables = None, []
    if campaigns and metric:
        figure, table = reports.scaling_report(campaigns=campaigns, stats=stats, metric=metric,
                                               x=x or selectors.X_HOSTS, statistic=statistic,
                                               reference=reference or "smallest")  # fmt: skip
        table.empty = _empty_text(stats, metric, x)
        tables.append(table)
    return _render(request, "analysis/scaling.html", context, name="scaling", tables=tables, figure=figure)


@login_required
def sweep(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    campaigns = _picked(request, errors)
    context = _base(request, campaigns, errors)
    ids = context["selected"]
    metrics = selectors.metric_names(campaign_ids=ids, aggregate_only=False)
    metric = _choice(request.GET, "metric", metrics, SWEEP_METRICS, errors, "metric")
    labels = selectors.label_keys(campaign_ids=ids, metric=metric) if metric else []
    x_choices = sorted({a for c in campaigns for a, _ in c.matrix} | set(labels))
    x = _choice(request.GET, "x", x_choices, SWEEP_X, errors, "x axis")
    hosts = _choice(request.GET, "hosts", HOSTS, ("aggregate",), errors, "hosts") or "aggregate"
    log = _choice(request.GET, "log", LOG, ("auto",), errors, "log") or "auto"
    where = forms.where(request.GET, errors)
    own = campaigns[0].statistic if campaigns else "mean"  # the first campaign's, unless the view overrides it
    statistic = _choice(request.GET, "stat", selectors.STATISTICS, (own,), errors, "statistic") or own
    context.update(metrics=metrics, metric=metric, x_choices=x_choices, x=x, hosts=hosts, host_choices=HOSTS,
                   log=log, log_choices=LOG, where=where, stat=statistic, stat_own=own,
                   statistics=selectors.STATISTICS)  # fmt: skip
    if _is_htmx(request):  # campaigns ticked: their metrics and axes
        return render(request, "analysis/_sweep_options.html", context)
    figure, tables = None, []
    if campaigns and metric and x:
        figure, table = reports.sweep_report(campaigns=campaigns, metric=metric, x=x, hosts=hosts, log=log,
                                             where=where, statistic=statistic)  # fmt: skip
        table.empty = (
            f"No point of the chosen campaigns has both {metric} and a numeric {x}: pick another metric or axis."
        )
        tables.append(table)
    return _render(request, "analysis/sweep.html", context, name="sweep", tables=tables, figure=figure)


@login_required
def storage(request: HttpRequest) -> HttpResponse:
    errors: list[str] = []
    campaigns = _picked(request, errors)[:1]
    context = _base(request, campaigns, errors)
    measured = next(iter(_picked(request, errors, "measured")), None)
    storages = list(selectors.storage_choices(request=request))
    storage_ids, bad = forms.ids(request.GET, "storage")
    errors += bad
    storage = selectors.storage_by_id(request=request, pk=storage_ids[0]) if storage_ids else None
    context.update(storages=storages, measured=measured, storage=storage,
                   storage_campaigns=selectors.visible_campaigns(request=request).filter(
                       kind__in=list(selectors.STORAGE_METRICS)).order_by("-created_at")[:100])  # fmt: skip
    campaign = campaigns[0] if campaigns else None
    metrics = selectors.metric_names(campaign_ids=context["selected"])
    metric = _choice(request.GET, "metric", metrics, ("images_per_sec",), errors, "metric")
    stats = reports.scaling_stats(campaigns=campaigns, metric=metric, where={}) if campaign and metric else []
    x_choices, x = _scaling_x(request, stats, campaigns, context)
    record = forms.positive_number(request.GET, "record_size", "the mean record size", errors)
    inputs = reports.StorageInputs(
        record_size_bytes=record or (selectors.record_size_default(campaign) if campaign else None),
        record_size_entered=record is not None,
        storage=storage or (campaign.storage if campaign else None),
        measured=measured,
        per_gpu_mbps=forms.positive_number(request.GET, "per_gpu", "MB/s per GPU", errors),
        per_node_mbps=forms.positive_number(request.GET, "per_node", "MB/s per storage node", errors),
        gpus=forms.whole_number(request.GET, "gpus", "the number of GPUs", errors, low=1, high=1_000_000),
    )
    report = reports.storage_report(campaign=campaign, stats=stats, metric=metric, x=x, inputs=inputs)
    report.demand.empty = _empty_text(stats, metric, x)
    context.update(metrics=metrics, metric=metric, x=report.x, x_choices=x_choices, inputs=inputs, report=report)
    if _is_htmx(request):  # a campaign picked: its metrics and axes
        return render(request, "analysis/_storage_options.html", context)
    tables = (
        [report.demand, report.sizing_table, report.reference] if campaign else [report.sizing_table, report.reference]
    )
    figure = report.figure if campaign else None
    return _render(request, "analysis/storage.html", context, name="storage-demand", tables=tables, figure=figure)


def _threshold(
    request: HttpRequest, errors: list[str], *, key: str = "threshold", default: float = fleet.DEFAULT_THRESHOLD
) -> float:
    raw = request.GET.get(key)
    try:
        return fleet.parse_threshold(raw) if raw else default
    except ParamError as exc:
        errors.append(f"{key}: {exc}")
        return default


@login_required
def suite_list(request: HttpRequest) -> HttpResponse:
    """The health suites, each with a form that launches it on nodes (one campaign per step)."""
    errors: list[str] = []
    teams = list(user_teams(user=request.user))
    if request.method == "POST":
        try:
            team = _chosen_team(request, teams)
            created = suites.suite_launch(
                slug=request.POST.get("suite", ""), nodes=_words(request.POST.get("nodes", "")),
                name=request.POST.get("name", "").strip(), steps=request.POST.getlist("steps"), owner=request.user,
                team=team, maintenance=request.POST.get("maintenance") == "on",
            )  # fmt: skip
            return redirect("analysis:suite-run", name=created[0].suite_run_name)
        except (ApplicationError, PermissionDenied) as exc:
            errors.append(str(exc))
    context = {"errors": errors, "suites": suites.suite_list(), "teams": teams, "form": request.POST}
    return render(request, "analysis/suites.html", context, status=400 if errors else 200)


def _chosen_team(request: HttpRequest, teams: list[Any]) -> Any:
    """The team picked in the form (one of the user's), else the scope's: the user's only team."""
    picked = request.POST.get("team", "")
    if picked:
        team = next((t for t in teams if str(t.pk) == picked), None)
        if team is None:
            raise ParamError("team", "not one of your teams")
        return team
    return scope_for(request).team


def _words(text: str) -> list[str]:
    return [w for w in text.replace(",", " ").split() if w]


@login_required
def suite_run_page(request: HttpRequest, name: str) -> HttpResponse:
    """A health suite run: every node healthy, suspect or failed, with reasons and evidence."""
    team = selectors.suite_run_team(request=request, name=name)
    errors: list[str] = []
    threshold = _threshold(request, errors)
    suspect = _threshold(request, errors, key="suspect_threshold", default=health.DEFAULT_SUSPECT_THRESHOLD)
    outcome = health.suite_run_outcome(name=name, team=team, threshold=threshold, suspect_threshold=suspect)
    context = {"errors": errors, "outcome": outcome, "counts": outcome.counts()}
    if request.headers.get("HX-Request"):  # the live part alone, polled while a step runs
        return render(request, "analysis/_suite_run_live.html", context)
    return _render(request, "analysis/suite_run.html", context, name=f"{name}-suite", tables=[])


@login_required
def fleet_page(request: HttpRequest, pk: int) -> HttpResponse:
    """Node x metric for one campaign, every cell against the fleet's median at its point; outliers named."""
    campaign = selectors.campaign_by_id(request=request, pk=pk)
    errors: list[str] = []
    threshold = _threshold(request, errors)
    data = selectors.campaign_fleet_data(campaign=campaign)
    view = fleet.fleet_view_by_column(data.by_column, threshold=threshold)
    devices = fleet.device_views(data.devices, groups=data.groups, threshold=threshold)
    pages = max(1, -(-len(view.nodes) // reports.FLEET_ROWS))
    page = _choice(request.GET, "page", [str(p) for p in range(1, pages + 1)], ("1",), errors, "page") or "1"
    context = {"errors": errors, "campaign": campaign, "view": view, "threshold": threshold, "page": int(page),
               "pages": range(1, pages + 1), "rows": reports.fleet_rows(view, page=int(page)),
               "findings": reports.fleet_findings(view), "devices": reports.device_sections(devices)}  # fmt: skip
    if request.GET.get("format"):  # the exports: every cell, not one page
        return _render(request, "analysis/fleet.html", context, name=f"{campaign.name}-fleet",
                       tables=reports.fleet_tables(view) + reports.device_tables(devices))  # fmt: skip
    return _render(request, "analysis/fleet.html", context, name=f"{campaign.name}-fleet", tables=[])


@login_required
def links_page(request: HttpRequest, pk: int) -> HttpResponse:
    """The N x N matrix of a pairwise campaign (iperf3 sender x receiver, perftest client x server, nccl-tests and
    torch_dist pairs), with outlier nodes and bad links named."""
    campaign = selectors.campaign_by_id(request=request, pk=pk)
    errors: list[str] = []
    threshold = _threshold(request, errors)
    pair_runs = selectors.campaign_pair_runs(campaign=campaign)
    points = pair_runs.points
    point = _choice(request.GET, "point", [str(p) for p in points], (), errors, "point")
    links = selectors.pair_links(pair_runs, point=int(point) if point else None)
    matrix = selectors.link_matrix(links, threshold=threshold)
    context = {"errors": errors, "campaign": campaign, "matrix": matrix, "threshold": threshold,
               "points": points, "point": point, "grid": reports.link_grid(matrix),
               "findings": reports.link_findings(matrix),
               "localisation": selectors.campaign_localisation(campaign=campaign)}  # fmt: skip
    return _render(request, "analysis/links.html", context, name=f"{campaign.name}-links",
                   tables=reports.link_tables(matrix))  # fmt: skip


@login_required
def node_history(request: HttpRequest, node: str) -> HttpResponse:
    """A node's results over its last N campaigns beside its peers', so a slow decline shows."""
    errors: list[str] = []
    metrics = selectors.node_metric_names(request=request, node=node)
    metric = _choice(request.GET, "metric", metrics, SWEEP_METRICS, errors, "metric")
    low, high = selectors.HISTORY_CAMPAIGNS
    last = forms.whole_number(request.GET, "last", "the number of campaigns", errors, low=low, high=high) or 10
    history = selectors.node_history(request=request, node=node, metric=metric, last=last) if metric else []
    table = reports.history_table(node, metric or "", history)
    context = {"errors": errors, "node": node, "metrics": metrics, "metric": metric, "last": last, "table": table}
    return _render(request, "analysis/node_history.html", context, name=f"{node}-history", tables=[table])
