"""Open a report page in Debian's headless Chromium (driven by playwright, never its own browser download) and
say what happened: console messages, page errors, requests, dialogs, paint times; a screenshot on request.

`browser()` skips the test with a printed reason where chromium or playwright is missing, except under CI
(CI=true), where a missing browser fails: CI installs chromium so that these tests always run there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def require_browser() -> str:
    """The chromium executable, or skip (fail under CI) saying what is missing."""
    path = chromium_path()
    missing = None
    if path is None:
        missing = "no chromium (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "no playwright (pip install playwright; its browser download is not needed)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests must run in CI: {missing}")
        print(f"skipping browser test: {missing}")
        pytest.skip(missing)
    assert path is not None
    return path


@dataclass
class PageVisit:
    console: list[tuple[str, str]] = field(default_factory=list)  # (type, text)
    errors: list[str] = field(default_factory=list)  # uncaught exceptions
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    dialogs: list[str] = field(default_factory=list)  # alert/confirm/prompt messages
    page: Any = None

    @property
    def remote_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file:", "data:", "about:", "blob:"))]

    @property
    def console_errors(self) -> list[str]:
        return [text for kind, text in self.console if kind in ("error", "warning")] + self.errors


@contextmanager
def visit(html: Path, *, width: int = 1300, height: int = 900) -> Iterator[PageVisit]:
    """Open `html` from disk in a fresh headless Chromium profile; yields once the page has loaded and its
    charts had their time to draw."""
    executable = require_browser()
    from playwright.sync_api import sync_playwright

    seen = PageVisit()
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="stepscope-chromium-") as profile:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": width, "height": height},
        )
        try:
            page = context.new_page()
            page.on("console", lambda m: seen.console.append((m.type, m.text)))
            page.on("pageerror", lambda e: seen.errors.append(str(e)))
            page.on("request", lambda r: seen.requests.append(r.url))

            def on_dialog(dialog: Any) -> None:
                seen.dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", on_dialog)
            page.goto(html.resolve().as_uri())
            page.wait_for_load_state("load")
            charts = page.locator("div.chart").count()
            if charts:
                # every chart drawn (an svg inside) or failed visibly
                page.wait_for_function(
                    "document.querySelectorAll('div.chart').length === "
                    "document.querySelectorAll('div.chart svg.marks, div.chart .chart-error').length",
                    timeout=20_000,
                )
            seen.page = page
            yield seen
        finally:
            context.close()
