"""Campaign as code: the YAML format, validated into a plain dict; every error names its field.

Format (see examples/campaigns/ and the README)::

    name: fio-read-vs-randread        # required, unique
    description: free text
    kind: fio                         # a benchmark plug-in
    nodes: [lab1, lab2]               # node names, and/or
    node_tags: [lab]                  # every active node with one of these tags
    storage: lab-local                # optional storage system (its flush command, export path)
    repetitions: 3
    warmup_runs: 0                    # per matrix point, run first and left out of statistics
    statistic: median                 # a point's repetitions summed up by mean (default) or median, in show,
                                      # charts, compare, verdicts and exports alike (seed 004: the median of 3)
    cache: {flush_clients: true, flush_storage: true}
    timeout: 600                      # seconds per run
    fixed: {bs: 1M, size: 64M}        # parameters of every run
    env: {NCCL_DEBUG: INFO}           # environment of every command (MPI passes it with -x)
    mounts: {count: 16, path: /mnt/isilon, options: "rsize=524288,nolock"}  # per node, round-robin over
                                      # the storage's data addresses; mounted before runs, unmounted at the end
    launcher: {kind: slurm, login_node: login1, partition: gpu, time: "01:00:00", extra: ["--gres=gpu:8"]}
                                      # submit each run's main command with sbatch on a login node (see the
                                      # README's Slurm section); absent or {kind: direct}: started over SSH
    telemetry: {interval: 1s, fast: [net], fast_interval: 1ms, groups: [cpu, mem, net, rdma, nfs, disk, gpu]}
                                      # samplers on every host during each run (runners/samplers.py)
    matrix:                           # full cross product, in this order
      rw: [read, randread]
      numjobs: [1, 4, 16]
      nodes: [1, 2]                   # reserved: the run uses the first N selected nodes
    zip: [[model, batch_size]]        # these axes vary together (same lengths)
    exclude: [{rw: randread, numjobs: 16}]            # points left out
    overrides: [{when: {model: vgg16}, set: {batch_size: 192}}]
    derived: {np: "nodes * gpus_per_node"}            # arithmetic over the point's numbers
    drift: {mode: refuse, golden: lab1, expect: {kernel: 6.8.0}, fields: [kernel, "nic.*.mtu"], max_age: 10m}
                                      # the drift gate before launch (inventory/drift.py): off by default
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from common.addresses import url_refusal
from common.errors import FieldError
from common.names import name_problem  # one rule for every name that becomes a path
from inventory.drift import validate_config as validate_drift
from plugins.benchmarks.base import ParamError, get_benchmark
from plugins.launchers.slurm import validate_launcher
from plugins.telemetry import validate_telemetry

TOP_LEVEL = {
    "name", "description", "kind", "nodes", "node_tags", "storage", "repetitions", "warmup_runs", "cache",
    "timeout", "fixed", "matrix", "env", "zip", "exclude", "overrides", "derived", "mounts", "container",
    "launcher", "family", "verdict", "telemetry", "statistic", "drift",
}  # fmt: skip
STATISTICS = ("mean", "median")  # campaigns.models.Statistic: what a point's repetitions are summed up by
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CACHE_KEYS = {"flush_clients", "flush_storage"}
SCALAR = (str, int, float, bool)


# A definition's error is any field error: a plug-in's ParamError passes through as it is, its field named.
SpecError = FieldError


def load_yaml(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError("", f"not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise SpecError("", "a campaign file must be a mapping of fields (name:, kind:, matrix:, ...)")
    return data


def _int(data: dict[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(key, f"must be a whole number, got {value!r}")
    if value < minimum:
        raise SpecError(key, f"must be at least {minimum}, got {value}")
    return value


def _names(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SpecError(key, "must be a list of names")
    return value


def _params(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(field, "must be a mapping of parameter names to values")
    for name, v in value.items():
        if not isinstance(name, str):
            raise SpecError(field, f"parameter name {name!r} must be text")
        if not isinstance(v, SCALAR):
            raise SpecError(f"{field}.{name}", f"must be a single value (text, number or boolean), got {v!r}")
    return dict(value)


def _matrix(value: Any) -> list[list[Any]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise SpecError("matrix", "must be a mapping of parameter names to lists of values")
    axes: list[list[Any]] = []
    for name, values in value.items():
        if not isinstance(name, str):
            raise SpecError("matrix", f"parameter name {name!r} must be text")
        if not isinstance(values, list) or not values:
            raise SpecError(f"matrix.{name}", "must be a non-empty list of values")
        for i, v in enumerate(values):
            if not isinstance(v, SCALAR):
                raise SpecError(f"matrix.{name}[{i}]", f"must be a single value, got {v!r}")
        if len(set(map(repr, values))) != len(values):
            raise SpecError(f"matrix.{name}", "lists a value twice")
        axes.append([name, list(values)])
    return axes


def validate(data: dict[str, Any]) -> dict[str, Any]:
    """Check a campaign definition and return it normalised. Raises SpecError naming the field."""
    unknown = sorted(set(data) - TOP_LEVEL)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known fields: {', '.join(sorted(TOP_LEVEL))})")
    name = data.get("name")
    problem = name_problem(name)
    if problem:
        raise SpecError("name", problem)
    kind = data.get("kind", "fio")
    try:
        benchmark = get_benchmark(kind)
    except ParamError as exc:
        raise SpecError("kind", exc.message) from None
    cache = data.get("cache") or {}
    if not isinstance(cache, dict) or set(cache) - CACHE_KEYS:
        raise SpecError("cache", f"must be a mapping with keys {sorted(CACHE_KEYS)}")
    for key in CACHE_KEYS & set(cache):
        if not isinstance(cache[key], bool):
            raise SpecError(f"cache.{key}", f"must be true or false, got {cache[key]!r}")
    fixed = _params(data.get("fixed"), "fixed")
    matrix = _matrix(data.get("matrix"))
    overlap = sorted(set(fixed) & {axis[0] for axis in matrix})
    if overlap:
        raise SpecError(f"matrix.{overlap[0]}", "is also set in fixed; set it in one place")
    rules = _rules(data, matrix, fixed)
    drift = validate_drift(data.get("drift"))
    if drift:
        rules["drift"] = drift
    spec = {
        "name": name,
        "description": str(data.get("description") or ""),
        "kind": kind,
        "nodes": _names(data, "nodes"),
        "node_tags": _names(data, "node_tags"),
        "storage": data.get("storage") or "",
        "repetitions": _int(data, "repetitions", 1, minimum=1),
        "warmup_runs": _int(data, "warmup_runs", 0, minimum=0),
        "flush_clients": cache.get("flush_clients", True),
        "flush_storage": cache.get("flush_storage", False),
        "timeout": _int(data, "timeout", 3600, minimum=1),
        "fixed": fixed,
        "matrix": matrix,
        "env": _env(data.get("env")),
        "mounts": data.get("mounts") or {},  # checked against the storage system by campaign_apply
        "container": _container(data.get("container")),
        "launcher": _launcher(data.get("launcher")),  # its login node is checked by campaign_apply
        "telemetry": _telemetry(data.get("telemetry")),
        "rules": rules,
        "family": _family(data.get("family")),
        "verdict": _verdict(data.get("verdict")),
        "statistic": _statistic(data.get("statistic")),
    }
    if not isinstance(spec["storage"], str):
        raise SpecError("storage", "must be the name of a storage system")
    if not spec["nodes"] and not spec["node_tags"]:
        raise SpecError("nodes", "select at least one node (nodes: [...] or node_tags: [...])")
    if spec["telemetry"] and spec["launcher"]:
        raise SpecError("telemetry", "samplers are not supported under Slurm yet: use launcher: {kind: direct}")
    _check_pairs(spec)
    _validate_points(benchmark, spec)
    return spec


def _family(value: Any) -> str:
    if value in (None, ""):
        return ""
    problem = name_problem(value)
    if problem:
        raise SpecError("family", problem)
    return str(value)


def _statistic(value: Any) -> str:
    if value is None:
        return "mean"
    if value not in STATISTICS:
        raise SpecError("statistic", f"must be one of {', '.join(STATISTICS)}, got {value!r}")
    return str(value)


VERDICT_KEYS = {"threshold_pct", "alpha", "min_repetitions", "rerun_regressions", "metrics", "webhook", "differs_in",
                "pairs"}  # fmt: skip


def _verdict(value: Any) -> dict[str, Any]:
    """How a finished campaign is judged against its family's baseline, and who is told."""
    from campaigns.verdicts import Policy, PolicyError

    if value in (None, {}):
        return {}
    if not isinstance(value, dict):
        raise SpecError("verdict", f"must be a mapping with keys {sorted(VERDICT_KEYS)}")
    unknown = sorted(set(value) - VERDICT_KEYS)
    if unknown:
        raise SpecError(f"verdict.{unknown[0]}", f"unknown field (known: {', '.join(sorted(VERDICT_KEYS))})")
    policy = {k: v for k, v in value.items() if k in {"threshold_pct", "alpha", "min_repetitions"}}
    try:
        Policy.from_mapping(policy)
    except PolicyError as exc:
        raise SpecError(f"verdict.{exc.field}", exc.message) from None
    if not isinstance(value.get("rerun_regressions", False), bool):
        raise SpecError("verdict.rerun_regressions", "must be true or false")
    differs = value.get("differs_in", [])
    if not isinstance(differs, list) or not all(isinstance(d, str) and d for d in differs):
        raise SpecError("verdict.differs_in", "must be a list of what may differ from the baseline: fixed parameter "
                        "names, hardware or software (what the campaign is testing)")  # fmt: skip
    _pairs(value.get("pairs", []))
    metrics = value.get("metrics", [])
    if not isinstance(metrics, list) or not all(isinstance(m, str) and m for m in metrics):
        raise SpecError("verdict.metrics", "must be a list of metric names (empty: every metric)")
    webhook = value.get("webhook", "")
    if not isinstance(webhook, str) or (webhook and not re.match(r"^https?://[^\s]+$", webhook)):
        raise SpecError("verdict.webhook", "must be an http:// or https:// URL")
    if webhook and not _allow_private_webhooks():
        refusal = url_refusal(webhook, resolve=False)  # a name is resolved, and checked again, when it is called
        if refusal:
            raise SpecError("verdict.webhook", f"{refusal} (RACKBENCH_WEBHOOK_ALLOW_PRIVATE=1 allows it)")
    return dict(value)


