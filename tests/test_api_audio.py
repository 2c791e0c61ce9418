"""Audio through the real daemon: SmolLM2-135M paired with the synthetic Ultravox projector
(tests/fixtures/synthetic_audio_projector.py), created with a second FROM; clips in Ollama's
``images`` (as Ollama carries audio), ``input_audio`` parts on /v1/chat/completions and
/v1/audio/transcriptions, with the official ``ollama`` and ``openai`` clients; greedy answers
that depend on the clip, identical with DRAFT ngram; bad clips refused with a 400 naming them,
before any runner work, and the daemon keeps serving."""

from __future__ import annotations

import base64
import io
import struct
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
from modelhub.server.audio import MAX_AUDIO_BYTES
from modelhub.server.routes_audio import max_transcript_tokens
from tests.fixtures.synthetic_audio_projector import (
    mp3_bytes,
    tone,
    wav_bytes,
    write_audio_projector,
)
from tests.fixtures.synthetic_projector import write_projector

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0, "num_predict": 16, "seed": 1}
MODEL = "smol-audio"


def wav(seed: int, seconds: float = 8.0, rate: int = 16_000) -> bytes:
    """A clip of its own for each seed (8 s: 12 of the window's 47 rows are the clip's)."""
    return wav_bytes(tone(200 + 150 * seed, seconds, rate, noise=seed), rate)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def hearing(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("audio")
    proj = write_audio_projector(base / "mmproj-audio.gguf")
    mf = base / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\nFROM {proj}\nPARAMETER num_ctx 1024\n")
    daemon.create(MODEL, mf)
    # A fixed draft length: the identity test below must draft whatever the controller would
    # decide from this machine's costs (it once declined every guess of a 40-token answer).
    fixed = "PARAMETER draft_num_predict 6\nPARAMETER draft_adaptive false\n"
    mf.write_text(f"FROM {MODEL}\nDRAFT ngram\n{fixed}")
    daemon.create("smol-audio-ngram", mf)
    mf.write_text(f"FROM {smollm2_q4_1()}\nFROM {write_projector(base / 'mmproj-v.gguf')}\n")
    daemon.create("smol-eyes-only", mf)
    yield daemon


def ask_chat(d: Daemon, *clips: bytes, content: str = "What is said here?") -> str:
    msg = {"role": "user", "content": content, "images": list(clips)}
    out = ollama.Client(host=d.url).chat(MODEL, messages=[msg], options=GREEDY)
    return out.message.content or ""


def test_show_reports_audio_not_vision(hearing: Daemon) -> None:
    info = ollama.Client(host=hearing.url).show(MODEL)
    assert "audio" in (info.capabilities or []) and "vision" not in (info.capabilities or [])
    raw = httpx.post(hearing.url + "/api/show", json={"model": MODEL}).json()
    assert raw["projector_info"]["clip.projector_type"] == "ultravox"
    assert raw["projector_info"]["clip.has_audio_encoder"] is True
    eyes = httpx.post(hearing.url + "/api/show", json={"model": "smol-eyes-only"}).json()
    assert "vision" in eyes["capabilities"] and "audio" not in eyes["capabilities"]


def test_clip_changes_output_deterministically_ollama_client(hearing: Daemon) -> None:
    a, again, b = ask_chat(hearing, wav(1)), ask_chat(hearing, wav(1)), ask_chat(hearing, wav(2))
    assert a == again
    assert a != b
    plain = ollama.Client(host=hearing.url).chat(
        MODEL, messages=[{"role": "user", "content": "What is said here?"}], options=GREEDY
    )
    assert a != plain.message.content
    assert ask_chat(hearing, mp3_bytes(tone(600, 8.0, noise=3))) == ask_chat(
        hearing, mp3_bytes(tone(600, 8.0, noise=3))
    )
    c = ollama.Client(host=hearing.url)
    gen = [
        c.generate(MODEL, "Describe it.", images=[w], options=GREEDY).response
        for w in (wav(1), wav(1), wav(2))
    ]
    assert gen[0] == gen[1] != gen[2]


def test_openai_input_audio_parts(hearing: Daemon) -> None:
    client = openai.OpenAI(base_url=hearing.url + "/v1", api_key="x")

    def ask(data: bytes, fmt: str = "wav") -> str:
        content = [
            {"type": "text", "text": "What is said here?"},
            {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}},
        ]
        r = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
            temperature=0,
            max_tokens=16,
            seed=1,
        )
        return r.choices[0].message.content or ""

    assert ask(wav(1)) == ask(wav(1))
    assert ask(wav(1)) != ask(wav(2))
    assert ask(mp3_bytes(tone(600, 8.0, noise=3)), "mp3")
    # the same request as Ollama's chat renders the same prompt: the same greedy answer
    assert ask(wav(1)) == ask_chat(hearing, wav(1))
    bad = [
        {"type": "text", "text": "hi"},
        {"type": "input_audio", "input_audio": {"data": b64(b"x" * 40), "format": "wav"}},
    ]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content\[1\]"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": bad}])  # type: ignore[misc,list-item]
    flac = [{"type": "input_audio", "input_audio": {"data": b64(wav(1)), "format": "flac"}}]
    with pytest.raises(openai.BadRequestError, match="wav or mp3"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": flac}])  # type: ignore[misc,list-item]


def test_transcriptions_with_the_openai_client(hearing: Daemon) -> None:
    client = openai.OpenAI(base_url=hearing.url + "/v1", api_key="x")

    def transcribe(data: bytes, name: str = "clip.wav", **kw: object) -> object:
        return client.audio.transcriptions.create(model=MODEL, file=(name, data), **kw)  # type: ignore[call-overload]

    a = transcribe(wav(1))
    assert a.text and a.text == transcribe(wav(1)).text  # type: ignore[attr-defined]
    assert a.text != transcribe(wav(2)).text  # type: ignore[attr-defined]
    assert transcribe(mp3_bytes(tone(600, 8.0, noise=3)), "clip.mp3").text  # type: ignore[attr-defined]
    text = transcribe(wav(1), response_format="text")
    assert isinstance(text, str) and text.strip() == a.text  # type: ignore[attr-defined]
    verbose = transcribe(wav(1, seconds=2.0), response_format="verbose_json")
    assert verbose.duration == pytest.approx(2.0)  # type: ignore[attr-defined]
    # This model never ends its answer to the 2 s clip (it filled the context, 931 tokens,
    # before the cap): cut at 64 tokens plus 16 a second.
    short = transcribe(wav(1, seconds=2.0))
    assert short.usage.output_tokens == max_transcript_tokens(2.0) == 96  # type: ignore[attr-defined]
    # a language and a prompt are told to the model: another prompt, another greedy answer
    hinted = transcribe(wav(1), language="fr", prompt="A cooking show.")
    assert hinted.text != a.text  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("files", "form", "words"),
    [
        ({"file": (None, "text, not a file")}, {"model": MODEL}, "file is required"),
        ({"file": ("a.wav", b"")}, {"model": MODEL}, "empty"),
        ({"file": ("a.wav", b"not audio at all")}, {"model": MODEL}, "file: not audio"),
        ({"file": ("a.wav", wav(1))}, {"model": MODEL, "response_format": "srt"}, "srt"),
        ({"file": ("a.wav", wav(1))}, {"model": MODEL, "stream": "true"}, "stream"),
        ({"file": ("a.wav", wav(1))}, {"model": MODEL, "speed": "2"}, "'speed'"),
        ({"file": ("a.wav", wav(1))}, {}, "model is required"),
        ({"file": ("a.wav", wav(1))}, {"model": "smol-eyes-only"}, "cannot transcribe audio"),
    ],
)
def test_transcription_form_errors(
    hearing: Daemon, files: dict[str, object], form: dict[str, str], words: str
) -> None:
    r = httpx.post(hearing.url + "/v1/audio/transcriptions", files=files, data=form, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_transcription_needs_a_multipart_form(hearing: Daemon) -> None:
    r = httpx.post(hearing.url + "/v1/audio/transcriptions", json={"model": MODEL})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    r = httpx.post(
        hearing.url + "/v1/audio/transcriptions",
        content=b"--x\r\nbroken",
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert r.status_code == 400, r.text


def test_greedy_identity_with_ngram_drafting(hearing: Daemon) -> None:
    fox = "the quick brown fox jumps over the lazy dog."
    messages = [  # the clip in an earlier turn, and an answer that copies the context
        {"role": "user", "content": "Listen.", "images": [b64(wav(5))]},
        {"role": "assistant", "content": "I heard it."},
        {"role": "user", "content": f"Repeat after me exactly: {fox} {fox}"},
    ]
    body = {"messages": messages, "stream": False}
    off = {**GREEDY, "num_predict": 40, "draft": "off"}
    plain = httpx.post(
        hearing.url + "/api/chat", json={"model": MODEL, **body, "options": off}, timeout=120
    ).json()
    on = {**GREEDY, "num_predict": 40}
    drafted = httpx.post(
        hearing.url + "/api/chat",
        json={"model": "smol-audio-ngram", **body, "options": on},
        timeout=120,
    ).json()
    assert drafted["message"]["content"] == plain["message"]["content"]
    assert drafted.get("draft_count", 0) > 0


def _truncated_wav() -> bytes:
    whole = wav(1)
    return whole[: len(whole) // 2]


def _empty_wav() -> bytes:
    return wav_bytes(np.zeros(0))


def _long_wav() -> bytes:  # 301 s at 8 kHz, 8-bit: a small file, too long a clip
    head = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + 8000 * 301,
        b"WAVE",
        b"fmt ",
        16,
        1,
        1,
        8000,
        8000,
        1,
        8,
        b"data",
        8000 * 301,
    )
    return head + bytes([128]) * (8000 * 301)


def _large_wav() -> bytes:
    return wav_bytes(np.zeros(16)) + bytes(MAX_AUDIO_BYTES)


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize(
    ("clip", "words"),
    [
        (b"RIFF\x10\x00\x00\x00WAVEfmt garbage!", "truncated"),
        (_truncated_wav(), "truncated"),
        (_empty_wav(), "empty"),
        (_long_wav(), "more than 300 s"),
        (_large_wav(), "bytes, more than"),
        (b"\xff\xfb" + bytes(range(200)), "damaged"),
        (_png(), "cannot read images"),
    ],
)
def test_bad_audio_gets_400_and_daemon_keeps_serving(
    hearing: Daemon, clip: bytes, words: str
) -> None:
    before = ask_chat(hearing, wav(1))
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "x", "images": [b64(wav(2)), b64(clip)]},
    ]
    r = httpx.post(
        hearing.url + "/api/chat",
        json={"model": MODEL, "messages": msgs, "stream": False},
        timeout=120,
    )
    assert r.status_code == 400, r.text
    assert "messages[1].images[1]" in r.json()["error"] and words in r.json()["error"]
    t = httpx.post(
        hearing.url + "/v1/audio/transcriptions",
        files={"file": ("clip.wav", clip)},
        data={"model": MODEL},
        timeout=120,
    )
    assert t.status_code == 400, t.text
    assert "file" in t.json()["error"]["message"]
    assert ask_chat(hearing, wav(1)) == before


