"""The dashboard at /: running campaigns with progress and ETA, recent results, nodes by status, failures."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from campaigns.models import Campaign, CampaignStatus, Run, RunStatus
from campaigns.services import campaign_apply, campaign_launch
from inventory.models import NodeStatus
from inventory.services import node_upsert

HX = {"HX-Request": "true"}
URL = "/"


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def fio(name: str, team: Any, nodes: list[str]) -> dict[str, Any]:
    return {"name": name, "kind": "fio", "nodes": nodes, "fixed": {"bs": "4k", "size": "1M"},
            "matrix": {"rw": ["read", "randread"]}, "repetitions": 2}  # fmt: skip


def running_campaign(name: str, team: Any, *, finished: int = 0, failed: int = 0) -> Campaign:
    """A launched campaign of 4 runs, ``finished`` of them succeeded in 10 s each, ``failed`` failed."""
    campaign = campaign_launch(campaign=campaign_apply(data=fio(name, team, ["n1"]), team=team))
    now = timezone.now()
    runs = list(campaign.runs.order_by("sequence"))
    for run in runs[:finished]:
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED, started_at=now - timedelta(seconds=10),
                                             finished_at=now)  # fmt: skip
    for run in runs[finished : finished + failed]:
        Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, started_at=now, finished_at=now,
                                             error=f"lab1: exited with code 1: {name} broke")  # fmt: skip
    return campaign


@pytest.fixture
def nodes(team: Any) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    node_upsert(name="n2", address="10.0.0.2", team=team, status=NodeStatus.MAINTENANCE)
    node_upsert(name="red1", address="10.9.0.1", team=None)


@pytest.mark.django_db
def test_it_sends_anonymous_users_to_the_login_page(client: Client) -> None:
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_shows_empty_states_on_a_fresh_install(member: Any) -> None:
    html = signed_in(member).get(URL).content.decode()
    assert "Nothing is running" in html and "No campaign has finished yet" in html and "No failed runs" in html
    assert "hx-trigger" not in html  # nothing runs: nothing polls
    assert 'href="/"' in html and reverse("campaigns:campaign-list") == "/campaigns/"


@pytest.mark.django_db
def test_it_shows_running_campaigns_with_progress_and_eta(owner: Any, member: Any, team: Any, nodes: None) -> None:
    running_campaign("blue-run", team, finished=1)
    html = signed_in(member).get(URL).content.decode()
    assert "blue-run" in html and 'data-done="1" data-total="4"' in html
    assert "30.0 s" in html  # 10 s per run measured x 3 runs left
    assert 'hx-get="/" hx-trigger="every 2s"' in html
    assert "team <strong>blue</strong>" in html  # the header names the user's team


@pytest.mark.django_db
def test_it_says_the_eta_is_unknown_before_a_run_has_ended(member: Any, team: Any, nodes: None) -> None:
    running_campaign("blue-run", team)
    assert "unknown" in signed_in(member).get(URL).content.decode()


@pytest.mark.django_db
def test_it_lists_recent_failures_with_their_error_and_nodes_by_status(member: Any, team: Any, nodes: None) -> None:
    campaign = running_campaign("blue-run", team, finished=3, failed=1)
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.FAILED, finished_at=timezone.now())
    html = signed_in(member).get(URL).content.decode()
    assert "blue-run broke" in html and "Recent failures" in html
    assert f'{reverse("inventory:node-list")}?status=maintenance">1 node<' in html
    assert f'{reverse("inventory:node-list")}?status=active">2 nodes<' in html  # n1 and the shared red1
    assert "Nothing is running" in html and 'class="badge status-failed">Failed' in html


@pytest.mark.django_db
def test_it_hides_another_teams_campaigns_and_failures(outsider: Any, team: Any, nodes: None) -> None:
    running_campaign("blue-secret", team, finished=1, failed=1)
    html = signed_in(outsider).get(URL).content.decode()
    assert "blue-secret" not in html and "broke" not in html
    assert f'{reverse("inventory:node-list")}?status=active">1 node<' in html  # only the shared node


@pytest.mark.django_db
def test_its_live_partial_polls_only_while_something_runs(member: Any, team: Any, nodes: None) -> None:
    campaign = running_campaign("blue-run", team)
    client = signed_in(member)
    response = client.get(URL, headers=HX)
    html = response.content.decode()
    assert "<html" not in html and 'id="dashboard-live"' in html and 'hx-trigger="every 2s"' in html
    assert "HX-Refresh" not in response
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.SUCCEEDED)
    response = client.get(URL, headers=HX)
    assert "hx-trigger" not in response.content.decode() and response["HX-Refresh"] == "true"


@pytest.mark.django_db
def test_it_reads_the_same_number_of_queries_for_2_or_12_campaigns(
    member: Any, team: Any, nodes: None, django_assert_max_num_queries: Any
) -> None:
    client = signed_in(member)

    def count() -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            assert client.get(URL).status_code == 200
        return len(queries)

    for i in range(2):
        running_campaign(f"c{i}", team, finished=1, failed=1)
    few = count()
    for i in range(2, 12):
        campaign = running_campaign(f"c{i}", team, finished=1, failed=1)
        if i % 2:
            Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.FAILED, finished_at=timezone.now())
    with django_assert_max_num_queries(few):
        client.get(URL)
