"""The security sweep, runnable alone (``scripts/test tests/test_security.py -s`` prints the counts):

- cross-team: every URL pattern of the URLconf (enumerated, so a new view is swept without editing this file), with
  every id of another team's objects, answers an outsider exactly as it answers for an id that does not exist;
- injection: a corpus of shell payloads in every parameter of every benchmark kind a preset defines, and in the
  campaign's environment, is refused or quoted: the exact script a node would run is run by a real ``sh`` here, and
  no payload leaves its mark;
- schemathesis: a bounded run over every API operation against the live test server: no server error, no answer
  outside the schema. The full run is ``bench/api_fuzz.sh`` (every check, many more examples).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from accounts.services import token_create
from campaigns import baselines
from campaigns.models import Campaign, Result, RunHost, RunStatus
from campaigns.plan import build_commands, host_context, run_host_infos
from campaigns.presets import preset_list
from campaigns.services import campaign_apply, campaign_finish, campaign_launch
from inventory.models import Credential
from inventory.services import node_upsert, storage_upsert
from plugins.benchmarks.base import get_benchmark
from runners.remote import command_script
from telemetry.models import Series
from telemetry.services import series_append

MISSING = 987654321
UNTHROTTLED = {"user": "1000000/minute", "anon": "1000000/minute"}
SECRET = "bluesecret"  # in the name of every object of team blue: an answer that shows it leaks


def walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, list[str]]]:
    """Every URL pattern as a template ("campaigns/{pk}/") and the names of its parameters."""
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from walk(p.url_patterns, prefix + _template(p.pattern))
        elif isinstance(p, URLPattern):
            template = prefix + _template(p.pattern)
            yield template, re.findall(r"\{(\w+)\}", template)


def _template(pattern: Any) -> str:
    text = str(pattern)
    text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)  # path("<int:pk>/")
    text = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", text)  # re_path / the API router
    return text.lstrip("^").rstrip("$").replace("\\.", ".").replace("\\", "")


@pytest.fixture
def blue(team: Any, owner: Any) -> dict[str, Any]:
    """Team blue's world: inventory, a finished campaign with runs, hosts, results, telemetry, baseline, verdict."""
    credential = Credential.objects.create(name=f"{SECRET}-key", username="u", private_key_encrypted="x",
                                           public_key="k", fingerprint="f", team=team)  # fmt: skip
    node = node_upsert(name=f"{SECRET}-n1", address="10.0.0.1", team=team, credential=credential)
    node.interfaces.create(name="eth0")
    storage_upsert(name=f"{SECRET}-nas", kind="nfs", team=team, admin_credential=credential)
    spec = {"name": f"{SECRET}-c", "kind": "fio", "nodes": [node.name], "family": f"{SECRET}-f", "repetitions": 2,
            "fixed": {"bs": "4k", "size": "1M"}, "matrix": {"rw": ["read"]}}  # fmt: skip
    campaign = campaign_launch(campaign=campaign_apply(data=spec, owner=owner, team=team))
    for run in campaign.runs.all():
        host = {"node": node, "address": "10.0.0.1", "command": "fio", "remote_dir": "/x"}
        RunHost.objects.get_or_create(run=run, host=node.name, defaults=host)
        Result.objects.create(run=run, name="bw_bytes", value=100.0 + run.repetition, unit="B/s")
        series_append(run=run, host=node.name, name="cpu.busiest_util", labels={}, unit="%", kind="gauge",
                      timestamps_ns=10**18 + np.arange(5, dtype=np.int64) * 10**9, values=np.full(5, 1.0))  # fmt: skip
    campaign.runs.update(status=RunStatus.SUCCEEDED, started_at=timezone.now() - timedelta(seconds=3),
                         finished_at=timezone.now())  # fmt: skip
    campaign_finish(campaign=campaign)
    baselines.baseline_set(campaign=campaign)
    baselines.verdict_compute(campaign=campaign, baseline_campaign=campaign)
    from scheduling.services import schedule_create

    schedule_create(campaign=campaign, kind="cron", cron="0 2 * * *", user=owner)
    ids: set[int] = set()
    from django.apps import apps

    for model in apps.get_models():  # every row that exists: none of them may answer differently from MISSING
        if model._meta.app_label in ("accounts", "inventory", "campaigns", "telemetry", "scheduling", "api"):
            ids |= set(model.objects.values_list("pk", flat=True)[:200])
    pairs = [(r.pk, h.pk) for r in campaign.runs.all() for h in r.hosts.all()]
    pairs += [(s.run_id, s.pk) for s in Series.objects.all()]
    return {"ids": sorted(i for i in ids if isinstance(i, int)), "pairs": pairs, "campaign": campaign}


