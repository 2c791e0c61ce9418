"""Context shift in the engine on tiny synthetic models: generations run past ``n_ctx``, with
every kind of drafter giving the plain target's greedy output, and the slot's cache stays exact
for the next request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from tests.fixtures.synthetic import write_tiny_llama_pair, write_tiny_mtp

N_CTX = 64
PROMPT = "the hello world tiny draft model fast"


def _cfg(path: Path, **kw: object) -> EngineConfig:
    return EngineConfig(path, n_ctx=N_CTX, n_batch=64, n_threads=1, **kw)  # type: ignore[arg-type]


def greedy(n: int = 3 * N_CTX, **kw: object) -> GenerateOptions:
    return GenerateOptions(num_predict=n, temperature=0, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("shift")
    target, draft = write_tiny_llama_pair(d)
    return {"target": target, "draft": draft, "mtp": write_tiny_mtp(d / "mtp.gguf", heads=1)}


@pytest.fixture(scope="module")
def plain(files: dict[str, Path]) -> Iterator[Engine]:
    with Engine(_cfg(files["target"])) as e:
        yield e


def test_a_generation_runs_past_the_context(plain: Engine) -> None:
    tokens = plain.tokenize(PROMPT)
    out = plain.generate(tokens, greedy())
    assert out.done_reason == "length" and out.eval_count == 3 * N_CTX
    assert len(plain.slots[0].cached) < N_CTX  # the cache holds the shifted sequence
    again = plain.generate(tokens, greedy())  # reuses what is left of the prompt
    assert again.tokens == out.tokens and again.prompt_eval_count < len(tokens)


def test_an_open_ended_generation_stops_at_ten_contexts(plain: Engine) -> None:
    out = plain.generate(plain.tokenize(PROMPT), greedy(-1))  # this model never ends by itself
    assert out.done_reason == "length" and out.eval_count == 10 * N_CTX


def test_shift_off_and_num_keep(plain: Engine) -> None:
    tokens = plain.tokenize(PROMPT)
    stopped = plain.generate(tokens, greedy(shift=False))
    assert stopped.done_reason == "length"
    assert len(tokens) + stopped.eval_count == N_CTX + 1  # the pending token needs no cell
    for keep in (0, -1, 10 * N_CTX):  # nothing, the whole prompt, more than fits
        out = plain.generate(tokens, greedy(num_keep=keep))
        assert out.eval_count == 3 * N_CTX
        assert out.tokens[: stopped.eval_count] == stopped.tokens  # the same until the shift


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("ngram", {}), ("draft_model", {"draft_path": "draft"}), ("mtp", {"file": "mtp"})],
)
def test_drafted_greedy_output_is_the_targets_across_shifts(
    files: dict[str, Path], kind: str, extra: dict[str, str]
) -> None:
    path = files[extra.get("file", "target")]
    draft = {"draft_path": files[extra["draft_path"]]} if "draft_path" in extra else {}
    with Engine(_cfg(path)) as alone:
        tokens = alone.tokenize(PROMPT)
        expected = alone.generate(tokens, greedy())
    assert expected.eval_count == 3 * N_CTX
    cfg = _cfg(path, draft_kind=kind, draft_num_predict=4, adaptive=False, **draft)
    with Engine(cfg) as drafted:
        got = drafted.generate(tokens, greedy())
        assert got.tokens == expected.tokens and got.draft_count > 0
        again = drafted.generate(tokens, greedy())  # every cache is consistent afterwards
        assert again.tokens == expected.tokens
