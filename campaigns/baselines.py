"""Baselines and verdicts: which campaign a family is compared with, and the stored judgement of a campaign.

The decision rule itself lives in campaigns.verdicts (pure statistics); this module gathers the numbers (the
candidate's repetitions, the baseline's, and the family's history), stores the verdict with its method and
version, re-runs suspected regressions when the campaign asks for it, and calls the campaign's webhook.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Aggregate, Avg, Count, FloatField, Max, Min, Q, StdDev, TextField
from django.db.models.functions import Cast

from campaigns import comparability, dispatch, verdicts
from campaigns.models import (
    Baseline,
    Campaign,
    CampaignStatus,
    PointSummary,
    Result,
    Run,
    RunStatus,
    Verdict,
    VerdictOutcome,
)
from common.errors import ApplicationError, NotFound
from plugins.benchmarks.base import ParamError, get_benchmark

log = logging.getLogger(__name__)

HISTORY_CAMPAIGNS = 10  # earlier campaigns of the family used for the campaign-to-campaign spread
LOWER_IS_BETTER_UNITS = {"s", "ms", "us", "µs", "ns", "usec", "msec", "sec"}


class NoBaseline(NotFound):
    """The family has no baseline (and none was named)."""


class Key(NamedTuple):
    """One comparable number: a matrix point (by its parameters) and a metric (with its labels)."""

    params: str  # canonical JSON of the point's parameters
    metric: str


class Series(NamedTuple):
    point: int
    params: dict[str, Any]
    unit: str
    values: list[float]


def metric_label(name: str, labels: dict[str, Any]) -> str:
    return name + ("{" + ",".join(f"{k}={labels[k]}" for k in sorted(labels)) + "}" if labels else "")


def point_values(*, campaign: Campaign, runs: Iterable[int] | None = None) -> dict[Key, Series]:
    """The aggregate metrics of the campaign's succeeded repetitions (warm-ups left out), per point and metric.

    A point is known by the values of its matrix axes only; whether the two campaigns' configurations may be
    compared at all is campaigns.comparability's question (verdict_compute).
    """
    return campaigns_point_values(campaigns=[campaign], runs=runs).get(campaign.pk, {})


def campaigns_point_values(
    *, campaigns: list[Campaign], runs: Iterable[int] | None = None
) -> dict[int, dict[Key, Series]]:
    """``point_values`` of several campaigns in one query, by campaign id."""
    axes = {c.pk: [name for name, _ in c.matrix] for c in campaigns}
    measured = Run.objects.filter(campaign__in=list(axes), status=RunStatus.SUCCEEDED, is_warmup=False)
    if runs is not None:
        measured = measured.filter(pk__in=list(runs))
    # A point's axes are the same in each of its runs: read them once per point, not once per result row.
    points: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
    for campaign_id, point, params in measured.values_list("campaign_id", "point", "params"):
        if (campaign_id, point) not in points:
            point_params = {k: params[k] for k in axes[campaign_id] if k in params}
            points[campaign_id, point] = (json.dumps(point_params, sort_keys=True), point_params)
    rows = Result.objects.filter(run__in=measured, host="").exclude(labels__has_key="job")
    found: dict[int, dict[Key, Series]] = defaultdict(dict)
    # labels as text: most are {}, and decoding JSON for every row is what a large comparison would spend its time on
    for campaign_id, point, name, labels, unit, value in rows.values_list(
        "run__campaign_id", "run__point", "name", Cast("labels", TextField()), "unit", "value"
    ).order_by("run__point", "run__sequence"):
        if (campaign_id, point) not in points:  # a run that succeeded between the two queries: next time
            continue
        text, point_params = points[campaign_id, point]
        key = Key(text, metric_label(name, json.loads(labels) if labels not in ("{}", "") else {}))
        found[campaign_id].setdefault(key, Series(point, point_params, unit, [])).values.append(value)
    return found


class Median(Aggregate):
    """The exact median of a group's values: PostgreSQL's percentile_cont(0.5); on SQLite, which has no ordered-set
    aggregates, the one campaigns.apps registers on each connection (SQLiteMedian)."""

    function = "percentile_cont"
    template = "%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, function=SQLiteMedian.NAME, template="%(function)s(%(expressions)s)",
                           **extra)  # fmt: skip


class GroupMedian(Median):
    """``Median`` taken over the array of the group's values (percentile_cont(0.5) of its unnested elements): the
    groups can then be hashed instead of every row being sorted first, and each group's sort is a small one. With
    work_mem room for the arrays (``GROUP_MEDIAN_WORK_MEM``) this spends about a third less of PostgreSQL's time on
    two campaigns of 5,000 runs than the plain ordered-set aggregate (bench/compare_page.py)."""

    template = "(SELECT %(function)s(0.5) WITHIN GROUP (ORDER BY v) FROM unnest(array_agg(%(expressions)s)) AS v)"


GROUP_MEDIAN_WORK_MEM = "32MB"  # the hashed groups' arrays: 8 bytes a value (80,000 values: under 2 MB in fact)


class SQLiteMedian:
    """The median as an SQLite aggregate (``sqlite3.Connection.create_aggregate``): the mean of the two middle values
    of an even count, as percentile_cont(0.5) and statistics.median give it; NULLs left out, NULL for none."""

    NAME = "rackbench_median"

    def __init__(self) -> None:
        self.values: list[float] = []

    def step(self, value: float | None) -> None:
        if value is not None:
            self.values.append(value)

    def finalize(self) -> float | None:
        return statistics.median(self.values) if self.values else None


class Summary(NamedTuple):
    """A Series summed up: its repetitions' statistics instead of the repetitions themselves."""

    point: int
    params: dict[str, Any]
    unit: str
    stats: verdicts.Stats


