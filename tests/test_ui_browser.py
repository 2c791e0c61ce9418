"""The web page (issue 25) in a real headless Chromium (Debian's package, driven by Playwright for
Python), against a real daemon serving SmolLM2: streaming with drafted tokens shaded, compare,
pull with progress, a Modelfile error at its line, model text that looks like HTML, and a page of
another origin that tries to drive the API. Each test saves a screenshot in its tmp dir.

Skipped, with the reason, only where Playwright or the system Chromium is missing (``.ci/run``
installs Chromium where apt-get can)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.pullservers import MEDIA_MODEL, Fault, RegistryServer, sha256
from devtools.realmodels import smollm2_q4_1

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package
# Chromium on a closed network: no background connections, no GPU, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MODEL = "ui-smol:latest"
# A prompt whose answer copies what the model has just read: n-gram drafting accepts.
EDIT = (
    "Copy this text exactly, word for word:\n"
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump. The five boxing wizards jump quickly."
)
# Records what the pull's progress bar and status showed (the page's CSP forbids the string
# evaluation that wait_for_function would use, so the test watches with an observer).
WATCH_PROGRESS = """() => {
  window.__seen = []; window.__partial = false;
  const bar = document.getElementById("pull-progress");
  const status = document.getElementById("pull-status");
  new MutationObserver(() => {
    window.__seen.push(status.textContent);
    if (bar.value > 0 && bar.value < bar.max) window.__partial = true;
  }).observe(status, {childList: true, characterData: true, subtree: true});
}"""
HOSTILE = '<img src=x onerror="window.__pwned=1"> and <script>window.__pwned=2</script>'


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module (all the browser tests of the suite)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: install Debian's chromium package")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    """The session's daemon with SmolLM2 as ``ui-smol`` (drafting: ``auto``, i.e. n-grams)."""
    mf = tmp_path_factory.mktemp("ui") / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
    r = daemon.cli("create", "ui-smol", "-f", str(mf))
    assert r.returncode == 0, r.stderr
    return daemon


@pytest.fixture
def page(browser: Any, served: Daemon, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.goto(served.url + "/")
    p.wait_for_selector("body[data-ready='1']")
    yield p
    p.screenshot(path=str(tmp_path / "screenshot.png"))
    context.close()
    assert not errors, errors


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"))


def ask(page: Any, text: str, **options: str) -> None:
    page.select_option("#model", MODEL)
    page.click("#settings summary")
    for key, value in options.items():
        page.fill(f"#opt-{key}", value)
    page.fill("#prompt", text)
    page.click("#send")


def test_chat_streams_drafted_tokens_shaded_and_compare_shows_identical_texts(
    page: Any, tmp_path: Path
) -> None:
    ask(page, EDIT, temperature="0", num_predict="48")
    page.wait_for_selector("#messages .message.assistant .content .drafted")
    page.wait_for_selector("#send:not([disabled])", timeout=120_000)  # the reply is complete
    shot(page, tmp_path, "chat")
    acceptance = page.text_content("#spec-acceptance") or ""
    assert "%" in acceptance and "/" in acceptance, acceptance
    assert page.text_content("#spec-drafter") == "ngram"
    assert float(page.text_content("#spec-tps") or "0") > 0
    assert page.locator("#spec-chart .bar").count() >= 1
    reply = page.text_content("#messages .message.assistant .content") or ""
    assert "quick brown fox" in reply

    page.click("#compare")
    page.wait_for_selector("#compare-verdict.same", timeout=120_000)
    shot(page, tmp_path, "compare")
    assert page.text_content("#compare-on") == page.text_content("#compare-off")
    assert "tokens/s" in (page.text_content("#compare-on-speed") or "")
    assert "tokens/s" in (page.text_content("#compare-off-speed") or "")
    stored = json.loads(page.evaluate("localStorage.getItem('modelhub.chats')"))
    assert stored[0]["messages"][-1]["stats"]["draft_accepted_count"] > 0


def test_a_pull_from_a_loopback_registry_shows_progress_and_lists_the_model(
    page: Any, tmp_path: Path
) -> None:
    """SmolLM2's weights from a loopback registry at 40 MB/s, into a daemon of its own (the
    session's store already holds that blob, which a pull would not fetch again)."""
    weights = smollm2_q4_1().read_bytes()
    fresh = start_daemon(tmp_path / "models", tmp_path / "daemon.log")
    try:
        with RegistryServer() as registry:
            registry.add_model("library/uismol", "latest", [(MEDIA_MODEL, weights)])
            registry.faults[sha256(weights)] = Fault(rate=40e6)
            name = f"{registry.host}/library/uismol:latest"
            page.goto(fresh.url + "/")
            page.wait_for_selector("body[data-ready='1']")
            page.click("#tab-models")
            page.evaluate(WATCH_PROGRESS)
            page.fill("#pull-name", name)
            page.check("#pull-insecure")
            page.click("#pull-form button[type=submit]")
            deadline = time.monotonic() + 60
            while not page.evaluate("window.__partial"):  # the bar part-way
                assert time.monotonic() < deadline, page.evaluate("window.__seen")[-8:]
                time.sleep(0.05)
            shot(page, tmp_path, "pulling")
            page.wait_for_selector(f"#model-table tr[data-name='{name}']", timeout=60_000)
        seen = page.evaluate("window.__seen")
        assert any(" MB of 98.4 MB" in text for text in seen), seen
        assert page.text_content("#pull-status") == "success"
        row = page.text_content(f"#model-table tr[data-name='{name}']") or ""
        assert "llama" in row and "Q4_1" in row, row
        shot(page, tmp_path, "models")
    finally:
        fresh.stop()


def test_a_modelfile_error_is_shown_at_its_line(page: Any, tmp_path: Path) -> None:
    page.click("#tab-models")
    page.fill("#create-name", "ui-broken")
    broken = "FROM ui-smol\nSYSTEM You answer briefly.\n\nPARAMETER temperature hot\n"
    page.fill("#create-modelfile", broken)
    page.click("#create-form button[type=submit]")
    page.wait_for_selector("#create-status.error")
    shot(page, tmp_path, "modelfile-error")
    assert page.get_attribute("#create-status", "data-line") == "4"
    assert page.text_content("#create-gutter li.bad") == "4"
    assert "invalid float value [hot]" in (page.text_content("#create-status") or "")

    page.fill("#create-modelfile", "FROM ui-smol\nPARAMETER temperature 0.2\n")
    page.click("#create-form button[type=submit]")
    page.wait_for_selector("#model-table tr[data-name='ui-broken:latest']")
    assert page.locator("#create-gutter li.bad").count() == 0


def test_model_text_that_looks_like_html_renders_as_text(
    page: Any, served: Daemon, tmp_path: Path
) -> None:
    """A conversation restored from localStorage (where the page keeps them) whose answer holds
    HTML, and the same text sent to the real model as a prompt: all of it shows as text."""
    chat = {
        "id": "restored",
        "title": "restored",
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "Show me HTML"},
            {"role": "assistant", "content": f"Here: {HOSTILE}\n\n```html\n{HOSTILE}\n```"},
        ],
    }
    page.evaluate("c => localStorage.setItem('modelhub.chats', JSON.stringify([c]))", chat)
    page.reload()
    page.wait_for_selector("body[data-ready='1']")
    ask(page, f"Repeat this: {HOSTILE}", temperature="0", num_predict="16")
    page.wait_for_selector("#send:not([disabled])", timeout=120_000)
    page.wait_for_selector("#messages .message.assistant >> nth=1")
    shot(page, tmp_path, "html-as-text")
    messages = page.locator("#messages")
    assert messages.locator("img").count() == 0
    assert messages.locator("script").count() == 0
    assert page.evaluate("window.__pwned") is None
    restored = page.text_content("#messages .message.assistant .content") or ""
    assert restored.count("<img src=x onerror=") == 2 and restored.count("<script>") == 2
    user = page.text_content("#messages .message.user >> nth=1") or ""
    assert HOSTILE in user


