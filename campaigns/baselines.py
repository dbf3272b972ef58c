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
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from typing import Any, NamedTuple

from django.conf import settings
from django.db import transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast

from campaigns import comparability, dispatch, verdicts
from campaigns.models import (
    Baseline,
    Campaign,
    CampaignStatus,
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
    for key in sorted(set(base) | set(cand), key=lambda k: ((cand.get(k) or base[k]).point, k.metric)):
        if wanted and key.metric.split("{", 1)[0] not in wanted:
            continue
        b, c = base.get(key), cand.get(key)
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
                "higher_is_better": better_up, **dataclasses.asdict(judgement)}  # fmt: skip
        flags = [f"{side} {doubt}" for side, found in doubts.items() for doubt in found.get(key.params, [])]
        if flags:  # a number read from the wrong place (page cache vs storage) says nothing about the other
            reason = f"cache discipline in doubt: {'; '.join(flags)} (the numbers alone: {item['reason']})"
            item.update(judged_outcome=item["outcome"], outcome=verdicts.INCONCLUSIVE, cache_flags=flags, reason=reason)
        items.append(item)
    # What the campaign says it is testing (verdict.differs_in: a throttled rate, a new software stack) may differ;
    # anything else that differs makes every item inconclusive, with the difference as the reason.
    accepted = set(campaign.verdict.get("differs_in") or [])
    found = comparability.differences(baseline_campaign, campaign)
    differences = [d for d in found if comparability.subject(d) not in accepted]
    for item in items if len(differences) < len(found) else []:
        item["accepted_differences"] = [d for d in found if comparability.subject(d) in accepted]
    if differences:  # across different configurations no change means what it seems to: inconclusive, and why
        reason = "not comparable, the configurations differ: " + "; ".join(differences)
        for item in items:
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