@pytest.mark.django_db
def test_an_outsider_gets_the_same_answer_for_another_teams_id_as_for_a_missing_one(
    blue: dict[str, Any], outsider: Any, settings: Any
) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": UNTHROTTLED}
    client = Client()
    client.force_login(outsider)
    patterns = [(t, params) for t, params in walk(get_resolver().url_patterns) if params]
    requests = leaks = 0
    problems: list[str] = []
    for template, params in patterns:
        values: list[tuple[Any, ...]] = [tuple([i] * len(params)) for i in blue["ids"]]
        if len(params) == 2:
            values += blue["pairs"]
        missing = "/" + template.format(**dict.fromkeys(params, MISSING))
        for method in ("get", "post"):
            expected = getattr(client, method)(missing).status_code
            for value in values:
                url = "/" + template.format(**dict(zip(params, value, strict=True)))
                answer = getattr(client, method)(url)
                requests += 1
                body = answer.content.decode(errors="replace")
                if answer.status_code != expected or SECRET in body:
                    leaks += 1
                    problems.append(f"{method.upper()} {url}: {answer.status_code} (missing: {expected})")
    print(f"\ncross-team sweep: {len(patterns)} URL patterns with ids, {requests} requests, {leaks} differing")
    assert len(patterns) > 40 and requests > 2 * len(patterns)
    assert not problems, problems[:20]


# --- injection ------------------------------------------------------------------------------------------------

MARK = "rbpwned"
PAYLOADS = [
    f"$(: > {MARK}1)", f"`: > {MARK}2`", f"x; : > {MARK}3", f"x && : > {MARK}4", f"x | : > {MARK}5",
    f"x\n: > {MARK}6", f"'; : > {MARK}7; '", f'"; : > {MARK}8; "', f"x > {MARK}9", f"${{IFS}}: > {MARK}10",
    f"--output={MARK}11", f"-o{MARK}12", f"../../../../tmp/{MARK}13",
]  # fmt: skip


def kinds_from_presets() -> dict[str, dict[str, Any]]:
    """One valid definition per benchmark kind the presets define (their reference campaigns)."""
    found: dict[str, dict[str, Any]] = {}
    for preset in preset_list():
        for part in preset.campaigns:
            data = preset.definition(part, name="inj")
            found.setdefault(data.get("kind", "fio"), data)
    return found


