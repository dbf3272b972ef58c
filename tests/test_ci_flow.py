"""The whole CI flow on real components: the standalone client against a live server, a real Celery worker and
lab sshd nodes running fio; and schemathesis fuzzing the live OpenAPI schema."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounts.models import TokenScope
from accounts.services import team_add_member, team_create, token_create
from campaigns.models import Campaign, CampaignStatus

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "rackbench_ci.py"
ARTIFACTS = ROOT / "var" / "test-artifacts"


def ci_token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user("ci-bot")
    team = team_create(name="storage")
    team_add_member(team=team, user=user)
    return token_create(user=user, team=team, name="pipeline", scope=TokenScope.LAUNCH).secret


def run_client(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The client as a pipeline runs it: a separate python with only the standard library on its path."""
    env = {"PATH": os.environ["PATH"], "RACKBENCH_URL": url, "RACKBENCH_TOKEN": token}
    return subprocess.run(
        [sys.executable, "-S", str(CLIENT), "run", "--poll-interval", "0.5", "--timeout", "300", *args],
        env=env, capture_output=True, text=True, timeout=360,
    )  # fmt: skip


def campaign_file(tmp_path: Path, **fixed: Any) -> Path:
    """Reads on one lab node, three repetitions of one point, judged on bandwidth and IOPS. fio's ``rate`` holds the
    bandwidth at 40 MB/s: unthrottled page-cache speed on a shared 2-core machine swings too much between
    campaigns for a test that must pass every time (latency percentiles too: they come out inconclusive)."""
    data = {
        "name": "fio-lab", "kind": "fio", "nodes": ["lab1"], "family": "fio-lab", "repetitions": 3,
        "cache": {"flush_clients": False}, "timeout": 120,
        # the "regressed system" is simulated by a lower rate on a smaller file: what this campaign tests may differ
        "verdict": {"metrics": ["bw_bytes", "iops"], "differs_in": ["rate", "size"]},
        "fixed": {"bs": "64k", "size": "16M", "rate": "40m", **fixed}, "matrix": {"rw": ["read"]},
    }  # fmt: skip
    path = tmp_path / f"campaign-{len(fixed)}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cases(junit: Path) -> dict[str, list[str]]:
    """Per test case (metric at point), the tags of its outcome children (failure, error, skipped)."""
    root = ET.parse(junit).getroot()
    outcomes = {"failure", "error", "skipped"}
    return {
        f"{case.get('classname', '').split('.')[-1]} at {case.get('name')}": [c.tag for c in case if c.tag in outcomes]
        for case in root.iter("testcase")
    }


@pytest.mark.lab
@pytest.mark.worker
def test_it_gates_a_pipeline_on_a_verdict_against_the_baseline(
    lab: dict[str, Any], worker: Any, live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    token = ci_token(django_user_model)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    first = run_client(live_server.url, token, "--file", str(campaign_file(tmp_path)), "--name", "fio-base")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "no baseline" in first.stdout + first.stderr
    base = Campaign.objects.get(name="fio-base")
    assert base.status == CampaignStatus.SUCCEEDED and base.team is not None and base.team.name == "storage"
    baseline = subprocess.run(
        ["curl", "-sf", "-X", "POST", "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
         "-d", f'{{"campaign": {base.pk}}}', f"{live_server.url}/api/v1/baselines/"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert baseline.returncode == 0, baseline.stdout + baseline.stderr

    junit = ARTIFACTS / "ci-pass.xml"
    same = run_client(live_server.url, token, "--file", str(campaign_file(tmp_path)), "--name", "fio-same",
                      "--threshold", "50", "--junit", str(junit))  # fmt: skip
    assert same.returncode == 0, same.stdout + same.stderr
    judged = cases(junit)
    assert judged == {"bw_bytes at rw=read": [], "iops at rw=read": []}
    assert "overall: pass" in same.stdout

    # The same campaign on a "regressed" system: 4 MB/s instead of 40 (on a smaller file, to keep it short).
    junit = ARTIFACTS / "ci-regression.xml"
    slow = run_client(live_server.url, token, "--file", str(campaign_file(tmp_path, rate="4m", size="8M")),
                      "--name", "fio-slow", "--threshold", "50", "--junit", str(junit))  # fmt: skip
    assert slow.returncode == 1, slow.stdout + slow.stderr
    judged = cases(junit)
    assert judged == {"bw_bytes at rw=read": ["failure"], "iops at rw=read": ["failure"]}
    failure = ET.parse(junit).getroot().find(".//failure")
    assert failure is not None and "worse" in (failure.get("message") or "")
    assert "regression" in slow.stdout and "fio-slow" in slow.stdout
    verdict = Campaign.objects.get(name="fio-slow").verdicts.first()
    assert verdict is not None and verdict.outcome == "regression" and verdict.baseline_campaign == base


@pytest.mark.lab
@pytest.mark.worker
def test_it_answers_a_failed_pipeline_with_exit_code_2(
    lab: dict[str, Any], worker: Any, live_server: Any, django_user_model: Any, tmp_path: Path
) -> None:
    token = ci_token(django_user_model)
    path = campaign_file(tmp_path)
    path.write_text(path.read_text().replace("lab1", "no-such-node"))
    result = run_client(live_server.url, token, "--file", str(path))
    assert result.returncode == 2
    assert "no node named 'no-such-node'" in result.stderr
    wrong = run_client(live_server.url, "rbk_abc_def", "--file", str(path))
    assert wrong.returncode == 2 and "invalid, expired or revoked token" in wrong.stderr


def test_it_never_answers_5xx_to_schemathesis(
    live_server: Any, django_user_model: Any, transactional_db: None, settings: Any
) -> None:
    """Fuzz every operation of the live schema (positive and negative inputs) as a token with launch scope."""
    # Unthrottled: at the API's rate most operations answered 429 before their view ran, proving nothing about them.
    unthrottled = {"user": "1000000/minute", "anon": "1000000/minute"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": unthrottled}
    token = ci_token(django_user_model)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run", f"{live_server.url}/api/v1/schema/",
         "--url", live_server.url, "--checks", "not_a_server_error", "--header", f"Authorization: Bearer {token}",
         "--max-examples", "8", "--seed", "1", "--phases", "examples,coverage,fuzzing", "--workers", "1",
         "--generation-database", "none", "--request-timeout", "20", "--max-time", "100"],
        capture_output=True, text=True, timeout=400, cwd=ARTIFACTS,
    )  # fmt: skip
    (ARTIFACTS / "schemathesis.log").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
