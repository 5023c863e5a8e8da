"""A headless Chromium for looking at pages: the system's browser (Debian's `chromium`,
scripts/install-browser.sh) driven by Playwright through `executable_path`, so Playwright
never downloads one. Used by the browser tests, `bench report` and `report --screenshot`."""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
READY = "document.body.dataset.ready === '1'"  # set by the page's script once every chart is drawn


def find() -> str | None:
    """The first Chromium on PATH, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


@contextlib.contextmanager
def chromium(exe: str | None = None, width: int = 1200):
    """A Playwright browser context on a fresh user-data dir, closed (and the browser reaped)
    on the way out. Raises RuntimeError when there is no Chromium."""
    exe = exe or find()
    if exe is None:
        raise RuntimeError(f"no Chromium on PATH (looked for {', '.join(BROWSERS)}); "
                           "install one with scripts/install-browser.sh")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        raise RuntimeError(f"the browser check needs playwright ({e}); "
                           "install it with: pip install 'diloco-chaos[browser]'") from None

    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="chaos-chromium-") as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=exe, args=ARGS, headless=True,
                                                    viewport={"width": width, "height": 900},
                                                    service_workers="block")
        try:
            yield ctx
        finally:
            ctx.close()


def open_drawn(ctx, page: Path, timeout_s: float = 60.0):
    """(tab, seconds until every chart was drawn) for a page file."""
    tab = ctx.new_page()
    t = time.perf_counter()
    tab.goto(Path(page).resolve().as_uri())
    tab.wait_for_function(READY, timeout=timeout_s * 1000)
    return tab, time.perf_counter() - t


def screenshot(page: Path, png: Path) -> Path:
    """A full-page PNG of a rendered page."""
    png.parent.mkdir(parents=True, exist_ok=True)
    with chromium() as ctx:
        tab, _ = open_drawn(ctx, page)
        tab.screenshot(path=str(png), full_page=True)
    return png
