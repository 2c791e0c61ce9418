"""EAGLE-3 heads and DFlash block drafters (both fed with the inputs of some of the target's
layers) on the tiny synthetic llama target, through the real Engine: greedy output is the
target's own at every draft length, follow-up turns reuse the prompt cache, two sequences
draft at once, sampled output keeps the target's distribution, and pairings they cannot
serve are refused before anything is loaded.

The DFlash fixture's block size is 4 (the anchor and three masks), which caps its drafts at 3
per round: it is tested at K 1..3, and at 8 to show the cap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions, GenerateResult
from modelhub.engine.speculative import layer_api
from modelhub.engine.speculative.dflash import DFlashDrafter
from modelhub.engine.speculative.eagle3 import Eagle3Drafter
from modelhub.errors import DraftError
from modelhub.gguf.info import read_gguf_info
from modelhub.gguf.pairing_layers import check_dflash_pairing, check_eagle3_pairing
from tests.fixtures import synthetic, synthetic_drafters
from tests.fixtures.chi2 import chi2_pvalue, exact_joint, sampled_pairs
from tests.fixtures.concurrency import run_concurrently

PROMPTS = ("hello world the model", "tiny fast token draft", "the the the hello")
GREEDY = GenerateOptions(num_predict=200, temperature=0)
KINDS = ("eagle3", "dflash")
DFLASH_CAP = synthetic_drafters.DFLASH_BLOCK_SIZE - 1
K_VALUES = {"eagle3": (1, 2, 4, 8), "dflash": (1, 2, 3, 8)}
DRAFTER_CLASS = {"eagle3": Eagle3Drafter, "dflash": DFlashDrafter}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("layered")
    target = synthetic.write_tiny_llama(d / "tiny-llama.gguf")
    return {
        "target": target,
        "eagle3": synthetic_drafters.write_tiny_eagle3(d / "tiny-eagle3.gguf", target),
        "dflash": synthetic_drafters.write_tiny_dflash(d / "tiny-dflash.gguf", target),
    }


def _engine(target: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(target, n_ctx=256, n_batch=64, n_threads=1, **kw))  # type: ignore[arg-type]


def _drafting(files: dict[str, Path], kind: str, **kw: object) -> Engine:
    kw.setdefault("draft_num_predict", 8)
    return _engine(files["target"], draft_kind=kind, draft_path=files[kind], **kw)


@pytest.fixture(scope="module")
def references(files: dict[str, Path]) -> dict[str, GenerateResult]:
    with _engine(files["target"]) as plain:
        return {p: plain.generate(plain.tokenize(p), GREEDY) for p in PROMPTS}


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_output_is_the_targets_at_every_k(
    files: dict[str, Path], references: dict[str, GenerateResult], kind: str
) -> None:
    for k in K_VALUES[kind]:
        with _drafting(files, kind, draft_num_predict=k, adaptive=False) as e:
            assert isinstance(e.drafter, DRAFTER_CLASS[kind])
            drafted = accepted = steps = 0
            for prompt in PROMPTS:
                got = e.generate(e.tokenize(prompt), GREEDY)
                assert got.tokens == references[prompt].tokens, (kind, k, prompt)
                assert got.drafter == kind and got.draft_accepted_count > 0, (kind, k)
                drafted += got.draft_count
                accepted += got.draft_accepted_count
                steps += got.draft_steps
            assert drafted > accepted, (kind, k)  # rejections happen and are cut back
            if kind == "dflash":
                assert drafted <= min(k, DFLASH_CAP) * steps  # the block caps K


@pytest.mark.parametrize(("kind", "adaptive"), [(k, a) for k in KINDS for a in (False, True)])
def test_follow_ups_reuse_the_prompt_cache(
    files: dict[str, Path], references: dict[str, GenerateResult], kind: str, adaptive: bool
) -> None:
    """The next turn (prompt + reply + more text) reuses the cached prompt; its output is a
    fresh plain engine's. The adaptive engine's choice of K follows measured timings (it may
    stop drafting after a few rounds here, where a draft costs about what the target does),
    so only its totals are checked."""
    drafted = accepted = 0
    with _drafting(files, kind, adaptive=adaptive) as e:
        for prompt in PROMPTS:
            tokens = e.tokenize(prompt)
            first = e.generate(tokens, GREEDY)
            assert first.tokens == references[prompt].tokens
            turn = [*tokens, *first.tokens[:30], *e.tokenize(" world", add_special=False)]
            second = e.generate(turn, GREEDY)
            assert second.prompt_eval_count < len(turn) // 2  # the prompt cache was reused
            assert adaptive or second.draft_accepted_count > 0
            with _engine(files["target"]) as fresh:
                assert second.tokens == fresh.generate(turn, GREEDY).tokens, (kind, prompt)
            drafted += first.draft_count + second.draft_count
            accepted += first.draft_accepted_count + second.draft_accepted_count
    assert drafted > accepted > 0


@pytest.mark.parametrize("kind", KINDS)
def test_two_sequences_draft_at_once(
    files: dict[str, Path], references: dict[str, GenerateResult], kind: str
) -> None:
    """Each sequence's drafter (the primary and its fork) reads its own rows of the batch."""
    with _drafting(files, kind, adaptive=False, n_parallel=2, draft_num_predict=4) as e:
        assert isinstance(e.slots[1].drafter, DRAFTER_CLASS[kind])
        prompts = [e.tokenize(p) for p in PROMPTS[:2]]
        results, running, _ = run_concurrently(e, prompts, GREEDY)
        assert running == 2
        for prompt, got in zip(PROMPTS[:2], results, strict=True):
            assert got.tokens == references[prompt].tokens
            assert got.draft_accepted_count > 0


