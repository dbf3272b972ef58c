"""The inventory admin: pages, the write-only credential key, host keys, fact collection and node import."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpRequest
from django.test import Client
from django.urls import reverse

from inventory import selectors, services
from inventory.crypto import decrypt
from inventory.models import Credential, HostKey, Interface, Node, Site, StorageSystem, Tag

pytestmark = pytest.mark.django_db

MODELS = ["site", "tag", "credential", "node", "storagesystem", "hostkey"]


def openssh_ed25519_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    return pem.decode()


def key_body(private_key: str) -> list[str]:
    """The base64 lines of a PEM-armoured key: what must never appear in a page or in the database."""
    return [line for line in private_key.splitlines() if line and not line.startswith("-----")]


@pytest.fixture
def inventory() -> dict[str, Any]:
    site = Site.objects.create(name="dc1")
    credential = services.credential_create(name="ops", username="root", private_key=openssh_ed25519_key())
    node = services.node_upsert(
        name="gpu01", address="10.0.0.11", site=site, credential=credential, tags=["a100"], gpu_model="NVIDIA A100"
    )
    services.node_store_facts(node=node, facts={"hostname": "gpu01.example", "gpus": [{"name": "NVIDIA A100"}]})
    Interface.objects.create(node=node, name="ib0", role="fabric", speed_mbps=200000)
    storage = StorageSystem.objects.create(name="nfs1", kind="nfs", site=site)
    hostkey = services.hostkey_pin(
        address="10.0.0.11", port=22, key_type="ssh-ed25519", key_base64="AAAAC3NzaC1lZDI1NTE5AAAAIO" + "A" * 42
    )
    return {"site": site, "credential": credential, "node": node, "storage": storage, "hostkey": hostkey}


# --- pages -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_every_changelist_loads(admin_client: Client, inventory: dict[str, Any], model: str) -> None:
    response = admin_client.get(reverse(f"admin:inventory_{model}_changelist"))
    assert response.status_code == 200


@pytest.mark.parametrize("model", [m for m in MODELS if m != "hostkey"])
def test_every_add_form_loads(admin_client: Client, model: str) -> None:
    assert admin_client.get(reverse(f"admin:inventory_{model}_add")).status_code == 200


def test_every_change_page_loads(admin_client: Client, inventory: dict[str, Any]) -> None:
    for model, obj in [("site", inventory["site"]), ("credential", inventory["credential"]),
                       ("node", inventory["node"]), ("storagesystem", inventory["storage"]),
                       ("hostkey", inventory["hostkey"]), ("tag", Tag.objects.get(name="a100"))]:  # fmt: skip
        response = admin_client.get(reverse(f"admin:inventory_{model}_change", args=[obj.pk]))
        assert response.status_code == 200, model


def test_the_node_page_shows_discovered_facts_read_only(admin_client: Client, inventory: dict[str, Any]) -> None:
    response = admin_client.get(reverse("admin:inventory_node_change", args=[inventory["node"].pk]))
    page = response.content.decode()
    assert "&quot;hostname&quot;: &quot;gpu01.example&quot;" in page
    assert 'name="facts"' not in page and 'name="facts_collected_at"' not in page
    assert 'name="interfaces-0-name"' in page


def test_the_node_list_filters_by_gpu_model_and_tag(admin_client: Client, inventory: dict[str, Any]) -> None:
    services.node_upsert(name="cpu01", address="10.0.0.50")
    url = reverse("admin:inventory_node_changelist")
    for query in [{"gpu_model": "NVIDIA A100"}, {"tags__id__exact": Tag.objects.get().pk}, {"status": "active"}]:
        response = admin_client.get(url, query)
        page = response.content.decode()
        assert response.status_code == 200 and "gpu01" in page, query
        assert ("cpu01" in page) == ("status" in query), query
    assert "cpu01" in admin_client.get(url, {"q": "cpu01"}).content.decode()


def test_the_node_list_selector_prefetches_tags(inventory: dict[str, Any], django_assert_num_queries: Any) -> None:
    services.node_upsert(name="cpu01", address="10.0.0.50", status="maintenance", tags=["cpu", "rack-2"])
    with django_assert_num_queries(2):  # nodes (with site and credential), then all their tags
        tags = {node.name: sorted(t.name for t in node.tags.all()) for node in selectors.node_list()}
    assert tags == {"cpu01": ["cpu", "rack-2"], "gpu01": ["a100"]}
    assert [s.name for s in selectors.storage_list()] == ["nfs1"]


# --- credentials -----------------------------------------------------------------------------------


def test_adding_a_credential_stores_the_key_encrypted(admin_client: Client) -> None:
    private_key = openssh_ed25519_key()

    response = admin_client.post(
        reverse("admin:inventory_credential_add"), {"name": "lab", "username": "bench", "private_key": private_key}
    )

    assert response.status_code == 302
    credential = Credential.objects.get(name="lab")
    assert credential.username == "bench"
    assert not any(line in credential.private_key_encrypted for line in key_body(private_key))
    assert decrypt(credential.private_key_encrypted) == private_key.strip() + "\n"
    assert credential.public_key.startswith("ssh-ed25519 ") and credential.fingerprint.startswith("SHA256:")


def test_the_change_page_never_shows_the_private_key(admin_client: Client) -> None:
    private_key = openssh_ed25519_key()
    credential = services.credential_create(name="lab", username="bench", private_key=private_key)

    page = admin_client.get(reverse("admin:inventory_credential_change", args=[credential.pk])).content.decode()

    assert not any(line in page for line in key_body(private_key))
    assert credential.private_key_encrypted not in page
    assert credential.fingerprint in page and credential.public_key.split()[1] in page


def test_a_blank_key_on_change_keeps_the_current_key(admin_client: Client) -> None:
    private_key = openssh_ed25519_key()
    credential = services.credential_create(name="lab", username="bench", private_key=private_key)
    url = reverse("admin:inventory_credential_change", args=[credential.pk])

    response = admin_client.post(url, {"name": "lab-renamed", "username": "ops", "private_key": ""})

    assert response.status_code == 302
    credential.refresh_from_db()
    assert (credential.name, credential.username) == ("lab-renamed", "ops")
    assert decrypt(credential.private_key_encrypted) == private_key.strip() + "\n"


def test_a_new_key_on_change_replaces_key_and_fingerprint(admin_client: Client) -> None:
    credential = services.credential_create(name="lab", username="bench", private_key=openssh_ed25519_key())
    old_fingerprint = credential.fingerprint
    new_key = openssh_ed25519_key()

    admin_client.post(
        reverse("admin:inventory_credential_change", args=[credential.pk]),
        {"name": "lab", "username": "bench", "private_key": new_key},
    )

    credential.refresh_from_db()
    assert credential.fingerprint != old_fingerprint
    assert decrypt(credential.private_key_encrypted) == new_key.strip() + "\n"


def test_an_unreadable_key_is_a_clear_form_error(admin_client: Client) -> None:
    response = admin_client.post(
        reverse("admin:inventory_credential_add"),
        {"name": "lab", "username": "bench", "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nnonsense\n"},
    )

    assert response.status_code == 200
    assert "not a private key paramiko can read" in response.content.decode()
    assert not Credential.objects.exists()


def test_a_key_posted_with_another_error_is_not_echoed_back(admin_client: Client, inventory: dict[str, Any]) -> None:
    private_key = openssh_ed25519_key()

    response = admin_client.post(
        reverse("admin:inventory_credential_add"), {"name": "ops", "username": "bench", "private_key": private_key}
    )

    page = response.content.decode()
    assert response.status_code == 200 and "Credential with this Name already exists." in page
    assert not any(line in page for line in key_body(private_key))


def test_a_new_credential_needs_a_key(admin_client: Client) -> None:
    response = admin_client.post(reverse("admin:inventory_credential_add"), {"name": "lab", "username": "bench"})
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    assert not Credential.objects.exists()


# --- host keys -------------------------------------------------------------------------------------


def test_host_keys_cannot_be_added_or_edited(admin_client: Client, inventory: dict[str, Any]) -> None:
    hostkey = inventory["hostkey"]
    assert admin_client.get(reverse("admin:inventory_hostkey_add")).status_code == 403
    url = reverse("admin:inventory_hostkey_change", args=[hostkey.pk])
    admin_client.post(url, {"address": "10.6.6.6", "port": 22, "key_type": "ssh-rsa", "key_base64": "x"})
    hostkey.refresh_from_db()
    assert (hostkey.address, hostkey.key_type) == ("10.0.0.11", "ssh-ed25519")


def test_deleting_a_host_key_forgets_it(admin_client: Client, inventory: dict[str, Any]) -> None:
    url = reverse("admin:inventory_hostkey_delete", args=[inventory["hostkey"].pk])
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert not HostKey.objects.exists()


def test_host_keys_can_be_forgotten_in_bulk(admin_client: Client, inventory: dict[str, Any]) -> None:
    services.hostkey_pin(
        address="10.0.0.12", port=22, key_type="ssh-ed25519", key_base64="AAAAC3NzaC1lZDI1NTE5AAAAIB" + "B" * 42
    )
    response = admin_client.post(
        reverse("admin:inventory_hostkey_changelist"),
        {
            "action": "delete_selected",
            "_selected_action": list(HostKey.objects.values_list("pk", flat=True)),
            "post": "yes",
        },
    )
    assert response.status_code == 302
    assert not HostKey.objects.exists()


# --- collecting facts ------------------------------------------------------------------------------


def test_collect_facts_queues_one_task_per_selected_node_after_commit(
    admin_client: Client, inventory: dict[str, Any], django_capture_on_commit_callbacks: Any
) -> None:
    other = services.node_upsert(name="gpu02", address="10.0.0.12")
    selected = {"action": "collect_facts", "_selected_action": [inventory["node"].pk, other.pk]}
    with (
        mock.patch("runners.tasks.collect_facts_task.delay") as delay,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = admin_client.post(reverse("admin:inventory_node_changelist"), selected, follow=True)
    assert sorted(call.args[0] for call in delay.call_args_list) == sorted([inventory["node"].pk, other.pk])
    assert "Queued fact collection for 2 node(s)." in response.content.decode()


@pytest.mark.parametrize(("codenames", "allowed"), [(["view_node"], False), (["view_node", "change_node"], True)])
def test_the_admin_and_the_node_page_let_the_same_staff_collect_facts(
    client: Client, inventory: dict[str, Any], django_user_model: Any, django_capture_on_commit_callbacks: Any,
    codenames: list[str], allowed: bool,
) -> None:  # fmt: skip
    node = inventory["node"]  # shared (no team): only staff who may change nodes change it
    user = django_user_model.objects.create_user("ops", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="inventory", codename__in=codenames))
    client.force_login(user)
    with django_capture_on_commit_callbacks() as from_admin:
        client.post(
            reverse("admin:inventory_node_changelist"), {"action": "collect_facts", "_selected_action": [node.pk]}
        )
    with django_capture_on_commit_callbacks() as from_page:
        client.post(reverse("inventory:node-collect-facts", args=[node.pk]))
    page = client.get(reverse("inventory:node-detail", args=[node.pk])).content.decode()
    assert (len(from_admin), len(from_page), "Collect facts</button>" in page) == (int(allowed), int(allowed), allowed)


# --- importing nodes -------------------------------------------------------------------------------


def test_the_node_list_links_to_the_import_page(admin_client: Client) -> None:
    page = admin_client.get(reverse("admin:inventory_node_changelist")).content.decode()
    assert reverse("admin:inventory_node_import") in page
    response = admin_client.get(reverse("admin:inventory_node_import"))
    assert response.status_code == 200 and 'enctype="multipart/form-data"' in response.content.decode()


def test_importing_pasted_csv_creates_the_nodes(admin_client: Client, inventory: dict[str, Any]) -> None:
    text = "name,address,credential,tags\ngpu10,10.0.0.10,ops,a100;new\ngpu11,10.0.0.11,,\n"

    response = admin_client.post(reverse("admin:inventory_node_import"), {"fmt": "csv", "text": text}, follow=True)

    assert "Imported 2 node(s)." in response.content.decode()
    assert Node.objects.get(name="gpu10").credential == inventory["credential"]
    assert Node.objects.filter(name__in=["gpu10", "gpu11"]).count() == 2


def test_importing_an_uploaded_yaml_file_creates_the_nodes(admin_client: Client) -> None:
    upload = SimpleUploadedFile("nodes.yaml", b"- name: gpu20\n  address: 10.0.0.20\n  gpu_count: 4\n")

    response = admin_client.post(reverse("admin:inventory_node_import"), {"fmt": "yaml", "file": upload})

    assert response.status_code == 302
    assert Node.objects.get(name="gpu20").gpu_count == 4


def test_a_refused_import_shows_every_error_and_creates_nothing(admin_client: Client) -> None:
    text = "name,address,ssh_port,role\ngpu30,10.0.0.30,22,compute\ngpu31,,22,compute\ngpu32,10.0.0.32,99999,boss\n"

    response = admin_client.post(reverse("admin:inventory_node_import"), {"fmt": "csv", "text": text})

    page = response.content.decode()
    assert response.status_code == 200
    assert "Nothing was imported: 3 problems to fix." in page
    assert "<td>3</td><td>address is missing</td>" in page
    assert "<td>4</td><td>ssh_port &#x27;99999&#x27; is not a TCP port (1-65535)</td>" in page
    assert "<td>4</td><td>role &#x27;boss&#x27; is not one of: compute, storage-client, login, other</td>" in page
    assert not Node.objects.exists()


def test_the_import_form_wants_exactly_one_source(admin_client: Client) -> None:
    url = reverse("admin:inventory_node_import")
    assert "Choose a file or paste the nodes." in admin_client.post(url, {"fmt": "csv"}).content.decode()
    upload = SimpleUploadedFile("nodes.csv", b"\xff\xfe\x00")
    assert "The file is not UTF-8 text." in admin_client.post(url, {"fmt": "csv", "file": upload}).content.decode()


def test_the_import_page_is_refused_to_staff_without_node_permissions(client: Client, django_user_model: Any) -> None:
    django_user_model.objects.create_user("viewer", password="pw-viewer-123", is_staff=True)
    client.login(request=HttpRequest(), username="viewer", password="pw-viewer-123")  # login throttling needs one
    assert client.get(reverse("admin:inventory_node_import")).status_code == 403


@pytest.mark.django_db
def test_campaigns_and_runs_are_shown_read_only_in_the_admin(admin_client: Client) -> None:
    from campaigns.models import Campaign, Run

    campaign = Campaign.objects.create(name="admin-view", kind="fio")
    run = Run.objects.create(campaign=campaign, sequence=1, point=0, repetition=1)
    for model, obj in (("campaign", campaign), ("run", run)):
        listing = admin_client.get(reverse(f"admin:campaigns_{model}_changelist"))
        assert listing.status_code == 200 and "admin-view" in listing.content.decode()
        page = admin_client.get(reverse(f"admin:campaigns_{model}_change", args=[obj.pk]))
        assert page.status_code == 200 and 'type="submit"' not in page.content.decode().split("</header>")[-1]
        assert admin_client.get(reverse(f"admin:campaigns_{model}_add")).status_code == 403


def test_the_import_help_lists_the_allowed_roles_and_statuses(admin_client: Client) -> None:
    page = admin_client.get(reverse("admin:inventory_node_import")).content.decode()
    for value in ("compute", "storage-client", "login", "other"):
        assert f"<code>{value}</code>" in page
    assert "<code>active</code>" in page
