"""The live campaign page: progress and ETA, the grid of run statuses, the running run's log, cancel, re-run
failed, clone and download; one real campaign on the lab watched through the page's polled partial."""

from __future__ import annotations

import html
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from campaigns.services import campaign_apply, campaign_launch
from campaigns.templatetags.rackbench import duration, seconds
from inventory.services import node_upsert
from runners import execution, remote, ssh
from tests.conftest import finished, wait_for

HX = {"HX-Request": "true"}


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def fio(name: str = "blue-fio", nodes: tuple[str, ...] = ("n1",), **overrides: Any) -> dict[str, Any]:
    data = {"name": name, "kind": "fio", "nodes": list(nodes), "repetitions": 2,
            "fixed": {"bs": "4k", "size": "1M"}, "matrix": {"rw": ["read", "randread"]}}  # fmt: skip
    return {**data, **overrides}


@pytest.fixture
def campaign(team: Any) -> Campaign:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    return campaign_apply(data=fio(), team=team)


@pytest.fixture
def running(campaign: Campaign) -> Campaign:
    """Launched: run 1 succeeded in 20 s, run 2 failed, run 3 running, run 4 pending."""
    campaign = campaign_launch(campaign=campaign)
    now = timezone.now()
    runs = list(campaign.runs.order_by("sequence"))
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.SUCCEEDED, started_at=now - timedelta(seconds=20),
                                             finished_at=now)  # fmt: skip
    Run.objects.filter(pk=runs[1].pk).update(status=RunStatus.FAILED, error="n1: exited with code 1")
    Run.objects.filter(pk=runs[2].pk).update(status=RunStatus.RUNNING, started_at=now)
    return campaign


def url(campaign: Campaign, name: str = "campaign-detail") -> str:
    return reverse(f"campaigns:{name}", args=[campaign.pk])


@pytest.mark.django_db
def test_it_sends_anonymous_users_to_the_login_page(client: Client, running: Campaign) -> None:
    for response in (client.get(url(running)), client.get(url(running, "campaign-yaml")),
                     client.post(url(running, "campaign-rerun-failed"))):  # fmt: skip
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


@pytest.mark.django_db
def test_it_answers_404_to_another_team(outsider: Any, running: Campaign) -> None:
    client = signed_in(outsider)
    assert client.get(url(running)).status_code == 404
    assert client.get(url(running), headers=HX).status_code == 404
    assert client.get(url(running, "campaign-yaml")).status_code == 404
    assert client.post(url(running, "campaign-rerun-failed")).status_code == 404
    assert client.post(url(running, "campaign-cancel")).status_code == 404
    assert Campaign.objects.get(pk=running.pk).status == CampaignStatus.RUNNING


@pytest.mark.django_db
def test_it_shows_progress_eta_grid_and_the_queue_spot_while_running(member: Any, running: Campaign) -> None:
    page = signed_in(member).get(url(running)).content.decode()
    assert 'id="progress"' in page and 'data-done="2" data-total="4"' in page
    assert "About <strong>40.0 s</strong> left" in page  # 20 s measured x 2 runs left
    assert 'id="run-grid"' in page and 'id="queue"' in page
    runs = list(running.runs.order_by("sequence"))
    for run, status in zip(runs, ["succeeded", "failed", "running", "pending"], strict=True):
        assert f'class="cell status-{status}" href="/runs/{run.pk}/"' in page
    assert ">Cancel</button>" in page and "Re-run failed" not in page and ">Clone</a>" in page
    assert "Running now" in page and f"run {runs[2].sequence}" in page


def test_durations_read_in_seconds_minutes_or_hours() -> None:
    start = timezone.now()
    assert [seconds(s) for s in (4.24, 187, 7500, None, -3)] == ["4.2 s", "3 min 07 s", "2 h 05 min", "—", "0.0 s"]
    assert duration(start, start + timedelta(minutes=3, seconds=7)) == "3 min 07 s" and duration(start, None) == "—"
    assert seconds(timedelta(hours=1)) == "1 h 00 min"


@pytest.mark.django_db
def test_it_says_the_eta_is_unknown_before_the_first_run_ends(member: Any, campaign: Campaign) -> None:
    campaign_launch(campaign=campaign)
    assert "ETA unknown" in signed_in(member).get(url(campaign)).content.decode()