def summaries_in_sql() -> bool:
    """Whether compare and the campaign statistics take a point's statistics from the database (its stored summaries,
    or chosen runs aggregated): PostgreSQL, with its exact median (percentile_cont) and the triggers that keep the
    summaries. SQLite, the embedded default, has neither (the median registered for it, SQLiteMedian, is a Python
    callback per row), so there they are computed in Python from the rows."""
    return connection.vendor == "postgresql"


def campaigns_point_summaries(
    *, campaigns: list[Campaign], runs: Iterable[int] | None = None, pooled: bool = False, median: bool = True
) -> dict[int, dict[Key, Summary]] | None:
    """What ``campaigns_point_values`` gives, summed up in SQL (count, avg, stddev_samp, min, max and the median,
    one row per campaign, point and metric instead of one per repetition); with ``pooled``, the points of each
    campaign pooled (key params ""), as a comparison of chosen runs pools them.

    Whole campaigns point by point are read from their stored summaries (``stored_point_summaries``); chosen runs,
    or pooled points, are aggregated from their results (without ``median``, the median is left out, None: it is
    most of that query's time).

    None where SQL cannot answer as the Python path would: a database without an exact median
    (``summaries_in_sql``), or two points of one campaign with the same axes (their repetitions pool, and medians do
    not add up)."""
    if not summaries_in_sql():
        return None
    if runs is None and not pooled:
        return stored_point_summaries(campaigns=campaigns)
    axes = {c.pk: [name for name, _ in c.matrix] for c in campaigns}
    measured = Run.objects.filter(campaign__in=list(axes), status=RunStatus.SUCCEEDED, is_warmup=False)
    if runs is not None:
        measured = measured.filter(pk__in=list(runs))
    # A point's axes are the same in each of its runs: read them from its first run only.
    firsts = measured.values("campaign_id", "point").annotate(first=Min("pk")).values("first")
    points: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
    for campaign_id, point, params in Run.objects.filter(pk__in=firsts).values_list("campaign_id", "point", "params"):
        point_params = {k: params[k] for k in axes[campaign_id] if k in params}
        points[campaign_id, point] = (json.dumps(point_params, sort_keys=True), point_params)
    if not pooled and len({(cid, text) for (cid, _), (text, _) in points.items()}) < len(points):
        return None
    found: dict[int, dict[Key, Summary]] = defaultdict(dict)
    of = Q(run__campaign_id__in=list(axes), run__status=RunStatus.SUCCEEDED, run__is_warmup=False)
    if runs is not None:
        of &= Q(run_id__in=list(runs))
    for campaign_id, point, metric, unit, stats in aggregated(of, by_point=not pooled, median=median):
        if not pooled and (campaign_id, point) not in points:  # a run that succeeded between the two queries
            continue
        text, point_params = ("", {}) if pooled else points[campaign_id, point]
        found[campaign_id][Key(text, metric)] = Summary(point, point_params, unit, stats)
    return found


