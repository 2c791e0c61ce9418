"""Engine behaviour on tiny synthetic GGUFs: greedy identity, exact sampling, edge cases.

The target/draft pair is written by ``tests/fixtures/synthetic.py`` (2-block llama models,
Q8_0, draft = target + noise), so every test here runs in milliseconds per request.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, TokenEvent
from modelhub.engine.speculative.base import ProbabilityFn, Proposal
from modelhub.engine.speculative.verify import accept_probability, draw
from tests.fixtures.chi2 import chi2_pvalue, exact_joint, sampled_pairs
from tests.fixtures.synthetic import write_tiny_llama_pair

PROMPTS = ["the hello world", "tiny draft model fast", "abc token the world"]
N_CTX = 256


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_llama_pair(tmp_path_factory.mktemp("tiny"))


def _engine(target: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(target, n_ctx=N_CTX, n_batch=64, n_threads=1, **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(pair: tuple[Path, Path]) -> Iterator[Engine]:
    with _engine(pair[0]) as e:
        yield e


@pytest.fixture(scope="module")
def spec(pair: tuple[Path, Path]) -> Iterator[Engine]:
    with _engine(
        pair[0], draft_kind="draft_model", draft_path=pair[1], draft_num_predict=8, adaptive=False
    ) as e:
        yield e


@pytest.fixture(scope="module")
def adaptive(pair: tuple[Path, Path]) -> Iterator[Engine]:
    with _engine(pair[0], draft_kind="draft_model", draft_path=pair[1], draft_num_predict=8) as e:
        yield e


GREEDY = GenerateOptions(num_predict=96, temperature=0)


def _greedy(k: int | None = None, **kw: object) -> GenerateOptions:
    kw.setdefault("num_predict", 96)
    return GenerateOptions(temperature=0, draft_num_predict=k, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_greedy_identity_fixed_k(plain: Engine, spec: Engine, k: int) -> None:
    for prompt in PROMPTS:
        tokens = plain.tokenize(prompt)
        expected = plain.generate(tokens, GREEDY)
        got = spec.generate(tokens, _greedy(k))
        assert got.tokens == expected.tokens
        assert got.text == expected.text
        assert got.draft_count > 0 and got.drafter == "draft_model"
        assert got.draft_accepted_count <= got.draft_count


def test_greedy_identity_adaptive_and_cache_reuse(plain: Engine, adaptive: Engine) -> None:
    for prompt in PROMPTS * 2:  # the second pass reuses the prompt cache
        tokens = plain.tokenize(prompt)
        expected = plain.generate(tokens, GREEDY)
        got = adaptive.generate(tokens, GREEDY)
        assert got.tokens == expected.tokens
    # a follow-up request that extends the previous answer reuses everything before it
    follow = tokens + got.tokens[:40] + plain.tokenize(" the", add_special=False)
    again = adaptive.generate(follow, GREEDY)
    assert again.prompt_eval_count <= len(follow) - len(tokens) - 39 + 1
    assert again.tokens == plain.generate(follow, GREEDY).tokens


def test_self_draft_accepts_everything(pair: tuple[Path, Path], tmp_path: Path) -> None:
    """SPEC-02: a draft identical to the target must be accepted (almost) always."""
    twin = tmp_path / "twin.gguf"
    shutil.copyfile(pair[0], twin)
    with _engine(pair[0], draft_kind="draft_model", draft_path=twin, adaptive=False) as e:
        for prompt in PROMPTS:
            r = e.generate(e.tokenize(prompt), _greedy(4, num_predict=200))
            assert r.draft_count > 100
            assert r.acceptance >= 0.99


def test_num_predict_reached_mid_chunk(plain: Engine, spec: Engine) -> None:
    tokens = plain.tokenize(PROMPTS[0])
    for n in (1, 2, 5, 37):
        expected = plain.generate(tokens, _greedy(None, num_predict=n))
        got = spec.generate(tokens, _greedy(8, num_predict=n))
        assert got.tokens == expected.tokens and len(got.tokens) == n
        assert got.done_reason == "length"


def test_stop_string_inside_a_chunk(plain: Engine, spec: Engine) -> None:
    tokens = plain.tokenize(PROMPTS[1])
    full = plain.generate(tokens, GREEDY).text
    stop = full[30:34]
    expected = plain.generate(tokens, _greedy(None, stop=[stop]))
    pieces: list[str] = []
    got = spec.generate(tokens, _greedy(8, stop=[stop]), on_token=lambda e: pieces.append(e.text))
    assert expected.text == full[: full.index(stop)]
    assert got.text == expected.text == "".join(pieces)
    assert got.done_reason == expected.done_reason == "stop"
    # the caches stay consistent: the next request matches a fresh plain run
    assert spec.generate(tokens, _greedy(4)).tokens == plain.generate(tokens, GREEDY).tokens


def test_full_context_stops_with_length(pair: tuple[Path, Path]) -> None:
    with (
        _engine(
            pair[0],
            draft_kind="draft_model",
            draft_path=pair[1],
            draft_num_predict=5,
            adaptive=False,
        ) as e,
        _engine(pair[0]) as p,
    ):
        tokens = e.tokenize(PROMPTS[0])
        # shift off: the context bounds the answer (shifting: test_engine_shift.py)
        got = e.generate(tokens, _greedy(5, num_predict=-1, shift=False))
        expected = p.generate(tokens, GreedyAll())
        assert got.done_reason == "length" == expected.done_reason
        assert got.tokens == expected.tokens
        assert len(tokens) + len(got.tokens) == N_CTX + 1  # the last token is never decoded
        assert e.generate(tokens, _greedy(5)).tokens == got.tokens[:96]


def GreedyAll() -> GenerateOptions:
    return GenerateOptions(num_predict=-1, temperature=0, shift=False)


def test_short_draft_context_turns_drafting_off_not_the_request(pair: tuple[Path, Path]) -> None:
    """SPEC-07: draft context 64, target 256: drafting stops when the sequence outgrows it."""
    with (
        _engine(
            pair[0],
            draft_kind="draft_model",
            draft_path=pair[1],
            draft_num_predict=4,
            adaptive=False,
            draft_n_ctx=64,
        ) as e,
        _engine(pair[0]) as p,
    ):
        tokens = e.tokenize(PROMPTS[2])
        drafted: list[bool] = []
        got = e.generate(
            tokens, _greedy(4, num_predict=150), on_token=lambda ev: drafted.append(ev.drafted)
        )
        assert got.tokens == p.generate(tokens, _greedy(None, num_predict=150)).tokens
        assert any(drafted)
        # nothing drafted once prompt + output no longer fit the draft's 64 positions
        assert not any(drafted[64 - len(tokens) :])


class WrongAtTwo:
    """A scripted drafter: proposes the target's own continuation but wrong at position 2."""

    kind = "scripted"

    def __init__(self, reference: Sequence[int], prompt_len: int) -> None:
        self.reference = list(reference)
        self.prompt_len = prompt_len
        self.commits: list[int] = []

    def begin(self, tokens: Sequence[int]) -> None:
        pass

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        at = len(tokens) - self.prompt_len
        guess = self.reference[at : at + max_tokens]
        if len(guess) >= 2:
            guess[1] = (guess[1] + 1) % 300 + 3
        return Proposal(guess)

    def commit(self, tokens: Sequence[int]) -> None:
        self.commits.append(len(tokens))


