"""Images through the real daemon: SmolLM2-135M paired with the synthetic projector
(tests/fixtures/synthetic_projector.py), created with a second FROM as in Ollama, served on
/api/generate, /api/chat and /v1/chat/completions with the official clients; bad images
refused with a 400 naming the image before any runner work."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import ollama
import openai
import pytest
from PIL import Image

from devtools.daemons import Daemon
from devtools.realmodels import smollm2_q4_1
from tests.fixtures.synthetic_projector import write_projector

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0, "num_predict": 16, "seed": 1}


def png(seed: int, size: tuple[int, int] = (40, 48)) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def vision(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("vision")
    proj = write_projector(base / "mmproj-smol.gguf")
    mf = base / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER num_ctx 1024\n")
    daemon.create("smol-vision", mf)
    # A fixed draft length: the identity test must draft whatever the controller would decide.
    fixed = "PARAMETER draft_num_predict 6\nPARAMETER draft_adaptive false\n"
    mf.write_text(f"FROM smol-vision\nDRAFT ngram\n{fixed}")
    daemon.create("smol-vision-ngram", mf)
    yield daemon


def test_show_reports_vision_and_projector_info(vision: Daemon) -> None:
    info = ollama.Client(host=vision.url).show("smol-vision")
    assert "vision" in (info.capabilities or [])
    raw = httpx.post(vision.url + "/api/show", json={"model": "smol-vision"}).json()
    assert raw["projector_info"]["clip.projector_type"] == "mlp"
    plain = httpx.post(vision.url + "/api/show", json={"model": "smol-vision-ngram"}).json()
    assert "vision" in plain["capabilities"]


def test_create_refuses_a_projector_of_another_width(vision: Daemon, tmp_path: Path) -> None:
    proj = write_projector(tmp_path / "mmproj-wide.gguf", n_embd_text=640)
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nFROM {proj}\n")
    r = vision.cli("create", "smol-wrong-proj", "-f", str(mf))
    assert r.returncode != 0
    assert "width 640" in r.stderr and "576" in r.stderr


def test_image_changes_output_deterministically_ollama_client(vision: Daemon) -> None:
    c = ollama.Client(host=vision.url)

    def ask(*images: str) -> str:
        msg = {"role": "user", "content": "What is in this picture?", "images": list(images)}
        return c.chat("smol-vision", messages=[msg], options=GREEDY).message.content or ""

    a, again, b = ask(png(1)), ask(png(1)), ask(png(2))
    assert a == again
    assert a != b
    both = ask(png(1), png(2))
    assert both not in (a, b)
    gen = c.generate("smol-vision", "Describe it.", images=[png(1)], options=GREEDY).response
    assert (
        gen != c.generate("smol-vision", "Describe it.", images=[png(2)], options=GREEDY).response
    )
    # an image in an earlier turn still counts
    history = [
        {"role": "user", "content": "Look.", "images": [png(3)]},
        {"role": "assistant", "content": "I see it."},
        {"role": "user", "content": "What was it?"},
    ]
    other = [{**history[0], "images": [png(4)]}, *history[1:]]
    first = c.chat("smol-vision", messages=history, options=GREEDY).message.content
    assert first != c.chat("smol-vision", messages=other, options=GREEDY).message.content


def test_openai_image_url_parts(vision: Daemon) -> None:
    client = openai.OpenAI(base_url=vision.url + "/v1", api_key="x")

    def ask(data: str) -> str:
        content = [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
        ]
        r = client.chat.completions.create(
            model="smol-vision",
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            temperature=0,
            max_tokens=16,
            seed=1,
        )
        return r.choices[0].message.content or ""

    assert ask(png(1)) == ask(png(1))
    assert ask(png(1)) != ask(png(2))
    with pytest.raises(openai.BadRequestError, match="remote image URLs"):
        client.chat.completions.create(
            model="smol-vision",
            messages=[  # type: ignore[list-item]
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
                    ],
                }
            ],
        )


def test_greedy_identity_with_ngram_drafting(vision: Daemon) -> None:
    msg = {
        "role": "user",
        "content": "Count: one two three one two three one two three",
        "images": [png(5)],
    }
    body = {"messages": [msg], "options": {**GREEDY, "num_predict": 40}, "stream": False}
    plain = httpx.post(
        vision.url + "/api/chat", json={"model": "smol-vision", **body}, timeout=120
    ).json()
    drafted = httpx.post(
        vision.url + "/api/chat", json={"model": "smol-vision-ngram", **body}, timeout=120
    ).json()
    assert drafted["message"]["content"] == plain["message"]["content"]
    assert drafted.get("draft_count", 0) > 0


def _bomb() -> str:
    out = io.BytesIO()
    Image.new("1", (12000, 12000)).save(out, format="PNG")  # tiny file, 144 M pixels
    return base64.b64encode(out.getvalue()).decode()


@pytest.mark.parametrize(
    ("image", "words"),
    [
        (base64.b64encode(b"not an image at all").decode(), "not an image"),
        (png(1)[: len(png(1)) // 2 // 4 * 4], "damaged or truncated"),
        ("%%%", "invalid base64"),
        (_bomb(), "pixels"),
    ],
)
def test_bad_images_get_400_and_daemon_keeps_serving(
    vision: Daemon, image: str, words: str
) -> None:
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "x", "images": [png(1), image]},
    ]
    r = httpx.post(
        vision.url + "/api/chat",
        json={"model": "smol-vision", "messages": msgs, "stream": False},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert "messages[1].images[1]" in r.json()["error"] and words in r.json()["error"]
    ok = httpx.post(
        vision.url + "/api/generate",
        json={"model": "smol-vision", "prompt": "hi", "options": GREEDY, "stream": False},
        timeout=60,
    )
    assert ok.status_code == 200


def test_text_model_refuses_images(daemon: Daemon, tmp_path: Path) -> None:
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\n")
    daemon.create("smol-text-only", mf)
    r = httpx.post(
        daemon.url + "/api/generate",
        json={"model": "smol-text-only", "prompt": "hi", "images": [png(1)], "stream": False},
    )
    assert r.status_code == 400
    assert "cannot read images" in r.json()["error"]
