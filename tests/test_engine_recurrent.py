"""A target with recurrent state (a tiny synthetic Mamba): its state cannot be cut back to an
earlier position, so the engine serves it without drafting (saying why) and re-evaluates a
prompt instead of reusing part of an earlier one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.speculative.base import Proposal
from tests.fixtures.synthetic import write_tiny_mamba

GREEDY = GenerateOptions(num_predict=40, temperature=0)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def _engine(path: Path, drafter: object = None, **kw: object) -> Engine:
    cfg = EngineConfig(path, n_ctx=256, n_batch=64, n_threads=1, **kw)  # type: ignore[arg-type]
    return Engine(cfg, drafter=drafter)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(mamba: Path) -> Iterator[Engine]:
    with _engine(mamba) as e:
        assert e.model.is_recurrent
        yield e


def test_drafting_is_disabled_with_a_logged_reason(
    mamba: Path, plain: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="modelhub.engine")
    prompt = plain.tokenize("hello world the model")
    expected = plain.generate(prompt, GREEDY)
    with _engine(mamba, draft_kind="ngram", draft_num_predict=8) as ngram:
        assert ngram.drafting_disabled == "mamba keeps recurrent state that cannot be rolled back"
        got = ngram.generate(prompt, GREEDY)
    assert "drafting disabled: mamba keeps recurrent state" in caplog.text
    assert got.tokens == expected.tokens
    assert got.drafter is None and got.draft_count == 0


class _AlwaysDrafts:
    """A drafter that would propose every round: it must never be asked."""

    kind = "ngram"

    def begin(self, tokens: object) -> None:
        raise AssertionError("a recurrent target must not draft")

    def propose(self, tokens: object, max_tokens: int, probs: object = None) -> Proposal:
        raise AssertionError("a recurrent target must not draft")

    def commit(self, tokens: object) -> None:
        raise AssertionError("a recurrent target must not draft")


def test_an_embedders_drafter_is_refused_too(mamba: Path, plain: Engine) -> None:
    prompt = plain.tokenize("tiny fast token")
    with _engine(mamba, drafter=_AlwaysDrafts(), draft_num_predict=8) as e:
        assert e.drafting_disabled is not None and e.drafter is None
        assert e.generate(prompt, GREEDY).tokens == plain.generate(prompt, GREEDY).tokens


def test_a_shared_prefix_is_evaluated_again_not_cut_back(mamba: Path, plain: Engine) -> None:
    first = plain.tokenize("hello world the model draft")
    second = first[:3] + plain.tokenize("fast tiny", add_special=False)
    plain.generate(first, GREEDY)
    got = plain.generate(second, GREEDY)
    assert got.prompt_eval_count == len(second)  # the state could not be cut back to 3 tokens
    with _engine(mamba) as fresh:
        assert got.tokens == fresh.generate(second, GREEDY).tokens
    # A prompt that extends the cached sequence exactly continues from the state.
    follow = [*second, *got.tokens, *plain.tokenize("world", add_special=False)]
    again = plain.generate(follow, GREEDY)
    assert again.prompt_eval_count < len(follow) // 2
    with _engine(mamba) as fresh:
        assert again.tokens == fresh.generate(follow, GREEDY).tokens
