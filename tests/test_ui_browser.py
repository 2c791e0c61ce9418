"""The web page (issue 25) in a real headless Chromium (Debian's package, driven by Playwright for
Python), against a real daemon serving SmolLM2: streaming with drafted tokens shaded, compare,
pull with progress, a Modelfile error at its line, model text that looks like HTML, a page of
another origin that tries to drive the API, an image dropped on a model with vision (SmolLM2 with
the synthetic projector of ``tests/fixtures/synthetic_projector.py``) and on one without,
thinking shown collapsed and a tool call shown as such (SmolLM2 with the reasoning and tool
templates of ``tests/test_serving_replies.py``, led by their few-shot histories). Each test saves
a screenshot in its tmp dir.

Skipped, with the reason, only where Playwright or the system Chromium is missing (``.ci/run``
installs Chromium where apt-get can)."""

from __future__ import annotations

import base64
import io
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from devtools.daemons import Daemon, start_daemon
from devtools.pullservers import MEDIA_MODEL, Fault, RegistryServer, sha256
from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from tests.fixtures.synthetic_projector import write_projector
from tests.test_serving_replies import (
    THINK_FEWSHOT,
    THINK_TEMPLATE,
    TOOLS_TEMPLATE,
    WEATHER,
    _native_fewshot,
)

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
VISION = "ui-vision:latest"  # SmolLM2 Q4_1 + the synthetic projector
THINKER = "ui-thinker:latest"  # SmolLM2 Q8_0, a template that reasons in <think> markers
TOOLY = "ui-tooly:latest"  # SmolLM2 Q8_0, a template that advertises tools
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
# A drop as a user makes it: a DataTransfer holding a File, as the browser builds for a drag
# from the desktop; Playwright dispatches dragover and drop with it.
DATA_TRANSFER = """([b64, name, type]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const dt = new DataTransfer();
  dt.items.add(new File([bytes], name, {type}));
  return dt;
}"""


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
    daemon.create("ui-smol", mf)
    return daemon


