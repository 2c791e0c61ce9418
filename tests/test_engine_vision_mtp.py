"""MTP drafting with images in the context (issue 23): the tiny NextN model
(tests/fixtures/synthetic.py ``write_tiny_mtp``, 64 wide) paired with a 64-wide synthetic
projector; the heads follow the image's rows (``engine.vision_drafting``), greedy output with MTP
is token-identical to the same requests without drafting, and drafts are made and kept, also
when the prompt cache keeps an image and the next prompt differs right after it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.options import GenerateResult
from tests.fixtures.media_engine import DRAFTING_PROMPTS as PROMPTS
from tests.fixtures.media_engine import IMAGE_MARK, image, media_prompt, submit_and_wait
from tests.fixtures.synthetic import write_tiny_mtp
from tests.fixtures.synthetic_projector import N_IMAGE_TOKENS, write_projector


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("vision-mtp")
    return write_tiny_mtp(d / "mtp1.gguf"), write_projector(d / "mmproj-64.gguf", n_embd_text=64)


def engine(files: tuple[Path, Path], **kw: object) -> Engine:
    model, projector = files
    cfg = EngineConfig(model, n_ctx=512, n_batch=64, n_threads=1, projector_path=projector, **kw)  # type: ignore[arg-type]
    return Engine(cfg)


@pytest.fixture(scope="module")
def plain(files: tuple[Path, Path]) -> Iterator[Engine]:
    with engine(files) as e:
        yield e


@pytest.fixture(scope="module")
def mtp(files: tuple[Path, Path]) -> Iterator[Engine]:
    with engine(files, draft_kind="mtp", draft_num_predict=4, adaptive=False) as e:
        yield e


def run(e: Engine, text: str, images: Mapping[str, object]) -> GenerateResult:
    tokens, spans = media_prompt(e, IMAGE_MARK, text, images)
    assert spans and all(s.n_tokens == N_IMAGE_TOKENS for s in spans)
    return submit_and_wait(e, tokens, spans, GenerateOptions(num_predict=64, temperature=0))


def test_mtp_greedy_identity_with_images(plain: Engine, mtp: Engine) -> None:
    images = {"0": image(1), "1": image(2)}
    drafted = accepted = 0
    for text in PROMPTS:
        expected = run(plain, text, images)
        got = run(mtp, text, images)
        assert got.tokens == expected.tokens, text
        assert got.drafter == "mtp"
        drafted += got.draft_count
        accepted += got.draft_accepted_count
    assert drafted > 0 and accepted > 0


def test_the_image_matters_and_the_cache_keeps_it(plain: Engine, mtp: Engine) -> None:
    one = run(mtp, PROMPTS[0], {"0": image(3)})
    again = run(mtp, PROMPTS[0], {"0": image(3)})  # the prompt cache keeps the image
    assert again.prompt_eval_count < N_IMAGE_TOKENS and again.draft_count > 0
    assert again.tokens == one.tokens == run(plain, PROMPTS[0], {"0": image(3)}).tokens
    other = run(mtp, PROMPTS[0], {"0": image(4)})
    assert one.tokens != other.tokens  # the heads' target reads the image
    run(mtp, PROMPTS[0], {"0": image(3)})
    # the next prompt differs right after the image: the heads need the image's last state,
    # so the image is evaluated again (never a replay from inside it), and drafting goes on
    after = run(mtp, PROMPTS[2], {"0": image(3)})
    assert after.tokens == run(plain, PROMPTS[2], {"0": image(3)}).tokens
    assert after.prompt_eval_count > N_IMAGE_TOKENS and after.draft_count > 0


def test_two_touching_images_then_other_text(plain: Engine, mtp: Engine) -> None:
    """The heads need the state of the first image's last row: both images are evaluated
    again, from the first one's start."""
    images = {"0": image(5), "1": image(6)}
    for text in ("the hello <|img-0|><|img-1|>abc", "the hello <|img-0|><|img-1|>token"):
        got = run(mtp, text, images)
        assert got.tokens == run(plain, text, images).tokens
        assert got.draft_accepted_count > 0
    assert got.prompt_eval_count > 2 * N_IMAGE_TOKENS
