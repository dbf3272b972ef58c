"""Reads used by views, the API and management commands."""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Avg, Count, F, Min, Prefetch, Q, QuerySet

from campaigns import planning
from campaigns.models import RUN_TERMINAL, Campaign, Result, Run, RunStatus
from campaigns.plan import build_commands, build_layout, display_command, host_context, remote_root, run_host_infos
from campaigns.verdicts import sample_stdev
from common import numbers
from inventory.drift import config_as_definition
from plugins.benchmarks.base import ParamError, get_benchmark


def preview_home(node: Any) -> str:
    """The node's home directory as a worker last found it (runners record it at every run) or as its facts say;
    else the usual one, until either has reached the host."""
    user = node.login_user
    return node.facts.get("home") or ("/root" if user == "root" else f"/home/{user}")


def campaign_list() -> QuerySet[Campaign]:
    return Campaign.objects.annotate(
        run_total=Count("runs"),
        run_done=Count("runs", filter=Q(runs__status__in=RUN_TERMINAL)),
        run_failed=Count("runs", filter=Q(runs__status__in=[RunStatus.FAILED, RunStatus.TIMED_OUT])),
    ).order_by("-created_at")


def campaign_progress(*, campaign: Campaign) -> dict[str, Any]:
    return progress_of(dict(campaign.runs.values_list("status").annotate(n=Count("id"))))


def progress_of(counts: dict[str, int]) -> dict[str, Any]:
    """Runs done of all, from the number of runs in each status."""
    total = sum(counts.values())
    done = sum(n for s, n in counts.items() if s in RUN_TERMINAL)
    return {"total": total, "done": done, "by_status": counts, "percent": round(100 * done / total) if total else 0}


def campaign_runs(*, campaign: Campaign) -> QuerySet[Run]:
    return campaign.runs.order_by("sequence").prefetch_related(
        Prefetch("results", queryset=Result.objects.filter(host="", labels={}).order_by("name"), to_attr="aggregates")
    )


RUN_CELL_FIELDS = ("pk", "campaign_id", "sequence", "point", "params", "repetition", "is_warmup", "attempt",
                   "status", "started_at", "finished_at")  # fmt: skip


def campaign_run_cells(*, campaign: Campaign) -> list[Run]:
    """Every run of the campaign without its results: enough for the grid, the ETA and the active run."""
    return list(campaign.runs.order_by("sequence").only(*RUN_CELL_FIELDS))


def run_details() -> QuerySet[Run]:
    """Runs with what their page shows (campaign, hosts, results)."""
    return Run.objects.select_related("campaign").prefetch_related("hosts", "results")


def campaign_spec(*, campaign: Campaign) -> dict[str, Any]:
    """The campaign's definition in the YAML format (what `campaign export` writes)."""
    data: dict[str, Any] = {"name": campaign.name}
    if campaign.description:
        data["description"] = campaign.description
    data["kind"] = campaign.kind
    nodes = [n.name for n in campaign.nodes.all()]
    tags = [t.name for t in campaign.node_tags.all()]
    if nodes:
        data["nodes"] = nodes
    if tags:
        data["node_tags"] = tags
    if campaign.storage:
        data["storage"] = campaign.storage.name
    data.update(
        repetitions=campaign.repetitions,
        warmup_runs=campaign.warmup_runs,
        cache={"flush_clients": campaign.flush_clients, "flush_storage": campaign.flush_storage},
        timeout=campaign.run_timeout_s,
        fixed=dict(campaign.fixed),
        matrix={name: list(values) for name, values in campaign.matrix},
    )
    if campaign.env:
        data["env"] = dict(campaign.env)
    if campaign.mounts:
        data["mounts"] = dict(campaign.mounts)
    if campaign.container:
        data["container"] = dict(campaign.container)
    if campaign.launcher:
        data["launcher"] = dict(campaign.launcher)
    if campaign.telemetry:
        data["telemetry"] = dict(campaign.telemetry)
    for key in ("zip", "exclude", "overrides", "derived"):
        if campaign.rules.get(key):
            data[key] = campaign.rules[key]
    if campaign.rules.get("drift"):
        data["drift"] = config_as_definition(campaign.rules["drift"])
    if campaign.family:
        data["family"] = campaign.family
    if campaign.verdict:
        data["verdict"] = dict(campaign.verdict)
    if campaign.statistic != "mean":
        data["statistic"] = campaign.statistic
    return data