@pytest.fixture(scope="module")
def replies(served: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    """Models for images, reasoning and tools (module scope: created before any page loads its
    model list)."""
    base = tmp_path_factory.mktemp("ui-replies")
    proj = write_projector(base / "mmproj-smol.gguf")
    head = f"FROM {smollm2_q8_0()}\nPARAMETER num_ctx 2048\nPARAMETER num_parallel 1\n"
    for name, body in (
        (VISION, f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER num_ctx 1024\n"),
        (THINKER, f'{head}TEMPLATE """{THINK_TEMPLATE}"""\n'),
        (TOOLY, f'{head}TEMPLATE """{TOOLS_TEMPLATE}"""\n'),
    ):
        mf = base / f"{name.split(':')[0]}.Modelfile"
        mf.write_text(body)
        served.create(name, mf)
    return served


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


def expect(locator: Any) -> Any:
    """Playwright's retrying assertions (imported here: the module imports without Playwright,
    so that the browser fixture can skip with its reason)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"))


def ask(page: Any, text: str, model: str = MODEL, tools: str = "", **options: str) -> None:
    page.select_option("#model", model)
    page.click("#settings summary")
    for key, value in options.items():
        page.fill(f"#opt-{key}", value)
    if tools:
        page.fill("#tools", tools)
    page.click("#settings summary")  # closed again: the conversation in view
    page.fill("#prompt", text)
    page.click("#send")


def restore(page: Any, chat: dict[str, Any]) -> None:
    """Put a conversation where the page keeps them (localStorage) and load it."""
    page.evaluate("c => localStorage.setItem('modelhub.chats', JSON.stringify([c]))", chat)
    page.reload()
    page.wait_for_selector("body[data-ready='1']")


def stored_messages(page: Any) -> list[dict[str, Any]]:
    chats = json.loads(page.evaluate("localStorage.getItem('modelhub.chats')"))
    return list(chats[0]["messages"])


def png(seed: int, size: tuple[int, int] = (40, 48)) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def drop(page: Any, b64: str, name: str, type_: str = "image/png") -> None:
    data = page.evaluate_handle(DATA_TRANSFER, [b64, name, type_])
    page.dispatch_event("#messages", "dragover", {"dataTransfer": data})
    page.dispatch_event("#messages", "drop", {"dataTransfer": data})


def test_chat_streams_drafted_tokens_shaded_and_compare_shows_identical_texts(
    page: Any, tmp_path: Path
) -> None:
    ask(page, EDIT, temperature="0", num_predict="48")
    # The first reply of the module loads the model: on a busy 2-core machine that takes a while.
    page.wait_for_selector("#messages .message.assistant .content .drafted", timeout=120_000)
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
    restore(page, chat)
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


def test_an_image_dropped_on_a_vision_model_goes_with_the_message_and_reaches_the_model(
    replies: Daemon, page: Any, tmp_path: Path
) -> None:
    """A PNG dropped on the chat of ``ui-vision``: a thumbnail waits in the composer, goes out
    as the message's base64 ``images`` and shows in the sent message; the streamed reply is the
    one the API gives for that image (greedy), not the one it gives without it or with another
    image."""
    image = png(1)
    page.select_option("#model", VISION)
    expect(page.locator("#drop-hint")).to_have_text("drop images here to attach them")
    drop(page, image, "photo.png")
    page.wait_for_selector("#attachments img")
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if r.url.endswith("/api/chat") else None)
    question = "What is in this picture?"
    ask(page, question, model=VISION, temperature="0", num_predict="16")
    page.wait_for_selector("#send:not([disabled])", timeout=120_000)
    shot(page, tmp_path, "image")

    assert page.locator("#attachments img").count() == 0  # it went with the message
    thumb = page.locator("#messages .message.user .thumbs img")
    assert thumb.count() == 1
    assert thumb.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [40, 48]
    assert thumb.get_attribute("src") == f"data:image/png;base64,{image}"
    (request,) = sent
    body = json.loads(request.post_data)
    assert body["messages"] == [{"role": "user", "content": question, "images": [image]}]
    reply = stored_messages(page)[-1]
    assert reply["role"] == "assistant" and reply["content"] and "error" not in reply

    def api(images: list[str]) -> str:
        message = {"role": "user", "content": question, "images": images}
        with replies.client(timeout=300) as c:
            r = c.post(
                "/api/chat",
                json={
                    "model": VISION,
                    "messages": [message] if images else [{"role": "user", "content": question}],
                    "stream": False,
                    "options": {"temperature": 0, "num_predict": 16},
                },
            )
        assert r.status_code == 200, r.text
        return str(r.json()["message"]["content"])

    assert reply["content"] == api([image])
    assert reply["content"] != api([])
    assert reply["content"] != api([png(2)])


def test_a_model_without_vision_refuses_a_dropped_image_with_a_message(
    page: Any, tmp_path: Path
) -> None:
    page.select_option("#model", MODEL)
    drop(page, png(1), "photo.png")
    refusal = f"{MODEL} cannot read images (it has no vision projector): nothing was attached"
    expect(page.locator("#status")).to_have_text(refusal)
    shot(page, tmp_path, "image-refused")
    assert page.text_content("#drop-hint") == ""  # no invitation to drop
    assert page.locator("#attachments img").count() == 0


def test_a_file_that_is_not_an_image_is_not_attached(
    replies: Daemon, page: Any, tmp_path: Path
) -> None:
    page.select_option("#model", VISION)
    drop(page, base64.b64encode(b"just text").decode(), "notes.txt", "text/plain")
    expect(page.locator("#status")).to_have_text("not an image, not attached: notes.txt")
    assert page.locator("#attachments img").count() == 0


def test_thinking_is_shown_collapsed_under_the_reply(
    replies: Daemon, page: Any, tmp_path: Path
) -> None:
    """``ui-thinker`` after the few-shot history (restored from localStorage, whose assistant
    turns carry ``thinking``, sent back with them) reasons before it answers; the page shows the
    reasoning in a closed <details>, the answer under it."""
    restore(
        page, {"id": "t", "title": "thinking", "model": THINKER, "messages": THINK_FEWSHOT[:-1]}
    )
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if r.url.endswith("/api/chat") else None)
    ask(page, THINK_FEWSHOT[-1]["content"], model=THINKER, temperature="0", num_predict="48")
    page.wait_for_selector("#send:not([disabled])", timeout=120_000)
    shot(page, tmp_path, "thinking-collapsed")

    assert json.loads(sent[0].post_data)["messages"] == THINK_FEWSHOT  # thinking went back
    last = page.locator("#messages .message.assistant").last
    details = last.locator("details.thinking")
    assert details.count() == 1 and details.get_attribute("open") is None
    assert not last.locator(".thinking-text").is_visible()
    assert last.locator(".thinking-text").text_content() == "Three plus five is eight."
    assert (last.locator(".content").text_content() or "").strip() == "8"
    reply = stored_messages(page)[-1]
    assert (reply["thinking"], reply["content"]) == ("Three plus five is eight.", "8")

    last.locator("details.thinking summary").click()
    assert last.locator(".thinking-text").is_visible()
    shot(page, tmp_path, "thinking-open")


def test_a_thinking_setting_is_offered_for_a_model_that_reasons_and_goes_with_its_request(
    replies: Daemon, page: Any
) -> None:
    """The options show a thinking setting for a model whose template reasons (``ui-thinker``)
    and not for one whose template does not (``ui-smol``: /api/chat would refuse ``think``);
    what it says goes with the request as ``think``, and "model's default" sends none."""
    page.select_option("#model", MODEL)
    page.click("#settings summary")
    expect(page.locator("#think-label")).to_be_hidden()
    page.select_option("#model", THINKER)
    expect(page.locator("#think-label")).to_be_visible()
    page.select_option("#opt-think", "false")
    page.fill("#opt-num_predict", "8")
    page.click("#settings summary")
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if r.url.endswith("/api/chat") else None)
    for setting in ("false", ""):
        page.click("#settings summary")
        page.select_option("#opt-think", setting)
        page.click("#settings summary")
        page.fill("#prompt", "What is 3+5?")
        page.click("#send")
        page.wait_for_selector("#send:not([disabled])", timeout=120_000)
    asked = [json.loads(r.post_data) for r in sent]
    assert asked[0]["think"] is False and "think" not in asked[1], asked
    answers = [m for m in stored_messages(page) if m["role"] == "assistant"]
    assert len(answers) == 2 and not any(m.get("error") for m in answers), answers


def test_a_tool_call_is_shown_as_such(replies: Daemon, page: Any, tmp_path: Path) -> None:
    """``ui-tooly`` with the weather tool in the options and the few-shot history of calls
    (restored from localStorage, sent back as ``tool_calls``): the model calls the tool; the
    page shows a tool-call badge with the function and its arguments, not the raw markup."""
    restore(page, {"id": "c", "title": "tools", "model": TOOLY, "messages": _native_fewshot()})
    sent: list[Any] = []
    page.on("request", lambda r: sent.append(r) if r.url.endswith("/api/chat") else None)
    tools = json.dumps([WEATHER])
    ask(
        page,
        "What is the weather in Paris?",
        model=TOOLY,
        tools=tools,
        temperature="0",
        num_predict="48",
    )
    page.wait_for_selector("#send:not([disabled])", timeout=120_000)
    shot(page, tmp_path, "tool-call")

    body = json.loads(sent[0].post_data)
    assert body["tools"] == [WEATHER]
    assert [m.get("tool_calls") for m in body["messages"][:4]] == [
        m.get("tool_calls") for m in _native_fewshot()
    ]
    last = page.locator("#messages .message.assistant").last
    call = last.locator(".tool-call")
    assert call.count() == 1
    assert call.locator(".badge").text_content() == "tool call"
    assert call.locator("code").text_content() == 'get_weather({"city":"Paris"})'
    assert "<tool_call>" not in (last.locator(".content").text_content() or "")
    reply = stored_messages(page)[-1]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in reply["tool_calls"]]
    assert calls == [("get_weather", {"city": "Paris"})]
