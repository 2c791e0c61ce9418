"""A bounded soak of bad images (issue 23): 200 requests with broken, truncated, oversized,
bomb, empty and non-image data against one daemon serving the tiny llama with a projector
(tests/fixtures/synthetic_projector.py, 64 wide) each get their 400; good image requests in
between keep their answers, no runner dies, and the daemon's memory stays within 10 % of what it
used after warming up. Unmarked, as test_soak.py: synthetic models only, about 10 s."""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from PIL import Image

from devtools.daemons import start_daemon
from tests.fixtures.synthetic import write_tiny_llama
from tests.fixtures.synthetic_projector import write_projector

ROUNDS = 200


def _encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def _bad_images() -> list[tuple[str, str]]:
    """(base64 data, words of its 400) for each kind of bad image."""
    rng = np.random.default_rng(5)
    good = _encoded(Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)))
    jpeg = _encoded(Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)), "JPEG")
    bomb = _encoded(Image.new("1", (12000, 12000)))  # tiny file, 144 M pixels
    b64 = base64.b64encode
    return [
        (b64(b"not an image at all").decode(), "not an image"),
        (b64(good[: len(good) // 2]).decode(), "damaged or truncated"),
        (b64(jpeg[: len(jpeg) // 3]).decode(), "damaged or truncated"),
        ("%%%not base64", "invalid base64"),
        (b64(bomb).decode(), "pixels"),
        (b64(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode(), "image"),
        ("https://example.com/a.png", "remote image URLs|invalid base64"),
    ]


def test_two_hundred_bad_images_leave_the_daemon_whole(tmp_path: Path) -> None:
    d = start_daemon(tmp_path / "models", tmp_path / "daemon.log", {"MODELHUB_KEEP_ALIVE": "5m"})
    try:
        model = write_tiny_llama(tmp_path / "tiny.gguf")
        proj = write_projector(tmp_path / "mmproj-tiny.gguf", n_embd_text=64)
        mf = tmp_path / "Modelfile"
        mf.write_text(f"FROM {model}\nFROM {proj}\n")
        d.create("tiny-seer", mf)
        good = base64.b64encode(
            _encoded(Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)))
        ).decode()
        greedy = {"temperature": 0, "num_predict": 8}
        body = {"model": "tiny-seer", "prompt": "a", "stream": False, "options": greedy}
        bad = _bad_images()
        daemon = psutil.Process(d.proc.pid)
        with httpx.Client(base_url=d.url, timeout=60) as c:

            def answer() -> str:
                r = c.post("/api/generate", json={**body, "images": [good]})
                assert r.status_code == 200, r.text
                return str(r.json()["response"])

            reference = answer()
            runners = d.runner_pids()

            def one(i: int) -> None:
                data, words = bad[i % len(bad)]
                if i % 2:
                    r = c.post("/api/generate", json={**body, "images": [good, data]})
                    where = "images[1]"
                else:
                    msgs = [{"role": "user", "content": "b", "images": [data]}]
                    r = c.post(
                        "/api/chat", json={"model": "tiny-seer", "messages": msgs, "stream": False}
                    )
                    where = "messages[0].images[0]"
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert where in error and any(w in error for w in words.split("|")), r.text
                if i % 25 == 0:
                    assert answer() == reference

            for i in range(20):  # warm up: every kind of bad image more than once
                one(i)
            start_rss = daemon.memory_info().rss
            started = time.monotonic()
            for i in range(20, ROUNDS):
                one(i)
            elapsed = time.monotonic() - started
            end_rss = daemon.memory_info().rss
            assert answer() == reference
        print(
            f"image soak: {ROUNDS - 20} bad images in {elapsed:.1f} s, daemon RSS "
            f"{start_rss / 2**20:.1f} -> {end_rss / 2**20:.1f} MiB"
        )
        assert d.runner_pids() == runners  # the runner was never restarted
        assert end_rss <= start_rss * 1.10, f"daemon memory {start_rss >> 20} -> {end_rss >> 20} MB"
    finally:
        d.stop()