def test_audio_in_all_adds_up_to_the_limit(hearing: Daemon) -> None:
    long = wav_bytes(np.zeros(8000 * 160), rate=8000)  # 160 s each: two are over 300 s
    msg = {"role": "user", "content": "x", "images": [b64(long), b64(long)]}
    r = httpx.post(
        hearing.url + "/api/chat",
        json={"model": MODEL, "messages": [msg], "stream": False},
        timeout=120,
    )
    assert r.status_code == 400 and "adds up to 320.0 s" in r.json()["error"]


def test_models_without_audio_refuse_clips(hearing: Daemon, tmp_path: Path) -> None:
    r = httpx.post(
        hearing.url + "/api/chat",
        json={
            "model": "smol-eyes-only",
            "messages": [{"role": "user", "content": "x", "images": [b64(wav(1))]}],
            "stream": False,
        },
    )
    assert r.status_code == 400 and "cannot read audio" in r.json()["error"]
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {smollm2_q4_1()}\n")
    hearing.create("smol-deaf", mf)
    r = httpx.post(
        hearing.url + "/api/generate",
        json={"model": "smol-deaf", "prompt": "hi", "images": [b64(wav(1))], "stream": False},
    )
    assert r.status_code == 400 and "cannot read images or audio" in r.json()["error"]
