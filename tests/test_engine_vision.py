"""Images in the engine: SmolLM2-135M with the synthetic projector (tests/fixtures/
synthetic_projector.py), through libmtmd; greedy outputs depend on the image, deterministically,
and drafting keeps them token-identical."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.realmodels import smollm2_q4_1
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.vision import prompt_with_images, reusable
from tests.fixtures.synthetic_projector import N_IMAGE_TOKENS, write_projector

pytestmark = pytest.mark.slow
MARK = r"<\|img-(\d+)\|>"


def image(seed: int, w: int = 40, h: int = 48) -> dict[str, object]:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return {"width": w, "height": h, "rgb": base64.b64encode(pixels.tobytes()).decode()}


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_projector(tmp_path_factory.mktemp("proj") / "mmproj.gguf")


def make(projector: Path, **kw: object) -> Engine:
    cfg = EngineConfig(smollm2_q4_1(), n_ctx=512, n_threads=2, projector_path=projector, **kw)
    return Engine(cfg)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(projector: Path) -> Iterator[Engine]:
    with make(projector) as e:
        yield e


def run(engine: Engine, text: str, images: dict[str, object], **kw: object) -> tuple[str, int]:
    msg = {"image_marker": MARK, "images": images}
    tokens, spans = prompt_with_images(engine, text, [], msg, None)
    opts = GenerateOptions(num_predict=24, temperature=0, **kw)  # type: ignore[arg-type]
    done: list[object] = []
    ev = threading.Event()
    engine.submit(tokens, opts, lambda res, err: (done.append(res or err), ev.set()), images=spans)
    assert ev.wait(120)
    result = done[0]
    assert not isinstance(result, BaseException), result
    return result.text, result.prompt_eval_count  # type: ignore[union-attr]


def test_image_changes_greedy_output_deterministically(engine: Engine) -> None:
    prompt = chat("<|img-0|>What is in this picture?")
    a1, n1 = run(engine, prompt, {"0": image(1)})
    a2, _ = run(engine, prompt, {"0": image(1)})  # the prompt cache keeps the image
    b, _ = run(engine, prompt, {"0": image(2)})  # same tokens, another image: not reused
    plain = engine.generate(
        engine.tokenize(chat("What is in this picture?")),
        GenerateOptions(num_predict=24, temperature=0),
    ).text
    assert a1 == a2
    assert a1 != b
    assert a1 != plain
    assert n1 > N_IMAGE_TOKENS


def test_two_images_and_order(engine: Engine) -> None:
    both = run(engine, chat("<|img-0|><|img-1|>Compare them."), {"0": image(3), "1": image(4)})
    swapped = run(engine, chat("<|img-0|><|img-1|>Compare them."), {"0": image(4), "1": image(3)})
    assert both[0] != swapped[0]


def test_greedy_identity_with_ngram_drafting(projector: Path, engine: Engine) -> None:
    prompt = chat("<|img-0|>Repeat after me: one two three one two three one two three")
    plain, _ = run(engine, prompt, {"0": image(5)})
    with make(projector, draft_kind="ngram") as drafted:
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
