"""Health suites: named lists of steps (plug-ins or presets with parameters) run on a set of nodes, one campaign
per step.

A suite file (``presets/suites/SLUG.yaml``) holds ``suite:`` (title, description) and ``steps:``, each a campaign
definition in the YAML format of campaigns.spec without nodes, plus ``name`` (the step's name: a short slug) and
either ``kind`` or ``preset`` (the first campaign of that preset, its ``fixed`` values overridden by the step's).

A suite run needs no table of its own: it is the campaigns called ``RUN-STEP`` in the family ``suite-SLUG-STEP``
(``RUN`` is the run's name). Its outcome per node is computed from them (analysis.health).

The drift gate is on in every step unless the suite or the step says otherwise: a suite file's ``drift:`` (default
``warn``: a node whose facts differ is named on the run's page and in the API, and its checks still run; ``refuse``
stops the whole run) is each step's unless the step sets its own, and a launch may override it for all steps.

Actions (maintenance, Slurm drain) asked for at launch are stored on every step's campaign and taken when the last
step ends (analysis.health.suite_run_ended), by whoever may change those nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import Team
from campaigns.definition import campaign_apply
from campaigns.errors import CampaignError
from campaigns.models import SUITE_FAMILY_PREFIX, Campaign, SuiteAction
from campaigns.services import campaign_launch
from campaigns.spec import TOP_LEVEL, SpecError
from common.errors import NotFound
from inventory import drift as fact_drift
from inventory.models import Node
from inventory.selectors import inventory_can_change

SUITE_DIR = Path(__file__).parent / "presets" / "suites"
FAMILY_PREFIX = SUITE_FAMILY_PREFIX
_SLUG = re.compile(r"[a-z][a-z0-9]{0,19}")  # no "-": RUN-STEP and suite-SLUG-STEP split at the last one
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,70}")
STEP_KEYS = (TOP_LEVEL - {"name", "nodes", "node_tags", "family"}) | {"preset", "judge"}
DEFAULT_DRIFT = "warn"  # a health suite compares its nodes' facts unless told not to


@dataclass(frozen=True)
class Step:
    name: str
    definition: dict[str, Any]  # a campaign definition without name, nodes or family
    judge: tuple[str, ...] = ()  # the metrics each node is judged on against the fleet; empty: higher-is-better ones


@dataclass(frozen=True)
class Suite:
    slug: str
    title: str
    description: str
    steps: tuple[Step, ...]
    drift: dict[str, Any] = dataclass_field(default_factory=lambda: {"mode": DEFAULT_DRIFT})  # {} when off

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)


def suite_list() -> list[Suite]:
    return [suite_load(path.read_text(), slug=path.stem) for path in sorted(SUITE_DIR.glob("*.yaml"))]


def suite_get(slug: str) -> Suite:
    path = SUITE_DIR / f"{slug}.yaml"
    if not _SLUG.fullmatch(slug) or not path.is_file():
        known = ", ".join(s.slug for s in suite_list())
        raise NotFound(f"no suite named {slug[:40]!r} (suites: {known})", field="suite")
    return suite_load(path.read_text(), slug=slug)


def suite_load(text: str, *, slug: str) -> Suite:
    """A suite file, checked: every step named once, with a kind or a preset and only campaign fields."""
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("suite"), dict):
        raise SpecError("suite", "a suite file holds suite: (title, description) and steps:")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise SpecError("steps", "must be a non-empty list of steps")
    seen: set[str] = set()
    loaded = []
    for i, raw in enumerate(steps):
        loaded.append(_step(raw, f"steps[{i}]", seen))
    meta = data["suite"]
    title, description = str(meta.get("title") or slug), str(meta.get("description") or "").strip()
    drift = fact_drift.validate_config(data.get("drift"), default_mode=DEFAULT_DRIFT)
    return Suite(slug, title, description, tuple(loaded), drift)


def _step(raw: Any, where: str, seen: set[str]) -> Step:
    if not isinstance(raw, dict):
        raise SpecError(where, "must be a mapping (name:, kind: or preset:, fixed:, ...)")
    name = raw.get("name")
    if not isinstance(name, str) or not _SLUG.fullmatch(name):
        raise SpecError(f"{where}.name", f"must be a short lower-case name (letters and digits), got {name!r}")
    if name in seen:
        raise SpecError(f"{where}.name", f"step {name!r} is named twice")
    seen.add(name)
    unknown = sorted(set(raw) - STEP_KEYS - {"name"})
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", "not a field of a suite step")
    if ("kind" in raw) == ("preset" in raw):
        raise SpecError(where, "needs either kind: (a plug-in) or preset: (a preset's first campaign)")
    judge = raw.get("judge", [])
    if not isinstance(judge, list) or not all(isinstance(m, str) and m for m in judge):
        raise SpecError(f"{where}.judge", "must be a list of metric names")
    definition = {k: v for k, v in raw.items() if k not in ("name", "judge")}
    if "preset" in definition:
        definition = _from_preset(definition, f"{where}.preset")
    return Step(name, definition, tuple(judge))


def _from_preset(step: dict[str, Any], where: str) -> dict[str, Any]:
    from campaigns.presets import preset_get

    slug = step.pop("preset")
    preset = preset_get(str(slug)) if isinstance(slug, str) else None
    if preset is None:
        raise SpecError(where, f"no preset named {slug!r}")
    base = {k: v for k, v in preset.campaigns[0].items() if k != "suffix"}
    fixed = {**(base.get("fixed") or {}), **(step.pop("fixed", None) or {})}
    overridden = set(fixed) & set(base.get("matrix") or {})
    matrix = {k: v for k, v in (base.get("matrix") or {}).items() if k not in overridden}
    return {**base, **step, "fixed": fixed, "matrix": matrix}


# --- a suite run: one campaign per step ----------------------------------------------------------------------


def suite_run_name(*, suite: Suite, name: str = "") -> str:
    """The run's name, checked; by default the suite's slug and the time."""
    name = name or f"{suite.slug}-{timezone.now():%Y%m%d-%H%M%S}"
    if not _RUN_NAME.fullmatch(name):
        raise SpecError(
            "name", "must be letters, digits, '.', '_' or '-' (at most 71), starting with a letter or digit"
        )
    return name


def suite_launch(
    *,
    slug: str,
    nodes: list[str],
    name: str = "",
    steps: list[str] | None = None,
    env: dict[str, str] | None = None,
    params: dict[str, dict[str, Any]] | None = None,
    repetitions: int | None = None,
    drift: str = "",
    maintenance: bool = False,
    slurm_login_node: str = "",
    threshold: float | None = None,
    suspect_threshold: float | None = None,
    owner: Any = None,
    team: Team | None = None,
) -> list[Campaign]:
    """Create and launch one campaign per step of the suite on ``nodes`` (all of them or none), in step order; the
    campaigns queue for the nodes one after the other. ``steps`` picks some of the suite's steps (default: all);
    ``env`` is added to every step's environment (the site's ``NCCL_SOCKET_IFNAME``, ``PYTHONPATH``, ...);
    ``params`` overrides a step's fixed parameters (``{"network": {"duration": 2}}``: a shorter run) and
    ``repetitions`` every step's repetitions; ``drift`` (off, warn or refuse) replaces the suite's drift gate in
    every step.

    ``maintenance`` and ``slurm_login_node``: the actions to take when the run ends (analysis.health), judged at
    ``threshold`` and ``suspect_threshold`` (default: the fleet view's); only by an owner who may change every node
    (PermissionDenied otherwise), nothing by default."""
    suite = suite_get(slug)
    run_name = suite_run_name(suite=suite, name=name)
    if not nodes:
        raise SpecError("nodes", "a suite runs on at least one node")
    chosen = _chosen_steps(suite, steps)
    overrides = _step_params(suite, params)
    gate = fact_drift.validate_config(drift, default_mode="off") if drift else suite.drift
    actions = _actions(nodes, maintenance, slurm_login_node, threshold, suspect_threshold, owner)
    with transaction.atomic():
        if suite_run_campaigns(name=run_name, team=team).exists():
            raise CampaignError(f"a suite run named {run_name!r} exists already", field="name", conflict=True)
        created = []
        for step in chosen:
            data = _step_definition(step, overrides.get(step.name), gate if drift else None)
            data.update(name=f"{run_name}-{step.name}", nodes=list(nodes),
                        family=f"{FAMILY_PREFIX}{suite.slug}-{step.name}")  # fmt: skip
            if repetitions is not None:
                data["repetitions"] = repetitions
            if "drift" not in data:
                data["drift"] = fact_drift.config_as_definition(gate) if gate else "off"
            if env:
                data["env"] = {**(step.definition.get("env") or {}), **env}
            data.setdefault("description", f"{suite.title}: step {step.name} of suite run {run_name}")
            try:
                campaign = campaign_apply(data=data, owner=owner, team=team)
            except SpecError as exc:
                raise SpecError(f"steps.{step.name}.{exc.field}".rstrip("."), exc.message) from None
            if actions:
                campaign.suite_actions = actions
                campaign.save(update_fields=["suite_actions"])
            created.append(campaign_launch(campaign=campaign, user=owner))
    return created


def _chosen_steps(suite: Suite, steps: list[str] | None) -> list[Step]:
    if not steps:
        return list(suite.steps)
    unknown = [s for s in steps if suite.step(s) is None]
    if unknown:
        names = ", ".join(s.name for s in suite.steps)
        raise SpecError("steps", f"suite {suite.slug} has no step {unknown[0]!r} (steps: {names})")
    return [s for s in suite.steps if s.name in steps]


def _step_params(suite: Suite, params: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``params`` checked: a mapping of the suite's step names to mappings of parameters (each value then checked by
    the step's plug-in, as a campaign's)."""
    if not params:
        return {}
    if not isinstance(params, dict):
        raise SpecError("params", "must map step names to parameters, e.g. {network: {duration: 2}}")
    for step, values in params.items():
        if suite.step(str(step)) is None:
            names = ", ".join(s.name for s in suite.steps)
            raise SpecError("params", f"suite {suite.slug} has no step {step!r} (steps: {names})")
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise SpecError(f"params.{step}", "must map parameter names to values")
    return params


def _step_definition(step: Step, params: dict[str, Any] | None, drift: dict[str, Any] | None) -> dict[str, Any]:
    """The step's campaign definition with the launch's parameters (a parameter given replaces that axis of the
    matrix) and its drift setting."""
    data = dict(step.definition)
    if params:
        data["fixed"] = {**(data.get("fixed") or {}), **params}
        data["matrix"] = {k: v for k, v in (data.get("matrix") or {}).items() if k not in params}
    if drift is not None:
        data["drift"] = fact_drift.config_as_definition(drift) if drift else "off"
    return data


def _actions(
    nodes: list[str],
    maintenance: bool,
    slurm_login_node: str,
    threshold: float | None,
    suspect_threshold: float | None,
    owner: Any,
) -> dict[str, Any]:
    """The actions a launch asks for, as stored on its campaigns; {} for none. Whoever asks must be allowed to
    change every node (inventory.selectors.inventory_can_change); a launch without an owner is the console's."""
    if not maintenance and not slurm_login_node:
        return {}
    if slurm_login_node and not Node.objects.filter(name=slurm_login_node).exists():
        raise NotFound(f"no node named {slurm_login_node[:80]!r} to run scontrol on", field="slurm_login_node")
    if owner is not None:
        found = Node.objects.filter(name__in=nodes)
        refused = sorted(n.name for n in found if not inventory_can_change(user=owner, obj=n))
        if refused:
            raise PermissionDenied(f"you may not change nodes {', '.join(refused)} (shared or another team's)")
    actions: dict[str, Any] = {"maintenance": bool(maintenance), "slurm_login_node": slurm_login_node}
    for key, value in (("threshold", threshold), ("suspect_threshold", suspect_threshold)):
        if value is not None:
            actions[key] = float(value)
    if owner is not None:
        actions["user"] = owner.pk
    return actions


def suite_run_campaigns(*, name: str, team: Team | None) -> Any:
    """The campaigns of the suite run ``name`` in ``team`` (or shared), in step order of creation."""
    return (
        Campaign.objects.filter(name__startswith=f"{name}-", family__startswith=FAMILY_PREFIX, team=team)
        .filter(name__regex=rf"^{re.escape(name)}-[a-z][a-z0-9]*$")
        .order_by("pk")
    )


def step_of(campaign: Campaign) -> tuple[str, str]:
    """(suite slug, step name) of a suite step's campaign."""
    slug, _, step = campaign.family[len(FAMILY_PREFIX) :].rpartition("-")
    return slug, step


def suite_action_record(
    *, campaign_id: int, node: str, action: str, reason: str = "", automatic: bool = False
) -> SuiteAction | None:
    """Record that the suite run whose first step is ``campaign_id`` took ``action`` on ``node``; None when it had
    already (the table's unique constraint: a task that arrives twice does nothing the second time). Called inside
    the transaction that makes the change, so that the change and its record stand or fall together."""
    try:
        with transaction.atomic():
            return SuiteAction.objects.create(
                campaign_id=campaign_id, node=node, action=action, reason=reason[:500], automatic=automatic
            )
    except IntegrityError:
        return None


def suite_action_failed(*, action: SuiteAction, error: str) -> None:
    """An action recorded but not done (the drain's scontrol failed): why, on the record; not tried again."""
    SuiteAction.objects.filter(pk=action.pk).update(error=error[:500])
