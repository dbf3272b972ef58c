"""The campaign builder (a YAML definition, a node picker, a team) and the quick fio form.

The builder's definition is the YAML of ``manage.py campaign apply``; nodes ticked in its picker are merged into
its ``nodes:`` list, so it works without JavaScript.

The quick fio form builds the campaign-as-code dict (campaigns/spec.py) from a few inputs.

Fixed parameters are ``key=value`` lines and matrix axes ``key=v1,v2,v3`` lines. A value is a whole number when it
looks like one (``numjobs=4`` as ``numjobs: 4`` in YAML) and text otherwise: fio options take text or integers.
The form checks only the shape of its inputs; the campaign itself is validated by ``campaign_apply`` (the
same code as ``manage.py campaign apply``), whose errors are shown next to the field they name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django import forms
from django.db.models import QuerySet

from accounts.models import Team
from campaigns import services
from campaigns.models import Campaign
from campaigns.spec import SpecError, load_yaml
from common.names import name_problem
from inventory.models import Node, NodeStatus, StorageSystem

KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
INT_RE = re.compile(r"^[+-]?[0-9]+$")
# spec field (before any "." or "[") -> form field, where their names differ
SPEC_FIELDS = {"node_tags": "nodes"}


def parse_value(text: str) -> int | str:
    return int(text) if INT_RE.match(text) else text


def parse_lines(text: str, *, many: bool) -> dict[str, Any]:
    """``key=value`` lines (``key=v1,v2`` lists when ``many``) into a dict; blank and ``#`` lines are skipped."""
    result: dict[str, Any] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        example = "key=v1,v2,v3" if many else "key=value"
        if not sep or not KEY_RE.match(key):
            raise forms.ValidationError(f"line {number}: expected {example}, got {line!r}")
        if key in result:
            raise forms.ValidationError(f"line {number}: {key} is set twice")
        values = [v.strip() for v in value.split(",")] if many else [value]
        if any(v == "" for v in values):
            raise forms.ValidationError(f"line {number}: {key} has an empty value")
        parsed = [parse_value(v) for v in values]
        result[key] = parsed if many else parsed[0]
    return result


