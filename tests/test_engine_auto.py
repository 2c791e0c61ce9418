"""``DRAFT auto`` in the engine: the choice among a request's drafters (SPEC-16), what drafting
learned kept across loads, and outputs that never depend on the drafter chosen."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelhub.engine.drafting_state import STATE_FILE, DraftingMemory
from modelhub.engine.generate import Engine, EngineConfig, GenerateOptions
from modelhub.engine.members import request_drafters
from modelhub.engine.options import DraftSource
from modelhub.engine.speculative.adaptive import AdaptiveDraftLength
from modelhub.engine.speculative.base import Proposal
from modelhub.engine.speculative.choice import TRIAL_ROUNDS, DraftChoice, Member, load_bucket
from modelhub.errors import InputError
from tests.fixtures.synthetic import write_tiny_llama_pair

PROMPTS = ["the hello world", "tiny draft model fast", "abc token the world"]
GREEDY = GenerateOptions(num_predict=64, temperature=0)


class _Named:
    """A drafter that is only a kind (the choice never calls it)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def begin(self, tokens: object) -> None: ...

    def propose(self, tokens: object, max_tokens: int, probs: object = None) -> Proposal:
        return Proposal([])

    def commit(self, tokens: object) -> None: ...


def _rounds(ctl: AdaptiveDraftLength, n: int, accepted: int, draft_s: float) -> None:
    """``n`` rounds of 4 drafts, ``accepted`` kept, at a 10 ms target step."""
    for _ in range(n):
        ctl.record(0, 0, 0, 0.0, 0.010)
        ctl.record(4, 4, accepted, 4 * draft_s, 0.010 * 2.05)


def test_untried_drafters_are_tried_then_the_best_expected_rate_drafts() -> None:
    verify: dict[int, object] = {}
    controllers = {
        name: AdaptiveDraftLength(4, verify=verify)  # type: ignore[arg-type]
        for name in ("cheap", "dear")
    }
    members = [Member(name, _Named("draft_model"), 4) for name in controllers]  # type: ignore[arg-type]
    choice = DraftChoice(members)

    def controller(m: Member) -> AdaptiveDraftLength:
        return controllers[m.name]

    first = [choice.model(controller).name for _ in range(2)]
    assert first == ["cheap", "cheap"]  # the fewest drafted rounds first
    _rounds(controllers["cheap"], TRIAL_ROUNDS, 4, 0.0005)
    assert choice.model(controller).name == "dear"  # the other has no figures yet
    _rounds(controllers["dear"], TRIAL_ROUNDS, 1, 0.008)
    picks = [choice.model(controller).name for _ in range(256)]
    assert picks.count("cheap") > 240 and "dear" in picks  # the runner-up is revisited


def test_load_buckets() -> None:
    assert [load_bucket(n) for n in (0, 1, 2, 3, 4, 5, 16)] == [1, 1, 2, 4, 4, 8, 8]


def test_what_was_learned_is_restored_and_costs_only_under_the_same_conditions(
    tmp_path: Path,
) -> None:
    conditions: dict[str, object] = {"n_threads": 2}
    memory = DraftingMemory(tmp_path, conditions)
    ctl = AdaptiveDraftLength(4, verify=memory.verify_costs("plain", 1))
    _rounds(ctl, 20, 3, 0.001)
    memory.save({("ngram", "plain", 1): ctl}, None)
    doc = json.loads((tmp_path / STATE_FILE).read_text())
    assert doc["summary"]["drafters"][0]["name"] == "ngram"

    again = DraftingMemory(tmp_path, conditions)
    restored = AdaptiveDraftLength(4, verify=again.verify_costs("plain", 1))
    again.restore(restored, ("ngram", "plain", 1))
    assert restored.acceptance == pytest.approx(ctl.acceptance)
    assert restored.verify_cost(1) == pytest.approx(ctl.verify_cost(1))
    assert restored.draft_rounds == ctl.draft_rounds

    elsewhere = DraftingMemory(tmp_path, {"n_threads": 8})  # other threads: costs re-measured
    other = AdaptiveDraftLength(4, verify=elsewhere.verify_costs("plain", 1))
    elsewhere.restore(other, ("ngram", "plain", 1))
    assert other.acceptance == pytest.approx(ctl.acceptance) and other.verify_cost(1) is None

    (tmp_path / STATE_FILE).write_text("{not json")
    assert DraftingMemory(tmp_path, conditions).verify_costs("plain", 1) == {}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_llama_pair(tmp_path_factory.mktemp("auto"))


