"""Brute force and request floods: login attempts are throttled per user name and address, the API per token and
per user, both configurable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from accounts.services import token_create

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.django_db
def test_fifty_wrong_passwords_lock_the_account_out_even_for_the_right_one(member: Any, settings: Any) -> None:
    browser = Client()
    url = reverse("login")
    answers = [browser.post(url, {"username": "member", "password": f"guess-{i}"}).status_code for i in range(50)]
    assert answers[:4] == [200] * 4 and set(answers[4:]) == {429}  # the 5th failure locks
    right = browser.post(url, {"username": "member", "password": "pw-member-123"})
    assert right.status_code == 429 and "_auth_user_id" not in browser.session
    other = Client(REMOTE_ADDR="10.9.9.9")  # the same name from another address is its own count
    assert other.post(url, {"username": "member", "password": "pw-member-123"}).status_code == 302


@pytest.mark.django_db
def test_a_success_resets_the_count(member: Any) -> None:
    browser = Client()
    url = reverse("login")
    for _ in range(4):
        browser.post(url, {"username": "member", "password": "wrong"})
    assert browser.post(url, {"username": "member", "password": "pw-member-123"}).status_code == 302
    browser.logout()
    for _ in range(4):
        assert browser.post(url, {"username": "member", "password": "wrong"}).status_code == 200


@pytest.mark.django_db
def test_the_api_answers_429_past_the_rate_of_a_token(member: Any, team: Any) -> None:
    from django.core.cache import cache

    api = APIClient()
    issued = token_create(user=member, team=team, name="ci")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    # 236 of the token's 240 requests a minute spent this instant (the throttle's own history: 241 real requests
    # took over a minute on a loaded machine, and the first ones left the window before the last was made)
    cache.set(f"throttle_user_token-{issued.token.pk}", [time.time()] * 236, 60)
    url = "/api/v1/nodes/"
    answers = [api.get(url).status_code for _ in range(5)]
    assert answers == [200] * 4 + [429]
    assert "Retry-After" in api.get(url).headers
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create(user=member, team=team, name='other').secret}")
    assert other.get(url).status_code == 200  # each token has its own budget
    assert APIClient().get(url).status_code == 401


def test_the_rates_come_from_the_environment_and_a_bad_one_stops_the_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RACKBENCH_")}
    env.update(RACKBENCH_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="rackbench.settings")
    code = ("import django; django.setup(); from django.conf import settings as s; "
            "print(s.REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']['user'], s.AXES_FAILURE_LIMIT)")  # fmt: skip

    def start(**extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip

    # The three processes at once: each spends seconds starting Django.
    default, custom, bad = (
        start(),
        start(RACKBENCH_API_RATE="50/hour", RACKBENCH_LOGIN_FAILURES="3"),
        start(RACKBENCH_API_RATE="lots"),
    )
    (default_out, _), (custom_out, _), (_, bad_err) = (p.communicate(timeout=60) for p in (default, custom, bad))
    assert default_out.split() == ["240/minute", "5"]
    assert custom_out.split() == ["50/hour", "3"]
    assert bad.returncode != 0 and "RACKBENCH_API_RATE" in bad_err


@pytest.mark.django_db(transaction=True)
def test_the_ci_client_waits_out_a_429_and_goes_on(live_server: Any, member: Any, team: Any, settings: Any) -> None:
    from django.core.cache import cache

    from clients import rackbench_ci as ci

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {"user": "3/s", "anon": "3/s"}}  # fmt: skip
    notes: list[str] = []
    issued = token_create(user=member, team=team, name="ci")
    api = ci.Api(live_server.url, issued.secret, note=notes.append)
    # The token's budget spent as three requests of this instant would (the throttle's own history, in the cache the
    # live server shares), so the next call is refused however slowly a loaded machine serves requests.
    cache.set(f"throttle_user_token-{issued.token.pk}", [time.time()] * 3, 60)
    answers = [api.call("GET", "/api/v1/presets/") for _ in range(3)]
    assert all(isinstance(a, list) and a for a in answers)
    assert any("429" in n for n in notes), notes