@pytest.fixture(scope="module")
def exact(files: dict[str, Path]) -> Iterator[tuple[list[int], dict[tuple[int, int], float]]]:
    with _engine(files["target"]) as plain:
        prompt = plain.tokenize("the")
    yield prompt, exact_joint(files["target"], prompt)


@pytest.mark.parametrize("kind", KINDS)
def test_sampling_keeps_the_targets_distribution(
    files: dict[str, Path], exact: tuple[list[int], dict[tuple[int, int], float]], kind: str
) -> None:
    prompt, joint = exact
    with _drafting(files, kind, adaptive=False) as e:
        samples = sampled_pairs(e, prompt, draft_num_predict=2)
    assert chi2_pvalue(samples, joint) > 1e-3


def test_pairings_they_cannot_serve_are_refused(files: dict[str, Path], tmp_path: Path) -> None:
    target = read_gguf_info(files["target"], with_tokens=True)
    eagle3, dflash = (read_gguf_info(files[k], with_tokens=True, full_arrays=True) for k in KINDS)
    check_eagle3_pairing(target, eagle3)  # the right pairs pass
    check_dflash_pairing(target, dflash)
    # an EAGLE-3 head for a target of another hidden size, through the engine
    other = synthetic_drafters.write_tiny_eagle3(
        tmp_path / "eagle3-96.gguf", files["target"], target_hidden_size=96
    )
    with pytest.raises(DraftError, match=r"target hidden size 96, but the target .* size 64"):
        _engine(files["target"], draft_kind="eagle3", draft_path=other)
    # a DFlash drafter reading layers the 2-block target does not have
    deep = synthetic_drafters.write_tiny_dflash(
        tmp_path / "dflash-deep.gguf", files["target"], target_layers=(0, 5)
    )
    with pytest.raises(DraftError, match=r"reads target layer 5, but the target .* 2 blocks"):
        _engine(files["target"], draft_kind="dflash", draft_path=deep)
    # a target whose graph does not expose layer inputs
    phi = dataclasses.replace(target, architecture="phi3")
    with pytest.raises(DraftError, match=r"'phi3' model, whose llama\.cpp graph does not expose"):
        check_eagle3_pairing(phi, eagle3)
    # the wrong kind of file
    with pytest.raises(DraftError, match="not a 'dflash' drafter"):
        check_dflash_pairing(target, eagle3)
    # another vocabulary (the existing draft-model check)
    other_vocab = dataclasses.replace(dflash, tokenizer_model="gpt2")
    with pytest.raises(DraftError, match="tokenizer model"):
        check_dflash_pairing(target, other_vocab)
    # EAGLE-3 reads exactly three layers
    two = dataclasses.replace(eagle3, kv={**eagle3.kv, "eagle3.target_layers": [0, 1]})
    with pytest.raises(DraftError, match="lists 2 target layers"):
        check_eagle3_pairing(target, two)


def test_a_build_without_the_layer_functions_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _, argtypes, restype = layer_api._FUNCTIONS["get_layer_inp"]
    monkeypatch.setitem(
        layer_api._FUNCTIONS, "get_layer_inp", (("llama_no_such_fn",), argtypes, restype)
    )
    with pytest.raises(DraftError, match=r"lacks llama_no_such_fn.*DRAFT ngram or a draft model"):
        layer_api.layer_api.__wrapped__()