def _point_commands(
    campaign: Campaign, benchmark: Any, params: dict[str, Any], nodes: list[Any]
) -> list[dict[str, Any]]:
    """The exact commands of one matrix point on each of its hosts, built as a run of it would build them."""
    placeholder = Run(campaign=campaign, pk=0, params=params)  # host_context reads the point's env.NAME parameters
    run_nodes = planning.nodes_for(params, nodes)
    infos = run_host_infos(placeholder, run_nodes)
    hosts = []
    for i, node in enumerate(run_nodes):
        root = remote_root(preview_home(node))  # the runs' root: runners.remote.remote_root
        ctx = host_context(placeholder, node_name=node.name, index=i, root=root, hosts=infos, dir_name="run-ID")
        main, service = build_commands(placeholder, benchmark, ctx)
        layout = build_layout(placeholder, benchmark, ctx)
        hosts.append(
            {
                "host": node.name,
                "address": node.address,
                # as runners.prepare runs it: before the cache flush, with its files beside the command's
                "layout": display_command(ctx.run_dir, layout.argv, {**ctx.env, **layout.env}) if layout else "",
                "command": display_command(ctx.run_dir, main.argv, main.env) if main else "",
                "files": main.files if main else {},
                "service": display_command(f"{ctx.run_dir}/service", service.argv, service.env) if service else "",
            }
        )
    if run_nodes and not any(h["command"] for h in hosts):
        raise ParamError("kind", f"{benchmark.kind} builds no command for any host of this point")
    return hosts


def campaign_build_check(*, campaign: Campaign, nodes: list[Any] | None = None) -> None:
    """Build every matrix point's commands on its hosts, as its runs will: ParamError names the first refusal.

    campaign_apply calls it, so that what apply accepts is what the plug-in builds (a refusal found only when a
    run starts, or when its output is collected, would throw the run away)."""
    from campaigns.services import campaign_target_nodes

    benchmark = get_benchmark(campaign.kind)
    nodes = campaign_target_nodes(campaign=campaign) if nodes is None else nodes
    for params in planning.expand(campaign.matrix, campaign.fixed, campaign.rules):
        _point_commands(campaign, benchmark, params, nodes)


def campaign_preview(*, campaign: Campaign, max_points: int = 50, nodes: list[Any] | None = None) -> dict[str, Any]:
    """How many runs the campaign expands to and the exact command of each matrix point on each host (``nodes``:
    its target nodes, for a definition not saved yet)."""
    from campaigns.services import campaign_target_nodes

    benchmark = get_benchmark(campaign.kind)
    nodes = campaign_target_nodes(campaign=campaign) if nodes is None else nodes
    points = []
    for index, params in enumerate(planning.expand(campaign.matrix, campaign.fixed, campaign.rules)):
        if index >= max_points:
            break
        points.append({"point": index, "params": params, "hosts": _point_commands(campaign, benchmark, params, nodes)})
    _explain_helpers(points)
    return {
        "points": planning.point_count(campaign.matrix, campaign.fixed, campaign.rules),
        "runs": planning.run_count(
            campaign.matrix,
            campaign.fixed,
            campaign.rules,
            repetitions=campaign.repetitions,
            warmup_runs=campaign.warmup_runs,
        ),
        "repetitions": campaign.repetitions,
        "warmup_runs": campaign.warmup_runs,
        "nodes": [n.name for n in nodes],
        "flush": {"clients": campaign.flush_clients, "storage": campaign.flush_storage},
        "uses_mpi": benchmark.uses_mpi,
        "kind": campaign.kind,
        "fixed": dict(campaign.fixed),
        "shown": points,
        "drift": _drift_preview(campaign, nodes),
    }


def _drift_preview(campaign: Campaign, nodes: list[Any]) -> dict[str, Any] | None:
    """The drift gate's findings on the facts as stored (a launch collects stale ones again first)."""
    from campaigns.drift import campaign_drift_check

    report = campaign_drift_check(campaign=campaign, nodes=list(nodes), refresh=False)
    return None if report is None else {**report.as_dict(), "messages": report.messages}


