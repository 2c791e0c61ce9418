"""Many clients at once through the real daemon: ``num_parallel`` sequences per model, the rest
queued (visible in /api/ps and /metrics), each greedy answer equal to the same request served
alone (plain, n-gram and draft-model drafting), a hung-up stream or queued request leaving the
others alone, 503 beyond MODELHUB_MAX_QUEUE, and memory planning per sequence."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.daemons import Daemon, start_daemon
from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub.gguf.info import read_gguf_info
from modelhub.runtime.memory import estimate
from tests.fixtures.prompts import QUESTIONS as PROMPTS

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("parallel")
    d = start_daemon(base / "models", base / "daemon.log", {"MODELHUB_KEEP_ALIVE": "10m"})
    target = f"FROM {smollm2_q8_0()}\nPARAMETER num_ctx 1024\nPARAMETER num_parallel 4\n"
    for name, extra in (
        ("par", ""),
        ("par-ngram", "DRAFT ngram\nPARAMETER draft_num_predict 8\n"),
        ("par-draft", f"DRAFT {smollm2_q4_1()}\nPARAMETER draft_num_predict 4\n"),
    ):
        mf = base / f"{name}.Modelfile"
        mf.write_text(target + extra)
        d.create(name, mf)
    yield d
    d.stop()


def _alone(d: Daemon, model: str, prompt: str, finals: list[dict[str, Any]] | None = None) -> str:
    with d.client(timeout=120) as c:
        body = {"model": model, "prompt": prompt, "stream": False, "options": GREEDY}
        r = c.post("/api/generate", json=body)
        assert r.status_code == 200, r.text
        if finals is not None:
            finals.append(r.json())
        return str(r.json()["response"])


def _stream(d: Daemon, model: str, prompt: str, stop_after: int | None = None) -> dict[str, Any]:
    """Stream one answer (hanging up after ``stop_after`` chunks); its text and final chunk."""
    text, final = "", {}
    with d.client(timeout=120) as c:
        body = {"model": model, "prompt": prompt, "options": GREEDY}
        with c.stream("POST", "/api/generate", json=body) as r:
            assert r.status_code == 200
            for i, line in enumerate(r.iter_lines()):
                if not line.strip():
                    continue
                chunk = json.loads(line)
                text += chunk.get("response", "")
                if chunk.get("done"):
                    final = chunk
                if stop_after is not None and i + 1 >= stop_after:
                    break
    return {"text": text, "final": final}


class Watcher:
    """Polls /api/ps while requests run: the most running and queued seen for one model."""

    def __init__(self, d: Daemon, model: str) -> None:
        self.d, self.model = d, model
        self.running = self.queued = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        with self.d.client(timeout=10) as c:
            while not self._stop.is_set():
                for m in c.get("/api/ps").json()["models"]:
                    if m["name"].startswith(self.model + ":"):
                        self.running = max(self.running, m["running"])
                        self.queued = max(self.queued, m["queued"])
                time.sleep(0.02)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _together(d: Daemon, model: str, prompts: list[str], **kw: Any) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in prompts]

    def run(i: int) -> None:
        results[i] = _stream(d, model, prompts[i], **(kw if i == 0 else {}))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("model", ["par", "par-ngram", "par-draft"])
def test_eight_streams_four_at_a_time_each_as_alone(served: Daemon, model: str) -> None:
    finals: list[dict[str, Any]] = []
    alone = [_alone(served, model, p, finals) for p in PROMPTS]
    with Watcher(served, model) as watch:
        together = _together(served, model, PROMPTS)
    assert [r["text"] for r in together] == alone
    assert all(r["final"].get("done_reason") in ("stop", "length") for r in together)
    assert watch.running == 4 and watch.queued >= 1  # four ran while the others waited
    ps = {m["name"]: m for m in served.client().get("/api/ps").json()["models"]}
    assert ps[f"{model}:latest"]["num_parallel"] == 4
    if model != "par":  # drafted (a 135M draft for a 135M target mostly only probes)
        finals += [r["final"] for r in together]
        assert sum(f.get("draft_count", 0) for f in finals) > 0
        assert sum(f.get("draft_accepted_count", 0) for f in finals) > 0


def test_a_stream_hung_up_midway_leaves_the_others_alone(served: Daemon) -> None:
    alone = [_alone(served, "par", p) for p in PROMPTS[:4]]
    together = _together(served, "par", PROMPTS[:4], stop_after=3)
    assert [r["text"] for r in together[1:]] == alone[1:]
    assert alone[0].startswith(together[0]["text"]) and together[0]["final"] == {}
    with served.client() as c:  # the hung-up sequence was freed: nothing runs or waits
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ps = {m["name"]: m for m in c.get("/api/ps").json()["models"]}
            if ps["par:latest"]["running"] == 0:
                break
            time.sleep(0.05)
        assert ps["par:latest"]["running"] == 0 and ps["par:latest"]["queued"] == 0
        metrics = c.get("/metrics").text
        assert 'modelhub_sequences_running{model="par:latest"} 0.0' in metrics


@pytest.fixture
def one_at_a_time(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon serving one sequence per model with room for one waiting request."""
    env = {"MODELHUB_NUM_PARALLEL": "1", "MODELHUB_MAX_QUEUE": "1"}
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", env)
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
    d.create("solo", mf)
    yield d
    d.stop()


