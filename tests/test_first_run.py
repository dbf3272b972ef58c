"""A newcomer's first run: the demo login can make an API token at once, the token form chooses the only team,
an administrator in no team is told how to get one, and scripts/demo prints no traceback or broker warning."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from accounts.models import Membership, Team

ROOT = Path(__file__).resolve().parent.parent


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_demo_user_is_an_admin_of_a_team_and_is_told_how_to_make_a_token(django_user_model: Any) -> None:
    out = io.StringIO()
    call_command("demo_user", stdout=out)
    demo = django_user_model.objects.get(username="demo")
    assert demo.is_superuser
    assert Membership.objects.get(user=demo, team__name="demo").role == Membership.Role.ADMIN
    assert "manage.py token create --user demo --team demo" in out.getvalue()
    page = signed_in(demo).get("/accounts/tokens/").content.decode()
    assert "Create token" in page and "ask an administrator" not in page
    created = signed_in(demo).post("/accounts/tokens/", {"name": "ci", "team": Team.objects.get(name="demo").pk,
                                                         "scope": "launch", "expires_days": "30"})  # fmt: skip
    assert 'id="token-secret"' in created.content.decode()


@pytest.mark.django_db
def test_the_demo_user_command_is_idempotent_and_mends_a_demo_user_in_no_team(django_user_model: Any) -> None:
    django_user_model.objects.create_superuser("demo", "demo@localhost", "x")  # made by an older demo
    call_command("demo_user", stdout=io.StringIO())
    call_command("demo_user", stdout=io.StringIO())
    assert Membership.objects.filter(user__username="demo").count() == 1 and Team.objects.count() == 1


@pytest.mark.django_db
def test_the_token_form_chooses_the_only_team(owner: Any, team: Any) -> None:
    page = signed_in(owner).get("/accounts/tokens/").content.decode()
    select = re.search(r'<select name="team"[^>]*>(.*?)</select>', page, re.S)
    assert select is not None
    assert "---------" not in select.group(1)
    assert re.search(rf'<option value="{team.pk}" selected>', select.group(1))


@pytest.mark.django_db
def test_a_superuser_in_no_team_is_shown_how_to_make_one(django_user_model: Any) -> None:
    root = django_user_model.objects.create_superuser("root", "root@localhost", "x")
    page = signed_in(root).get("/accounts/tokens/").content.decode()
    assert "ask an administrator" not in page
    assert 'href="/admin/accounts/team/add/"' in page and "manage.py team add TEAM root --role admin" in page


@pytest.mark.django_db
def test_a_member_in_no_team_is_told_to_ask_an_administrator(outsider: Any) -> None:
    outsider.memberships.all().delete()
    page = signed_in(outsider).get("/accounts/tokens/").content.decode()
    assert "ask an administrator to add you" in page and "/admin/accounts/team/add/" not in page


def test_the_demo_scripts_status_helper_prints_nothing_for_a_campaign_not_applied_yet() -> None:
    """scripts/demo asks for the demo campaign's status before applying it: no traceback then."""
    helper = next(line for line in (ROOT / "scripts/demo").read_text().splitlines() if line.startswith("status()"))
    script = (
        f'set -euo pipefail; py={sys.executable}; demo=no-such-campaign-for-the-helper; {helper}; echo "[$(status)]"'
    )
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr and "JSONDecodeError" not in done.stderr, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_default_filesystem_queue_connects_without_kombus_hostname_warning(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CELERY_BROKER_URL"}
    env["RACKBENCH_DATA_DIR"] = str(tmp_path)
    code = (
        "import logging, django; logging.basicConfig(); django.setup();"
        "from rackbench.celery import app; conn = app.connection_for_write(); conn._info(); print(conn.transport_cls)"
    )
    env["DJANGO_SETTINGS_MODULE"] = "rackbench.settings"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    assert done.stdout.strip() == "filesystem"
    assert "No hostname was supplied" not in done.stderr, done.stderr