def _explain_helpers(points: list[dict[str, Any]]) -> None:
    """For the preview pages: each host's real commands (the ``argv`` lists of a helper's JSON plan, such as the
    iperf3 servers and clients the iperf helper starts) as ``planned``, and its files as ``helper_files``, each
    file's text given once in the whole preview and named "the same as" where it repeats."""
    seen: dict[tuple[str, str], str] = {}
    for point in points:
        for host in point["hosts"]:
            planned, helpers = [], []
            for name, content in host["files"].items():
                planned += _planned_argvs(content)
                where = f"point {point['point']} on {host['host']}"
                first = seen.setdefault((name, content), where)
                helpers.append({"name": name, "content": content if first == where else "", "same_as": first})
            host["planned"], host["helper_files"] = planned, helpers


def _planned_argvs(content: str) -> list[str]:
    try:
        plan = json.loads(content)
    except ValueError:
        return []
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            argv = node.get("argv")
            if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
                found.append(shlex.join(argv))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(plan)
    return found


def describe(values: list[float]) -> dict[str, float | int | None]:
    n = len(values)
    mean = statistics.fmean(values)
    stdev = sample_stdev(values)
    return {
        "n": n,
        "mean": mean,
        "median": statistics.median(values),
        "stdev": stdev,
        "min": min(values),
        "max": max(values),
        "cv": (stdev / mean) if mean else None,
    }


def _compare_order(rows: Collection[tuple[str, str]]) -> list[tuple[str, str]]:
    """Compare rows by their point's parameters as numbers (1, 4, 16; 4k, 64k, 1m), then by metric (each point's
    key made once, not once per metric)."""
    keys: dict[str, tuple[Any, ...]] = {}
    for params, _ in rows:
        if params not in keys:
            keys[params] = numbers.params_sort_key(json.loads(params) if params else {})
    return sorted(rows, key=lambda row: (keys[row[0]], row[1]))


def campaign_summary(*, campaign: Campaign) -> list[dict[str, Any]]:
    """Per matrix point and aggregate metric: statistics over the succeeded repetitions (warm-ups excluded), and
    ``value``, the one the campaign sums its points up by (``statistic``: its mean or median)."""
    from campaigns import baselines
    from campaigns.baselines import metric_label

    measured = campaign.runs.filter(status=RunStatus.SUCCEEDED, is_warmup=False)
    params: dict[int, dict[str, Any]] = {}
    # A point's parameters are the same in each of its runs: read them from its first run only.
    firsts = measured.values("point").annotate(first=Min("sequence")).values("first")
    for point, run_params in measured.filter(sequence__in=firsts).values_list("point", "params"):
        params[point] = run_params
    if baselines.summaries_in_sql():  # its stored summaries: one row per point and metric, not one per repetition
        found = [({"point": point, "params": params[point], "metric": metric, "unit": unit}, stats)
                 for _, point, _, metric, unit, stats in baselines.stored_aggregated(campaign_ids=[campaign.pk])
                 if point in params]  # fmt: skip
        return [summed_up(_described(stats), campaign.statistic, meta)
                for meta, stats in sorted(found, key=lambda row: (row[0]["point"], row[0]["metric"]))]  # fmt: skip
    rows = (
        Result.objects.filter(run__in=measured, host="")
        .exclude(labels__has_key="job")  # aggregates across hosts, not per-job rows
        .values_list("run__point", "name", "labels", "unit", "value")
        .order_by("run__point", "name")
    )
    grouped: dict[tuple[int, str], dict[str, Any]] = {}
    values: dict[tuple[int, str], list[float]] = defaultdict(list)
    for point, name, labels, unit, value in rows:
        if point not in params:  # a run that succeeded between the two queries: next time
            continue
        # A labelled aggregate (a training epoch's rate, one of mdtest's tests, a direction) is its own row: pooled
        # with the unlabelled one it would change the headline's mean.
        metric = metric_label(name, labels or {})
        grouped.setdefault((point, metric), {"point": point, "params": params[point], "metric": metric, "unit": unit})
        values[(point, metric)].append(value)
    return [summed_up(describe(values[key]), campaign.statistic, meta)
            for key, meta in sorted(grouped.items(), key=lambda kv: kv[0])]  # fmt: skip


