"""The engine applies a model's LoRA adapter (EngineConfig.adapter_paths) to its generation and
embedding contexts, refuses one that does not fit with an error naming it, and drafts
losslessly for the adapted model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.realmodels import smollm2_q4_1, smollm2_q8_0
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.errors import GGUFError
from tests.fixtures.synthetic import write_smollm2_lora, write_tiny_llama, write_tiny_llama_lora

GREEDY = GenerateOptions(temperature=0, num_predict=40)
POEM = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"
LIST = (
    "<|im_start|>user\nRepeat this list exactly: apples, pears, plums, apples, pears, plums, "
    "apples, pears, plums.<|im_end|>\n<|im_start|>assistant\n"
)


def test_tiny_adapter_changes_the_output(tmp_path: Path) -> None:
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    lora = write_tiny_llama_lora(tmp_path / "lora.gguf")
    outputs = []
    for paths in ([], [lora], [lora]):
        with Engine(EngineConfig(model_path=tiny, n_ctx=256, adapter_paths=paths)) as engine:
            prompt = engine.tokenize("hello world the model")
            outputs.append(engine.generate(prompt, GenerateOptions(temperature=0, num_predict=24)))
    base, adapted, again = (r.tokens for r in outputs)
    assert adapted != base
    assert adapted == again


def test_adapter_scale_zero_is_the_base(tmp_path: Path) -> None:
    tiny = write_tiny_llama(tmp_path / "tiny.gguf")
    lora = write_tiny_llama_lora(tmp_path / "lora.gguf")
    outputs = []
    for cfg in (
        EngineConfig(model_path=tiny, n_ctx=256),
        EngineConfig(model_path=tiny, n_ctx=256, adapter_paths=[lora], adapter_scale=0.0),
    ):
        with Engine(cfg) as engine:
            prompt = engine.tokenize("hello world")
            outputs.append(engine.generate(prompt, GenerateOptions(temperature=0, num_predict=16)))
    assert outputs[0].tokens == outputs[1].tokens


@pytest.fixture(scope="module")
def lora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_smollm2_lora(tmp_path_factory.mktemp("lora") / "smollm2-lora.gguf")


@pytest.fixture(scope="module")
def base() -> Iterator[Engine]:
    with Engine(EngineConfig(model_path=smollm2_q4_1(), n_ctx=512)) as engine:
        yield engine


@pytest.fixture(scope="module")
def adapted(lora: Path) -> Iterator[Engine]:
    """SmolLM2 with the adapter and n-gram drafting (requests turn it off with
    draft_num_predict=0)."""
    cfg = EngineConfig(
        model_path=smollm2_q4_1(),
        n_ctx=512,
        adapter_paths=[lora],
        draft_kind="ngram",
        draft_num_predict=8,
    )
    with Engine(cfg) as engine:
        yield engine


def _plain(options: GenerateOptions) -> GenerateOptions:
    return GenerateOptions(temperature=0, num_predict=options.num_predict, draft_num_predict=0)


@pytest.mark.slow
def test_the_adapter_changes_greedy_output_deterministically(base: Engine, adapted: Engine) -> None:
    before = base.generate(base.tokenize(POEM), _plain(GREEDY))
    after, again = (adapted.generate(adapted.tokenize(POEM), _plain(GREEDY)) for _ in range(2))
    assert after.tokens != before.tokens
    assert after.tokens == again.tokens
    assert after.text.strip() and after.text != before.text


@pytest.mark.slow
def test_ngram_drafting_is_lossless_for_the_adapted_model(adapted: Engine) -> None:
    options = GenerateOptions(temperature=0, num_predict=64)
    prompt = adapted.tokenize(LIST)
    alone = adapted.generate(prompt, _plain(options))
    # The second drafted run finds the first answer in the n-gram pool: drafting is certain.
    first, second = (adapted.generate(prompt, options) for _ in range(2))
    assert first.tokens == second.tokens == alone.tokens
    assert second.draft_count >= second.draft_accepted_count > 0


@pytest.mark.slow
def test_a_draft_model_drafts_losslessly_for_the_adapted_target(lora: Path) -> None:
    """The adapter is the target's alone: the base Q4_1 drafts for Q8_0 + adapter, and the
    output is still that of the adapted Q8_0."""
    cfg = EngineConfig(
        model_path=smollm2_q8_0(),
        n_ctx=512,
        adapter_paths=[lora],
        draft_kind="draft_model",
        draft_path=smollm2_q4_1(),
        draft_num_predict=4,
        adaptive=False,
    )
    short = GenerateOptions(temperature=0, num_predict=16)
    with Engine(cfg) as engine:
        prompt = engine.tokenize(POEM)
        alone = engine.generate(prompt, _plain(short))
        drafted = engine.generate(prompt, short)
    assert drafted.tokens == alone.tokens
    assert drafted.draft_count > 0


@pytest.mark.slow
def test_embeddings_use_the_adapter(base: Engine, adapted: Engine) -> None:
    (plain,), (lora,) = base.embed(["hello"]), adapted.embed(["hello"])
    assert len(plain) == len(lora) == 576
    assert max(abs(a - b) for a, b in zip(plain, lora, strict=True)) > 1e-3


@pytest.mark.slow
def test_an_adapter_that_does_not_fit_is_a_load_error_naming_it(tmp_path: Path) -> None:
    wrong = write_tiny_llama_lora(tmp_path / "tiny-lora.gguf")
    with pytest.raises(GGUFError) as exc:
        Engine(EngineConfig(model_path=smollm2_q4_1(), n_ctx=256, adapter_paths=[wrong]))
    message = exc.value.message
    assert "could not load the LoRA adapter tiny-lora.gguf" in message
    assert "incorrect shape" in message
    with pytest.raises(GGUFError, match=r"adapter file not found: .*missing.gguf"):
        Engine(EngineConfig(model_path=smollm2_q4_1(), adapter_paths=[tmp_path / "missing.gguf"]))
