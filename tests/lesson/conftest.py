"""The lesson's API tests share one shape of server: the embedded model behind the real app, one per module."""

from __future__ import annotations

import pytest

from prefill.lesson.routes import add_lesson
from prefill.server.app import ServeConfig, create_app, model_id_of
from prefill.server.server import BackgroundServer


@pytest.fixture(scope="module")
def url(smollm):
    """The root URL of a server over the embedded model (a 64 MiB KV pool), for the module's tests."""
    with BackgroundServer(add_lesson(create_app(smollm, ServeConfig(model_id_of(smollm), kv_cache_mb=64)))) as root:
        yield root


HEIGHTS = {1280: 800, 390: 844}  # the page's two widths (a laptop, a phone) and their windows' heights
PAGE_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, one for the module (skipped where either is missing)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium found: install the Debian package `chromium`")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module", params=sorted(HEIGHTS, reverse=True), ids=lambda w: f"{w}px")
def page(request, browser, url):
    """The page at 1280 px, then at 390 px, each fresh and kept for the module's tests in file order, with what
    went wrong in the browser on `page.problems` (a refused input's own 400 line excepted: tests type some). A
    test parametrized with `page` at [1280] alone (indirect: test_lesson_story.AT_1280) runs at that width only."""
    pg = browser.new_page(viewport={"width": request.param, "height": HEIGHTS[request.param]})
    pg.set_default_timeout(PAGE_TIMEOUT_MS)
    pg.problems = []
    refused = "status of 400"
    pg.on("console", lambda m: pg.problems.append(m.text) if m.type == "error" and refused not in m.text else None)
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.goto(url + "/")
    pg.wait_for_function("document.getElementById('model-badge').textContent.startsWith('this server runs')")
    yield pg
    pg.close()
