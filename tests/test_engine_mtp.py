"""MTP (NextN) drafting on tiny synthetic ``hy_v3`` models with one and two heads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.speculative.mtp import MtpDrafter, nextn_api
from modelhub.errors import DraftError
from tests.fixtures.concurrency import run_concurrently
from tests.fixtures.synthetic import write_tiny_llama, write_tiny_mtp

PROMPTS = ["the hello world", "tiny draft model fast", "abc token the world"]


def _cfg(path: Path, **kw: object) -> EngineConfig:
    return EngineConfig(path, n_ctx=512, n_batch=64, n_threads=1, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("mtp")
    return {
        "one": write_tiny_mtp(d / "mtp1.gguf", heads=1),
        "two": write_tiny_mtp(d / "mtp2.gguf", heads=2),
        "trunk": write_tiny_mtp(d / "trunk.gguf", trunk_only=True),
        "heads": write_tiny_mtp(d / "heads.gguf", mtp_only=True),
        "llama": write_tiny_llama(d / "llama.gguf"),
    }


@pytest.fixture(scope="module")
def plain(files: dict[str, Path]) -> Iterator[Engine]:
    with Engine(_cfg(files["one"])) as e:
        yield e


def greedy(k: int | None = None, n: int = 96) -> GenerateOptions:
    return GenerateOptions(num_predict=n, temperature=0, draft_num_predict=k)


def test_one_head_greedy_identity(files: dict[str, Path], plain: Engine) -> None:
    with Engine(_cfg(files["one"], draft_kind="mtp", draft_num_predict=8, adaptive=False)) as mtp:
        assert isinstance(mtp.drafter, MtpDrafter)
        for k in (1, 2, 4, 8):
            for prompt in PROMPTS:
                tokens = plain.tokenize(prompt)
                expected = plain.generate(tokens, greedy())
                got = mtp.generate(tokens, greedy(k))
                assert got.tokens == expected.tokens
                assert got.drafter == "mtp" and got.draft_count > 0
                if k == 1:
                    assert got.acceptance > 0.6  # the head mostly predicts the target
        # the same prompt again reuses the caches (at most one token replayed for MTP)
        again = mtp.generate(tokens, greedy(4))
        assert again.prompt_eval_count <= 2 and again.tokens == expected.tokens


def test_one_head_adaptive_identity(files: dict[str, Path], plain: Engine) -> None:
    with Engine(_cfg(files["one"], draft_kind="mtp", draft_num_predict=4)) as mtp:
        for prompt in PROMPTS * 2:
            tokens = plain.tokenize(prompt)
            assert mtp.generate(tokens, greedy()).tokens == plain.generate(tokens, greedy()).tokens


def test_two_chained_heads(files: dict[str, Path]) -> None:
    with (
        Engine(_cfg(files["two"])) as plain2,
        Engine(_cfg(files["two"], draft_kind="mtp", draft_num_predict=4, adaptive=False)) as mtp,
    ):
        assert isinstance(mtp.drafter, MtpDrafter) and mtp.drafter.n_heads == 2
        for prompt in PROMPTS:
            tokens = plain2.tokenize(prompt)
            expected = plain2.generate(tokens, greedy())
            got = mtp.generate(tokens, greedy(4))
            assert got.tokens == expected.tokens
            assert got.draft_count <= 2 * got.draft_steps  # K is capped at the head count
            assert got.acceptance > 0.5


def test_sampled_mtp_drafts_are_verified(files: dict[str, Path]) -> None:
    with Engine(_cfg(files["one"], draft_kind="mtp", draft_num_predict=3, adaptive=False)) as mtp:
        opts = GenerateOptions(num_predict=80, temperature=0.7, top_k=10, seed=5)
        tokens = mtp.tokenize(PROMPTS[0])
        a = mtp.generate(tokens, opts)
        b = mtp.generate(tokens, opts)
        assert a.tokens == b.tokens and len(a.tokens) == 80
        assert a.draft_accepted_count > 0


def test_refusals_are_clear_and_never_crash(files: dict[str, Path]) -> None:
    with pytest.raises(DraftError, match="NextN tensors are not"):
        Engine(_cfg(files["trunk"], draft_kind="mtp"))
    with pytest.raises(DraftError, match="no MTP"):
        Engine(_cfg(files["llama"], draft_kind="mtp"))
    assert nextn_api() is not None  # this build has the staging API


def test_mtp_only_file_drafts_for_a_trunk_only_or_full_target(
    files: dict[str, Path], plain: Engine
) -> None:
    """The heads exported on their own (an MTP-only GGUF) draft exactly as the built-in ones."""
    prompt = plain.tokenize(PROMPTS[0])
    expected = plain.generate(prompt, greedy())
    with Engine(_cfg(files["one"], draft_kind="mtp", draft_num_predict=4, adaptive=False)) as own:
        builtin = own.generate(prompt, greedy(4))
    assert builtin.tokens == expected.tokens and builtin.draft_accepted_count > 0
    for target in (files["trunk"], files["one"]):
        cfg = _cfg(
            target,
            draft_kind="mtp",
            draft_path=files["heads"],
            draft_num_predict=4,
            adaptive=False,
        )
        with Engine(cfg) as e:
            assert e.drafting_disabled is None
            for _ in range(2):  # the second request reuses the prompt cache
                got = e.generate(prompt, greedy(4))
                assert got.tokens == expected.tokens and got.drafter == "mtp"
                assert (got.draft_count, got.draft_accepted_count) == (
                    builtin.draft_count,
                    builtin.draft_accepted_count,
                )


def test_mtp_only_file_of_another_model_is_refused(files: dict[str, Path]) -> None:
    with pytest.raises(DraftError, match="MTP drafter for 'hy_v3' models"):
        Engine(_cfg(files["llama"], draft_kind="mtp", draft_path=files["heads"]))


def test_other_external_mtp_drafter_files_serve_without_drafting(files: dict[str, Path]) -> None:
    with Engine(_cfg(files["one"], draft_kind="mtp", draft_path=files["llama"])) as e:
        assert e.drafting_disabled is not None and "not supported" in e.drafting_disabled
        r = e.generate(e.tokenize(PROMPTS[0]), greedy(n=10))
        assert len(r.tokens) == 10 and r.drafter is None


@pytest.mark.parametrize("heads", ["one", "two", "file"])
def test_mtp_drafts_for_four_sequences_in_one_batch(
    files: dict[str, Path], plain: Engine, heads: str
) -> None:
    """Each sequence drafts with its own MTP context, reading its own rows of the batched
    target decode: 8 requests on 4 sequences give each one's output alone, and the same drafts
    (rows of another sequence's hidden states would change what the heads propose)."""
    target, draft_path = (files["one"], files["heads"]) if heads == "file" else (files[heads], None)
    base = dict(draft_kind="mtp", draft_num_predict=4, adaptive=False, draft_path=draft_path)
    words = ["the", "hello", "world", "tiny", "draft", "model", "fast", "abc", "token"]
    texts = [" ".join(words[i:] + words[:i][:2]) for i in range(8)]
    with Engine(_cfg(target, **base)) as alone_engine:
        assert alone_engine.n_parallel == 1
        prompts = [alone_engine.tokenize(t) for t in texts]
        alone = [alone_engine.generate(p, greedy()) for p in prompts]
    with Engine(_cfg(target, n_parallel=4, **base)) as batched:
        assert batched.n_parallel == 4
        assert all(isinstance(s.drafter, MtpDrafter) for s in batched.slots)
        together, running, waiting = run_concurrently(batched, prompts, greedy())
    assert running == 4 and waiting >= 1
    for p, a, b in zip(prompts, alone, together, strict=True):
        assert a.tokens == plain.generate(p, greedy()).tokens  # lossless alone
        assert b.tokens == a.tokens
        assert (b.draft_count, b.draft_accepted_count) == (a.draft_count, a.draft_accepted_count)
    drafted = sum(r.draft_count for r in together)
    accepted = sum(r.draft_accepted_count for r in together)
    assert 0 < accepted < drafted  # drafts were both kept and rejected
