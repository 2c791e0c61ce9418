"""A Gemma 4 assistant drafter (``gemma4-assistant``: a small model that reads the target's
attention cache and hidden states) on a tiny synthetic ``gemma4`` target: greedy output is the
target's own at every draft length, sampled output keeps its distribution, several sequences
draft at once, and pairings it cannot serve are refused before anything is loaded."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, GenerateResult
from modelhub.engine.speculative.mtp import MtpDrafter
from modelhub.errors import DraftError
from modelhub.gguf.info import read_gguf_info
from modelhub.gguf.pairing import check_assistant_pairing, check_draft_pairing
from tests.fixtures.chi2 import chi2_pvalue, exact_joint, sampled_pairs
from tests.fixtures.concurrency import run_concurrently
from tests.fixtures.synthetic_drafters import write_tiny_gemma4, write_tiny_gemma4_assistant
from tests.fixtures.synthetic_hybrid import write_tiny_qwen35

PROMPTS = ("hello world the model", "tiny fast token draft", "the the the hello")
GREEDY = GenerateOptions(num_predict=200, temperature=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("gemma4")
    target = write_tiny_gemma4(d / "tiny-gemma4.gguf")
    return target, write_tiny_gemma4_assistant(d / "tiny-gemma4-assistant.gguf", target)


def _engine(target: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(target, n_ctx=256, n_batch=64, n_threads=1, **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def references(files: tuple[Path, Path]) -> dict[str, GenerateResult]:
    with _engine(files[0]) as plain:
        return {p: plain.generate(plain.tokenize(p), GREEDY) for p in PROMPTS}


def _assisted(files: tuple[Path, Path], **kw: object) -> Engine:
    return _engine(files[0], draft_kind="mtp", draft_path=files[1], draft_num_predict=8, **kw)


def test_greedy_output_is_the_targets_at_every_k(
    files: tuple[Path, Path], references: dict[str, GenerateResult]
) -> None:
    with _assisted(files, adaptive=False) as e:
        assert isinstance(e.drafter, MtpDrafter) and e.drafter.shared
        for k in (1, 2, 4, 8):
            rejected = 0
            for prompt in PROMPTS:
                got = e.generate(
                    e.tokenize(prompt), dataclasses.replace(GREEDY, draft_num_predict=k)
                )
                assert got.tokens == references[prompt].tokens, (k, prompt)
                assert got.drafter == "mtp" and got.draft_accepted_count > 0
                rejected += got.draft_count - got.draft_accepted_count
            assert rejected > 0, k  # rejections happen, and the target's cache is cut back


def test_adaptive_and_follow_ups(
    files: tuple[Path, Path], references: dict[str, GenerateResult]
) -> None:
    """The next turn reuses the cache. The plain engine answers the same two requests: the
    fixture's heads (16 wide) get an F16 KV cache, whose attention kernel is not identical
    for every batch shape, so both sides must evaluate the prompt in the same pieces."""
    with _assisted(files) as e, _engine(files[0]) as plain:
        for prompt in PROMPTS:
            tokens = e.tokenize(prompt)
            first = e.generate(tokens, GREEDY)
            assert first.tokens == references[prompt].tokens
            assert plain.generate(tokens, GREEDY).tokens == first.tokens
            turn = [*tokens, *first.tokens[:30], *e.tokenize("world", add_special=False)]
            second = e.generate(turn, GREEDY)
            assert second.prompt_eval_count <= 2  # the prompt was reused
            assert second.tokens == plain.generate(turn, GREEDY).tokens


def test_two_sequences_draft_at_once(
    files: tuple[Path, Path], references: dict[str, GenerateResult]
) -> None:
    """Each sequence's assistant context reads its own sequence of the shared cache."""
    with _assisted(files, adaptive=False, n_parallel=2) as e:
        prompts = [e.tokenize(p) for p in PROMPTS[:2]]
        options = dataclasses.replace(GREEDY, draft_num_predict=4)
        results, running, _ = run_concurrently(e, prompts, options)
        assert running == 2
        for prompt, got in zip(PROMPTS[:2], results, strict=True):
            assert got.tokens == references[prompt].tokens
            assert got.draft_accepted_count > 0


@pytest.fixture(scope="module")
def spec(files: tuple[Path, Path]) -> Iterator[Engine]:
    with _assisted(files, adaptive=False) as e:
        yield e


def test_sampling_keeps_the_targets_distribution(files: tuple[Path, Path], spec: Engine) -> None:
    prompt = spec.tokenize("the")
    samples = sampled_pairs(spec, prompt, draft_num_predict=2)
    assert chi2_pvalue(samples, exact_joint(files[0], prompt)) > 1e-3


def test_pairings_an_assistant_cannot_serve_are_refused(
    files: tuple[Path, Path], tmp_path: Path
) -> None:
    target, assistant = (read_gguf_info(p, with_tokens=True) for p in files)
    check_draft_pairing(target, assistant, files[0], files[1])  # the right pair passes
    qwen = write_tiny_qwen35(tmp_path / "qwen35.gguf")
    with pytest.raises(DraftError, match="MTP drafter for 'gemma4' models"):
        check_draft_pairing(read_gguf_info(qwen, with_tokens=True), assistant, qwen, files[1])
    wider = dataclasses.replace(
        assistant, kv={**assistant.kv, "gemma4-assistant.embedding_length_out": 96}
    )
    with pytest.raises(DraftError, match=r"width 96, but the target .* hidden size 64"):
        check_assistant_pairing(target, wider)
    heads = dataclasses.replace(
        assistant, kv={**assistant.kv, "gemma4-assistant.attention.key_length": 32}
    )
    with pytest.raises(DraftError, match=r"attention\.key_length 32, the target .* 16"):
        check_assistant_pairing(target, heads)
    full = dataclasses.replace(
        target, kv={**target.kv, "gemma4.attention.sliding_window_pattern": [False, False]}
    )
    with pytest.raises(DraftError, match="sliding-window and a full-attention layer"):
        check_assistant_pairing(full, assistant)
    # and through the engine, before any native code sees the pair
    with pytest.raises(DraftError, match=r"is a Gemma 4 assistant; the target .* not 'gemma4'"):
        _engine(qwen, draft_kind="mtp", draft_path=files[1])
