"""Images in the engine: SmolLM2-135M with the synthetic projector (tests/fixtures/
synthetic_projector.py), through libmtmd; greedy outputs depend on the image, deterministically,
and drafting keeps them token-identical."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

from modelhub.engine.generate import Engine
from modelhub.engine.vision import reusable
from tests.fixtures import media_engine
from tests.fixtures.media_engine import (
    IMAGE_MARK,
    assert_media_steers_greedy_output,
    chat,
    greedy_with_media,
    smollm2_engine,
)
from tests.fixtures.synthetic_projector import N_IMAGE_TOKENS, write_projector

pytestmark = pytest.mark.slow


def image(seed: int) -> dict[str, object]:
    return media_engine.image(seed, width=40, height=48)


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("proj") / "mmproj.gguf")


@pytest.fixture(scope="module")
def engine(projector: Path) -> Iterator[Engine]:
    with smollm2_engine(projector) as e:
        yield e


def run(engine: Engine, text: str, images: Mapping[str, object]) -> tuple[str, int]:
    return greedy_with_media(engine, IMAGE_MARK, text, images)


def test_image_changes_greedy_output_deterministically(engine: Engine) -> None:
    question = "What is in this picture?"
    one, other = {"0": image(1)}, {"0": image(2)}
    assert_media_steers_greedy_output(
        engine, IMAGE_MARK, "<|img-0|>", question, one, other, N_IMAGE_TOKENS
    )


def test_two_images_and_order(engine: Engine) -> None:
    both = run(engine, chat("<|img-0|><|img-1|>Compare them."), {"0": image(3), "1": image(4)})
    swapped = run(engine, chat("<|img-0|><|img-1|>Compare them."), {"0": image(4), "1": image(3)})
    assert both[0] != swapped[0]


def test_greedy_identity_with_ngram_drafting(projector: Path, engine: Engine) -> None:
    prompt = chat("<|img-0|>Repeat after me: one two three one two three one two three")
    plain, _ = run(engine, prompt, {"0": image(5)})
    with smollm2_engine(projector, draft_kind="ngram") as drafted:
        text, _ = run(drafted, prompt, {"0": image(5)})
    assert text == plain


def test_reuse_never_inside_an_image() -> None:
    from modelhub.engine.vision import ImageSpan

    embd = np.zeros((4, 2), np.float32)
    a = ImageSpan(2, 4, "a", embd)
    b = ImageSpan(2, 4, "b", embd)
    assert reusable([a], [a], 10) == 10
    assert reusable([a], [b], 10) == 2
    assert reusable([a], [a], 4) == 2
    assert reusable([], [a], 10) == 2