def _pairs(value: Any) -> None:
    """verdict.pairs: which baseline point each candidate point is judged against, where their parameters differ
    (campaigns.baselines._judged_keys): ``[{baseline: {bs: 128k}, candidate: {bs: 4k}}]``."""
    if not isinstance(value, list):
        raise SpecError("verdict.pairs", "must be a list of {baseline: {NAME: VALUE}, candidate: {NAME: VALUE}}")
    for i, pair in enumerate(value):
        if not isinstance(pair, dict) or set(pair) != {"baseline", "candidate"}:
            raise SpecError(f"verdict.pairs[{i}]", "must be a mapping with exactly the keys baseline and candidate")
        for side in ("baseline", "candidate"):
            values = pair[side]
            if not isinstance(values, dict) or not values:
                raise SpecError(f"verdict.pairs[{i}].{side}", "must map one or more parameter names to values")
            for name, v in values.items():
                if not isinstance(v, SCALAR):
                    raise SpecError(f"verdict.pairs[{i}].{side}.{name}", "must be a single value")


def _check_pairs(spec: dict[str, Any]) -> None:
    """A pair's candidate side names parameters of this campaign (its baseline is known only when it is judged)."""
    known = set(spec["fixed"]) | {name for name, _ in spec["matrix"]}
    for i, pair in enumerate(spec["verdict"].get("pairs") or []):
        for name in pair["candidate"]:
            if name not in known:
                raise SpecError(f"verdict.pairs[{i}].candidate.{name}", "is not a parameter of this campaign (fixed "
                                f"or matrix: {', '.join(sorted(known)) or 'none'})")  # fmt: skip