def _wait_for(d: Daemon, what: str, value: int) -> None:
    deadline = time.monotonic() + 60
    with d.client() as c:
        while time.monotonic() < deadline:
            models = c.get("/api/ps").json()["models"]
            if models and models[0][what] == value:
                return
            time.sleep(0.05)
    raise AssertionError(f"/api/ps never showed {what} = {value}")


def _send_raw(port: int, body: dict[str, Any]) -> socket.socket:
    """Send a request on a socket of our own (closing it is the client hanging up)."""
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(
        f"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return s


def test_beyond_the_queue_is_503_and_a_queued_hang_up_leaves_it(one_at_a_time: Daemon) -> None:
    d = one_at_a_time
    long = {"model": "solo", "prompt": "Tell a long story.", "options": {"num_predict": 400}}
    with d.client(timeout=120) as c, c.stream("POST", "/api/generate", json=long) as running:
        assert running.status_code == 200
        answer = running.iter_lines()  # kept: a dropped iterator closes the stream
        next(answer)  # the long answer has started
        waiting = _send_raw(d.port, long)
        _wait_for(d, "queued", 1)
        with d.client(timeout=30) as other:
            r = other.post("/api/generate", json={**long, "stream": False})
            assert r.status_code == 503, r.text
            assert "server busy" in r.json()["error"]
        waiting.close()  # the queued client hangs up: it leaves the queue
        _wait_for(d, "queued", 0)
        _wait_for(d, "running", 1)  # while the long answer goes on
    _wait_for(d, "running", 0)
    with d.client(timeout=120) as c:  # and the model serves the next request at once
        r = c.post("/api/generate", json={**long, "stream": False, "options": GREEDY})
        assert r.status_code == 200, r.text


def test_memory_planning_counts_every_sequence(tmp_path: Path) -> None:
    path = smollm2_q4_1()
    one = estimate(read_gguf_info(path), 1024, 512)
    four = one.with_sequences(4)
    assert four.total > one.total  # each sequence has its KV cache
    # Room for four sequences, not for sixteen; automatic picks 4.
    d = start_daemon(
        tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_MEMORY_LIMIT": str(four.total)}
    )
    try:
        for name, extra in (("auto", ""), ("many", "PARAMETER num_parallel 16\n")):
            mf = tmp_path / f"{name}.Modelfile"
            mf.write_text(f"FROM {path}\nPARAMETER num_ctx 1024\n{extra}")
            d.create(name, mf)
        with d.client(timeout=120) as c:
            body = {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
            r = c.post("/api/generate", json={"model": "many", **body})
            assert r.status_code == 500, r.text
            assert "model requires more system memory" in r.json()["error"]
            assert c.get("/api/ps").json()["models"] == []  # refused before loading
            assert c.post("/api/generate", json={"model": "auto", **body}).status_code == 200
            assert c.get("/api/ps").json()["models"][0]["num_parallel"] == 4
    finally:
        d.stop()
    # Room for one sequence and a little: automatic picks 1.
    d = start_daemon(
        tmp_path / "models2",
        tmp_path / "daemon2.log",
        {"MODELHUB_MEMORY_LIMIT": str(one.total + one.kv_cache)},
    )
    try:
        mf = tmp_path / "auto.Modelfile"
        d.create("auto", mf)
        with d.client(timeout=120) as c:
            body = {"model": "auto", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
            assert c.post("/api/generate", json=body).status_code == 200
            assert c.get("/api/ps").json()["models"][0]["num_parallel"] == 1
    finally:
        d.stop()


def test_kv_cache_type_setting(tmp_path: Path) -> None:
    from modelhub.config import Settings
    from modelhub.errors import InputError

    assert Settings.from_env({}).kv_cache_type == "auto"
    assert Settings.from_env({"MODELHUB_KV_CACHE_TYPE": "Q8_0"}).kv_cache_type == "q8_0"
    with pytest.raises(InputError, match="MODELHUB_KV_CACHE_TYPE='q5': use auto, f16"):
        Settings.from_env({"MODELHUB_KV_CACHE_TYPE": "q5"})
    one = estimate(read_gguf_info(smollm2_q4_1()), 1024, 512)
    sizes = [one.with_sequences(2, t).kv_cache for t in ("f16", "auto", "q8_0", "q4_0")]
    assert sizes[0] == 2 * one.kv_cache and sizes == sorted(sizes, reverse=True)
    d = start_daemon(
        tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_KV_CACHE_TYPE": "q4_0"}
    )
    try:
        mf = tmp_path / "Modelfile"
        mf.write_text(f"FROM {smollm2_q4_1()}\nPARAMETER num_ctx 1024\n")
        d.create("kv", mf)
        with d.client(timeout=120) as c:
            body = {"model": "kv", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}
            assert c.post("/api/generate", json=body).status_code == 200
            assert c.get("/api/ps").json()["models"][0]["kv_cache_type"] == "q4_0"
    finally:
        d.stop()
