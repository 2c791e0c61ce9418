"""``input_audio`` parts on /v1/responses through the real daemon, with the ``openai`` SDK:
SmolLM2-135M paired with the synthetic Ultravox projector
(tests/fixtures/synthetic_audio_projector.py). A clip is the same request as the
``input_audio`` part on /v1/chat/completions (the same greedy answer); a bad clip is refused
with a 400 naming the input item, and the daemon keeps serving."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from devtools.daemons import Daemon
from tests.fixtures.media_daemon import create_smollm2_with, respond
from tests.fixtures.synthetic_audio_projector import tone, wav_bytes, write_audio_projector

pytestmark = pytest.mark.slow
MODEL = "smol-audio-responses"
QUESTION = "What is said here?"


def clip(seed: int) -> str:
    return base64.b64encode(wav_bytes(tone(200 + 150 * seed, 8.0, noise=seed))).decode()


def audio(seed: int) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": clip(seed), "format": "wav"}}


@pytest.fixture(scope="module")
def client(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    base = tmp_path_factory.mktemp("audio-responses")
    create_smollm2_with(daemon, MODEL, write_audio_projector(base / "mmproj-audio.gguf"))
    yield openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")


def ask(client: openai.OpenAI, *parts: dict[str, Any]) -> str:
    return respond(client, MODEL, QUESTION, *parts).output_text


def test_input_audio_is_the_chat_completions_clip(client: openai.OpenAI) -> None:
    first = ask(client, audio(1))
    assert first == ask(client, audio(1))  # same clip, same greedy text
    assert first != ask(client, audio(2))  # another clip, another text
    assert first != ask(client)  # the clip is heard, not ignored
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}, audio(1)]}],  # type: ignore[misc,list-item]
        temperature=0,
        max_tokens=16,
    )
    assert chat.choices[0].message.content == first
    # the older flat shape ({"type", "data", "format"}) is the same clip
    assert ask(client, {"type": "input_audio", "data": clip(1), "format": "wav"}) == first


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"data": base64.b64encode(b"x" * 40).decode(), "format": "wav"}, "not WAV or MP3"),
        ({"data": "%%%%", "format": "wav"}, "invalid base64"),
        ({"data": "", "format": "wav"}, "with base64 data"),
        ({"data": "UklGRiQAAABXQVZF", "format": "flac"}, "'flac' is not supported"),
        (  # a WAV whose data chunk is cut short: found when the clip is decoded
            {"data": base64.b64encode(base64.b64decode(clip(1))[:5000]).decode()},
            "truncated",
        ),
    ],
)
def test_bad_clip_gets_400(client: openai.OpenAI, body: dict[str, Any], words: str) -> None:
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        ask(client, {"type": "input_audio", "input_audio": body})
    assert caught.value.status_code == 400
    if "truncated" not in words:
        assert "input[0].content[1]" in str(caught.value)  # named where the client sent it
    assert ask(client, audio(1))  # the daemon keeps serving