@pytest.mark.django_db
def test_its_partial_polls_only_while_the_campaign_runs(member: Any, running: Campaign) -> None:
    client = signed_in(member)
    response = client.get(url(running), headers=HX)
    partial = response.content.decode()
    assert "<html" not in partial and 'id="run-grid"' in partial and "HX-Refresh" not in response
    assert f'hx-get="{url(running)}" hx-trigger="every 2s"' in partial
    Campaign.objects.filter(pk=running.pk).update(status=CampaignStatus.FAILED, finished_at=timezone.now())
    response = client.get(url(running), headers=HX)
    assert "hx-trigger" not in response.content.decode() and response["HX-Refresh"] == "true"


@pytest.mark.django_db
def test_it_reruns_the_failed_runs_of_a_failed_campaign(owner: Any, running: Campaign) -> None:
    running.runs.filter(status__in=[RunStatus.RUNNING, RunStatus.PENDING]).update(status=RunStatus.SUCCEEDED)
    Campaign.objects.filter(pk=running.pk).update(status=CampaignStatus.FAILED, finished_at=timezone.now())
    client = signed_in(owner)
    page = client.get(url(running)).content.decode()
    assert "Re-run failed</button>" in page and ">Cancel</button>" not in page
    response = client.post(url(running, "campaign-rerun-failed"), follow=True)
    assert "1 run of blue-fio queued again." in response.content.decode()
    running.refresh_from_db()
    assert running.status == CampaignStatus.RUNNING and running.runs.count() == 5
    again = client.post(url(running, "campaign-rerun-failed"), follow=True).content.decode()
    assert "only a finished one re-runs" in again


@pytest.mark.django_db
def test_it_downloads_the_definition_as_yaml(member: Any, campaign: Campaign) -> None:
    response = signed_in(member).get(url(campaign, "campaign-yaml"))
    assert response["Content-Disposition"] == 'attachment; filename="blue-fio.yaml"'
    data = yaml.safe_load(response.content)
    assert data["name"] == "blue-fio" and data["matrix"] == {"rw": ["read", "randread"]}
    page = signed_in(member).get(url(campaign)).content.decode()
    assert url(campaign, "campaign-yaml") in page and f"/campaigns/new/?clone={campaign.pk}" in page