def test_scripted_wrong_drafter_positions_and_stats(pair: tuple[Path, Path], plain: Engine) -> None:
    """SPEC-06/SPEC-09: caches follow the committed tokens; stats count exactly."""
    tokens = plain.tokenize(PROMPTS[0])
    reference = plain.generate(tokens, GREEDY).tokens
    scripted = WrongAtTwo(reference, len(tokens))
    cfg = EngineConfig(
        pair[0], n_ctx=N_CTX, n_batch=64, n_threads=1, draft_num_predict=4, adaptive=False
    )
    with Engine(cfg, drafter=scripted) as e:
        positions: list[tuple[int, int]] = []
        events: list[TokenEvent] = []

        def watch(ev: TokenEvent) -> None:
            events.append(ev)
            positions.append((e.ctx.pos_max(), len(events)))

        got = e.generate(tokens, GREEDY, on_token=watch)
        assert got.tokens == reference
        # each round proposes 4 (fewer near the end), keeps exactly 1 (position 2 is wrong)
        assert got.draft_accepted_count == got.draft_steps
        assert got.draft_count >= 3 * got.draft_steps
        # emitted = first token + (accepted + 1) per drafting round + 1 final plain round
        # (95 tokens after 47 rounds of 2: the last round has room for one token only)
        assert len(got.tokens) == 1 + got.draft_accepted_count + got.draft_steps + 1
        assert sum(ev.drafted for ev in events) == got.draft_accepted_count
        # after every round the target cache holds the committed sequence minus its last token
        assert e.ctx.pos_max() == len(tokens) + len(got.tokens) - 2
        assert all(c == len(tokens) + 1 + 2 * (i + 1) for i, c in enumerate(scripted.commits[:-1]))


