"""Images in the context, through the real daemon (issue 23): truncation counts an image as the
positions the projector gives it (16 for tests/fixtures/synthetic_projector.py) and never cuts
inside one; a separate draft model (SmolLM2 Q4_1 for its Q8_0 self) keeps drafting with an
image in the context and the greedy answer is token-identical to the target alone."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from devtools.daemons import Daemon
from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from tests.fixtures.synthetic_projector import N_IMAGE_TOKENS, write_projector

pytestmark = pytest.mark.slow
MARKER = re.compile(r"<\|image-[0-9a-f]+-\d+\|>")


def png(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def seer(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("vision-context")
    proj = write_projector(base / "mmproj-smol.gguf")
    draft = "DRAFT {}\nPARAMETER draft_num_predict 4\nPARAMETER draft_adaptive false\n"
    for name, text in (
        ("seer", f"FROM {smollm2_q4_1()}\nFROM {proj}\n"),
        ("seer8", f"FROM {smollm2_q8_0()}\nFROM {proj}\nPARAMETER num_ctx 1024\n"),
        ("seer8-draft", f"FROM seer8\n{draft.format(smollm2_q4_1())}"),
    ):
        mf = base / f"{name}.Modelfile"
        mf.write_text(text)
        daemon.create(name, mf)
    yield daemon


def chat(d: Daemon, model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "stream": False, **extra}
    r = httpx.post(d.url + "/api/chat", json=body, timeout=180)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_truncation_counts_image_tokens_and_keeps_images_whole(seer: Daemon) -> None:
    n_images = 6
    text_only = [
        {"role": "user", "content": "Look at these."},
        {"role": "assistant", "content": "Nice pictures."},
        {"role": "user", "content": "What was it?"},
    ]
    with_images = [{**text_only[0], "images": [png(i) for i in range(n_images)]}, *text_only[1:]]
    # the exact positions of the whole chat: its text (a fresh model: nothing cached) plus
    # the projector's tokens for each image
    plain = chat(seer, "seer", text_only, options={"num_predict": 1, "num_ctx": 512})
    positions = plain["prompt_eval_count"] + n_images * N_IMAGE_TOKENS

    def rendered(num_ctx: int) -> str:
        out = chat(seer, "seer", with_images, options={"num_ctx": num_ctx}, _debug_render_only=True)
        return str(out["debug_info"]["rendered_template"])

    # one position to spare: the chat is kept whole (a marker's text, ~18 tokens, would not fit)
    assert len(MARKER.findall(rendered(positions + 1))) == n_images
    # none to spare: the first turn goes, with all of its images, never some of them
    cut = rendered(positions)
    assert MARKER.findall(cut) == [] and "Look at these." not in cut and "What was it?" in cut
    answer = chat(seer, "seer", with_images, options={"num_ctx": positions + 1, "num_predict": 1})
    assert answer["prompt_eval_count"] <= positions


def test_greedy_identity_with_a_draft_model_and_an_image(seer: Daemon) -> None:
    history = [
        {"role": "user", "content": "Here is a picture.", "images": [png(11)]},
        {"role": "assistant", "content": "I see it."},
        {
            "role": "user",
            "content": "Describe it, then count from one to twenty in words.",
            "images": [png(12)],
        },
    ]
    greedy = {"temperature": 0, "num_predict": 48, "seed": 1}
    alone = chat(seer, "seer8", history, options=greedy)
    drafted = chat(seer, "seer8-draft", history, options=greedy)
    off = chat(seer, "seer8-draft", history, options={**greedy, "draft": "off"})
    assert drafted["message"]["content"] == alone["message"]["content"]
    assert off["message"]["content"] == alone["message"]["content"]
    assert drafted["eval_count"] == alone["eval_count"]
    assert drafted["draft_count"] >= drafted["draft_accepted_count"] > 0, drafted
    assert off.get("draft_count", 0) == 0
    # the image matters to the answer: the drafts were checked against it
    one = [{"role": "user", "content": "What is in this picture?", "images": [png(12)]}]
    two = [{**one[0], "images": [png(14)]}]
    first, second = (chat(seer, "seer8-draft", m, options=greedy) for m in (one, two))
    assert first["message"] != second["message"] and first["draft_count"] > 0