def _allow_private_webhooks() -> bool:
    from django.conf import settings  # the definition's rules are otherwise Django-free

    return bool(settings.RACKBENCH["WEBHOOK_ALLOW_PRIVATE"])


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError("env", "must be a mapping of variable names to values")
    env = {}
    for name, v in value.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise SpecError("env", f"{name!r} is not an environment variable name")
        if not isinstance(v, SCALAR) or "\n" in str(v) or "\0" in str(v):
            raise SpecError(f"env.{name}", "must be a single-line value")
        env[name] = str(v).lower() if isinstance(v, bool) else str(v)
    return env


def _container(value: Any) -> dict[str, Any]:
    """The container jobs run in (plugins/containers): validated by its runtime, kept as given."""
    from dataclasses import asdict

    from plugins.containers import get_runtime, spec_from_dict

    if not value:
        return {}
    if not isinstance(value, dict):
        raise SpecError("container", "must be a mapping: {runtime: docker, image: ..., ssh_port: 2222}")
    try:
        spec = spec_from_dict(value)
        get_runtime(spec.runtime).validate(spec)
    except ParamError as exc:
        field = exc.field if exc.field.startswith("container") else f"container.{exc.field}"
        raise SpecError(field, exc.message) from None
    return asdict(spec) if spec.runtime != "bare" else {}


def _launcher(value: Any) -> dict[str, Any]:
    """How runs start (plugins/launchers/slurm.py): {} for the direct launch over SSH."""
    return validate_launcher(value)


def _telemetry(value: Any) -> dict[str, Any]:
    """Samplers on every host during runs (runners/samplers.py): {} when off."""
    return validate_telemetry(value)