@pytest.mark.parametrize("cancel_after", [1, 2, 3, 4, 5, 9])
def test_cancel_mid_round_leaves_caches_consistent(
    plain: Engine, spec: Engine, cancel_after: int
) -> None:
    """SPEC-11: cancel after the n-th streamed token, whatever round it falls in."""
    tokens = plain.tokenize(PROMPTS[1])
    cancel = threading.Event()
    seen: list[int] = []

    def on_token(ev: TokenEvent) -> None:
        seen.append(ev.token)
        if len(seen) == cancel_after:
            cancel.set()

    got = spec.generate(tokens, _greedy(8), on_token=on_token, cancel=cancel)
    assert got.done_reason == "cancel"
    assert got.tokens == seen[:cancel_after] == plain.generate(tokens, GREEDY).tokens[:cancel_after]
    assert spec.ctx.pos_max() == len(tokens) + cancel_after - 2
    assert spec.generate(tokens, _greedy(8)).tokens == plain.generate(tokens, GREEDY).tokens


def test_rule_a_with_a_seed_matches_plain_sampling(plain: Engine, spec: Engine) -> None:
    """llama.cpp's rule draws from the RNG exactly as plain sampling does."""
    for seed in (1, 2, 3):
        opts = GenerateOptions(  # the RNG's stream, not the seed-keyed (coupled) draws
            num_predict=80, temperature=0.9, top_k=20, seed=seed, sampling_verify="compare"
        )
        tokens = plain.tokenize(PROMPTS[seed - 1])
        expected = plain.generate(tokens, opts)
        got = spec.generate(
            tokens,
            GenerateOptions(
                num_predict=80,
                temperature=0.9,
                top_k=20,
                seed=seed,
                draft_num_predict=4,
                sampling_verify="compare",
            ),
        )
        assert got.tokens == expected.tokens
        assert got.draft_count > 0


def test_seeded_rejection_sampling_is_reproducible(spec: Engine) -> None:
    tokens = spec.tokenize(PROMPTS[0])
    opts = GenerateOptions(
        num_predict=60, temperature=1.0, seed=9, draft_num_predict=4, sampling_verify="rejection"
    )
    a = spec.generate(tokens, opts)
    b = spec.generate(tokens, opts)
    c = spec.generate(tokens, dataclasses.replace(opts, seed=10))
    assert a.tokens == b.tokens != c.tokens
    assert a.acceptance > 0.3


def test_a_seed_fixes_the_output_whatever_is_drafted(plain: Engine, spec: Engine) -> None:
    """Seeded requests sample by Gumbel-max with noise fixed by (seed, token index): the output
    is the plain target's, for every draft length (the adaptive controller's choice can then
    not change it)."""
    for seed in (1, 2, 3):
        tokens = plain.tokenize(PROMPTS[seed - 1])
        opts = GenerateOptions(num_predict=60, temperature=1.0, top_k=20, seed=seed)
        expected = plain.generate(tokens, opts)
        assert (
            plain.generate(tokens, dataclasses.replace(opts, seed=seed + 10)).tokens
            != expected.tokens
        )
        for k in (1, 2, 4):
            got = spec.generate(tokens, dataclasses.replace(opts, draft_num_predict=k))
            assert got.tokens == expected.tokens, (seed, k)
            assert got.draft_accepted_count > 0


# ---- chi-square: sampled output with a draft has the target's distribution ------------------


