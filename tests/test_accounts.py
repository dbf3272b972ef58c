"""Teams and API tokens: the services, the tokens page, the admin, the commands; and team-scoped pages."""

from __future__ import annotations

import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.core.management import CommandError, call_command
from django.test import Client

from accounts.models import ApiToken, TokenScope
from accounts.services import AccountError, digest, token_authenticate, token_create, token_expires_at
from campaigns.services import campaign_apply
from inventory.services import node_upsert


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_it_stores_only_the_digest_of_a_token(owner: Any, team: Any) -> None:
    issued = token_create(user=owner, team=team, name="ci", scope=TokenScope.LAUNCH)
    row = ApiToken.objects.get()
    assert row.digest == digest(issued.secret) and issued.secret not in str(row.__dict__)
    assert token_authenticate(secret=issued.secret) == row
    assert token_authenticate(secret=issued.secret + "x") is None


@pytest.mark.django_db
def test_it_refuses_a_token_for_a_team_the_user_is_not_in(owner: Any, outsider: Any, team: Any) -> None:
    with pytest.raises(AccountError, match="not a member of team blue"):
        token_create(user=outsider, team=team, name="sneaky")
    with pytest.raises(AccountError, match="scope must be one of"):
        token_create(user=owner, team=team, name="x", scope="admin")


@pytest.mark.django_db
def test_it_creates_a_token_on_the_page_shows_it_once_and_revokes_it(owner: Any) -> None:
    client = signed_in(owner)
    page = client.post("/accounts/tokens/", {"name": "nightly", "team": owner.teams.get().pk, "scope": "launch",
                                             "expires_days": "30"})  # fmt: skip
    assert page.status_code == 200
    secret = re.search(r"rbk_[0-9a-f]{12}_[\w-]+", page.content.decode())
    assert secret is not None and token_authenticate(secret=secret.group(0)) is not None
    listing = client.get("/accounts/tokens/").content.decode()
    assert "nightly" in listing and secret.group(0) not in listing
    token = ApiToken.objects.get()
    client.post(f"/accounts/tokens/{token.pk}/revoke/")
    assert token_authenticate(secret=secret.group(0)) is None


@pytest.mark.django_db
def test_it_lets_nobody_revoke_another_users_token(owner: Any, outsider: Any, team: Any) -> None:
    token = token_create(user=owner, team=team, name="ci").token
    assert signed_in(outsider).post(f"/accounts/tokens/{token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get().revoked_at is None


@pytest.mark.django_db
def test_it_shows_the_form_errors_instead_of_creating_a_bad_token(owner: Any) -> None:
    page = signed_in(owner).post("/accounts/tokens/", {"name": "", "team": "999", "scope": "root"})
    assert page.status_code == 200 and ApiToken.objects.count() == 0
    assert "errorlist" in page.content.decode()


@pytest.mark.django_db
def test_it_manages_teams_and_tokens_from_the_command_line(django_user_model: Any) -> None:
    django_user_model.objects.create_user("ci-bot")
    out = io.StringIO()
    call_command("team", "create", "storage", stdout=out)
    call_command("team", "add", "storage", "ci-bot", stdout=out)
    call_command("token", "create", "--user", "ci-bot", "--team", "storage", "--scope", "launch", "--name", "ci",
                 "--expires-days", "7", stdout=out)  # fmt: skip
    secret = out.getvalue().strip().splitlines()[-1]
    token = token_authenticate(secret=secret)
    assert token is not None and token.scope == "launch" and token.expires_at is not None
    call_command("token", "revoke", token.prefix, stdout=out)
    assert token_authenticate(secret=secret) is None
    with pytest.raises(CommandError, match="already exists"):
        call_command("team", "create", "storage", stdout=out)
    with pytest.raises(CommandError, match="no team 'nope'"):
        call_command("token", "create", "--user", "ci-bot", "--team", "nope", "--name", "x", stdout=out)


@pytest.mark.django_db
def test_it_creates_a_token_in_the_admin_and_shows_the_secret_once(admin_client: Any, owner: Any, team: Any) -> None:
    response = admin_client.post("/admin/accounts/apitoken/add/", {"user": owner.pk, "team": team.pk, "name": "ci",
                                                                   "scope": "read"}, follow=True)  # fmt: skip
    assert response.status_code == 200
    secret = re.search(r"rbk_[0-9a-f]{12}_[\w-]+", response.content.decode())
    assert secret is not None and token_authenticate(secret=secret.group(0)) is not None
    token = ApiToken.objects.get()
    entry = LogEntry.objects.get()  # the addition is logged once, for the row that was created
    assert (entry.action_flag, entry.object_id, entry.object_repr) == (ADDITION, str(token.pk), str(token))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("who", "expires_at", "field", "message"),
    [("outsider", None, "team", "outsider is not a member of team blue"),
     ("owner", "2001-01-01 00:00:00", "expires_at", "the expiry must be in the future")],
)  # fmt: skip
def test_the_admin_refuses_a_token_on_its_form_and_logs_nothing(
    admin_client: Any, owner: Any, outsider: Any, team: Any, who: str, expires_at: str | None, field: str,
    message: str,
) -> None:  # fmt: skip
    user = {"owner": owner, "outsider": outsider}[who]
    data = {"user": user.pk, "team": team.pk, "name": "ci", "scope": "read", "expires_at_0": "", "expires_at_1": ""}
    if expires_at:
        data["expires_at_0"], data["expires_at_1"] = expires_at.split()
    response = admin_client.post("/admin/accounts/apitoken/add/", data)
    assert response.status_code == 200  # the form again, not a redirect to the list
    assert response.context["adminform"].form.errors == {field: [message]}
    assert "was added successfully" not in response.content.decode()
    assert not ApiToken.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.django_db
