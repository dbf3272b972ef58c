"""The generic command step (kind "command"): programs only from the admins' allow-list, arguments checked against
it, pass/fail by exit status, metrics from declared patterns; run for real on the lab nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory

from campaigns.models import CampaignStatus
from campaigns.services import campaign_apply
from common.errors import FieldError
from inventory.models import AllowedCommand
from inventory.services import node_upsert
from plugins.benchmarks import command as command_module
from plugins.benchmarks.base import HostContext, HostInfo, ParamError, ParseError, get_benchmark
from tests.conftest import launch_and_wait


@pytest.fixture
def allow_list(db: None) -> None:
    AllowedCommand.objects.create(name="uname", program="uname", max_args=2, arg_pattern="-[asrnm]")
    AllowedCommand.objects.create(name="meminfo", program="cat", fixed_args=["/proc/meminfo"])
    AllowedCommand.objects.create(name="proc", program="cat", max_args=1, arg_pattern="/proc/[a-z_-]{1,40}")


def context() -> HostContext:
    return HostContext(node="n1", index=0, run_dir="/srv/rb/n1", data_dir="/scratch", hosts=(HostInfo("n1", "h"),))


MEMTOTAL = {"mem_total": {"regex": r"^MemTotal:\s+(\d+) kB", "unit": "KiB"}}
MEMTOTAL_TEXT = "mem_total[KiB]=^MemTotal:\\s+(\\d+) kB\nmem_free[KiB]=^MemFree:\\s+(?P<value>\\d+)"


# --- parameters against the allow-list ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field", "said"),
    [
        ({}, "command", "allowed: meminfo, proc, uname"),
        ({"command": "rm"}, "command", "not on the allow-list"),
        ({"command": "sh -c id"}, "command", "name of an allowed command"),
        ({"command": "meminfo", "args": ["/etc/shadow"]}, "args", "at most 0"),
        ({"command": "proc", "args": ["/etc/shadow"]}, "args", "not an argument proc allows"),
        ({"command": "proc", "args": ["/proc/meminfo; reboot"]}, "args", "not an argument"),
        ({"command": "uname", "args": ["-a", "-r", "-s"]}, "args", "at most 2"),
        ({"command": "uname", "patterns": {"Bad Name": {"regex": "(1)"}}}, "patterns", "not a metric name"),
        ({"command": "uname", "patterns": {"passed": {"regex": "(1)"}}}, "patterns", "not a metric name"),
        ({"command": "uname", "patterns": {"x": {"regex": "no group"}}}, "patterns", "needs a group"),
        ({"command": "uname", "patterns": {"x": {"regex": "(unclosed"}}}, "patterns", "not a regular expression"),
        ({"command": "uname", "patterns": {"x": {"regex": "(1)", "unit": "k B;"}}}, "patterns", "unit"),
        ({"command": "uname", "shell": True}, "shell", "unknown"),
    ],
)
def test_it_refuses_what_the_allow_list_does_not_allow_naming_the_field(allow_list, params, field, said):
    with pytest.raises(ParamError) as caught:
        get_benchmark("command").validate(params)
    assert caught.value.field == field and said in str(caught.value)


def test_with_no_allow_list_nothing_runs(db: None):
    with pytest.raises(ParamError, match="the allow-list is empty"):
        get_benchmark("command").validate({"command": "uname"})


def test_it_reads_patterns_given_as_text_one_a_line(allow_list):
    p = command_module.params({"command": "meminfo", "patterns": MEMTOTAL_TEXT})
    assert [(x.name, x.unit, x.regex.pattern) for x in p.patterns] == [
        ("mem_total", "KiB", r"^MemTotal:\s+(\d+) kB"), ("mem_free", "KiB", r"^MemFree:\s+(?P<value>\d+)"),
    ]  # fmt: skip
    with pytest.raises(ParamError, match="NAME"):
        command_module.params({"command": "meminfo", "patterns": "just a regex (1)"})


def test_it_builds_the_allowed_argv_with_the_campaigns_arguments_as_words(allow_list):
    built = get_benchmark("command").build({"command": "uname", "args": "-s -r"}, context())
    plan = json.loads(built.files[command_module.PLAN])
    assert built.argv == ["python3", "rackbench_command.py", "command.json"]
    assert plan == {"argv": ["uname", "-s", "-r"], "patterns": {}}
    built = get_benchmark("command").build({"command": "meminfo", "patterns": MEMTOTAL}, context())
    plan = json.loads(built.files[command_module.PLAN])
    assert plan["argv"] == ["cat", "/proc/meminfo"] and plan["patterns"]["mem_total"]["unit"] == "KiB"


def test_a_campaign_naming_a_program_off_the_list_is_refused_when_applied(allow_list, team: Any):
    node_upsert(name="n1", address="10.0.0.1", team=team)
    data = {"name": "bad", "kind": "command", "nodes": ["n1"], "fixed": {"command": "rm", "args": "-rf /"}}
    with pytest.raises(FieldError) as caught:
        campaign_apply(data=data, team=team)
    assert caught.value.field.endswith("command") and "not on the allow-list" in str(caught.value)


# --- the helper and the parser --------------------------------------------------------------------------------


def _run_helper(tmp_path: Path, argv: list[str], patterns: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "h.py").write_text(command_module.HELPER_SCRIPT)
    (tmp_path / "c.json").write_text(json.dumps({"argv": argv, "patterns": patterns}))
    return subprocess.run([sys.executable, "h.py", "c.json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_helper_reads_declared_patterns_from_real_output(tmp_path):
    done = _run_helper(tmp_path, ["cat", "/proc/meminfo"], MEMTOTAL)
    assert done.returncode == 0
    metrics = {m.name: m for m in get_benchmark("command").parse(done.stdout, host="n1")}
    expected = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in line
    )
    assert metrics["mem_total"].value == expected and metrics["mem_total"].unit == "KiB"
    assert metrics["passed"].value == 1


def test_a_pattern_that_matches_nothing_fails_and_the_programs_own_lines_cannot_stand_in(tmp_path):
    fake = command_module.HEADER + json.dumps({"values": {"x": 1}, "unmatched": [], "units": {}})
    done = _run_helper(tmp_path, ["echo", fake], {"x": {"regex": r"^never (\d+)", "unit": ""}})
    with pytest.raises(ParseError, match="matched no line of the output: x"):
        get_benchmark("command").parse(done.stdout, host="n1")


def test_the_helper_exits_with_the_programs_status(tmp_path):
    assert _run_helper(tmp_path, ["cat", "/proc/rackbench-none"], {}).returncode == 1


# --- who keeps the list ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_only_superusers_change_the_allow_list_staff_read_it():
    users = get_user_model().objects
    staff = users.create_user("staff", password="x", is_staff=True)
    root = users.create_superuser("root", password="x")
    admin = site._registry[AllowedCommand]
    for user, may_change in ((staff, False), (root, True)):
        request = RequestFactory().get("/")
        request.user = user
        assert admin.has_view_permission(request)
        assert admin.has_add_permission(request) is may_change
        assert admin.has_change_permission(request) is may_change
        assert admin.has_delete_permission(request) is may_change
    client = Client()
    client.force_login(staff)
    assert client.post("/admin/inventory/allowedcommand/add/", {"name": "rm", "program": "rm"}).status_code == 403
    assert not AllowedCommand.objects.exists()


@pytest.mark.django_db
def test_a_superuser_adds_an_entry_and_bad_programs_are_refused(admin_client: Client):
    url = "/admin/inventory/allowedcommand/add/"
    form = {"name": "dcgm", "program": "/usr/bin/dcgmi", "fixed_args": '["diag", "-r"]', "max_args": 1,
            "arg_pattern": "[1-4]", "description": ""}  # fmt: skip
    assert admin_client.post(url, form).status_code == 302
    entry = AllowedCommand.objects.get(name="dcgm")
    assert entry.fixed_args == ["diag", "-r"] and entry.changed_by is not None
    for program in ("rm -rf /", "../bin/sh", "-x"):
        page = admin_client.post(url, {**form, "name": "bad", "program": program})
        assert page.status_code == 200 and not AllowedCommand.objects.filter(name="bad").exists()


# --- on the lab -------------------------------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.worker
def test_on_the_lab_an_allowed_command_passes_with_its_metrics_and_a_failing_one_fails(lab: dict[str, Any], worker):
    AllowedCommand.objects.create(name="uname", program="uname", max_args=2, arg_pattern="-[asrnm]")
    AllowedCommand.objects.create(name="meminfo", program="cat", fixed_args=["/proc/meminfo"])
    AllowedCommand.objects.create(name="proc", program="cat", max_args=1, arg_pattern="/proc/[a-z_-]{1,40}")
    base = {"kind": "command", "nodes": ["lab1", "lab2"], "cache": {"flush_clients": False}}

    ok = launch_and_wait({**base, "name": "meminfo", "fixed": {"command": "meminfo", "patterns": MEMTOTAL_TEXT}})
    assert ok.status == CampaignStatus.SUCCEEDED, [r.error for r in ok.runs.all()]
    run = ok.runs.get()
    totals = {r.host: r for r in run.results.filter(name="mem_total")}
    assert set(totals) == {"lab1", "lab2"} and all(r.value > 0 and r.unit == "KiB" for r in totals.values())
    assert run.results.filter(name="mem_free", host="lab1").exists()
    assert run.results.filter(name="passed", host="lab2", value=1).exists()

    uname = launch_and_wait({**base, "name": "uname", "fixed": {"command": "uname", "args": "-s"}})
    assert uname.status == CampaignStatus.SUCCEEDED
    assert "Linux" in uname.runs.get().hosts.get(host="lab1").stdout

    failing = launch_and_wait({**base, "name": "no-file", "fixed": {"command": "proc", "args": "/proc/rackbench-none"}})
    assert failing.status == CampaignStatus.FAILED
    error = failing.runs.get().error
    assert "exited with code 1" in error and "No such file" in error, error
