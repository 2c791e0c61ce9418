"""Drafting with images in the context by the drafters that read the target's states other than
MTP (issue 23): EAGLE-3 heads and DFlash block drafters on the tiny synthetic llama target, and a
Gemma 4 assistant on the tiny synthetic ``gemma4`` target (tests/fixtures/synthetic_drafters.py),
each given a 64-wide synthetic projector. They follow the image's rows as MTP heads do
(``engine.vision_drafting``): greedy output with drafting is token-identical to the same request
without drafting, drafts are made and kept, also when the prompt cache keeps an image and the
next prompt differs right after it; and what EAGLE-3 and DFlash read of an image's rows is the
target's layer inputs there (layer 0's input is the image's embeddings)."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.options import GenerateResult
from modelhub.engine.speculative.layered import LayeredDrafter
from modelhub.engine.vision import decode_embeddings
from tests.fixtures import synthetic, synthetic_drafters
from tests.fixtures.media_engine import DRAFTING_PROMPTS as PROMPTS
from tests.fixtures.media_engine import IMAGE_MARK, image, media_prompt, submit_and_wait
from tests.fixtures.synthetic_audio_projector import tone, wav_bytes, write_audio_projector
from tests.fixtures.synthetic_projector import N_IMAGE_TOKENS, write_projector

KINDS = ("eagle3", "dflash", "assistant")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("vision-layered")
    llama = synthetic.write_tiny_llama(d / "tiny-llama.gguf")
    gemma4 = synthetic_drafters.write_tiny_gemma4(d / "tiny-gemma4.gguf")
    return {
        "llama": llama,
        "gemma4": gemma4,
        "eagle3": synthetic_drafters.write_tiny_eagle3(d / "tiny-eagle3.gguf", llama),
        "dflash": synthetic_drafters.write_tiny_dflash(d / "tiny-dflash.gguf", llama),
        "assistant": synthetic_drafters.write_tiny_gemma4_assistant(d / "assistant.gguf", gemma4),
        "projector": write_projector(d / "mmproj-64.gguf", n_embd_text=64),
        "audio": write_audio_projector(d / "mmproj-audio-64.gguf", n_embd_text=64),
    }


def target_of(kind: str) -> str:
    return "gemma4" if kind == "assistant" else "llama"


def engine(
    files: dict[str, Path], target: str, kind: str | None = None, projector: str = "projector"
) -> Engine:
    kw: dict[str, object] = {}
    if kind is not None:
        draft_kind = "mtp" if kind == "assistant" else kind
        kw = {"draft_kind": draft_kind, "draft_path": files[kind], "adaptive": False}
        kw["draft_num_predict"] = 3 if kind == "dflash" else 4  # DFlash's cap: block size - 1
    cfg = EngineConfig(
        files[target],
        n_ctx=512,
        n_batch=64,
        n_threads=1,
        projector_path=files[projector],
        **kw,  # type: ignore[arg-type]
    )
    return Engine(cfg)


@pytest.fixture(scope="module")
def plain(files: dict[str, Path]) -> Iterator[dict[str, Engine]]:
    with engine(files, "llama") as llama, engine(files, "gemma4") as gemma4:
        yield {"llama": llama, "gemma4": gemma4}


@pytest.fixture(scope="module", params=KINDS)
def drafting(request: pytest.FixtureRequest, files: dict[str, Path]) -> Iterator[Engine]:
    with engine(files, target_of(request.param), request.param) as e:
        yield e


def run(e: Engine, text: str, images: Mapping[str, object]) -> GenerateResult:
    tokens, spans = media_prompt(e, IMAGE_MARK, text, images)
    assert spans
    return submit_and_wait(e, tokens, spans, GenerateOptions(num_predict=64, temperature=0))


def reference(plain: dict[str, Engine], e: Engine) -> Engine:
    return plain["gemma4" if e.model.path.name.startswith("tiny-gemma4") else "llama"]


def test_greedy_identity_with_images(plain: dict[str, Engine], drafting: Engine) -> None:
    base = reference(plain, drafting)
    images = {"0": image(1), "1": image(2)}
    drafted = accepted = 0
    for text in PROMPTS:
        got = run(drafting, text, images)
        assert got.tokens == run(base, text, images).tokens, text
        assert got.drafter == drafting.cfg.draft_kind
        drafted += got.draft_count
        accepted += got.draft_accepted_count
    assert drafted > accepted > 0  # drafts made, kept, and rejections cut back


def test_the_image_matters_and_the_cache_keeps_it(
    plain: dict[str, Engine], drafting: Engine
) -> None:
    base = reference(plain, drafting)
    one = run(drafting, PROMPTS[0], {"0": image(3)})
    again = run(drafting, PROMPTS[0], {"0": image(3)})  # the prompt cache keeps the image
    assert again.prompt_eval_count < N_IMAGE_TOKENS and again.draft_accepted_count > 0
    assert again.tokens == one.tokens == run(base, PROMPTS[0], {"0": image(3)}).tokens
    other = run(drafting, PROMPTS[0], {"0": image(4)})
    assert one.tokens != other.tokens  # the target reads the image
    assert other.tokens == run(base, PROMPTS[0], {"0": image(4)}).tokens
    # the next prompt differs right after the image: drafting goes on, the output unchanged
    run(drafting, PROMPTS[0], {"0": image(3)})
    after = run(drafting, PROMPTS[2], {"0": image(3)})
    assert after.tokens == run(base, PROMPTS[2], {"0": image(3)}).tokens
    assert after.draft_accepted_count > 0


def test_two_touching_images_then_other_text(plain: dict[str, Engine], drafting: Engine) -> None:
    base = reference(plain, drafting)
    images = {"0": image(5), "1": image(6)}
    for text in ("the hello <|img-0|><|img-1|>abc", "the hello <|img-0|><|img-1|>token"):
        got = run(drafting, text, images)
        assert got.tokens == run(base, text, images).tokens
        assert got.draft_accepted_count > 0


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_layer_inputs_of_image_rows_are_the_images(files: dict[str, Path], kind: str) -> None:
    """What the layer-fed drafters read after the target decodes an image's rows: layer 0's
    input there is the image's embeddings, row for row (so the states they follow are the
    image's, not a stale batch's)."""
    with engine(files, "llama", kind) as e:
        drafter = e.drafter
        assert isinstance(drafter, LayeredDrafter) and 0 in drafter.layer_ids
        _, spans = media_prompt(e, IMAGE_MARK, "the <|img-0|> hello", {"0": image(7)})
        span = dataclasses.replace(spans[0], start=0)  # into the empty cache
        seen: list[np.ndarray] = []

        def after(off: int, n: int) -> None:
            seen.append(drafter.api.layer_rows(e.ctx.handle, 0, 0, n, drafter.n_target_embd))

        decode_embeddings(e.ctx, span, 0, after)
        assert np.allclose(np.concatenate(seen), span.embd, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_greedy_identity_with_an_audio_clip(files: dict[str, Path], kind: str) -> None:
    """A clip's rows are followed as an image's are (the 64-wide synthetic audio projector)."""
    sound = wav_bytes(tone(523, seconds=4.0, noise=6))
    clips = {str(i): {"audio": base64.b64encode(sound).decode()} for i in range(2)}
    text = "the hello <|img-0|> world tiny draft <|img-1|> model fast"
    with engine(files, "llama", projector="audio") as base:
        want = run(base, text, clips)
    with engine(files, "llama", kind, projector="audio") as e:
        got = run(e, text, clips)
        assert got.tokens == want.tokens
        assert got.draft_accepted_count > 0