def _engine(target: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(target, n_ctx=256, n_batch=64, n_threads=1, **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engines(pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    state = tmp_path_factory.mktemp("state")
    candidates = [DraftSource("tiny-draft", "draft_model", pair[1], 8)]
    with _engine(pair[0], draft_kind="auto", draft_candidates=candidates, state_dir=state) as e:
        yield e


def test_auto_output_is_the_targets_whatever_drafts(
    pair: tuple[Path, Path], engines: Engine
) -> None:
    assert [src.name for src in engines.sources] == ["tiny-draft", "ngram"]
    assert engines.default_drafters == ["tiny-draft", "ngram"]
    with _engine(pair[0]) as plain:
        for text in PROMPTS * 2:
            prompt = plain.tokenize(text)
            expected = plain.generate(prompt, GREEDY)
            for draft in (None, "tiny-draft", "ngram", "off"):
                got = engines.generate(
                    prompt, GenerateOptions(num_predict=64, temperature=0, draft=draft)
                )
                assert got.tokens == expected.tokens, (text, draft)
                if draft == "off":
                    assert got.draft_count == 0 and got.drafter_name is None
                elif draft is not None and got.draft_count:
                    assert got.drafter_name == draft
                assert sum(got.draft_count_by_position) == got.draft_count
                assert sum(got.draft_accepted_by_position) == got.draft_accepted_count
    report = engines.drafting_report()
    assert {r["name"] for r in report["drafters"]} == {"tiny-draft", "ngram"}, report
    with pytest.raises(InputError, match="'mtp' is not one of this model's drafters"):
        engines.generate(prompt, GenerateOptions(num_predict=4, draft="mtp"))


def test_a_store_draft_is_priced_by_its_size_until_measured_unless_named(
    pair: tuple[Path, Path], engines: Engine
) -> None:
    """Under auto a draft model's first guesses are priced by its size against the target's
    (equal here: never worth a probe's catch-up on the prompt); a request that names it, or a
    Modelfile's DRAFT line, tries it whatever its size."""
    slot = engines.slots[0]
    ratio = pair[1].stat().st_size / pair[0].stat().st_size
    assert [m.cost_prior for m in slot.members] == [pytest.approx(ratio), None]
    members, _ = request_drafters(engines, slot, GenerateOptions(), None)
    assert [m.cost_prior for m in members] == [pytest.approx(ratio), None]
    members, _ = request_drafters(engines, slot, GenerateOptions(draft="tiny-draft"), None)
    assert [(m.name, m.cost_prior) for m in members] == [("tiny-draft", None)]
    with _engine(pair[0], draft_kind="draft_model", draft_path=pair[1]) as by_hand:
        assert [m.cost_prior for m in by_hand.slots[0].members] == [None, None]


def test_a_plain_engine_has_no_default_drafter_but_ngram_on_request(
    pair: tuple[Path, Path],
) -> None:
    with _engine(pair[0]) as plain:
        assert plain.drafter is None and plain.default_drafters == []
        prompt = plain.tokenize(PROMPTS[0] * 6)
        off = plain.generate(prompt, GREEDY)
        asked = plain.generate(
            prompt, GenerateOptions(num_predict=64, temperature=0, draft="ngram")
        )
    assert off.draft_count == 0 and asked.tokens == off.tokens
