"""A storage system's flush and statistics commands: known programs only, set by staff or the team's admins, every
change audited; a team's inventory uses only its own credentials and those staff shared."""

from __future__ import annotations

from importlib import import_module
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import Team
from inventory.commands import CommandError, command_normalise
from inventory.models import Credential, StorageCommandChange, StorageSystem
from inventory.services import storage_upsert


def client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("field", "text", "stored"),
    [
        ("flush_command", "sync", "sync"),
        ("flush_command", "isi_for_array isi_flush", "isi_for_array isi_flush"),
        ("flush_command", "isi_for_array  isi_flush -123k", "isi_for_array isi_flush -123k"),
        ("flush_command", "sysctl -w vm.drop_caches=3", "sysctl -w vm.drop_caches=3"),
        ("flush_command", "lctl set_param ldlm.namespaces.*.lru_size=clear",
         "lctl set_param 'ldlm.namespaces.*.lru_size=clear'"),
        ("flush_command", "", ""),
        ("stats_command", "isi statistics system --nodes all --format top",
         "isi statistics system --nodes all --format top"),
        ("stats_command", "isi statistics system --nodes 1-4,7 --format csv --degraded",
         "isi statistics system --nodes 1-4,7 --format csv --degraded"),
    ],
)  # fmt: skip
def test_it_accepts_known_programs_with_valid_arguments(field: str, text: str, stored: str) -> None:
    assert command_normalise(field, text) == stored


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("flush_command", 'sh -c "id > owned.txt"'),
        ("flush_command", "sync; id"),
        ("flush_command", "sync id"),
        ("flush_command", "isi_for_array isi_flush -123k; id"),
        ("flush_command", "isi_for_array id"),
        ("flush_command", "isi_for_array isi_flush -x"),
        ("flush_command", "sysctl -w kernel.core_pattern=|/tmp/x"),
        ("flush_command", "lctl set_param debug=-1"),
        ("flush_command", "lctl set_param ldlm.namespaces.$(id).lru_size=clear"),
        ("flush_command", "/usr/bin/sync"),
        ("flush_command", "sync 'unterminated"),
        ("stats_command", "isi statistics system --nodes all --format top; rm -rf /"),
        ("stats_command", "isi statistics system --output /etc/passwd"),
        ("stats_command", "isi statistics system --nodes all --nodes 1"),
        ("stats_command", "isi statistics system --format"),
        ("stats_command", "sync"),
    ],
)
def test_it_refuses_any_other_command_naming_the_field(field: str, text: str) -> None:
    with pytest.raises(CommandError) as caught:
        command_normalise(field, text)
    assert caught.value.field == field and str(caught.value).startswith(f"{field}: ")


@pytest.mark.django_db
def test_a_member_cannot_set_the_commands_a_team_admin_can_and_every_change_is_recorded(
    owner: Any, member: Any, team: Any
) -> None:
    storage = storage_upsert(name="nas-blue", kind="isilon-powerscale", team=team)
    url = f"/api/v1/storage-systems/{storage.pk}/"
    attack = client_for(member).patch(url, {"flush_command": 'sh -c "id > owned.txt"'}, format="json")
    assert attack.status_code in (400, 403) and "flush_command" in str(attack.json())
    refused = client_for(member).patch(url, {"flush_command": "sync"}, format="json")
    assert refused.status_code == 403 and "flush_command" in refused.json()["message"]
    assert client_for(member).patch(url, {"export_path": "/ifs/data"}, format="json").status_code == 200
    admin = client_for(owner)
    bad = admin.patch(url, {"stats_command": "isi statistics system; id"}, format="json")
    assert bad.status_code == 400 and "stats_command" in bad.json()["extra"]
    good = admin.patch(url, {"flush_command": "isi_for_array isi_flush -123k"}, format="json")
    assert good.status_code == 200 and good.json()["flush_command"] == "isi_for_array isi_flush -123k"
    storage.refresh_from_db()
    assert storage.flush_command == "isi_for_array isi_flush -123k"
    changes = list(
        StorageCommandChange.objects.filter(storage=storage).values_list("field", "old", "new", "changed_by")
    )
    assert changes == [("flush_command", "", "isi_for_array isi_flush -123k", owner.pk)]
    created = client_for(member).post("/api/v1/storage-systems/", {"name": "nas2", "flush_command": "sync"},
                                      format="json")  # fmt: skip
    assert created.status_code == 403 and not StorageSystem.objects.filter(name="nas2").exists()