def _rules(data: dict[str, Any], matrix: list[list[Any]], fixed: dict[str, Any]) -> dict[str, Any]:
    """zip, exclude, overrides and derived, checked against the matrix they apply to."""
    axes = {name: values for name, values in matrix}
    rules: dict[str, Any] = {}
    zipped = data.get("zip") or []
    if not isinstance(zipped, list) or not all(isinstance(g, list) and len(g) >= 2 for g in zipped):
        raise SpecError("zip", "must be a list of groups of at least two matrix parameters, e.g. [[model, batch_size]]")
    seen: set[str] = set()
    for i, group in enumerate(zipped):
        for name in group:
            if name not in axes:
                raise SpecError(f"zip[{i}]", f"{name!r} is not a matrix parameter")
            if name in seen:
                raise SpecError(f"zip[{i}]", f"{name!r} is in two zip groups")
            seen.add(name)
        if len({len(axes[name]) for name in group}) != 1:
            raise SpecError(f"zip[{i}]", "zipped parameters must list the same number of values")
    if zipped:
        rules["zip"] = zipped
    known = set(axes) | set(fixed)
    exclude = data.get("exclude") or []
    if not isinstance(exclude, list):
        raise SpecError("exclude", "must be a list of mappings, e.g. [{rw: randread, numjobs: 16}]")
    for i, rule in enumerate(exclude):
        _condition(rule, known, f"exclude[{i}]")
    if exclude:
        rules["exclude"] = exclude
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list):
        raise SpecError("overrides", "must be a list of {when: {...}, set: {...}}")
    for i, rule in enumerate(overrides):
        if not isinstance(rule, dict) or set(rule) != {"when", "set"}:
            raise SpecError(f"overrides[{i}]", "must be {when: {...}, set: {...}}")
        _condition(rule["when"], known, f"overrides[{i}].when")
        _params(rule["set"], f"overrides[{i}].set")
    if overrides:
        rules["overrides"] = overrides
    derived = data.get("derived") or {}
    if not isinstance(derived, dict) or not all(isinstance(v, str) for v in derived.values()):
        raise SpecError("derived", 'must map names to arithmetic expressions, e.g. {np: "nodes * gpus_per_node"}')
    for name in derived:
        if name in known:
            raise SpecError(f"derived.{name}", "is also a matrix or fixed parameter")
    if derived:
        rules["derived"] = dict(derived)
    return rules


def _condition(rule: Any, known: set[str], field: str) -> None:
    if not isinstance(rule, dict) or not rule:
        raise SpecError(field, "must be a non-empty mapping of parameter names to values")
    for name in rule:
        if name not in known:
            raise SpecError(field, f"{name!r} is not a matrix or fixed parameter")


def _blame(spec: dict[str, Any], param: str, axes: set[str]) -> str:
    """The field that set a parameter: an override that sets it, else the matrix or the fixed values."""
    for i, override in enumerate(spec["rules"].get("overrides", [])):
        if param in override["set"]:
            return f"overrides[{i}].set.{param}"
    return f"{'matrix' if param in axes else 'fixed'}.{param}"


def field_of(spec: dict[str, Any], param: str) -> str:
    """The campaign field a plug-in's refusal of ``param`` is about: where the campaign sets it, else the parameter
    itself (a default the plug-in applies, or a run-level field such as ``nodes``)."""
    axes = {axis[0] for axis in spec["matrix"]}
    setting = axes | set(spec["fixed"]) | {p for o in spec["rules"].get("overrides", []) for p in o["set"]}
    return _blame(spec, param, axes) if param in setting else param


def _validate_points(benchmark: Any, spec: dict[str, Any]) -> None:
    from campaigns.planning import ExpressionError, benchmark_params, expand

    axes = {axis[0] for axis in spec["matrix"]}
    try:
        for params in expand(spec["matrix"], spec["fixed"], spec["rules"]):
            for key in params:
                if key.startswith("env.") and not ENV_NAME.match(key[4:]):
                    raise SpecError(_blame(spec, key, axes), f"{key[4:]!r} is not an environment variable name")
            count = params.get("nodes")
            if "nodes" in params and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                field = _blame(spec, "nodes", axes)
                raise SpecError(field, f"node counts must be whole numbers of at least 1, got {count!r}")
            try:
                benchmark.validate(benchmark_params(params))
            except ParamError as exc:
                raise SpecError(_blame(spec, exc.field, axes), exc.message) from None
    except ExpressionError as exc:
        raise SpecError("derived", str(exc)) from None


def to_yaml(data: dict[str, Any]) -> str:
    """YAML of a campaign definition in the format above, keys in their documented order."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
