"""A real headless Chromium for the browser tests: Debian's ``chromium`` package, driven
by Playwright's sync API. No browser is ever downloaded (``playwright install`` is not
run); a missing browser skips locally and fails in CI, like a missing service."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests import services

#: Where Debian's ``chromium`` package installs the browser; ``CHROMIUM`` overrides it.
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
#: Headless, and nothing that reaches for the network on its own: on a machine with no
#: way out, Chromium otherwise stalls on updates, sync and QUIC probes.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Milliseconds Playwright waits for a page or an element before failing the test.
TIMEOUT_MS = 15_000
#: A laptop-sized window: long lines must wrap inside it.
VIEWPORT = {"width": 1024, "height": 768}


def _unavailable(message: str) -> None:
    if services.services_required():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser per module (about 2 s to start); each test gets its own context.

    Between two calls, Playwright's sync API leaves its event loop marked as running in
    this thread (the loop itself is parked in a greenlet), so Django would refuse the
    test's own queries as "async". Nothing runs concurrently here: the check is turned
    off while the browser is open, and back on when the module is done with it.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the browser tests need playwright: pip install -e '.[dev,django52]'")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(
            f"no Chromium at {CHROMIUM}: install Debian's package "
            "(apt-get install chromium) or set CHROMIUM"
        )
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(chromium: Any) -> Iterator[Any]:
    """``new_page()``: a page in a fresh context (its own cookies, so its own login)."""
    contexts = []

    def open_page() -> Any:
        context = chromium.new_context(viewport=VIEWPORT)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield open_page
    for context in contexts:
        context.close()