def stored_point_summaries(*, campaigns: list[Campaign]) -> dict[int, dict[Key, Summary]] | None:
    """``campaigns_point_summaries`` of whole campaigns point by point, read from their stored summaries; None where
    two points of one campaign have the same axes (the Python path pools them)."""
    axes = {c.pk: [name for name, _ in c.matrix] for c in campaigns}
    points: dict[tuple[int, int], tuple[str, dict[str, Any]]] = {}
    found: dict[int, dict[Key, Summary]] = defaultdict(dict)
    for campaign_id, point, params, metric, unit, stats in stored_aggregated(campaign_ids=list(axes)):
        at = points.get((campaign_id, point))
        if at is None:
            run_params = json.loads(params)
            point_params = {k: run_params[k] for k in axes[campaign_id] if k in run_params}
            at = points[campaign_id, point] = (json.dumps(point_params, sort_keys=True), point_params)
        found[campaign_id][Key(at[0], metric)] = Summary(point, at[1], unit, stats)
    if len({(cid, text) for (cid, _), (text, _) in points.items()}) < len(points):
        return None
    return found


def stored_aggregated(*, campaign_ids: list[int]) -> Iterator[tuple[int, int, str, str, str, verdicts.Stats]]:
    """(campaign id, point, the parameters of the point's first counted run as JSON text, metric with its labels,
    unit, statistics) of each point and metric of the campaigns: what ``aggregated`` computes point by point,
    read from campaigns.models.PointSummary, which PostgreSQL keeps up to date as results and runs change (one row
    per point and metric, whatever the repetitions; PostgreSQL only)."""
    rows = PointSummary.objects.filter(campaign_id__in=campaign_ids).order_by()
    labelled: dict[tuple[str, str], str] = {}  # a campaign has a few metrics, each in every point: decoded once
    for campaign_id, point, params, name, labels, unit, n, mean, stdev, low, high, median in rows.values_list(
        "campaign_id", "point", Cast("params", TextField()), "name", "labels_text", "unit", "n", "mean", "stdev",
        "low", "high", "median",
    ):  # fmt: skip
        if labels == "{}":
            metric = name
        elif (metric := labelled.get((name, labels))) is None:
            metric = labelled[name, labels] = metric_label(name, json.loads(labels))
        yield campaign_id, point, params, metric, unit, summary_stats(n, mean, stdev, low, high, median)


def aggregated(
    runs: Q, *, by_point: bool = True, median: bool = True
) -> Iterator[tuple[int, int, str, str, verdicts.Stats]]:
    """(campaign id, point, metric with its labels, unit, statistics) of the aggregate results (across hosts, per-job
    rows left out) of the runs ``runs`` selects (a filter on Result: ``run__...``), per campaign, point (or, not
    ``by_point``, its first point for all of them) and metric, aggregated in SQL: one row per group, whatever the
    repetitions (PostgreSQL only). One join of results and runs; without ``median``, no median (None), and the
    database may hash the groups instead of sorting every row."""
    # the integers first: rows of different points are told apart by them, before any text is compared
    group = ["run__campaign_id"] + (["run__point"] if by_point else []) + ["name", "labels_text"]
    statistics = {"n": Count("id"), "mean": Avg("value"), "stdev": StdDev("value", sample=True), "low": Min("value"),
                  "high": Max("value"), "unit": Max("unit"), "first_point": Min("run__point")}  # fmt: skip
    if median:
        statistics["median"] = GroupMedian("value")
    query = (
        Result.objects.filter(runs, host="")
        .exclude(labels__has_key="job")
        .annotate(labels_text=Cast("labels", TextField()))
        .values(*group)
        .annotate(**statistics)
        .order_by()
    )
    if median and connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            # for this transaction only: with room for the arrays the planner hashes the groups
            cursor.execute("SELECT set_config('work_mem', %s, true)", [GROUP_MEDIAN_WORK_MEM])
            rows = list(query)
    else:
        rows = list(query)
    for r in rows:
        labels = r["labels_text"]
        metric = metric_label(r["name"], json.loads(labels) if labels not in ("{}", "") else {})
        point = r["run__point"] if by_point else r["first_point"]
        yield r["run__campaign_id"], point, metric, r["unit"], _sql_stats(r)