def test_a_page_of_another_origin_cannot_call_the_api(
    page: Any, served: Daemon, tmp_path: Path
) -> None:
    """A website (here http://evil.test, served by Playwright's router) tries the daemon: a
    CORS read of /api/tags, and a no-cors POST that would copy a model. Neither gets through."""
    evil = f"""<!doctype html><title>evil</title><script>
    window.results = {{}};
    fetch("{served.url}/api/tags").then(r => r.text()).then(
      t => window.results.read = t, e => window.results.read = "blocked: " + e);
    fetch("{served.url}/api/copy", {{method: "POST", mode: "no-cors",
      headers: {{"Content-Type": "text/plain"}},
      body: JSON.stringify({{source: "{MODEL}", destination: "stolen"}})}}).then(
      r => window.results.write = "sent", e => window.results.write = "blocked: " + e);
    </script>"""
    page.route(
        "http://evil.test/**",
        lambda route: route.fulfill(status=200, content_type="text/html", body=evil),
    )
    page.goto("http://evil.test/")
    page.wait_for_function("window.results.read && window.results.write")
    shot(page, tmp_path, "other-origin")
    assert page.evaluate("window.results.read").startswith("blocked")
    with httpx.Client(base_url=served.url, timeout=30) as c:
        assert c.post("/api/show", json={"model": "stolen"}).status_code == 404
        # What the guard answers such a request, whether or not the browser sent it.
        asked = c.get("/api/tags", headers={"Origin": "http://evil.test"})
        assert asked.status_code == 403
        own = c.get("/", headers={"Accept": "text/html"})
    csp = own.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp


def test_the_page_is_off_with_modelhub_ui_0_and_curl_still_reads_modelhub_is_running(
    tmp_path: Path,
) -> None:
    """In process (no browser): ``/`` answers a browser with the page and anything else with
    Ollama's text; ``MODELHUB_UI=0`` leaves only the text; the page has no inline script or
    style for the CSP to allow."""
    from starlette.testclient import TestClient

    from modelhub.config import Settings
    from modelhub.server.app import build_asgi
    from modelhub.server.routes_ui import WEB_DIR

    html = {"Accept": "text/html,application/xhtml+xml"}
    for ui, page_served in (("1", True), ("0", False)):
        settings = Settings.from_env(
            {"MODELHUB_MODELS": str(tmp_path / "models"), "MODELHUB_UI": ui}
        )
        with TestClient(build_asgi(settings), base_url=settings.base_url) as http:
            assert http.get("/").text == "modelhub is running"
            browser_view = http.get("/", headers=html)
            asset = http.get("/ui/app.js")
        assert ("<!doctype html>" in browser_view.text) is page_served
        assert asset.status_code == (200 if page_served else 404)
    index = (WEB_DIR / "index.html").read_text()
    assert "<script>" not in index and "style=" not in index and "<style" not in index
    assert all(" on" not in tag.split(">")[0] for tag in index.split("<")[1:] if "=" in tag)