@pytest.mark.django_db
def test_the_campaign_list_reads_as_many_queries_for_2_or_20_campaigns(
    member: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    client = signed_in(member)
    for i in range(2):
        campaign_launch(campaign=campaign_apply(data=fio(f"c{i}"), team=team))
    with CaptureQueriesContext(connection) as few:
        assert client.get(reverse("campaigns:campaign-list")).status_code == 200
    for i in range(2, 20):
        campaign_apply(data=fio(f"c{i}"), team=team)
    with django_assert_max_num_queries(len(few)):
        page = client.get(reverse("campaigns:campaign-list")).content.decode()
    assert "c19" in page


def test_it_pages_the_runs_table_of_a_large_campaign_but_grids_every_run(
    member: Any, team: Any, django_assert_max_num_queries: Any
) -> None:
    node_upsert(name="n1", address="10.0.0.1", team=team)
    campaign = campaign_launch(
        campaign=campaign_apply(data=fio(matrix={"rw": ["read", "write"]}, repetitions=2), team=team)
    )
    client = signed_in(member)
    with CaptureQueriesContext(connection) as small:
        assert client.get(url(campaign)).status_code == 200
    big = campaign_launch(
        campaign=campaign_apply(
            data=fio("big", matrix={"rw": ["read", "write"], "iodepth": list(range(1, 31))}, repetitions=2), team=team
        )
    )
    runs = list(big.runs.order_by("sequence"))
    Result.objects.bulk_create(Result(run=r, name="bw_bytes", value=r.sequence, unit="B/s") for r in runs)
    with django_assert_max_num_queries(len(small) + 2):  # the pager counts the runs: as many queries for 120 runs
        first = client.get(url(big)).content.decode()
    assert first.count('class="cell status-') == 120  # the grid shows every run
    assert "Runs 1–50 of 120" in first and 'rel="next"' in first
    last = client.get(url(big) + "?page=3").content.decode()
    assert "Runs 101–120 of 120" in last and 'rel="prev"' in last
    assert f'href="{reverse("campaigns:run-detail", args=[runs[119].pk])}"' in last
    partial = client.get(url(big) + "?page=3", headers=HX).content.decode()
    assert f'hx-get="{url(big)}?page=3"' in partial  # polling keeps the page being read
    assert client.get(url(big) + "?page=nonsense").status_code == 200  # a bad page number reads page 1


@pytest.mark.lab
@pytest.mark.worker
def test_it_watches_a_real_campaign_on_the_lab_until_done(lab: dict[str, Any], worker: Any, owner: Any) -> None:
    """Built and launched in the builder, watched through the polled partial: progress moves, polling stops."""
    definition = yaml.safe_dump(fio("page-lab", ("lab1",), repetitions=1, timeout=120,
                                    fixed={"bs": "64k", "size": "4M", "runtime": 2, "time_based": 1}))  # fmt: skip
    client = signed_in(owner)
    response = client.post(reverse("campaigns:campaign-new"), {"definition": definition, "launch": "1"})
    campaign = Campaign.objects.get(name="page-lab")
    assert response["Location"] == url(campaign) and campaign.status == CampaignStatus.RUNNING

    def live() -> str | None:
        partial = html.unescape(client.get(url(campaign), headers=HX).content.decode())
        return partial if "Running now" in partial else None

    partial = wait_for(live, timeout=60, what="a run to be active on the campaign page")
    assert 'hx-trigger="every 2s"' in partial and 'id="progress"' in partial
    assert "could not be read" not in partial
    finished(campaign, timeout=120)
    assert campaign.status == CampaignStatus.SUCCEEDED, list(campaign.runs.values_list("error", flat=True))
    response = client.get(url(campaign), headers=HX)
    partial = response.content.decode()
    assert response["HX-Refresh"] == "true" and "hx-trigger" not in partial
    assert 'data-done="2" data-total="2"' in partial and partial.count('class="cell status-succeeded"') == 2
    page = client.get(url(campaign)).content.decode()
    assert "Ended" in page and "read_bw_bytes" in page


@pytest.mark.lab
@pytest.mark.worker
def test_the_page_shows_the_running_runs_output_as_the_worker_read_it(
    lab: dict[str, Any], worker: Any, owner: Any
) -> None:
    """The poll task reads the output's end while the page is open; the page itself never opens SSH."""
    data = fio("live-log", ("lab1",), repetitions=1, matrix={"rw": ["read"]},
               fixed={"bs": "4k", "size": "4M", "runtime": 60, "time_based": 1})  # fmt: skip
    campaign = campaign_launch(campaign=campaign_apply(data=data))
    run = campaign.runs.get()
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.RUNNING, what="the run to be running")
    client = signed_in(owner)
    marker = f"progress line {run.uid}"
    stdout = Path(run.hosts.get().remote_dir) / "stdout"  # the lab node's directory is local
    # Running means submitted: the job starts at its start instant, and its launcher's "> stdout" truncates the file
    # then (a line appended before that was lost, or left a file the job could not write).
    wait_for(stdout.exists, what="the job to start and open its stdout")
    with open(stdout, "a") as out:
        out.write(f"{marker}\n")

    def shown() -> str | None:
        with mock.patch("runners.remote.pool", side_effect=AssertionError("the web process opened SSH")):
            partial = html.unescape(client.get(url(campaign), headers=HX).content.decode())
        return partial if marker in partial else None

    partial = wait_for(shown, timeout=90, what="the output line to reach the page")
    assert "last lines of the output on lab1, read at" in partial
    assert Run.objects.get(pk=run.pk).live_log["host"] == "lab1"
    services.campaign_cancel(campaign=campaign)
    assert finished(campaign).status == CampaignStatus.CANCELLED


def test_a_run_nobody_watches_has_no_output_read_for_the_page(owner: Any, running: Campaign) -> None:
    run = running.runs.get(status=RunStatus.RUNNING)
    unreachable = remote.Target(ssh.Endpoint(address="192.0.2.1", port=22, username="root"), None)
    host = execution.RunTarget(run.hosts.get(), unreachable)

    execution.store_live_log(run, host.target, host)  # nobody watches: the host is not asked (it is unreachable)
    assert Run.objects.get(pk=run.pk).live_log == {}
    signed_in(owner).get(url(running), headers=HX)
    assert Run.objects.get(pk=run.pk).live_log_wanted_at is not None