def _sql_stats(row: dict[str, Any]) -> verdicts.Stats:
    return summary_stats(row["n"], row["mean"], row["stdev"], row["low"], row["high"], row.get("median"))


def summary_stats(
    n: int, mean: float, stdev: float | None, low: float, high: float, median: float | None
) -> verdicts.Stats:
    """verdicts.Stats from SQL aggregates, as verdicts.stats_of gives them from the values: a stdev of 0 for one value
    or identical ones (stddev_samp is NULL for one), no cv for one value or a zero mean."""
    stdev = 0.0 if n < 2 or low == high or stdev is None else stdev
    cv = stdev / abs(mean) if n > 1 and mean != 0 else None
    return verdicts.Stats(n, mean, stdev, low, high, cv, median)


def cache_doubts(*, campaign: Campaign, runs: Iterable[int] | None = None) -> dict[str, list[str]]:
    """Per point (``Key.params``), the cache-discipline flags of its succeeded measured runs ("run 12: ...")."""
    axes = [name for name, _ in campaign.matrix]
    measured = Run.objects.filter(campaign=campaign, status=RunStatus.SUCCEEDED, is_warmup=False)
    if runs is not None:
        measured = measured.filter(pk__in=list(runs))
    found: dict[str, list[str]] = defaultdict(list)
    for pk, params, flags in measured.values_list("pk", "params", "provenance__cache__flags").order_by("sequence"):
        for flag in flags if isinstance(flags, list) else []:
            text = json.dumps({k: params[k] for k in axes if k in params}, sort_keys=True)
            found[text].append(f"run {pk}: {flag.get('message', flag)}")
    return found


def higher_is_better(kind: str, metric: str, unit: str) -> bool:
    """The plug-in's declared direction; for a metric it does not declare, time units mean lower is better."""
    try:
        spec = get_benchmark(kind).spec(metric.split("{", 1)[0])
    except ParamError:
        spec = None
    if spec is not None:
        return spec.higher_is_better
    return unit.strip().lower() not in LOWER_IS_BETTER_UNITS


# --- baselines ----------------------------------------------------------------------------------


class BaselineError(ApplicationError, ValueError):
    pass


def baseline_set(*, campaign: Campaign, runs: list[Run] | None = None, note: str = "", user: Any = None) -> Baseline:
    """Make ``campaign`` (or a chosen set of its succeeded runs) the baseline of its family, replacing the old."""
    if campaign.status not in (CampaignStatus.SUCCEEDED, CampaignStatus.FAILED):
        raise BaselineError(f"campaign {campaign.name} is {campaign.status}: only a finished one can be a baseline",
                            conflict=True)  # fmt: skip
    chosen = list(runs or [])
    wrong = [r.pk for r in chosen if r.campaign_id != campaign.pk or r.status != RunStatus.SUCCEEDED]
    if wrong:
        raise BaselineError(f"runs {wrong} are not succeeded runs of campaign {campaign.name}", field="runs")
    if not point_values(campaign=campaign, runs=[r.pk for r in chosen] if chosen else None):
        raise BaselineError(f"campaign {campaign.name} has no results to compare with", field="campaign")
    with transaction.atomic():
        Baseline.objects.filter(team=campaign.team, family=campaign.family_name, active=True).update(active=False)
        baseline = Baseline.objects.create(
            team=campaign.team, family=campaign.family_name, campaign=campaign, note=note, created_by=user
        )
        baseline.runs.set(chosen)
    return baseline


