"""The daemon stays responsive while requests carry costly text (issue 26, item 14): parsing a
2 MB Modelfile TEMPLATE takes seconds of Python, which must not run on the event loop. Three
creates with such templates (answered 400, rightly) and two generates with one run while
``/api/version`` is asked every 50 ms; each answer must come within half a second."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.daemons import Daemon, start_daemon
from tests.fixtures.synthetic import write_tiny_llama

pytestmark = pytest.mark.timeout(300)

# About 2 MB of template actions that parse (slowly) up to a stray {{ end }} at the very end.
HEAVY_TEMPLATE = "{{ .Prompt }}" * 160_000 + "{{ end }}"
VALID_TEMPLATE = "{{ .Prompt }}" * 40_000  # 520 KB that parse
BOUND_S = 0.5


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("event-loop")
    d = start_daemon(base / "models", base / "daemon.log")
    mf = base / "Modelfile"
    mf.write_text(f"FROM {write_tiny_llama(base / 'tiny.gguf')}\n")
    d.create("tiny", mf)
    yield d
    d.stop()


def test_heavy_templates_do_not_hold_other_requests(served: Daemon, tmp_path: Path) -> None:
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def post(path: str, body: dict[str, object]) -> None:
        with served.client(timeout=240) as c:
            r = c.post(path, json=body)
        with lock:
            answers.append(r)

    heavy = [
        ("/api/create", {"model": f"heavy{i}", "from": "tiny", "template": HEAVY_TEMPLATE})
        for i in range(3)
    ] + [
        ("/api/generate", {"model": "tiny", "prompt": "hi", "template": HEAVY_TEMPLATE})
        for _ in range(2)
    ]
    valid = ("/api/create", {"model": "big", "from": "tiny", "template": VALID_TEMPLATE})
    threads = [threading.Thread(target=post, args=item) for item in [*heavy, valid]]
    latencies = []
    with served.client(timeout=30) as c:
        assert c.get("/api/version").status_code == 200  # connected and warm
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            started = time.monotonic()
            assert c.get("/api/version").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.05)
    for t in threads:
        t.join()
    assert len(answers) == len(heavy) + 1
    refused = [r for r in answers if r.status_code == 400]
    assert len(refused) == len(heavy), [r.text[:200] for r in answers]
    for r in refused:
        assert "template error: unexpected {{end}}" in r.json()["error"], r.text
    with served.client() as c:
        shown = c.post("/api/show", json={"model": "big"}).json()
    assert shown["template"] == VALID_TEMPLATE
    assert len(latencies) > 5, latencies  # the heavy requests took a while
    assert max(latencies) < BOUND_S, sorted(latencies)[-5:]


def test_a_large_request_template_renders_in_the_child(served: Daemon) -> None:
    """A generate's own template over the in-process bound is rendered by the child: the model
    is given the same prompt as from the same template without the long comment."""
    options = {"num_predict": 4, "temperature": 0}
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": options}
    answers = []
    with served.client() as c:
        for template in ("{{/* " + "x" * 70_000 + " */}}[{{ .Prompt }}]", "[{{ .Prompt }}]"):
            r = c.post("/api/generate", json={**body, "template": template})
            assert r.status_code == 200, r.text
            answers.append(r.json())
    large, small = answers
    assert large["context"] == small["context"]  # the prompt's tokens and the answer's
    assert large["response"] == small["response"]