def test_the_page_and_the_command_count_a_tokens_days_alike(owner: Any, team: Any) -> None:
    signed_in(owner).post("/accounts/tokens/", {"name": "page", "team": team.pk, "scope": "read", "expires_days": "30"})
    call_command("token", "create", "--user", "owner", "--team", "blue", "--name", "command", "--expires-days", "30",
                 stdout=io.StringIO())  # fmt: skip
    for token in ApiToken.objects.all():
        assert token.expires_at is not None
        assert abs(token.expires_at - token.created_at - timedelta(days=30)) < timedelta(minutes=1), token.name
    assert ApiToken.objects.count() == 2
    for days in ("0", "3651"):
        with pytest.raises(CommandError, match="a token lasts from 1 to 3650 days"):
            call_command("token", "create", "--user", "owner", "--team", "blue", "--name", "x", "--expires-days", days)
        page = signed_in(owner).post("/accounts/tokens/", {"name": "x", "team": team.pk, "scope": "read",
                                                           "expires_days": days})  # fmt: skip
        assert page.context["form"].errors.keys() == {"expires_days"}
    assert token_expires_at(days=None) is None
    assert ApiToken.objects.count() == 2


@pytest.mark.django_db
def test_it_answers_404_on_pages_of_another_teams_campaign(owner: Any, outsider: Any, team: Any) -> None:
    node = node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "blue-only", "kind": "fio", "nodes": ["n1"], "fixed": {"bs": "4k", "size": "1M"},
            "matrix": {"rw": ["read"]}}  # fmt: skip
    campaign = campaign_apply(data=data, team=team)
    pages = [f"/campaigns/{campaign.pk}/", f"/campaigns/{campaign.pk}/preview/", f"/inventory/nodes/{node.pk}/"]
    for url in pages:
        assert signed_in(owner).get(url).status_code == 200, url
        assert signed_in(outsider).get(url).status_code == 404, url
    assert "blue-only" not in signed_in(outsider).get("/").content.decode()
    assert signed_in(outsider).post(f"/campaigns/{campaign.pk}/launch/").status_code == 404


@pytest.mark.django_db
def test_it_shows_the_verdict_on_the_campaign_page(owner: Any, team: Any) -> None:
    from campaigns import baselines
    from tests.test_api import finished_campaign

    base = finished_campaign("base", team, {"read": [100.0, 100.5], "randread": [50.0, 50.5]}, family="f")
    baselines.baseline_set(campaign=base)
    worse = finished_campaign("worse", team, {"read": [70.0, 70.5], "randread": [50.0, 50.5]}, family="f")
    page = signed_in(owner).get(f"/campaigns/{worse.pk}/").content.decode()
    assert 'verdict-regression">regression' in page and "-29.9 %" in page and "0.00014" in page and ">base</a>" in page


@pytest.mark.django_db
def test_it_exposes_its_own_metrics_for_prometheus(team: Any, settings: Any) -> None:
    from datetime import timedelta

    from django.db.models import F
    from prometheus_client.parser import text_string_to_metric_families

    from tests.test_api import finished_campaign

    campaign = finished_campaign("measured", team, {"read": [1.0], "randread": [2.0]})
    campaign.runs.update(started_at=F("finished_at") - timedelta(seconds=2))
    assert Client().get("/metrics").status_code == 403  # no token set: off, unless opened on purpose
    settings.RACKBENCH = {**settings.RACKBENCH, "METRICS_OPEN": True}
    body = Client().get("/metrics").content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body) for s in family.samples}  # fmt: skip
    assert samples[("rackbench_campaigns", (("status", "succeeded"),))] == 1
    assert samples[("rackbench_runs", (("status", "succeeded"),))] == 2
    assert samples[("rackbench_run_duration_seconds_count", (("kind", "fio"),))] == 2
    assert samples[("rackbench_run_duration_seconds_sum", (("kind", "fio"),))] == 4.0
    assert ("rackbench_queue_depth", (("queue", "ssh"),)) in samples
    settings.RACKBENCH = {**settings.RACKBENCH, "METRICS_TOKEN": "scrape-me"}
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200
