"""Runner lifecycle and bounded work, through a real daemon: every runner is either registered
(in /api/ps, counted by the planner) or gone, whatever the request did; bad input is refused at
the door, before any runner starts. What the door decides (bad options, stored texts, blobs'
modes, a FIFO, junk images, a prompt too long) runs in-process over fake runners (``app``,
``tests/fakes``), the CLI in-process too."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from devtools.daemons import Daemon, start_daemon
from tests.fakes.daemon import FakeDaemon, fake_daemon
from tests.fixtures.synthetic import write_tiny_llama, write_tiny_llama_without


def runner_pids(d: Daemon) -> set[int]:
    return d.runner_pids()


def settled_runner_pids(d: Daemon, want: int, timeout: float = 10) -> set[int]:
    """The runners once their number is ``want`` (or the timeout has passed)."""
    deadline = time.monotonic() + timeout
    while (pids := runner_pids(d)) and len(pids) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return runner_pids(d)


def create(d: Daemon, tmp_path: Path, name: str, model: Path) -> None:
    mf = tmp_path / f"{name}.Modelfile"
    mf.write_text(f"FROM {model}\n")
    d.create(name, mf)


@pytest.fixture
def served(tmp_path: Path) -> Daemon:
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_KEEP_ALIVE": "5m"})
    create(d, tmp_path, "tiny", write_tiny_llama(tmp_path / "tiny.gguf"))
    yield d
    d.stop()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[FakeDaemon]:
    """The app over fake runners with ``tiny`` created, as ``served`` has it."""
    with fake_daemon(tmp_path / "fake", env={"MODELHUB_KEEP_ALIVE": "5m"}) as d:
        d.add_model("tiny")
        yield d


def hang_up_after(d: Daemon, body: dict[str, object], seconds: float) -> None:
    """Send a request on a raw socket and close it ``seconds`` later, unanswered."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", d.port)) as s:
        s.sendall(
            b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        time.sleep(seconds)


def test_a_hang_up_while_loading_leaves_no_runner(served: Daemon) -> None:
    body = {"model": "tiny", "prompt": "a b", "options": {"num_predict": 4}}
    for delay in (0.05, 0.3, 0.6):
        with served.client() as c:  # unloaded before each try, so the hang-up meets a load
            c.post("/api/generate", json={"model": "tiny", "keep_alive": 0}).raise_for_status()
        hang_up_after(served, body, delay)
        time.sleep(1.5)  # whatever the daemon started is loaded or gone by now
        with served.client() as c:
            shown = {m["name"] for m in c.get("/api/ps").json()["models"]}
        assert len(settled_runner_pids(served, len(shown))) == len(shown), (delay, shown)


def test_failed_loads_leave_no_runner(served: Daemon, tmp_path: Path) -> None:
    create(served, tmp_path, "broken", write_tiny_llama_without(tmp_path / "broken.gguf"))
    with served.client() as c:
        for _ in range(5):
            r = c.post("/api/generate", json={"model": "broken", "prompt": "a", "stream": False})
            assert r.status_code in (400, 500), r.text
            assert "loading broken:latest failed" in r.json()["error"]
        assert c.get("/api/ps").json()["models"] == []
    assert settled_runner_pids(served, 0) == set()


def test_bad_options_are_refused_before_any_runner_starts(app: FakeDaemon) -> None:
    with app.http_client() as c:
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "a", "stream": False})
        assert r.status_code == 200
        (before,) = app.runners.made
        cases = {
            "draft_p_min": (5, "option draft_p_min must be between 0 and 1"),
            "num_thread": (1_000_000, "option num_thread must be at most"),
            "num_ctx": (-3, "option num_ctx must be"),
        }
        for option, (value, message) in cases.items():
            body = {"model": "tiny", "prompt": "a", "options": {option: value}}
            r = c.post("/api/generate", json=body)
            assert r.status_code == 400 and r.json()["error"].startswith(message), r.text
        bogus = {"model": "tiny", "prompt": "a", "format": {"type": "nonsense"}}
        r = c.post("/api/generate", json=bogus)
        assert r.status_code == 400
        assert r.json()["error"].startswith("format: the JSON schema cannot be turned into")
        # The healthy runner was neither unloaded nor replaced by any of these.
        assert app.runners.made == [before] and not before.dead
        assert len(app.runners.loads()) == 1