def baseline_for(*, campaign: Campaign) -> Baseline | None:
    """The active baseline of the campaign's family, unless it is the campaign itself."""
    baseline = (
        Baseline.objects.filter(team=campaign.team, family=campaign.family_name, active=True)
        .select_related("campaign")
        .first()
    )
    return None if baseline is None or baseline.campaign_id == campaign.pk else baseline


def _history(*, campaign: Campaign, exclude: list[int]) -> dict[Key, list[list[float]]]:
    """Per key, the repetitions of the family's earlier succeeded campaigns (most recent first)."""
    family = campaign.family_name
    earlier = Campaign.objects.filter(
        Q(family=family) | Q(family="", name=family), team=campaign.team, status=CampaignStatus.SUCCEEDED
    ).exclude(pk__in=[campaign.pk, *exclude])
    if campaign.launched_at:
        earlier = earlier.filter(finished_at__lt=campaign.launched_at)
    pasts = list(earlier.order_by("-finished_at")[:HISTORY_CAMPAIGNS])
    values = campaigns_point_values(campaigns=pasts)
    history: dict[Key, list[list[float]]] = defaultdict(list)
    for past in pasts:
        for key, series in values.get(past.pk, {}).items():
            history[key].append(series.values)
    return history


# --- verdicts -----------------------------------------------------------------------------------


def policy_for(campaign: Campaign, overrides: dict[str, Any] | None = None) -> verdicts.Policy:
    keys = {"threshold_pct", "alpha", "min_repetitions"}
    data = {k: v for k, v in campaign.verdict.items() if k in keys}
    data.update({k: v for k, v in (overrides or {}).items() if k in keys and v is not None})
    # The campaign's own statistic, the one its pages and exports show, unless this verdict asks for another.
    data["statistic"] = (overrides or {}).get("statistic") or campaign.statistic
    return verdicts.Policy.from_mapping(data)


