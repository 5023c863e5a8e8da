"""A real headless Chromium for the report tests: Debian's `chromium` (scripts/install-browser.sh)
driven by Playwright for Python through `executable_path`, so Playwright never downloads
a browser of its own. Tests skip, saying why, only when no Chromium is on PATH."""
from __future__ import annotations

from pathlib import Path

import pytest

from diloco_chaos.reports import browser


@pytest.fixture(scope="module")
def browser_context(unavailable):
    """A persistent context on a fresh user-data dir; closed (browser reaped) after the module,
    so Playwright's event loop never outlives the browser tests."""
    if browser.find() is None:
        unavailable(f"no Chromium on PATH (looked for {', '.join(browser.BROWSERS)}); "
                    "install one with scripts/install-browser.sh")
    with browser.chromium() as ctx:
        yield ctx


class Visit:
    """A page opened on a local file, with every console message, page error and request it made."""

    def __init__(self, ctx, path: Path):
        self.url = path.resolve().as_uri()
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = ctx.new_page()
        self.page.on("console", lambda m: self.console.append((m.type, m.text)))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(self.url)
        self.page.wait_for_function(browser.READY, timeout=60_000)

    def foreign_requests(self) -> list[str]:
        """Requests for anything but the page's own file (data: and blob: stay in the page)."""
        return [u for u in self.requests if u != self.url and not u.startswith(("data:", "blob:"))]

    def complaints(self) -> list[tuple[str, str]]:
        return [(t, m) for t, m in self.console if t in ("error", "warning", "assert")] + \
               [("pageerror", e) for e in self.errors]


@pytest.fixture
def visit(browser_context):
    opened: list[Visit] = []

    def open_(path: Path) -> Visit:
        v = Visit(browser_context, path)
        opened.append(v)
        return v

    yield open_
    for v in opened:
        v.page.close()