def test_deep_and_huge_bodies_are_400s(served: Daemon) -> None:
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    daemon_mem = psutil.Process(served.proc.pid).memory_info().rss
    with served.client() as c:
        r = c.post("/api/generate", content=deep, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"] == "invalid JSON in request body: nested too deeply"

        def chunks():  # 300 MB, never declared up front
            block = b" " * (1 << 20)
            for _ in range(300):
                yield block

        try:
            r = c.post("/api/generate", content=chunks())
            assert r.status_code == 400, r.text
            assert r.json()["error"].startswith("request body too large")
        except httpx.HTTPError:
            pass  # the daemon may answer and close before the upload ends
    grown = psutil.Process(served.proc.pid).memory_info().rss - daemon_mem
    assert grown < 100 << 20, f"the daemon grew by {grown >> 20} MB reading a refused body"


def test_a_refused_reload_leaves_the_healthy_runner_alone(tmp_path: Path) -> None:
    from modelhub.gguf.info import read_gguf_info
    from modelhub.runtime.memory import estimate

    model = write_tiny_llama(tmp_path / "tiny.gguf")
    info = read_gguf_info(model)
    fits = estimate(info, 256, 512).total
    too_big = estimate(info, 256, 8192).total
    assert too_big > 2 * fits
    limit = (fits + too_big) // 2  # the default load fits, one with num_batch 8192 does not
    d = start_daemon(
        tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_MEMORY_LIMIT": str(limit)}
    )
    try:
        create(d, tmp_path, "tiny", model)
        with d.client() as c:
            ok = c.post("/api/generate", json={"model": "tiny", "prompt": "a", "stream": False})
            assert ok.status_code == 200, ok.text
            (healthy,) = runner_pids(d)
            body = {"model": "tiny", "prompt": "a", "stream": False, "options": {"num_batch": 8192}}
            refused = c.post("/api/generate", json=body)
            assert refused.status_code == 500
            assert refused.json()["error"].startswith("model requires more system memory")
            assert runner_pids(d) == {healthy}
            assert len(c.get("/api/ps").json()["models"]) == 1
    finally:
        d.stop()


def test_stored_texts_over_the_show_limit_are_refused_at_create(app: FakeDaemon) -> None:
    from modelhub.library.views import MAX_TEXT_LAYER

    big = "x" * (MAX_TEXT_LAYER + 1)
    with app.http_client() as c:
        for field, value in (("license", big), ("system", big), ("template", big)):
            r = c.post("/api/create", json={"model": "huge", "from": "tiny", field: value})
            assert r.status_code == 400, r.text
            assert r.json()["error"] == (
                f"{field if field != 'license' else 'license[0]'} is {MAX_TEXT_LAYER + 1} bytes; "
                f"the limit for a stored text is {MAX_TEXT_LAYER} bytes"
            )
        fits = c.post("/api/create", json={"model": "fits", "from": "tiny", "license": "MIT"})
        assert fits.status_code == 200
        names = [m["name"] for m in c.get("/api/tags").json()["models"]]
        assert "fits:latest" in names and "huge:latest" not in names
        assert c.post("/api/show", json={"model": "fits"}).json()["license"] == "MIT"


def test_blobs_and_folders_are_private_and_counted_once(app: FakeDaemon, tmp_path: Path) -> None:
    source = write_tiny_llama(tmp_path / "public.gguf", seed=5)
    source.chmod(0o644)
    digest = "sha256:" + __import__("hashlib").sha256(source.read_bytes()).hexdigest()
    with app.http_client() as c:
        assert c.post(f"/api/blobs/{digest}", content=source.read_bytes()).status_code == 201
        files = {"a.gguf": digest, "b.gguf": digest}  # the same file listed twice
        r = c.post("/api/create", json={"model": "twice", "files": files, "stream": False})
        assert r.status_code == 200, r.text
        size = next(
            m["size"] for m in c.get("/api/tags").json()["models"] if m["name"] == "twice:latest"
        )
    blob = app.models / "blobs" / digest.replace(":", "-")
    assert oct(blob.stat().st_mode & 0o777) == oct(0o600)
    for folder in (app.models, app.models / "blobs", app.models / "manifests"):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700), folder
    assert source.stat().st_size < size < 2 * source.stat().st_size


