"""Audio in the engine: SmolLM2-135M with the synthetic Ultravox projector
(tests/fixtures/synthetic_audio_projector.py), through libmtmd: WAV and MP3 clips decoded by
libmtmd, cut into 30-second windows, greedy outputs that depend on the clip, deterministically,
token-identical with n-gram drafting, and the count op's positions equal to the prompt's."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine
from modelhub.engine.vision import count_tokens, prompt_with_images
from modelhub.errors import InputError
from tests.fixtures.media_engine import (
    assert_media_steers_greedy_output,
    chat,
    greedy_with_media,
    smollm2_engine,
)
from tests.fixtures.synthetic_audio_projector import (
    N_AUDIO_TOKENS,
    SAMPLE_RATE,
    mp3_bytes,
    tone,
    wav_bytes,
    write_audio_projector,
)

pytestmark = pytest.mark.slow
MARK = r"<\|clip-(\d+)\|>"


def clip(data: bytes, frames: int = SAMPLE_RATE, rate: int = SAMPLE_RATE) -> dict[str, object]:
    return {"audio": base64.b64encode(data).decode(), "frames": frames, "sample_rate": rate}


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_audio_projector(tmp_path_factory.mktemp("aproj") / "mmproj-audio.gguf")


@pytest.fixture(scope="module")
def engine(projector: Path) -> Iterator[Engine]:
    with smollm2_engine(projector) as e:
        yield e


def run(engine: Engine, text: str, clips: Mapping[str, object]) -> tuple[str, int]:
    return greedy_with_media(engine, MARK, text, clips)


def test_projector_reads_audio_only(engine: Engine) -> None:
    assert engine.projector is not None
    assert engine.projector.audio and not engine.projector.vision
    assert engine.projector.sample_rate == SAMPLE_RATE


def test_clip_changes_greedy_output_deterministically(engine: Engine) -> None:
    question = "What is said in this recording?"
    one = {"0": clip(wav_bytes(tone(440, noise=1)))}
    other = {"0": clip(wav_bytes(tone(1300, noise=2)))}
    assert_media_steers_greedy_output(
        engine, MARK, "<|clip-0|>", question, one, other, N_AUDIO_TOKENS
    )


def test_mp3_and_wav_of_other_rates_are_decoded_by_libmtmd(engine: Engine) -> None:
    prompt = chat("<|clip-0|>Describe the sound.")
    wav_8k = wav_bytes(tone(440, rate=8000, noise=3), rate=8000)
    assert run(engine, prompt, {"0": clip(mp3_bytes(tone(700, noise=4)))})[0]
    assert run(engine, prompt, {"0": clip(wav_8k, 8000, 8000)})[0]


def test_a_clip_longer_than_a_window_takes_two_and_counts_as_the_prompt(engine: Engine) -> None:
    text = chat("<|clip-0|>Summarise.")
    long = tone(220, seconds=31.0, noise=5)
    msg = {"image_marker": MARK, "images": {"0": clip(wav_bytes(long), long.size)}}
    tokens, spans = prompt_with_images(engine, text, [], msg, None)
    assert [s.n_tokens for s in spans] == [N_AUDIO_TOKENS, N_AUDIO_TOKENS]
    counted = {"image_marker": MARK, "audio_frames": {"0": [long.size, SAMPLE_RATE]}}
    assert count_tokens(engine, text, counted, True, None) == len(tokens)
    # a clip sent at another rate counts as the samples libmtmd resamples it to
    half = {"image_marker": MARK, "audio_frames": {"0": [long.size // 2, SAMPLE_RATE // 2]}}
    assert count_tokens(engine, text, half, True, None) == len(tokens)


def test_greedy_identity_with_ngram_drafting(projector: Path, engine: Engine) -> None:
    prompt = chat("<|clip-0|>Repeat after me: one two three one two three one two three")
    sound = {"0": clip(wav_bytes(tone(523, noise=6)))}
    plain, _ = run(engine, prompt, sound)
    with smollm2_engine(projector, draft_kind="ngram") as drafted:
        text, _ = run(drafted, prompt, sound)
    assert text == plain


def test_undecodable_clip_is_an_input_error(engine: Engine) -> None:
    bad = {"0": clip(b"RIFF\0\0\0\0WAVEjunkjunkjunk")}
    with pytest.raises(InputError, match="audio cannot be decoded"):
        prompt_with_images(
            engine, chat("<|clip-0|>hi"), [], {"image_marker": MARK, "images": bad}, None
        )


def test_image_to_an_audio_only_projector_is_refused(engine: Engine) -> None:
    pixels = {"width": 8, "height": 8, "rgb": base64.b64encode(bytes(192)).decode()}
    msg = {"image_marker": MARK, "images": {"0": pixels}}
    with pytest.raises(InputError, match="no vision encoder"):
        prompt_with_images(engine, chat("<|clip-0|>hi"), [], msg, None)