class BuilderForm(forms.Form):
    definition = forms.CharField(
        label="Definition (YAML)",
        widget=forms.Textarea(attrs={"rows": 24, "spellcheck": "false", "class": "code"}),
        help_text="The same format as manage.py campaign apply FILE.yaml (see the README).",
    )
    picked = forms.MultipleChoiceField(
        label="Nodes", required=False, widget=forms.CheckboxSelectMultiple,
        help_text="Ticked nodes are added to the definition's nodes: list.",
    )  # fmt: skip
    team = forms.ModelChoiceField(queryset=Team.objects.none(), required=False, empty_label=None)

    def __init__(self, *args: Any, nodes: Iterable[Node], teams: QuerySet[Team], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = list(nodes)
        self.fields["picked"].choices = [(n.name, n.name) for n in self.nodes]  # type: ignore[attr-defined]
        self.fields["team"].queryset = teams  # type: ignore[attr-defined]
        self.many_teams = len(teams) > 1
        self.only_team = teams[0] if len(teams) == 1 else None  # taken when the form asks nothing
        if self.many_teams:
            self.fields["team"].required = True
        elif not self.is_bound:
            self.initial.setdefault("team", self.only_team)

    def clean_definition(self) -> dict[str, Any]:
        try:
            return load_yaml(self.cleaned_data["definition"])
        except SpecError as exc:
            raise forms.ValidationError(exc.message) from None

    def clean_team(self) -> Team | None:
        return self.cleaned_data.get("team") or self.only_team

    def spec(self) -> dict[str, Any]:
        """The parsed definition with the picked nodes merged into ``nodes:`` (valid forms only)."""
        data = dict(self.cleaned_data["definition"])
        picked = self.cleaned_data.get("picked") or []
        if picked:
            listed = data.get("nodes") or []
            if isinstance(listed, str):
                listed = [listed]
            if isinstance(listed, list):  # anything else is left for validation to name
                data["nodes"] = listed + [n for n in picked if n not in listed]
        return data

    def check_name(self, data: dict[str, Any]) -> None:
        """A builder creates: a name already taken is an error here (``campaign apply`` would update it)."""
        name = data.get("name")
        if isinstance(name, str) and Campaign.objects.filter(name=name, team=self.cleaned_data.get("team")).exists():
            raise SpecError("name", f"a campaign named {name!r} already exists; choose another")

    def save(self, *, owner: Any) -> Campaign | None:
        """Create the campaign; None (the error shown on the definition, naming its field) when invalid."""
        data = self.spec()
        try:
            self.check_name(data)
            return services.campaign_apply(data=data, owner=owner, team=self.cleaned_data["team"])
        except SpecError as exc:
            self.add_error("definition", str(exc))
        except services.CampaignError as exc:
            self.add_error("definition", f"{exc.field}: {exc.message}" if exc.field else exc.message)
        return None


class CampaignForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Unique; letters, digits, '.', '_' or '-'.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    nodes = forms.ModelMultipleChoiceField(
        queryset=Node.objects.none(),  # the viewer's (__init__): another team's are neither listed nor accepted
        to_field_name="name",
        widget=forms.CheckboxSelectMultiple,
        help_text="Every run uses all the selected nodes at once.",
    )
    storage = forms.ModelChoiceField(
        queryset=StorageSystem.objects.none(),  # the viewer's (__init__)
        to_field_name="name",
        required=False,
        empty_label="(none)",
        help_text="Optional: its export path holds the test data; needed to flush the storage cache.",
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(),
        required=False,
        empty_label=None,
        help_text="You belong to several teams: the campaign is created in this one.",
    )
    repetitions = forms.IntegerField(min_value=1, initial=1)
    warmup_runs = forms.IntegerField(
        min_value=0, initial=0, label="Warm-up runs", help_text="Per matrix point; left out of statistics."
    )
    statistic = forms.ChoiceField(
        choices=[("mean", "mean"), ("median", "median")], initial="mean", label="Statistic", required=False,
        help_text="What a point's repetitions are summed up by in statistics, charts, comparisons and verdicts.",
    )  # fmt: skip
    timeout = forms.IntegerField(min_value=1, initial=3600, label="Timeout (s)", help_text="Per run.")
    flush_clients = forms.BooleanField(required=False, initial=True, label="Flush client caches before each run")
    flush_storage = forms.BooleanField(required=False, initial=False, label="Flush the storage cache before each run")
    fixed = forms.CharField(
        label="Fixed parameters",
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "bs=1M\nsize=64M"}),
        help_text="One key=value per line; shared by every run.",
    )
    matrix = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "rw=read,randread\nnumjobs=1,4,16"}),
        help_text="One key=v1,v2,v3 per line; every combination is run (full cross product).",
    )

    def __init__(
        self,
        *args: Any,
        teams: QuerySet[Team],
        nodes: QuerySet[Node],
        storage: QuerySet[StorageSystem],
        **kwargs: Any,
    ) -> None:
        """Every choice comes from the viewer's scope: ``nodes`` and ``storage`` as ``accounts.selectors.visible``
        gives them, ``teams`` the viewer's own."""
        super().__init__(*args, **kwargs)
        self.fields["nodes"].queryset = nodes.filter(status=NodeStatus.ACTIVE).order_by("name")  # type: ignore[attr-defined]
        self.fields["storage"].queryset = storage.order_by("name")  # type: ignore[attr-defined]
        self.fields["team"].queryset = teams  # type: ignore[attr-defined]
        self.many_teams = len(teams) > 1
        self.only_team = teams[0] if len(teams) == 1 else None  # taken when the form asks nothing
        if self.many_teams:
            self.fields["team"].required = True
        else:
            del self.fields["team"]

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        problem = name_problem(name)  # checked here too, so it shows along with the form's other errors
        if problem:
            raise forms.ValidationError(problem)
        return name

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        name, team = data.get("name"), data.get("team") or self.only_team
        if name and Campaign.objects.filter(name=name, team=team).exists():  # in this team: names are per team
            self.add_error("name", f"a campaign named {name!r} already exists")
        return data

    def clean_fixed(self) -> dict[str, Any]:
        return parse_lines(self.cleaned_data["fixed"], many=False)

    def clean_matrix(self) -> dict[str, list[Any]]:
        return parse_lines(self.cleaned_data["matrix"], many=True)

    def to_spec(self) -> dict[str, Any]:
        data = self.cleaned_data
        spec: dict[str, Any] = {
            "name": data["name"],
            "description": data["description"],
            "kind": "fio",
            "nodes": [node.name for node in data["nodes"]],
            "repetitions": data["repetitions"],
            "warmup_runs": data["warmup_runs"],
            "statistic": data.get("statistic") or "mean",
            "cache": {"flush_clients": data["flush_clients"], "flush_storage": data["flush_storage"]},
            "timeout": data["timeout"],
            "fixed": data["fixed"],
            "matrix": data["matrix"],
        }
        if data["storage"]:
            spec["storage"] = data["storage"].name
        return spec

    def save(self, *, owner: Any) -> Campaign | None:
        """Create the campaign in the chosen team (the owner's only one); None (and the error shown on the form)
        when the definition is invalid."""
        team = self.cleaned_data.get("team") or self.only_team
        try:
            return services.campaign_apply(data=self.to_spec(), owner=owner, team=team)
        except SpecError as exc:
            self.add_spec_error(exc)
        except services.CampaignError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return None

    def add_spec_error(self, exc: SpecError) -> None:
        head = re.split(r"[.\[]", exc.field, maxsplit=1)[0]
        rest = exc.field[len(head) :].lstrip(".")  # "matrix.rw[0]" -> "matrix", "rw[0]"
        field: str | None = rest if head == "cache" else SPEC_FIELDS.get(head, head)
        if field not in self.fields:
            field = None
        # Name the parameter ("rw[0]: ..."), so the user knows which line; "nodes[2]" messages name the node.
        detail = rest if head in ("matrix", "fixed") else ""
        self.add_error(field, f"{detail}: {exc.message}" if detail else exc.message)