def test_from_a_fifo_is_refused_without_reading_it(app: FakeDaemon, tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {fifo}\n")
    r = app.cli("create", "fifo", "-f", str(mf))
    assert r.returncode == 1
    assert r.stderr == f"Error: {mf} (line 1): FROM {fifo}: {fifo} is not a regular file\n"


def test_junk_images_and_think_are_400s(app: FakeDaemon) -> None:
    cases = [
        ({"images": "abc"}, 'field "images" must be an array of base64 strings'),
        ({"images": ["@@@"]}, "images[0]: invalid base64 data"),
        ({"images": ["aGk="]}, "images"),  # no projector (generate), not on a message (chat)
        ({"think": "maybe"}, 'invalid think value: "maybe" (must be "high"'),
        ({"think": 3}, "invalid think value: 3"),
    ]
    with app.http_client() as c:
        for extra, message in cases:
            for path, body in (
                ("/api/generate", {"model": "tiny", "prompt": "a", **extra}),
                (
                    "/api/chat",
                    {"model": "tiny", "messages": [{"role": "user", "content": "a"}], **extra},
                ),
            ):
                r = c.post(path, json=body)
                assert r.status_code == 400 and r.json()["error"].startswith(message), (
                    path,
                    r.text,
                )
        in_message = {"role": "user", "content": "a", "images": [1]}
        r = c.post("/api/chat", json={"model": "tiny", "messages": [in_message]})
        assert r.json()["error"] == 'field "messages[0].images" must be an array of base64 strings'
        ok = c.post(
            "/api/generate",
            json={"model": "tiny", "prompt": "a", "think": False, "images": [], "stream": False},
        )
        assert ok.status_code == 200, ok.text


@pytest.mark.slow
def test_a_daemon_killed_mid_quantize_leaves_no_quantizer_and_no_debris(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from devtools.realmodels import smollm2_q4_1

    models = tmp_path / "models"
    d = start_daemon(models, tmp_path / "daemon.log")
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\n")
    create = subprocess.Popen(
        [sys.executable, "-m", "modelhub", "create", "q", "-f", str(mf), "--quantize", "f16"],
        env=d.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        quantizers: list[psutil.Process] = []
        while time.monotonic() < deadline and not quantizers:
            quantizers = [
                p
                for p in psutil.Process(d.proc.pid).children(recursive=True)
                if "modelhub.gguf.quantize" in " ".join(p.cmdline())
            ]
            time.sleep(0.05)
        assert quantizers, "the quantizer never started"
        time.sleep(0.5)  # it is writing its output now
        work = list((models / "tmp").iterdir())
        assert len(work) == 1 and work[0].name.startswith(f"quantize-{d.proc.pid}-")
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
        _, alive = psutil.wait_procs(quantizers, timeout=10)
        assert alive == [], "the quantizer outlived the daemon"
    finally:
        create.kill()
        create.wait(10)
        d.stop()
    assert list((models / "tmp").iterdir()) == work  # the debris is still there...
    restarted = start_daemon(models, tmp_path / "daemon2.log")
    try:
        assert list((models / "tmp").iterdir()) == []  # ...until the next daemon starts
        assert "removed 1 leftover work folder(s)" in restarted.log.read_text()
    finally:
        restarted.stop()


def test_runners_die_with_a_killed_daemon(tmp_path: Path) -> None:
    import os
    import signal

    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log")
    try:
        create(d, tmp_path, "tiny", write_tiny_llama(tmp_path / "tiny.gguf"))
        with d.client() as c:
            r = c.post("/api/generate", json={"model": "tiny", "prompt": "a", "stream": False})
            assert r.status_code == 200
        runners = [psutil.Process(pid) for pid in runner_pids(d)]
        assert len(runners) == 1
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(10)
        _, alive = psutil.wait_procs(runners, timeout=10)
        assert alive == [], "a runner outlived its daemon"
    finally:
        d.stop()


def test_a_prompt_too_long_to_fit_is_refused_before_loading(app: FakeDaemon) -> None:
    with app.http_client() as c:
        c.post("/api/generate", json={"model": "tiny", "keep_alive": 0}).raise_for_status()
        huge = "word " * 200_000  # 1 MB: more tokens than the tiny model's 256 positions
        for path, body in (
            ("/api/generate", {"model": "tiny", "prompt": huge}),
            ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": huge}]}),
            ("/v1/completions", {"model": "tiny", "prompt": huge}),
        ):
            r = c.post(path, json=body)
            assert r.status_code == 400, r.text
            text = r.text
            assert "the prompt has at least" in text and "the context holds 256" in text, text
        assert c.get("/api/ps").json()["models"] == []
    assert not app.runners.made  # no runner was started for any of them
