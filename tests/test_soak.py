"""A bounded soak: 200 mixed requests (answers, streams cut off mid-way, hang-ups while loading,
failed loads, refusals) against one daemon end with no orphan runner and the daemon's memory
within 10 % of what it used after warming up."""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import httpx
import psutil
import pytest

from devtools.daemons import start_daemon
from tests.fixtures.synthetic import write_tiny_llama, write_tiny_llama_without

pytestmark = pytest.mark.slow  # tens of seconds
ROUNDS = 200


def _raw(port: int, path: str, body: dict[str, object], read: int, linger: float) -> None:
    """Send a request, read at most ``read`` bytes, wait ``linger`` s, and hang up."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        if read:
            s.recv(read)
        time.sleep(linger)


def test_a_mixed_soak_leaves_no_orphans_and_flat_memory(tmp_path: Path) -> None:
    d = start_daemon(
        tmp_path / "models",
        tmp_path / "daemon.log",
        {"MODELHUB_KEEP_ALIVE": "1m", "MODELHUB_MAX_LOADED_MODELS": "2"},
    )
    try:
        for name, path in (
            ("tiny", write_tiny_llama(tmp_path / "tiny.gguf")),
            ("other", write_tiny_llama(tmp_path / "other.gguf", seed=3)),
            ("broken", write_tiny_llama_without(tmp_path / "broken.gguf")),
        ):
            mf = tmp_path / f"{name}.Modelfile"
            mf.write_text(f"FROM {path}\n")
            d.create(name, mf)
        rng = random.Random(7)
        daemon = psutil.Process(d.proc.pid)
        long = {"options": {"num_predict": 200, "temperature": 0}}
        with httpx.Client(base_url=d.url, timeout=60) as c:

            def one(i: int) -> None:
                kind = rng.choice(
                    ["answer", "stream", "cut", "unload-and-hang-up", "broken", "bad", "chat"]
                )
                model = rng.choice(["tiny", "other"])
                if kind == "answer":
                    body = {"model": model, "prompt": f"a {i}", "stream": False, **long}
                    assert c.post("/api/generate", json=body).status_code == 200
                elif kind == "stream":
                    with c.stream(
                        "POST", "/api/generate", json={"model": model, "prompt": "b", **long}
                    ) as r:
                        assert r.status_code == 200 and list(r.iter_lines())
                elif kind == "cut":  # a stream abandoned after its first bytes
                    _raw(d.port, "/api/generate", {"model": model, "prompt": "c", **long}, 64, 0)
                elif kind == "unload-and-hang-up":
                    c.post("/api/generate", json={"model": model, "keep_alive": 0})
                    _raw(d.port, "/api/generate", {"model": model, "prompt": "d"}, 0, 0.05)
                elif kind == "broken":
                    r = c.post("/api/generate", json={"model": "broken", "prompt": "e"})
                    assert r.status_code in (400, 500) and "failed" in r.json()["error"]
                elif kind == "bad":
                    r = c.post("/api/generate", json={"model": model, "options": {"top_p": 7}})
                    assert r.status_code == 400
                else:
                    msgs = [{"role": "user", "content": f"hi {i}"}]
                    r = c.post(
                        "/api/chat",
                        json={"model": model, "messages": msgs, "stream": False, **long},
                    )
                    assert r.status_code == 200

            for i in range(20):  # warm up: every kind of request once or more
                one(i)
            start_rss = daemon.memory_info().rss
            for i in range(20, ROUNDS):
                one(i)
            time.sleep(1)  # let abandoned requests finish unwinding
            end_rss = daemon.memory_info().rss
            listed = len(c.get("/api/ps").json()["models"])
        print(f"soak: daemon RSS {start_rss / 2**20:.1f} -> {end_rss / 2**20:.1f} MiB")
        assert d.unlisted_runners() is None
        assert len(d.runner_pids()) == listed <= 2
        assert end_rss <= start_rss * 1.10, f"daemon memory {start_rss >> 20} -> {end_rss >> 20} MB"
    finally:
        d.stop()