def verdict_compute(
    *,
    campaign: Campaign,
    baseline_campaign: Campaign | None = None,
    baseline: Baseline | None = None,
    overrides: dict[str, Any] | None = None,
) -> Verdict:
    """Judge ``campaign`` against ``baseline_campaign``, else ``baseline``, else its family's baseline, and store
    the verdict.

    Raises NoBaseline when there is nothing to compare with, verdicts.PolicyError on a bad override, and
    BaselineError (a conflict) while the campaign has not finished.
    """
    if campaign.status not in (CampaignStatus.SUCCEEDED, CampaignStatus.FAILED):
        raise BaselineError(
            f"campaign {campaign.name} is {campaign.status}: judge it once it has finished", conflict=True
        )
    policy = policy_for(campaign, overrides)
    if baseline_campaign is None:
        baseline = baseline or baseline_for(campaign=campaign)
        if baseline is None:
            raise NoBaseline(f"no baseline for family {campaign.family_name}", reason="no-baseline")
        baseline_campaign = baseline.campaign
        chosen = list(baseline.runs.values_list("pk", flat=True)) or None
    else:
        baseline, chosen = None, None
    base = point_values(campaign=baseline_campaign, runs=chosen)
    cand = point_values(campaign=campaign)
    history = _history(campaign=campaign, exclude=[baseline_campaign.pk])
    wanted = set(campaign.verdict.get("metrics") or [])
    doubts = {
        "baseline": cache_doubts(campaign=baseline_campaign, runs=chosen),
        "candidate": cache_doubts(campaign=campaign),
    }
    items = []
    for b_key, c_key, pair in _judged_keys(campaign, baseline_campaign, base, cand):
        key = c_key or b_key
        assert key is not None
        if wanted and key.metric.split("{", 1)[0] not in wanted:
            continue
        b, c = base.get(b_key) if b_key else None, cand.get(c_key) if c_key else None
        ref = c or b
        assert ref is not None
        better_up = higher_is_better(campaign.kind, key.metric, ref.unit)
        judgement = verdicts.judge(
            baseline=b.values if b else [],
            candidate=c.values if c else [],
            higher_is_better=better_up,
            policy=policy,
            history=history.get(key, []),
            metric=key.metric,
            unit=ref.unit,
        )
        item = {"point": ref.point, "params": ref.params, "metric": key.metric, "unit": ref.unit,
                "higher_is_better": better_up, "statistic": policy.statistic,
                **dataclasses.asdict(judgement)}  # fmt: skip
        if pair is not None:
            item["paired_with"] = {"pair": pair, "baseline_params": b.params if b else None}
        flags = [f"baseline {doubt}" for doubt in (doubts["baseline"].get(b_key.params, []) if b_key else [])]
        flags += [f"candidate {doubt}" for doubt in (doubts["candidate"].get(c_key.params, []) if c_key else [])]
        if flags:  # a number read from the wrong place (page cache vs storage) says nothing about the other
            reason = f"cache discipline in doubt: {'; '.join(flags)} (the numbers alone: {item['reason']})"
            item.update(judged_outcome=item["outcome"], outcome=verdicts.INCONCLUSIVE, cache_flags=flags, reason=reason)
        items.append(item)
    # What the campaign says it is testing (verdict.differs_in: a throttled rate, a new software stack) may differ,
    # and so may the parameters a pair maps (verdict.pairs), for the items it maps; anything else that differs makes
    # the item inconclusive, with the difference as the reason.
    found = comparability.differences(baseline_campaign, campaign)
    pairs = campaign.verdict.get("pairs") or []
    for item in items:
        accepted = set(campaign.verdict.get("differs_in") or [])
        if "paired_with" in item:
            accepted |= pair_subjects(pairs[item["paired_with"]["pair"]])
        differences = [d for d in found if comparability.subject(d) not in accepted]
        if len(differences) < len(found):
            item["accepted_differences"] = [d for d in found if comparability.subject(d) in accepted]
        if differences:  # across different configurations no change means what it seems to: inconclusive, and why
            reason = "not comparable, the configurations differ: " + "; ".join(differences)
            item.update(judged_outcome=item.get("judged_outcome", item["outcome"]), outcome=verdicts.INCONCLUSIVE,
                        differences=differences,
                        reason=f"{reason} (the numbers alone: {item['reason']})")  # fmt: skip
    counts = {o: sum(1 for i in items if i["outcome"] == o) for o in VerdictOutcome.values}
    return Verdict.objects.create(
        campaign=campaign,
        baseline=baseline,
        baseline_campaign=baseline_campaign,
        outcome=verdicts.overall(i["outcome"] for i in items),
        method=verdicts.METHOD,
        method_version=verdicts.METHOD_VERSION,
        policy=dataclasses.asdict(policy),
        items=items,
        counts=counts,
    )


def pair_subjects(pair: dict[str, Any]) -> set[str]:
    """The parameters a pair maps: the differences it accepts for the items it maps."""
    return set(pair["baseline"]) | set(pair["candidate"])


