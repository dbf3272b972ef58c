"""Filtersets of the API's lists, and the query parameters that do not fit one (``param.<name>``, compare)."""

from __future__ import annotations

import json
from typing import Any

import django_filters as df
from django.db.models import QuerySet
from django.http import QueryDict
from rest_framework.exceptions import NotFound, ValidationError

from accounts.selectors import Scope
from campaigns.models import Baseline, Campaign, CampaignStatus, Result, Run, RunStatus, Verdict, VerdictOutcome
from inventory.models import Interface, Node, NodeRole, NodeStatus, StorageKind, StorageSystem


class NodeFilter(df.FilterSet):
    status = df.ChoiceFilter(choices=NodeStatus.choices)
    role = df.ChoiceFilter(choices=NodeRole.choices)
    tag = df.CharFilter(field_name="tags__name", help_text="nodes carrying this tag")
    gpu_model = df.CharFilter()
    site = df.CharFilter(field_name="site__name")
    name = df.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Node
        fields = ["status", "role", "tag", "gpu_model", "site", "name"]


class InterfaceFilter(df.FilterSet):
    node = df.CharFilter(field_name="node__name")

    class Meta:
        model = Interface
        fields = ["node", "role"]


class StorageFilter(df.FilterSet):
    kind = df.ChoiceFilter(choices=StorageKind.choices)

    class Meta:
        model = StorageSystem
        fields = ["kind"]


class CampaignFilter(df.FilterSet):
    status = df.ChoiceFilter(choices=CampaignStatus.choices)
    kind = df.CharFilter()
    family = df.CharFilter()
    name = df.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Campaign
        fields = ["status", "kind", "family", "name"]


class RunFilter(df.FilterSet):
    campaign = df.NumberFilter(field_name="campaign_id")
    status = df.ChoiceFilter(choices=RunStatus.choices)
    point = df.NumberFilter()

    class Meta:
        model = Run
        fields = ["campaign", "status", "point"]


class ResultFilter(df.FilterSet):
    campaign = df.NumberFilter(field_name="run__campaign_id")
    run = df.NumberFilter(field_name="run_id")
    name = df.CharFilter(help_text="metric name")
    host = df.CharFilter(help_text="node name; empty for the aggregate across hosts")
    finished_after = df.IsoDateTimeFilter(field_name="run__finished_at", lookup_expr="gte")
    finished_before = df.IsoDateTimeFilter(field_name="run__finished_at", lookup_expr="lt")

    class Meta:
        model = Result
        fields = ["campaign", "run", "name", "host", "finished_after", "finished_before"]


class BaselineFilter(df.FilterSet):
    campaign = df.NumberFilter(field_name="campaign_id")

    class Meta:
        model = Baseline
        fields = ["family", "active", "campaign"]


class VerdictFilter(df.FilterSet):
    campaign = df.NumberFilter(field_name="campaign_id")
    outcome = df.ChoiceFilter(choices=VerdictOutcome.choices)

    class Meta:
        model = Verdict
        fields = ["campaign", "outcome", "final"]


def by_params(results: QuerySet[Result], query: QueryDict) -> QuerySet[Result]:
    """``param.numjobs=4``: results of runs whose point has that parameter value (JSON-typed: 4 is a number,
    "4k" a string). ``host=`` (empty) keeps the aggregates across hosts, which a filterset would ignore."""
    if query.get("host", None) == "":
        results = results.filter(host="")
    for key in query:
        if not key.startswith("param."):
            continue
        name = key[len("param.") :]
        if not name:
            raise ValidationError({key: ["name the parameter: param.<name>=<value>"]})
        raw = query.get(key, "")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        results = results.filter(**{f"run__params__{name}": value})
    return results


def numbers(query: QueryDict, *names: str) -> dict[str, float]:
    found = {}
    for name in names:
        if name in query:
            try:
                found[name] = float(query.get(name, ""))
            except ValueError:
                raise ValidationError({name: [f"must be a number, got {query.get(name)!r}"]}) from None
    return found


def _ids(query: QueryDict, name: str) -> list[str]:
    return [part.strip() for part in query.get(name, "").split(",") if part.strip()]


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValidationError({name: [f"must be whole numbers separated by commas, got {text!r}"]}) from None


def comparison_sets(query: QueryDict, scope: Scope) -> list[tuple[str, Campaign, list[int] | None]]:
    """What ``/compare/`` puts side by side: whole campaigns, single runs, or matrix points (campaign:point)."""
    visible = scope.filter(Campaign.objects.all())
    sets: list[tuple[str, Campaign, list[int] | None]] = []
    for text in _ids(query, "campaigns"):
        campaign = visible.filter(pk=_int(text, "campaigns")).first()
        if campaign is None:
            raise NotFound(f"no campaign {text}")
        sets.append((campaign.name, campaign, None))
    for text in _ids(query, "runs"):
        run = Run.objects.filter(pk=_int(text, "runs"), campaign__in=visible).select_related("campaign").first()
        if run is None:
            raise NotFound(f"no run {text}")
        sets.append((f"{run.campaign.name} #{run.sequence}", run.campaign, [run.pk]))
    for text in _ids(query, "points"):
        campaign_id, _, point = text.partition(":")
        campaign = visible.filter(pk=_int(campaign_id, "points")).first()
        if campaign is None or not point:
            raise NotFound(f"no matrix point {text} (campaign:point)")
        runs = list(campaign.runs.filter(point=_int(point, "points"), is_warmup=False).values_list("pk", flat=True))
        if not runs:
            raise NotFound(f"campaign {campaign.name} has no point {point}")
        sets.append((f"{campaign.name} point {point}", campaign, runs))
    if len(sets) < 2:
        raise ValidationError({"campaigns": ["give two or more campaigns, runs or points to compare"]})
    return sets
