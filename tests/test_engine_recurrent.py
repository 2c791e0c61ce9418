"""Drafting on targets with recurrent state: a tiny synthetic ``qwen35`` hybrid (gated
delta-net + attention + a NextN head) and a tiny ``mamba``. A partly rejected draft is cut back
with llama.cpp's state snapshots (qwen35) or a checkpoint and a replay of the accepted tokens
(mamba; qwen35 with ``recurrent_rollback="checkpoint"``). Either way greedy output must be the
target's own, token for token, and sampled output must keep its distribution; the tests count
the rejections and restores, or the path they claim to cover might never run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, GenerateResult
from modelhub.engine.rollback import MAX_SNAPSHOTS
from modelhub.engine.speculative.base import Drafter, ProbabilityFn, Proposal
from modelhub.engine.speculative.factory import ngram_drafter
from tests.fixtures.chi2 import chi2_pvalue, exact_joint, sampled_pairs
from tests.fixtures.concurrency import run_concurrently
from tests.fixtures.synthetic import write_tiny_mamba
from tests.fixtures.synthetic_hybrid import write_tiny_qwen35

PROMPTS = ("hello world the model", "tiny fast token draft", "the the the hello")
N_TOKENS = 200
GREEDY = GenerateOptions(num_predict=N_TOKENS, temperature=0)


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_qwen35(tmp_path_factory.mktemp("qwen35") / "tiny-qwen35.gguf")


@pytest.fixture(scope="module")
def mamba(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def _engine(path: Path, drafter: Drafter | None = None, **kw: object) -> Engine:
    cfg = EngineConfig(path, n_ctx=1024, n_batch=64, n_threads=1, **kw)  # type: ignore[arg-type]
    return Engine(cfg, drafter=drafter)


class _SometimesWrong:
    """N-gram drafts with every third token replaced: the mamba fixture's output is a cycle
    the n-gram drafter predicts perfectly, and a rollback test needs rejections."""

    kind = "ngram"

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.calls = 0

    def begin(self, tokens: Sequence[int]) -> None:
        self.inner.begin(tokens)

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        self.calls += 1
        drafts = list(self.inner.propose(tokens, max_tokens).tokens)
        for i in range(len(drafts)):
            if (self.calls + i) % 3 == 0:
                drafts[i] = (drafts[i] + 1) % 300
        return Proposal(drafts)

    def commit(self, tokens: Sequence[int]) -> None:
        self.inner.commit(tokens)


CASES = {
    # name: (fixture, engine settings, uses a wrong-on-purpose drafter)
    "qwen35-ngram-snapshots": ("qwen35", {"draft_kind": "ngram"}, False),
    "qwen35-ngram-checkpoint": (
        "qwen35",
        {"draft_kind": "ngram", "recurrent_rollback": "checkpoint"},
        False,
    ),
    "qwen35-mtp-snapshots": ("qwen35", {"draft_kind": "mtp"}, False),
    "qwen35-mtp-checkpoint": (
        "qwen35",
        {"draft_kind": "mtp", "recurrent_rollback": "checkpoint"},
        False,
    ),
    "mamba-checkpoint": ("mamba", {}, True),
}


def _case_engine(request: pytest.FixtureRequest, case: str, *, adaptive: bool) -> Engine:
    fixture, settings, wrong = CASES[case]
    path: Path = request.getfixturevalue(fixture)
    drafter = _SometimesWrong(ngram_drafter(path)) if wrong else None
    return _engine(path, drafter, draft_num_predict=8, adaptive=adaptive, **settings)


_references: dict[tuple[Path, str], GenerateResult] = {}


def _reference(path: Path, prompt: str, options: GenerateOptions = GREEDY) -> GenerateResult:
    """The target alone (no drafter, no snapshots), once per fixture and prompt."""
    key = (path, prompt + repr(options))
    if key not in _references:
        with _engine(path) as plain:
            _references[key] = plain.generate(plain.tokenize(prompt), options)
    return _references[key]


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_output_is_the_targets_at_every_k(request: pytest.FixtureRequest, case: str) -> None:
    path: Path = request.getfixturevalue(CASES[case][0])
    with _case_engine(request, case, adaptive=False) as e:
        assert e.drafting_disabled is None
        snapshots = e.ctx.n_rs_seq
        assert snapshots == (MAX_SNAPSHOTS if "snapshots" in case else 0)
        for k in (1, 2, 4, 8):
            rejected = 0
            for prompt in PROMPTS:
                got = e.generate(
                    e.tokenize(prompt), dataclasses.replace(GREEDY, draft_num_predict=k)
                )
                assert got.tokens == _reference(path, prompt).tokens, (case, k, prompt)
                assert len(got.tokens) == N_TOKENS and got.draft_accepted_count > 0
                rejected += got.draft_count - got.draft_accepted_count
            assert rejected > 0, (case, k)  # or the rollback was never exercised
        if snapshots:
            assert e.rollback.restores == 0  # every cut within the snapshots
        else:
            assert e.rollback.restores > 0


@pytest.mark.parametrize("case", list(CASES))
def test_adaptive_drafting_and_follow_ups_reuse_the_cache(
    request: pytest.FixtureRequest, case: str
) -> None:
    path: Path = request.getfixturevalue(CASES[case][0])
    with _case_engine(request, case, adaptive=True) as e:
        for prompt in PROMPTS:
            tokens = e.tokenize(prompt)
            first = e.generate(tokens, GREEDY)
            assert first.tokens == _reference(path, prompt).tokens
            # The next turn continues the cached sequence: only the new tokens are evaluated.
            turn = [*tokens, *first.tokens, *e.tokenize("world", add_special=False)]
            second = e.generate(turn, GREEDY)
            assert second.prompt_eval_count <= 3
            with _engine(path) as fresh:
                assert second.tokens == fresh.generate(turn, GREEDY).tokens


def test_a_prompt_that_diverges_restarts_from_the_prompt_checkpoint(qwen35: Path) -> None:
    """After plain rounds (one token per decode) llama.cpp would accept cutting the state back
    five tokens and leave a wrong state (its snapshots cover the last decode only): the engine
    must go back to the checkpoint taken before the last prompt token instead."""
    with _engine(qwen35, draft_kind="ngram", draft_num_predict=8) as e:
        tokens = e.tokenize(PROMPTS[0])
        plain_rounds = dataclasses.replace(GREEDY, num_predict=30, draft_num_predict=0)
        reply = e.generate(tokens, plain_rounds).tokens
        diverging = [*tokens, *reply[:25], *e.tokenize("fast tiny", add_special=False)]
        got = e.generate(diverging, GREEDY)
        assert got.prompt_eval_count == len(diverging) - (len(tokens) - 1)
        assert e.rollback.restores == 1
        with _engine(qwen35) as fresh:
            assert got.tokens == fresh.generate(diverging, GREEDY).tokens


def test_parallel_requests_replay_in_one_batch(qwen35: Path) -> None:
    """Two sequences cut back to checkpoints in the same steps: each still gets its own text."""
    with _engine(
        qwen35,
        draft_kind="ngram",
        draft_num_predict=4,
        adaptive=False,
        recurrent_rollback="checkpoint",
        n_parallel=2,
    ) as e:
        prompts = [e.tokenize(p) for p in PROMPTS[:2]]
        results, running, _ = run_concurrently(e, prompts, GREEDY)
        assert running == 2
        for prompt, got in zip(PROMPTS[:2], results, strict=True):
            assert got.tokens == _reference(qwen35, prompt).tokens
        assert e.rollback.restores > 0


@pytest.fixture(scope="module")
def mtp_spec(qwen35: Path) -> Iterator[Engine]:
    with _engine(qwen35, draft_kind="mtp", draft_num_predict=2, adaptive=False) as e:
        yield e


def test_sampling_with_mtp_keeps_the_hybrid_targets_distribution(
    qwen35: Path, mtp_spec: Engine
) -> None:
    prompt = mtp_spec.tokenize("the")
    exact = exact_joint(qwen35, prompt)
    samples = sampled_pairs(mtp_spec, prompt, draft_num_predict=2)
    assert chi2_pvalue(samples, exact) > 1e-3


def test_a_seed_gives_the_plain_targets_text_with_mtp(qwen35: Path, mtp_spec: Engine) -> None:
    options = GenerateOptions(num_predict=60, temperature=0.8, seed=42)
    expected = _reference(qwen35, PROMPTS[1], options)
    for k in (1, 2):
        got = mtp_spec.generate(
            mtp_spec.tokenize(PROMPTS[1]), dataclasses.replace(options, draft_num_predict=k)
        )
        assert got.tokens == expected.tokens and got.draft_count > 0