def _matches(params: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(k in params and str(params[k]) == str(v) for k, v in wanted.items())


def _judged_keys(
    campaign: Campaign, baseline_campaign: Campaign, base: dict[Key, Series], cand: dict[Key, Series]
) -> list[tuple[Key | None, Key | None, int | None]]:
    """(baseline key, candidate key, pair index) of every item to judge, in point and metric order.

    Points are matched by the values of their matrix axes, except where the campaign maps them explicitly
    (``verdict.pairs``: ``[{baseline: {bs: 128k}, candidate: {bs: 4k}}]``): a candidate point whose parameters (fixed
    and axes) hold a pair's ``candidate`` values is judged against the baseline point that holds its ``baseline``
    values and the candidate point's value of every other axis the baseline has. A baseline point a pair took is not
    reported again as missing its candidate; a pair that finds no baseline point, or several, judges the candidate
    point against nothing (inconclusive, "no baseline values")."""
    pairs = campaign.verdict.get("pairs") or []
    paired: dict[Key, tuple[Key | None, int]] = {}
    taken: set[Key] = set()
    for c_key, c in cand.items():
        full_c = {**campaign.fixed, **c.params}
        index = next((i for i, p in enumerate(pairs) if _matches(full_c, p["candidate"])), None)
        if index is None:
            continue
        pair = pairs[index]
        found = [
            b_key
            for b_key, b in base.items()
            if b_key.metric == c_key.metric
            and _matches({**baseline_campaign.fixed, **b.params}, pair["baseline"])
            and _matches(full_c, {k: v for k, v in b.params.items() if k not in pair_subjects(pair)})
        ]
        paired[c_key] = (found[0] if len(found) == 1 else None, index)
        taken.update(found[:1] if len(found) == 1 else [])
    keys: list[tuple[Key | None, Key | None, int | None]] = [(b, c, i) for c, (b, i) in paired.items()]
    for key in set(base) | set(cand):
        if key in paired or (key not in cand and key in taken):
            continue
        keys.append((key if key in base else None, key if key in cand else None, None))

    def order(k: tuple[Key | None, Key | None, int | None]) -> tuple[int, str, str]:
        ref = cand[k[1]] if k[1] else base[k[0]] if k[0] else None
        key = k[1] or k[0]
        assert ref is not None and key is not None
        return ref.point, key.metric, key.params

    return sorted(keys, key=order)


def campaign_judge(*, campaign: Campaign) -> Verdict | None:
    """Called as a campaign ends: judge it when its family has a baseline; re-run suspected regressions once.

    Runs inside the transaction that ends the campaign, so no reader sees it finished before the re-run
    decision. Returns the verdict, or None when there is no baseline.
    """
    from campaigns.services import campaign_rerun

    baseline = baseline_for(campaign=campaign)
    if baseline is None:
        return None
    already_rerun = campaign.verdicts.filter(final=False).exists()
    rerun = campaign.verdict.get("rerun_regressions", False) and not already_rerun
    verdict = verdict_compute(campaign=campaign, baseline=baseline)
    if rerun and verdict.outcome == VerdictOutcome.REGRESSION:
        points = sorted({i["point"] for i in verdict.items if i["outcome"] == VerdictOutcome.REGRESSION})
        campaign_rerun(campaign=campaign, points=points)
        Verdict.objects.filter(pk=verdict.pk).update(final=False)
        verdict.final = False
        return verdict
    if campaign.verdict.get("webhook"):
        from campaigns.tasks import verdict_webhook_task

        transaction.on_commit(partial(verdict_webhook_task.delay, verdict.pk))
    return verdict


# --- webhook ------------------------------------------------------------------------------------


def webhook_payload(verdict: Verdict) -> dict[str, Any]:
    campaign = verdict.campaign
    return {
        "event": "campaign.finished",
        "campaign": {"id": campaign.pk, "name": campaign.name, "family": campaign.family_name,
                     "status": campaign.status},
        "verdict": dispatch.verdict_document()(verdict),
    }  # fmt: skip


def webhook_signature(body: bytes, secret: str) -> str:
    """``sha256=<hex HMAC of the body>``, the form GitHub's webhooks made familiar."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_request(verdict: Verdict) -> tuple[str, bytes, dict[str, str]]:
    """The URL, body and headers of the POST announcing ``verdict``."""
    body = json.dumps(webhook_payload(verdict), sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "rackbench-webhook/1",
               "X-Rackbench-Event": "campaign.finished"}  # fmt: skip
    secret = settings.RACKBENCH["WEBHOOK_SECRET"]
    if secret:
        headers["X-Rackbench-Signature"] = webhook_signature(body, secret)
    return verdict.campaign.verdict["webhook"], body, headers