def pairs_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (section, name) a user fills that reaches a node: each fixed and matrix parameter, and an env var."""
    matrix = data.get("matrix") or {}
    names = list(matrix) if isinstance(matrix, dict) else [axis[0] for axis in matrix]
    return [("fixed", k) for k in data.get("fixed") or {}] + [("matrix", k) for k in names] + [("env", "X_INJ")]


@pytest.mark.django_db
def test_no_injected_payload_runs_in_any_field_that_reaches_a_node(team: Any) -> None:
    node_upsert(name="inj1", address="10.0.0.1", team=team)
    node_upsert(name="inj2", address="10.0.0.2", team=team)
    storage_upsert(name="inj-nas", kind="nfs", team=team, export_path="/ifs/data", data_addresses=["10.0.9.1"])
    kinds = kinds_from_presets()
    attempts = refused = ran_scripts = 0
    marks: list[str] = []
    field_pairs = 0
    with tempfile.TemporaryDirectory() as work:
        for _kind, base in sorted(kinds.items()):
            for section, name in pairs_of(base):
                field_pairs += 1
                for payload in PAYLOADS:
                    attempts += 1
                    data = yaml.safe_load(yaml.safe_dump(base))
                    data.update(name=f"inj-{attempts}", nodes=["inj1", "inj2"], storage="inj-nas", node_tags=[])
                    if section == "env":
                        data["env"] = {**(data.get("env") or {}), name: payload}
                    elif section == "fixed":
                        data["fixed"][name] = payload
                    else:
                        data["matrix"] = {**dict(data["matrix"]), name: [payload]}
                    scripts = scripts_for(data, team)
                    if scripts is None:
                        refused += 1
                        continue
                    for script in scripts:
                        ran_scripts += 1
                        run_script(script, Path(work))
                    marks += [p.name for p in Path(work).rglob(f"{MARK}*")]
    print(f"\ninjection corpus: {len(kinds)} kinds, {field_pairs} (kind, field) pairs, {attempts} attempts, "
          f"{refused} refused, {ran_scripts} node scripts run by sh, {len(marks)} payloads ran")  # fmt: skip
    assert field_pairs > 20 and attempts > 200
    assert not marks, marks


def scripts_for(data: dict[str, Any], team: Any) -> list[str] | None:
    """The exact command scripts (and service scripts) the nodes would run for the first point; None if refused."""
    try:
        campaign = campaign_apply(data=data, team=team)
    except Exception:  # noqa: BLE001 - any refusal (SpecError, ParamError, CampaignError) is what we hope for
        return None
    try:
        run = campaign_launch(campaign=campaign).runs.order_by("sequence").first()
        benchmark = get_benchmark(campaign.kind)
        nodes = list(campaign.nodes.all())
        infos = run_host_infos(run, nodes)
        scripts = []
        for i, node in enumerate(nodes):
            ctx = host_context(run, node_name=node.name, index=i, root="/home/u/.rackbench", hosts=infos)
            for command in build_commands(run, benchmark, ctx):
                if command is not None:
                    scripts.append(command_script(command.argv, command.env))
        return scripts
    except Exception:  # noqa: BLE001 - refused when building the commands: nothing would run
        return None
    finally:
        Campaign.objects.filter(pk=campaign.pk).delete()


def run_script(script: str, work: Path) -> None:
    """Run a node's script with a real sh in ``work`` with no programs on PATH: the benchmark is not found, but any
    unquoted payload (substitution, separator, redirection) still runs there and leaves its mark."""
    subprocess.run(["/bin/sh", "-c", script], cwd=work, env={"PATH": "/nonexistent", "HOME": str(work)},
                   capture_output=True, timeout=10, check=False)  # fmt: skip


# --- schemathesis ---------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_schema(
    live_server: Any, owner: Any, team: Any, settings: Any
) -> None:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given
    from hypothesis import settings as hypothesis_settings
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": UNTHROTTLED}
    examples = int(os.environ.get("RACKBENCH_FUZZ_EXAMPLES", "3"))
    node_upsert(name="fz1", address="10.0.0.1", team=team)
    fixed = {"rw": "read", "bs": "4k", "size": "1M"}
    campaign_apply(data={"name": "fz", "kind": "fio", "nodes": ["fz1"], "fixed": fixed}, team=team)
    secret = token_create(user=owner, team=team, name="fuzz", scope="launch").secret
    browser = Client()
    browser.force_login(owner)
    raw = yaml.safe_load(browser.get("/api/v1/schema/").content)
    schema = schemathesis.openapi.from_dict(raw)
    headers = {"Authorization": f"Bearer {secret}"}
    counts = {"operations": 0, "requests": 0, "server_errors": 0, "violations": 0}
    failures: list[str] = []

    for result in schema.get_all_operations():
        operation = result.ok()
        counts["operations"] += 1

        @hypothesis_settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                             derandomize=True, suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=operation.as_strategy())
        def call(case: Any) -> None:
            counts["requests"] += 1
            try:
                response = case.call(base_url=live_server.url, headers=headers)
            except Exception as exc:  # noqa: BLE001 - the server hung up: as bad as a 500
                counts["server_errors"] += 1
                failures.append(f"{case.method} {case.formatted_path}: {exc}")
                return
            if response.status_code >= 500:
                counts["server_errors"] += 1
                failures.append(f"{case.method} {case.formatted_path}: {response.status_code}")
                return
            try:
                # A schema-valid request may still be refused (a node name that does not exist, a definition the
                # benchmark rejects): positive_data_acceptance is for the full run to report, not to fail on.
                case.validate_response(response, excluded_checks=[positive_data_acceptance])
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - a violation, collected with the others
                counts["violations"] += 1
                failures.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {str(exc)[:300]}")

        call()
    print(f"\nschemathesis (bounded, {examples} examples per operation): {counts}")
    assert counts["operations"] > 40
    assert not failures, failures[:15]


def test_the_sweep_module_names_its_full_run() -> None:
    assert (Path(__file__).resolve().parent.parent / "bench" / "api_fuzz.sh").exists()
