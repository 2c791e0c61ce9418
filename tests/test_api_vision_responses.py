"""``input_image`` parts on /v1/responses through the real daemon, with the ``openai`` SDK:
SmolLM2-135M paired with the synthetic projector (tests/fixtures/synthetic_projector.py). An
image is the same request as on /v1/chat/completions (the same greedy answer), in earlier turns
of a stored conversation too; ``file_id`` images and remote URLs are refused with a 400."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
from PIL import Image

from devtools.daemons import Daemon
from devtools.realmodels import smollm2_q4_1
from tests.fixtures.synthetic_projector import write_projector

pytestmark = pytest.mark.slow
MODEL = "smol-vision-responses"
QUESTION = "What is in this picture?"


def data_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 40, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def client(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    base = tmp_path_factory.mktemp("vision-responses")
    proj = write_projector(base / "mmproj-smol.gguf")
    mf = base / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER num_ctx 1024\n")
    r = daemon.cli("create", MODEL, "-f", str(mf))
    assert r.returncode == 0, r.stderr
    yield openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")


def ask(
    client: openai.OpenAI, *parts: dict[str, Any], **kw: Any
) -> openai.types.responses.Response:
    content = [{"type": "input_text", "text": QUESTION}, *parts]
    return client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
        temperature=0,
        max_output_tokens=16,
        **kw,
    )


def image(seed: int) -> dict[str, Any]:
    return {"type": "input_image", "image_url": data_url(seed), "detail": "auto"}


def test_input_image_is_the_chat_completions_image(client: openai.OpenAI) -> None:
    first = ask(client, image(1)).output_text
    assert first == ask(client, image(1)).output_text  # same image, same greedy text
    assert first != ask(client, image(2)).output_text  # another image, another text
    assert first != ask(client).output_text  # the image is read, not ignored
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": QUESTION},
                    {"type": "image_url", "image_url": {"url": data_url(1)}},
                ],
            }
        ],
        temperature=0,
        max_tokens=16,
    )
    assert chat.choices[0].message.content == first


def test_image_in_an_earlier_stored_turn(client: openai.OpenAI) -> None:
    def follow_up(seed: int) -> str:
        first = ask(client, image(seed))
        return client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input="And what colour is it?",
            temperature=0,
            max_output_tokens=16,
        ).output_text

    assert follow_up(3) == follow_up(3)
    assert follow_up(3) != follow_up(4)


@pytest.mark.parametrize(
    ("part", "words"),
    [
        ({"type": "input_image", "file_id": "file-abc123"}, "file_id is not supported"),
        ({"type": "input_image", "image_url": "https://example.com/a.png"}, "remote image URLs"),
        ({"type": "input_image", "image_url": "data:image/png;base64,%%%"}, "invalid base64"),
        ({"type": "input_file", "file_id": "file-abc123"}, "'input_file' are not supported"),
    ],
)
def test_refused_images(client: openai.OpenAI, part: dict[str, Any], words: str) -> None:
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        ask(client, part)
    if "file_id is" in words or "remote" in words:
        assert "input[0].content[1]" in str(caught.value)  # named where the client sent it
    assert ask(client, image(1)).output_text  # the daemon keeps serving