@pytest.mark.django_db
def test_a_team_uses_only_its_own_credentials_and_those_staff_shared(member: Any, team: Any, outsider: Any) -> None:
    def credential(name: str, **fields: Any) -> Credential:
        return Credential.objects.create(name=name, username="u", private_key_encrypted="x", public_key="k",
                                         fingerprint="f", **fields)  # fmt: skip

    credential("lab")  # shared inventory's, not shared with teams
    credential("common", shared=True)
    credential("reds", team=Team.objects.get(name="red"))
    credential("blues", team=team)
    client = client_for(member)
    answers = {
        name: client.post("/api/v1/nodes/", {"name": f"n-{name}", "address": "10.0.0.9", "credential": name},
                          format="json").status_code
        for name in ("lab", "common", "reds", "blues")
    }  # fmt: skip
    assert answers == {"lab": 400, "common": 201, "reds": 400, "blues": 201}
    storage = client.post("/api/v1/storage-systems/", {"name": "nas", "admin_credential": "lab",
                                                       "admin_address": "10.9.9.9"}, format="json")  # fmt: skip
    assert storage.status_code == 400 and "admin_credential" in storage.json()["extra"]


@pytest.mark.django_db
def test_the_migration_keeps_allowed_commands_and_takes_off_the_others_keeping_them_on_record() -> None:
    kept = storage_upsert(name="isilon", flush_command="isi_for_array  isi_flush -123k")
    StorageSystem.objects.filter(pk=kept.pk).update(flush_command="isi_for_array  isi_flush -123k")
    owned = storage_upsert(name="owned")
    stats = "isi statistics system --nodes all --format top"
    StorageSystem.objects.filter(pk=owned.pk).update(flush_command='sh -c "id > owned.txt"', stats_command=stats)
    migration = import_module("inventory.migrations.0004_storage_commands_allowlist")
    migration.refuse_unknown_commands(apps, connection.schema_editor())
    kept.refresh_from_db()
    owned.refresh_from_db()
    assert kept.flush_command == "isi_for_array isi_flush -123k"
    assert (owned.flush_command, owned.stats_command) == ("", stats)
    record = StorageCommandChange.objects.get(storage=owned)
    assert (record.field, record.old, record.new) == ("flush_command", 'sh -c "id > owned.txt"', "")
    assert record.note.startswith("refused by the allow-list")


@pytest.mark.django_db
def test_the_admin_refuses_an_unknown_command_and_records_who_changed_one(django_user_model: Any) -> None:
    from django.contrib import admin
    from django.test import RequestFactory

    root = django_user_model.objects.create_superuser("root")
    request = RequestFactory().post("/admin/")
    request.user = root
    model_admin = admin.site._registry[StorageSystem]
    storage = storage_upsert(name="nas")
    fields = {"name": "nas", "kind": "nfs", "admin_port": 22, "stats_interval_s": 5, "node_count": 1,
              "data_addresses": "[]"}  # fmt: skip
    form_class = model_admin.get_form(request, storage, change=True)
    bad = form_class(data={**fields, "flush_command": "sh -c id"}, instance=storage)
    assert not bad.is_valid() and "flush_command" in bad.errors
    good = form_class(data={**fields, "flush_command": "sync"}, instance=storage)
    assert good.is_valid(), good.errors
    model_admin.save_model(request, good.save(commit=False), good, change=True)
    change = StorageCommandChange.objects.get(storage=storage)
    assert (change.field, change.old, change.new, change.changed_by, change.note) == ("flush_command", "", "sync",
                                                                                       root, "admin")  # fmt: skip
