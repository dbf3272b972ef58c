"""Playwright driving Debian's headless Chromium (no browser is downloaded): fixtures for the browser tests.

Screenshots of every page a test visits are saved under var/test-artifacts/browser/ for people to look at.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "var" / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("RACKBENCH_TEST_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: scripts/bootstrap --services installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the tests still call the ORM between steps.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Any, live_server: Any) -> Iterator[Any]:
    """A fresh browser context at a laptop's 1280 x 800, with the live server as its base URL."""
    context = chromium.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 800})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the pages: {errors}"


def snap(page: Any, name: str) -> Path:
    """Save a full-page screenshot as a test artifact."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def log_in(page: Any, username: str, password: str) -> None:
    page.goto("/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_load_state()