def _wrong_rule(p, q, token, rng):  # type: ignore[no-untyped-def]
    """The classic bug: after a rejection, resample from p instead of the residual."""
    if rng.random() < accept_probability(p, q, token):
        return True, token
    return False, draw(p, rng)


@pytest.fixture(scope="module")
def chi2_setup(
    pair: tuple[Path, Path], spec: Engine
) -> tuple[list[int], dict[tuple[int, int], float]]:
    prompt = spec.tokenize("the")
    return prompt, exact_joint(pair[0], prompt)


def test_rejection_sampling_has_the_targets_distribution(spec: Engine, chi2_setup) -> None:  # type: ignore[no-untyped-def]
    prompt, exact = chi2_setup
    samples = sampled_pairs(spec, prompt, draft_num_predict=2)
    assert chi2_pvalue(samples, exact) > 1e-3


def test_coupled_sampling_has_the_targets_distribution(spec: Engine, chi2_setup) -> None:  # type: ignore[no-untyped-def]
    """Gumbel-max over seeds (what seeded requests use): the target's joint distribution."""
    prompt, exact = chi2_setup
    samples = sampled_pairs(spec, prompt, draft_num_predict=2, sampling_verify="coupled")
    assert chi2_pvalue(samples, exact) > 1e-3


def test_wrong_residual_is_detected_on_the_model(spec: Engine, chi2_setup) -> None:  # type: ignore[no-untyped-def]
    prompt, exact = chi2_setup
    samples = sampled_pairs(spec, prompt, draft_num_predict=2, acceptance_rule=_wrong_rule)
    assert chi2_pvalue(samples, exact) < 1e-4


# ---- prediction (OpenAI Predicted Outputs) -------------------------------------------------


def test_prediction_of_the_exact_output_is_accepted(plain: Engine) -> None:
    cfg = EngineConfig(
        plain.cfg.model_path,
        n_ctx=N_CTX,
        n_batch=64,
        n_threads=1,
        draft_num_predict=8,
        adaptive=False,
    )
    with Engine(cfg) as e:  # no drafter configured: the prediction is the only draft source
        tokens = e.tokenize(PROMPTS[0])
        expected = plain.generate(tokens, GREEDY)
        got = e.generate(tokens, GREEDY, prediction=expected.tokens)
        assert got.tokens == expected.tokens
        assert got.drafter == "prediction"
        assert got.acceptance > 0.95
        # a prediction with an edit in the middle: still identical, re-aligned after it
        edited = [*expected.tokens[:30], 300, 301, 302, *expected.tokens[30:]]
        again = e.generate(tokens, GREEDY, prediction=edited)
        assert again.tokens == expected.tokens
        assert again.draft_accepted_count > 60
        # a useless prediction costs acceptance, never correctness
        junk = e.generate(tokens, GREEDY, prediction=[5] * 50)
        assert junk.tokens == expected.tokens
        # the next request without a prediction decodes plainly
        assert e.generate(tokens, GREEDY).drafter is None


class NeverRight:
    """A scripted drafter whose guesses are never what the target wants."""

    kind = "scripted"

    def begin(self, tokens: Sequence[int]) -> None:
        pass

    def propose(
        self, tokens: Sequence[int], max_tokens: int, probs: ProbabilityFn | None = None
    ) -> Proposal:
        return Proposal([0] * max_tokens)  # <unk>: the tiny models never predict it

    def commit(self, tokens: Sequence[int]) -> None:
        pass


def test_a_draft_that_is_never_right(pair: tuple[Path, Path], plain: Engine) -> None:
    cfg = EngineConfig(pair[0], n_ctx=N_CTX, n_batch=64, n_threads=1, draft_num_predict=8)
    with Engine(cfg, drafter=NeverRight()) as e:
        for prompt in PROMPTS:
            tokens = e.tokenize(prompt)
            got = e.generate(tokens, _greedy(num_predict=150))
            assert got.tokens == plain.generate(tokens, _greedy(num_predict=150)).tokens
            assert got.draft_accepted_count == 0
        # adaptive drafting gave up: few rounds still try (probes), most decode plainly
        assert got.draft_steps < 20
