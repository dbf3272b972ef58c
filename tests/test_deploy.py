"""Defaults and deployment: DEBUG is off unless asked for, and ``manage.py check --deploy`` is clean with the
production environment of docker/compose.yaml and docker/env.example (what the README tells to deploy)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# A clean environment: the test session's own variables (DJANGO_ALLOW_ASYNC_UNSAFE from the browser tests, ...)
# are no part of a deployment.
BASE_ENV = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")}
FILLED = {  # what an operator fills into docker/.env
    "POSTGRES_PASSWORD": "pw",
    "RACKBENCH_SECRET_KEY": "k" * 20 + "-Qx7#pL9!vR2@mZ4$wT8%nB6^hJ3&dF5*gK1(sY0)",
    "RACKBENCH_ENCRYPTION_KEYS": "ZmDfcTF7_60GrrY167zsiPd67pEvs0aGOv2oasOM1Pg=",
}


def production_env(tmp_path: Path) -> dict[str, str]:
    """The web service's environment as compose would give it, with docker/env.example filled in."""
    example = dict(
        line.split("=", 1) for line in (ROOT / "docker/env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )  # fmt: skip
    example = {**example, **{k: v for k, v in FILLED.items()}}
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())

    def expand(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            name, op, default = match.group(1), match.group(2) or "", match.group(3) or ""
            if example.get(name):
                return example[name]
            assert op != ":?", f"{name} must be set in docker/.env"
            return default

        return re.sub(r"\$\{([A-Z_]+)(?:(:[-?])([^}]*))?\}", one, str(value))

    env = dict(BASE_ENV)
    env.update({name: expand(value) for name, value in compose["x-app"]["environment"].items()})
    env.update(RACKBENCH_DATA_DIR=str(tmp_path), RACKBENCH_STATIC_ROOT=str(tmp_path / "static"))
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"  # check --deploy does not connect
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path: Path) -> None:
    done = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_check_deploy_names_what_is_missing_without_it(tmp_path: Path) -> None:
    env = dict(BASE_ENV)
    env.update(RACKBENCH_DATA_DIR=str(tmp_path), RACKBENCH_STATIC_ROOT=str(tmp_path / "static"),
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")  # fmt: skip
    done = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    found = set(re.findall(r"\((security\.W\d+|accounts\.E\d+)\)", done.stdout + done.stderr))
    assert done.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016", "accounts.E001"} <= found, found
    assert "security.W018" not in found  # DEBUG is off by default


def test_debug_is_off_unless_asked_for(tmp_path: Path) -> None:
    env = dict(BASE_ENV)
    env.update(RACKBENCH_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="rackbench.settings")
    code = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    # Both processes at once: each spends seconds starting Django.
    off, on = (
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for e in (env, {**env, "RACKBENCH_DEBUG": "1"})
    )  # fmt: skip
    (off_out, off_err), (on_out, on_err) = off.communicate(timeout=60), on.communicate(timeout=60)
    assert (off_out.strip(), on_out.strip()) == ("False", "True"), off_err + on_err
