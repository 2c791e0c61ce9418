"""``input_image`` parts on /v1/responses through the real daemon, with the ``openai`` SDK:
SmolLM2-135M paired with the synthetic projector (tests/fixtures/synthetic_projector.py). An
image is the same request as on /v1/chat/completions (the same greedy answer), in earlier turns
of a stored conversation too; ``file_id`` images and remote URLs are refused with a 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from devtools.daemons import Daemon
from tests.fixtures.media_daemon import create_smollm2_with, png, respond
from tests.fixtures.synthetic_projector import write_projector

pytestmark = pytest.mark.slow
MODEL = "smol-vision-responses"
QUESTION = "What is in this picture?"


def data_url(seed: int) -> str:
    return "data:image/png;base64," + png(seed, width=40, height=48)


@pytest.fixture(scope="module")
def client(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    base = tmp_path_factory.mktemp("vision-responses")
    create_smollm2_with(daemon, MODEL, write_projector(base / "mmproj-smol.gguf"))
    yield openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")


def ask(client: openai.OpenAI, *parts: dict[str, Any], **kw: Any) -> Response:
    return respond(client, MODEL, QUESTION, *parts, **kw)


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
