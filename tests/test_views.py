"""The HTML pages: login required, every page renders, live partials poll only while running, the new-campaign form."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from campaigns.services import campaign_apply, campaign_launch
from inventory.models import Interface, NodeStatus
from inventory.services import node_upsert, storage_upsert

HX = {"HX-Request": "true"}


def fio_data(name: str = "fio-smoke", **overrides: Any) -> dict[str, Any]:
    data = {
        "name": name,
        "kind": "fio",
        "nodes": ["lab1"],
        "fixed": {"bs": "4k", "size": "16M"},
        "matrix": {"rw": ["read", "randread"]},
    }
    return {**data, **overrides}


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="alice", is_staff=True)  # no password: no slow hashing


@pytest.fixture
def browser(client: Any, user: Any) -> Any:
    client.force_login(user)
    return client


@pytest.fixture
def node() -> Any:
    node = node_upsert(
        name="lab1", address="127.0.0.1", ssh_port=2201, tags=["lab"], gpu_model="H100", gpu_count=8, ram_mb=2048
    )
    node.facts = {"kernel": "6.8.0-lab", "os": "Ubuntu 24.04"}
    node.save(update_fields=["facts"])
    Interface.objects.create(node=node, name="eth0", role="storage", speed_mbps=100_000, addresses=["10.0.0.1/24"])
    return node


@pytest.fixture
def campaign(node: Any, user: Any) -> Campaign:
    return campaign_apply(data=fio_data(), owner=user)


@pytest.fixture
def running(campaign: Campaign, user: Any) -> Campaign:
    """A launched campaign; its first run has output, provenance and results as a worker would leave them."""
    campaign = campaign_launch(campaign=campaign, user=user)
    run = campaign.runs.order_by("sequence").first()
    host = run.hosts.get()
    host.command = "cd /home/lab/.rackbench/lab1/run-1 && fio --output-format=json job.fio"
    host.exit_code = 0
    host.stdout = '{"fio version": "fio-3.36"}\n' + "x" * 20_000 + "\nEND-OF-STDOUT"
    host.stderr = "warning: something"
    host.save()
    now = timezone.now()
    run.status = RunStatus.SUCCEEDED
    run.started_at = now
    run.finished_at = now
    flush = {"target": "lab1", "command": "sync; echo 3 > /proc/sys/vm/drop_caches", "at": now.isoformat()}
    run.provenance = {"kernel": "6.8.0-lab", "flush": [{**flush, "seconds": 0.25, "exit_code": 0}]}
    run.save()
    Result.objects.create(run=run, name="read_iops", value=1234.5, unit="IOPS", host="")
    Result.objects.create(run=run, name="read_iops", value=1234.5, unit="IOPS", host="lab1", labels={"job": "0"})
    return campaign


def page_urls(campaign: Campaign) -> list[str]:
    run = campaign.runs.order_by("sequence").first()
    urls = [
        reverse("campaigns:campaign-list"),
        reverse("campaigns:dashboard"),
        reverse("campaigns:campaign-new"),
        reverse("campaigns:campaign-new-fio"),
        reverse("campaigns:campaign-detail", args=[campaign.pk]),
        reverse("campaigns:campaign-yaml", args=[campaign.pk]),
        reverse("campaigns:campaign-preview", args=[campaign.pk]),
        reverse("inventory:node-list"),
        reverse("inventory:node-detail", args=[campaign.nodes.get().pk]),
        reverse("inventory:storage-list"),
    ]
    if run is not None:
        host = run.hosts.get()
        urls += [
            reverse("campaigns:run-detail", args=[run.pk]),
            reverse("campaigns:run-host-log", args=[run.pk, host.pk]),
        ]
    return urls


# --- access ------------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_redirects_anonymous_users_to_the_login_page(client: Any, running: Campaign) -> None:
    login = reverse("login")
    for url in page_urls(running):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(login), url
    for action in ("campaign-launch", "campaign-cancel"):
        response = client.post(reverse(f"campaigns:{action}", args=[running.pk]))
        assert response.status_code == 302
        assert response["Location"].startswith(login)
    assert Campaign.objects.get(pk=running.pk).status == CampaignStatus.RUNNING


@pytest.mark.django_db
def test_it_renders_every_page_for_a_logged_in_user(browser: Any, running: Campaign) -> None:
    storage_upsert(name="lab-local", kind="local", export_path="/srv/bench", flush_command="sync")
    for url in page_urls(running):
        response = browser.get(url)
        assert response.status_code == 200, url


@pytest.mark.django_db
def test_it_renders_every_page_of_a_draft_campaign(browser: Any, campaign: Campaign) -> None:
    for url in page_urls(campaign):
        assert browser.get(url).status_code == 200, url


@pytest.mark.django_db
def test_it_loads_htmx_and_the_stylesheet_from_static_files_only(browser: Any) -> None:
    html = browser.get(reverse("campaigns:campaign-list")).content.decode()
    assert "/static/vendor/htmx.min.js" in html
    assert "/static/rackbench.css" in html
    assert "https://" not in html
    for label in ("Dashboard", "Campaigns", "New campaign", "Nodes", "Storage", "Admin", "alice", "Log out"):
        assert label in html


@pytest.mark.django_db
def test_it_shows_an_empty_state_when_there_is_no_campaign(browser: Any) -> None:
    html = browser.get(reverse("campaigns:campaign-list")).content.decode()
    assert "No campaigns yet" in html
    assert reverse("campaigns:campaign-new") in html
    assert "manage.py campaign apply" in html


@pytest.mark.django_db
def test_it_lists_campaigns_with_their_status_and_progress(browser: Any, running: Campaign) -> None:
    html = browser.get(reverse("campaigns:campaign-list")).content.decode()
    assert "fio-smoke" in html
    assert 'class="badge status-running"' in html
    assert "1 / 2" in html


# --- campaign page -----------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_shows_the_definition_and_only_the_launch_button_of_a_draft(browser: Any, campaign: Campaign) -> None:
    html = browser.get(reverse("campaigns:campaign-detail", args=[campaign.pk])).content.decode()
    assert "randread" in html and "bs=4k" in html and "lab1" in html
    assert reverse("campaigns:campaign-launch", args=[campaign.pk]) in html
    assert reverse("campaigns:campaign-cancel", args=[campaign.pk]) not in html
    assert reverse("campaigns:campaign-preview", args=[campaign.pk]) in html
    assert 'id="campaign-runs"' in html
    assert "hx-trigger" not in html


@pytest.mark.django_db
def test_it_shows_runs_statistics_and_only_the_cancel_button_while_running(browser: Any, running: Campaign) -> None:
    html = browser.get(reverse("campaigns:campaign-detail", args=[running.pk])).content.decode()
    assert reverse("campaigns:campaign-cancel", args=[running.pk]) in html
    assert reverse("campaigns:campaign-launch", args=[running.pk]) not in html
    assert "<html" in html and 'hx-trigger="every 2s"' in html
    assert "read_iops" in html and "1,234 IOPS" in html  # the run's aggregate and the statistics table
    assert "Statistics" in html


@pytest.mark.django_db
def test_it_returns_the_runs_partial_alone_for_htmx_polling_while_running(browser: Any, running: Campaign) -> None:
    url = reverse("campaigns:campaign-detail", args=[running.pk])
    response = browser.get(url, headers=HX)
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html and "<header" not in html and "Statistics" not in html
    assert f'hx-get="{url}" hx-trigger="every 2s" hx-swap="outerHTML"' in html
    assert "HX-Refresh" not in response


@pytest.mark.django_db
def test_it_stops_polling_once_the_campaign_is_not_running(browser: Any, running: Campaign) -> None:
    Campaign.objects.filter(pk=running.pk).update(status=CampaignStatus.SUCCEEDED)
    response = browser.get(reverse("campaigns:campaign-detail", args=[running.pk]), headers=HX)
    html = response.content.decode()
    assert 'id="campaign-runs"' in html and "<html" not in html
    assert "hx-trigger" not in html and "hx-get" not in html
    assert response["HX-Refresh"] == "true"  # one reload brings the buttons and statistics up to date


@pytest.mark.django_db
def test_it_previews_the_exact_command_and_job_file_of_each_point(browser: Any, campaign: Campaign) -> None:
    html = browser.get(reverse("campaigns:campaign-preview", args=[campaign.pk])).content.decode()
    assert "fio" in html and "job.fio" in html
    assert "rw=randread" in html
    assert "Point 1" in html


# --- launch and cancel -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_launches_a_draft_and_refuses_a_second_launch_with_a_message(browser: Any, campaign: Campaign) -> None:
    url = reverse("campaigns:campaign-launch", args=[campaign.pk])
    response = browser.post(url)
    assert response.status_code == 302
    assert response["Location"] == reverse("campaigns:campaign-detail", args=[campaign.pk])
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.RUNNING
    assert campaign.runs.count() == 2
    response = browser.post(url, follow=True)
    assert "already running" in response.content.decode()
    assert campaign.runs.count() == 2


@pytest.mark.django_db
def test_it_accepts_launch_and_cancel_only_as_post(browser: Any, campaign: Campaign) -> None:
    for action in ("campaign-launch", "campaign-cancel"):
        assert browser.get(reverse(f"campaigns:{action}", args=[campaign.pk])).status_code == 405
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.DRAFT


@pytest.mark.django_db
def test_it_cancels_a_running_campaign(browser: Any, running: Campaign) -> None:
    response = browser.post(reverse("campaigns:campaign-cancel", args=[running.pk]))
    assert response.status_code == 302
    running.refresh_from_db()
    assert running.status == CampaignStatus.CANCELLED
    assert not running.runs.filter(status=RunStatus.PENDING).exists()


@pytest.mark.django_db
def test_it_shows_why_a_draft_cannot_be_cancelled(browser: Any, campaign: Campaign) -> None:
    response = browser.post(reverse("campaigns:campaign-cancel", args=[campaign.pk]))
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert messages == ["campaign fio-smoke is draft, not running"]


# --- run page ----------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_shows_a_run_with_its_hosts_provenance_and_results(browser: Any, running: Campaign) -> None:
    run = running.runs.order_by("sequence").first()
    html = browser.get(reverse("campaigns:run-detail", args=[run.pk])).content.decode()
    assert "fio --output-format=json job.fio" in html
    assert "127.0.0.1" in html
    assert "END-OF-STDOUT" in html and '"fio version"' not in html  # a tail of stdout, the start cut off
    assert "warning: something" in html
    assert "drop_caches" in html and "6.8.0-lab" in html
    assert "all hosts" in html and "job=0" in html
    assert reverse("campaigns:run-host-log", args=[run.pk, run.hosts.get().pk]) in html
    assert "hx-trigger" not in html  # succeeded: nothing left to poll


@pytest.mark.django_db
def test_it_polls_the_run_partial_while_the_run_is_not_finished(browser: Any, running: Campaign) -> None:
    run = running.runs.get(sequence=2)
    url = reverse("campaigns:run-detail", args=[run.pk])
    html = browser.get(url, headers=HX).content.decode()
    assert "<html" not in html
    assert f'hx-get="{url}" hx-trigger="every 2s" hx-swap="outerHTML"' in html
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error="exit code 1 on lab1")
    html = browser.get(url, headers=HX).content.decode()
    assert "hx-trigger" not in html and "exit code 1 on lab1" in html


@pytest.mark.django_db
def test_it_serves_the_full_host_log_as_text(browser: Any, running: Campaign) -> None:
    run = running.runs.order_by("sequence").first()
    host = run.hosts.get()
    response = browser.get(reverse("campaigns:run-host-log", args=[run.pk, host.pk]))
    text = response.content.decode()
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert "run-" in response["Content-Disposition"]
    assert text.count("x" * 20_000) == 1 and '"fio version"' in text and "warning: something" in text
    other = running.runs.get(sequence=2)
    assert browser.get(reverse("campaigns:run-host-log", args=[other.pk, host.pk])).status_code == 404


@pytest.mark.django_db
def test_it_explains_a_preview_the_plug_in_cannot_build_instead_of_failing(browser: Any, campaign: Campaign) -> None:
    Campaign.objects.filter(pk=campaign.pk).update(fixed={"bs": "4k", "size": "16M", "group_reporting": "1"})
    response = browser.get(reverse("campaigns:campaign-preview", args=[campaign.pk]))
    assert response.status_code == 200
    assert "The commands cannot be built" in response.content.decode()


@pytest.mark.django_db
def test_it_answers_404_for_an_unknown_run(browser: Any) -> None:
    assert browser.get(reverse("campaigns:run-detail", args=[999])).status_code == 404


# --- the quick fio form -------------------------------------------------------------------------------------------


def form_data(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "web-fio",
        "description": "made in the browser",
        "nodes": ["lab1"],
        "storage": "",
        "repetitions": "3",
        "warmup_runs": "1",
        "timeout": "600",
        "flush_clients": "on",
        "fixed": "bs=4k\nsize=16M\n",
        "matrix": "rw=read, randread\nnumjobs=1,4\n",
        "create": "",
    }
    return {**data, **overrides}


@pytest.mark.django_db
def test_it_creates_a_draft_campaign_from_the_form(browser: Any, node: Any, user: Any) -> None:
    response = browser.post(reverse("campaigns:campaign-new-fio"), form_data())
    campaign = Campaign.objects.get(name="web-fio")
    assert response.status_code == 302
    assert response["Location"] == reverse("campaigns:campaign-detail", args=[campaign.pk])
    assert campaign.status == CampaignStatus.DRAFT
    assert campaign.kind == "fio" and campaign.owner == user
    assert campaign.fixed == {"bs": "4k", "size": "16M"}
    assert campaign.matrix == [["rw", ["read", "randread"]], ["numjobs", [1, 4]]]
    assert (campaign.repetitions, campaign.warmup_runs, campaign.run_timeout_s) == (3, 1, 600)
    assert (campaign.flush_clients, campaign.flush_storage) == (True, False)
    assert [n.name for n in campaign.nodes.all()] == ["lab1"]
    assert not campaign.runs.exists()


@pytest.mark.django_db
def test_it_creates_and_launches_a_campaign_from_the_form(browser: Any, node: Any) -> None:
    data = form_data(launch="")
    del data["create"]
    browser.post(reverse("campaigns:campaign-new-fio"), data)
    campaign = Campaign.objects.get(name="web-fio")
    assert campaign.status == CampaignStatus.RUNNING
    assert campaign.runs.count() == 4 * (3 + 1)


@pytest.mark.django_db
def test_it_offers_only_active_nodes(browser: Any, node: Any) -> None:
    node_upsert(name="lab9", address="127.0.0.9", status=NodeStatus.MAINTENANCE)
    for page in ("campaigns:campaign-new", "campaigns:campaign-new-fio"):
        html = browser.get(reverse(page)).content.decode()
        assert 'value="lab1"' in html and 'value="lab9"' not in html, page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"repetitions": "0"}, "repetitions", "greater than or equal to 1"),
        ({"nodes": ["ghost"]}, "nodes", "ghost is not one of the available choices"),
        ({"nodes": []}, "nodes", "This field is required"),
        ({"matrix": "rw=read,\nrandread"}, "matrix", "has an empty value"),
        ({"matrix": "rw=read\nrandread"}, "matrix", "expected key=v1,v2,v3"),
        ({"matrix": "rw=read,read"}, "matrix", "rw: lists a value twice"),
        ({"matrix": "rw=read,sideways"}, "matrix", "rw: must be one of read, write"),
        ({"matrix": "bs=4k,1M"}, "matrix", "bs: is also set in fixed"),
        ({"fixed": "bs=4k\nbs=1M"}, "fixed", "bs is set twice"),
        ({"fixed": "bs=4k\nsize=$HOME"}, "fixed", "size: "),
        ({"fixed": "bs=4k\nsize=16M\nexec_prerun=reboot"}, "fixed", "exec_prerun"),
        ({"name": "has spaces"}, "name", "letters, digits"),
        ({"flush_storage": "on"}, "flush_storage", "names no storage system"),
    ],
)
def test_it_shows_field_errors_and_creates_nothing_on_bad_input(
    browser: Any, node: Any, overrides: dict[str, Any], field: str, message: str
) -> None:
    response = browser.post(reverse("campaigns:campaign-new-fio"), form_data(**overrides))
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert list(errors) == [field], errors
    assert message in " ".join(errors[field]), errors
    assert message in html.unescape(response.content.decode())
    assert not Campaign.objects.exists()


@pytest.mark.django_db
def test_it_refuses_a_name_already_taken(browser: Any, campaign: Campaign) -> None:
    response = browser.post(reverse("campaigns:campaign-new-fio"), form_data(name="fio-smoke"))
    assert "already exists" in " ".join(response.context["form"].errors["name"])
    assert Campaign.objects.get(name="fio-smoke").fixed == {"bs": "4k", "size": "16M"}


# --- inventory ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_filters_nodes_by_status_tag_and_gpu_model(browser: Any, node: Any) -> None:
    node_upsert(name="old1", address="10.0.0.9", status=NodeStatus.RETIRED, tags=["old"], gpu_model="V100")
    url = reverse("inventory:node-list")

    def names(**params: str) -> set[str]:
        return {n.name for n in browser.get(url, params).context["nodes"]}

    assert names() == {"lab1", "old1"}
    assert names(status="retired") == {"old1"}
    assert names(tag="lab") == {"lab1"}
    assert names(gpu_model="H100") == {"lab1"}
    assert names(gpu_model="H100", status="retired") == set()
    html = browser.get(url).content.decode()
    assert "127.0.0.1:2201" in html and "8 × H100" in html


@pytest.mark.django_db
def test_it_shows_a_node_with_its_facts_and_interfaces(browser: Any, node: Any) -> None:
    html = browser.get(reverse("inventory:node-detail", args=[node.pk])).content.decode()
    assert "eth0" in html and "10.0.0.1/24" in html
    assert "&quot;kernel&quot;: &quot;6.8.0-lab&quot;" in html


def test_a_non_staff_user_can_log_in_through_the_login_page(client: Any, django_user_model: Any) -> None:
    django_user_model.objects.create_user("engineer", password="pw-engineer-123")

    response = client.post(reverse("login"), {"username": "engineer", "password": "pw-engineer-123"}, follow=True)

    assert response.status_code == 200 and response.wsgi_request.user.username == "engineer"
    assert client.get("/").status_code == 200
