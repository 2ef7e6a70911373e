"""Shared by the browser tests: headless Chromium kept off the network, started through Playwright."""

import os
import shutil

import pytest
from _browser import skip_or_fail


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    exe = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        skip_or_fail("no Chromium found (set CHROMIUM)")
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=args)
        yield b
        b.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each test's outcome on it (item.rep_call), for fixtures that act on a failure."""
    outcome = yield
    if call.when == "call":
        item.rep_call = outcome.get_result()