def summed_up(stats: dict[str, Any], statistic: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """A summary row or compared cell: ``meta``, the statistic it is summed up by and that statistic's value, then
    every statistic (``describe``)."""
    return {**(meta or {}), "statistic": statistic, "value": stats[statistic], **stats}


def compare(
    *,
    sets: list[tuple[str, Campaign, list[int] | None]],
    policy: Any = None,
    statistic: str | None = None,
    in_sql: bool | None = None,
    every_statistic: bool = True,
) -> dict[str, Any]:
    """Side by side: each set (a label, its campaign, and its runs or None for all) against the first one.

    Whole campaigns are matched point by point (same parameters); single runs or points, metric by metric.
    Every change is judged like a verdict (campaigns.verdicts), so a change within the spread of the
    repetitions reads "no significant change" instead of a win or a loss. Each cell is summed up by ``statistic``
    (the view's choice), else by the reference campaign's: the statistic its own pages and verdicts use. The
    statistics are aggregated in SQL where the database can (``compared_summaries``; ``in_sql`` forces a path).
    Not ``every_statistic``: a reader of the cells' value, stdev and n only (the /compare/ page and its exports),
    for whom a comparison of chosen runs or points by mean leaves the median out of the SQL (None there; whole
    campaigns read it with the rest of their stored summaries).
    """
    from campaigns import baselines, comparability, verdicts

    policy = dataclasses.replace(policy or verdicts.Policy(), statistic=statistic or sets[0][1].statistic)
    by_point = all(runs is None for _, _, runs in sets)
    columns: list[dict[str, Any]] = [
        {"label": label, "campaign": campaign.pk, "campaign_name": campaign.name, "runs": runs}
        for label, campaign, runs in sets
    ]
    median = every_statistic or policy.statistic == "median"
    tables = compared_summaries(sets=sets, by_point=by_point, in_sql=in_sql, median=median)
    first = sets[0][1]
    configs = comparability.configurations(list({c.pk: c for _, c, _ in sets}.values()))
    for column, (_, campaign, _) in zip(columns, sets, strict=True):
        # what differs from the reference's configuration: a change across different configurations is no verdict
        column["differences"] = comparability.between(configs[first.pk], configs[campaign.pk])
    rows = []
    reference = tables[0]
    directions: dict[tuple[str, str], bool] = {}  # per metric and unit: the plug-in's word, looked up once
    for row in _compare_order({k for t in tables for k in t}):
        present = [t.get(row) for t in tables]
        first = next(s for s in present if s is not None)
        if (row[1], first.unit) not in directions:
            directions[row[1], first.unit] = baselines.higher_is_better(sets[0][1].kind, row[1], first.unit)
        better_up = directions[row[1], first.unit]
        base = reference.get(row)
        cells: list[dict[str, Any] | None] = []
        changes: list[dict[str, Any] | None] = []
        for i, found in enumerate(present):
            cells.append(_cell(found.stats, policy.statistic) if found else None)
            if i == 0:
                changes.append(None)
                continue
            j = verdicts.judge_stats(
                baseline=base.stats if base else None, candidate=found.stats if found else None,
                higher_is_better=better_up, policy=policy, metric=row[1], unit=first.unit,
            )  # fmt: skip
            change = {"change_pct": j.change_pct, "outcome": j.outcome, "p_value": j.p_value, "reason": j.reason}
            if columns[i]["differences"]:
                change.update(outcome=verdicts.INCONCLUSIVE, reason="not comparable, the configurations differ: "
                              + "; ".join(columns[i]["differences"]))  # fmt: skip
            changes.append(change)
        rows.append({"params": first.params if by_point else {}, "metric": row[1], "unit": first.unit,
                     "higher_is_better": better_up, "values": cells, "changes": changes})  # fmt: skip
    return {"by_point": by_point, "statistic": policy.statistic,
            "policy": {"threshold_pct": policy.threshold_pct, "alpha": policy.alpha, "statistic": policy.statistic},
            "columns": columns, "rows": rows}  # fmt: skip


def compared_summaries(
    *, sets: list[tuple[str, Campaign, list[int] | None]], by_point: bool, in_sql: bool | None = None,
    median: bool = True,
) -> list[dict[tuple[str, str], Any]]:  # fmt: skip
    """Per set, its cells ((point parameters or "", metric) -> baselines.Summary): whole campaigns point by point,
    chosen runs or points pooled metric by metric.

    Aggregated in SQL where the database can (``in_sql`` None: baselines.summaries_in_sql), one row per cell (whole
    campaigns: their stored summaries); else, or where SQL cannot pool as asked, from every repetition in Python.
    Both give the same statistics (the SQL of chosen runs leaves the median out, None, when not asked for
    ``median``).
    """
    from campaigns import baselines

    campaigns = list({c.pk: c for _, c, _ in sets}.values())
    if in_sql is not False and (in_sql or baselines.summaries_in_sql()):
        if by_point:
            together = baselines.campaigns_point_summaries(campaigns=campaigns, median=median)
            if together is not None:
                return [{(k.params, k.metric): v for k, v in together.get(c.pk, {}).items()} for _, c, _ in sets]
        else:
            pooled = [baselines.campaigns_point_summaries(campaigns=[c], runs=runs, pooled=True, median=median)
                      for _, c, runs in sets]  # fmt: skip
            if all(p is not None for p in pooled):
                return [{("", k.metric): v for k, v in (p or {}).get(c.pk, {}).items()}
                        for p, (_, c, _) in zip(pooled, sets, strict=True)]  # fmt: skip
    return _compared_in_python(sets=sets, by_point=by_point, campaigns=campaigns)


def _compared_in_python(*, sets: list[tuple[str, Campaign, list[int] | None]], by_point: bool,
                        campaigns: list[Campaign]) -> list[dict[tuple[str, str], Any]]:  # fmt: skip
    from campaigns import baselines, verdicts

    # Whole campaigns are read together, in one pass; chosen runs or points set by set.
    together = baselines.campaigns_point_values(campaigns=campaigns) if by_point else {}
    tables = []
    for _, campaign, runs in sets:
        pooled: dict[tuple[str, str], baselines.Series] = {}
        values = together.get(campaign.pk, {}) if by_point else baselines.point_values(campaign=campaign, runs=runs)
        for key, series in values.items():
            cell = (key.params if by_point else "", key.metric)
            if cell in pooled:  # several points folded into one column: pool their repetitions
                pooled[cell].values.extend(series.values)
            else:
                pooled[cell] = baselines.Series(series.point, series.params, series.unit, list(series.values))
        table = {}
        for cell, series in pooled.items():
            stats = verdicts.stats_of(series.values)
            if stats is not None:
                table[cell] = baselines.Summary(series.point, series.params, series.unit, stats)
        tables.append(table)
    return tables


def _cell(stats: Any, statistic: str) -> dict[str, Any]:
    """``summed_up(_described(stats), statistic)`` in one dict: a comparison of two large campaigns has thousands."""
    return {"statistic": statistic, "value": stats.median if statistic == "median" else stats.mean, "n": stats.n,
            "mean": stats.mean, "median": stats.median, "stdev": stats.stdev, "min": stats.min, "max": stats.max,
            "cv": (stats.stdev / stats.mean) if stats.mean else None}  # fmt: skip


def _described(stats: Any) -> dict[str, Any]:
    """A compared cell's statistics, as ``describe`` words them."""
    return {"n": stats.n, "mean": stats.mean, "median": stats.median, "stdev": stats.stdev, "min": stats.min,
            "max": stats.max, "cv": (stats.stdev / stats.mean) if stats.mean else None}  # fmt: skip


# --- pages: dashboard, live campaign page, builder ---------------------------------------------------


def with_live_counts(campaigns: QuerySet[Campaign]) -> QuerySet[Campaign]:
    """``campaign_list`` plus the mean duration of the finished runs (one query for a whole list, for ETAs)."""
    finished = Q(runs__started_at__isnull=False, runs__finished_at__isnull=False)
    return campaigns.annotate(run_mean=Avg(F("runs__finished_at") - F("runs__started_at"), filter=finished))


def eta_seconds(*, mean: timedelta | None, total: int, done: int) -> float | None:
    """Measured mean run duration x runs left; None before the first run has ended (nothing measured yet)."""
    if mean is None:
        return None
    return mean.total_seconds() * max(total - done, 0)


def campaign_eta(*, runs: list[Run], progress: dict[str, Any]) -> float | None:
    durations = [r.finished_at - r.started_at for r in runs if r.started_at and r.finished_at]
    mean = sum(durations, timedelta()) / len(durations) if durations else None
    return eta_seconds(mean=mean, total=progress["total"], done=progress["done"])


def campaign_grid(*, campaign: Campaign, runs: list[Run]) -> list[dict[str, Any]]:
    """The matrix as rows of run cells: one row per point (its matrix values), its runs in execution order
    (warm-ups, repetitions, then re-run attempts)."""
    axes = [name for name, _ in campaign.matrix]
    rows: dict[int, dict[str, Any]] = {}
    for run in runs:
        row = rows.setdefault(
            run.point, {"point": run.point, "params": {a: run.params.get(a) for a in axes}, "runs": []}
        )
        row["runs"].append(run)
    return [rows[p] for p in sorted(rows)]


def run_live_log(*, run: Run, lines: int = 40) -> dict[str, Any]:
    """The last ``lines`` lines of the output of a run's first main host: while the run is active, what its poll
    task last stored (``services.run_live_log_watch`` asks for it; ``at`` says when it was read); afterwards its
    whole stored output. Never touches the host."""
    rows = list(run.hosts.order_by("host"))
    hosts = [h for h in rows if h.command] or rows
    if not hosts:
        return {"host": "", "text": "", "error": "", "at": None}
    host = hosts[0]
    if run.is_terminal or not host.remote_dir:
        text = host.stdout + (f"\n{host.stderr}" if host.stderr else "")
        return {"host": host.host, "text": _last(text, lines), "error": "", "at": None}
    live = Run.objects.values_list("live_log", flat=True).get(pk=run.pk)
    text = live.get("stdout", "") + (f"\n{live['stderr']}" if live.get("stderr") else "")
    at = datetime.fromisoformat(live["at"]) if live.get("at") else None
    return {"host": live.get("host") or host.host, "text": _last(text, lines), "error": live.get("error", ""), "at": at}


def _last(text: str, lines: int) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def spec_preview(*, data: dict[str, Any], team: Any, owner: Any = None, max_points: int = 5) -> dict[str, Any]:
    """What ``campaign_apply(data=data, team=team)`` would create, previewed without writing anything: the same
    checks (campaign_definition_check) and the exact commands campaign_preview shows for a saved campaign.
    Raises what apply raises."""
    from campaigns.services import campaign_definition_check

    checked = campaign_definition_check(data=data, team=team, owner=owner)
    return campaign_preview(campaign=checked.campaign, max_points=max_points, nodes=checked.targets)


def unused_name(base: str, team: Any = None) -> str:
    """``base``, or ``base-2``, ``base-3``... : the first campaign name not taken yet in ``team`` (None: among shared
    campaigns). Names are unique per team; another team's names are never looked at."""
    taken = set(Campaign.objects.filter(name__startswith=base, team=team).values_list("name", flat=True))
    if base not in taken:
        return base
    return next(f"{base}-{i}" for i in range(2, len(taken) + 3) if f"{base}-{i}" not in taken)


def preset_spec(*, slug: str, suffix: str = "") -> dict[str, Any] | None:
    """One campaign of a preset as an editable definition, named and described as preset_instantiate would
    (nodes and storage left for the user to fill in); None for an unknown preset or part."""
    from campaigns.presets import preset_get

    preset = preset_get(slug)
    if preset is None:
        return None
    part = next((p for p in preset.campaigns if p.get("suffix", "") == suffix), None)
    if part is None:
        return None
    data = preset.definition(part, name=slug)
    data["name"] = unused_name(data["name"])
    data["nodes"] = []
    if "storage" in preset.needs:
        data["storage"] = ""
    return data


def clone_spec(*, campaign: Campaign) -> dict[str, Any]:
    """A previous campaign's definition under a new name, in its family (what campaign_clone creates)."""
    data = campaign_spec(campaign=campaign)
    data["name"] = unused_name(campaign.name, campaign.team)
    data.setdefault("family", campaign.family_name)
    return data


def run_start_summary(provenance: dict[str, Any]) -> dict[str, Any] | None:
    """How together a run's hosts started (the start barrier's record in provenance["start"]), with the times in human
    units; None for a run started without one (before it existed, or under Slurm)."""
    start = provenance.get("start") or {}
    if "attempt" not in start:
        return None
    spread = start.get("spread_s")
    attempts = start.get("attempts") or []
    return {
        "spread_s": spread,
        "spread": numbers.quantity(spread, "s") if spread is not None else "not recorded yet (read at collect)",
        "statistic": "max - min of the hosts' recorded start instants",
        "hosts": start.get("recorded", 0),
        "first_host": start.get("first_host", ""),
        "last_host": start.get("last_host", ""),
        "after_instant_s": start.get("after_instant_s"),
        "after_instant": numbers.quantity(start.get("after_instant_s") or 0.0, "s"),
        "margin_s": start.get("margin_s"),
        "margin": numbers.quantity(start.get("margin_s") or 0.0, "s"),
        "attempts": len(attempts),
        "late_attempts": sum(1 for a in attempts if a.get("late")),
    }
