"""Filtersets of the API's lists, and the query parameters that do not fit one (``param.<name>``, compare)."""

from __future__ import annotations

import json
from typing import Any

import django_filters as df
from django.db.models import QuerySet
from django.http import QueryDict
from rest_framework.exceptions import ValidationError

from analysis import forms as analysis_forms
from analysis import selectors as analysis_selectors
from analysis.selectors import CompareSet
from campaigns import verdicts
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
    run_status = df.ChoiceFilter(field_name="run__status", choices=RunStatus.choices, help_text="the run's status")

    class Meta:
        model = Result
        fields = ["campaign", "run", "name", "host", "finished_after", "finished_before", "run_status"]


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
        # Containment, not a key lookup: "param.rw__isnull" is a parameter named "rw__isnull", never a lookup.
        results = results.filter(run__params__contains={name: value})
    return results


def comparison_sets(request: Any) -> tuple[list[CompareSet], verdicts.Policy, str | None]:
    """What ``/compare/`` puts side by side (whole campaigns, single runs, matrix points ``campaign:point``, in the
    order written), the policy judging it and the statistic asked for (None: the reference campaign's): the
    /compare/ page's parameters and selector
    (analysis.forms, analysis.selectors.compare_sets), a bad value answered 400 and an unseen set 404."""
    picks, problems = analysis_forms.picks(request.META.get("QUERY_STRING", ""))
    policy = analysis_forms.policy(request.query_params, problems)
    statistic = analysis_forms.statistic(request.query_params, problems)
    if problems:
        found: dict[str, list[str]] = {}
        for problem in problems:
            found.setdefault(problem.field, []).append(problem.message)
        raise ValidationError(found)
    sets = analysis_selectors.compare_sets(request=request, picks=picks)
    if len(sets) < 2:
        raise ValidationError({"campaigns": ["give two or more campaigns, runs or points to compare"]})
    return sets, policy, statistic
