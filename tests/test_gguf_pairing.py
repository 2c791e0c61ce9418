"""Draft pairing: which drafts may serve which targets, checked from metadata only."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from devtools import realmodels
from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo, read_gguf_info
from modelhub.gguf.pairing import (
    MAX_TRAILING_SPECIAL,
    PairingReport,
    check_draft_pairing,
    check_mtp_target,
)
from tests.fixtures.synthetic import (
    CONTROL,
    MISMATCH_FIELDS,
    MISMATCHED_TOKEN_ID,
    USER_DEFINED,
    tiny_vocab,
    write_mismatched_draft,
    write_tiny_llama,
    write_tiny_llama_pair,
    write_tiny_mtp,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_llama_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def target(pair: tuple[Path, Path]) -> GGUFInfo:
    return read_gguf_info(pair[0])


def check(target_path: Path, draft_path: Path) -> PairingReport:
    return check_draft_pairing(
        read_gguf_info(target_path), read_gguf_info(draft_path), target_path, draft_path
    )


def small(info: GGUFInfo, target: GGUFInfo) -> GGUFInfo:
    """The same draft, as if it had a twentieth of the target's parameters."""
    return dataclasses.replace(info, parameter_count=target.parameter_count // 20)


def test_matching_pair_is_accepted(pair: tuple[Path, Path], target: GGUFInfo) -> None:
    draft = read_gguf_info(pair[1])
    report = check_draft_pairing(target, small(draft, target), *pair)
    assert report.warnings == []


def test_draft_too_large_warns(pair: tuple[Path, Path]) -> None:
    report = check(*pair)  # the tiny draft is as large as its target
    assert len(report.warnings) == 1
    assert "more than a tenth" in report.warnings[0]


EXPECTED = {
    "vocab_size": ["vocabulary size", "target 340, draft 540"],
    "token_text": [f"token text of id {MISMATCHED_TOKEN_ID}", "'▁fa'", "'▁zz'"],
    "tokenizer_model": ["tokenizer model", "'llama'", "'gpt2'"],
    "eos_id": ["EOS token id", "target 2, draft 0"],
    "add_bos": ["add-BOS flag", "target True, draft False"],
}


def test_every_mismatch_field_has_an_expectation() -> None:
    assert set(EXPECTED) == set(MISMATCH_FIELDS)


@pytest.mark.parametrize("field", MISMATCH_FIELDS)
def test_single_field_mismatch_is_refused(
    field: str, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    draft = write_mismatched_draft(tmp_path, field)
    with pytest.raises(DraftError) as err:
        check(pair[0], draft)
    message = str(err.value)
    for part in EXPECTED[field]:
        assert part in message, message
    assert draft.name in message and pair[0].name in message
    assert "DRAFT ngram" in message  # says what to do
    assert err.value.status == 400
    # and the other way round
    with pytest.raises(DraftError, match=EXPECTED[field][0].split(" (")[0]):
        check(draft, pair[0])


def test_trailing_special_tokens_are_tolerated(pair: tuple[Path, Path], tmp_path: Path) -> None:
    padded = tiny_vocab().with_tokens([f"<pad{i}>" for i in range(8)], token_type=CONTROL)
    draft = write_tiny_llama(tmp_path / "padded.gguf", vocab=padded, seed=3)
    report = check(pair[0], draft)
    assert any("8 extra special tokens" in w for w in report.warnings), report.warnings
    report = check(draft, pair[0])  # the target may be the padded one too
    assert any("8 extra special tokens" in w for w in report.warnings), report.warnings


def test_too_many_trailing_special_tokens_are_refused(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    n = MAX_TRAILING_SPECIAL + 1
    padded = tiny_vocab().with_tokens([f"<pad{i}>" for i in range(n)], token_type=USER_DEFINED)
    draft = write_tiny_llama(tmp_path / "padded.gguf", vocab=padded, seed=3)
    with pytest.raises(DraftError, match="vocabulary size"):
        check(pair[0], draft)


def test_trailing_ordinary_tokens_are_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    longer = tiny_vocab().with_tokens(["▁ab", "▁abc"])
    draft = write_tiny_llama(tmp_path / "longer.gguf", vocab=longer, seed=3)
    with pytest.raises(DraftError, match=r"extra token 340 \('▁ab'\) is an ordinary token"):
        check(pair[0], draft)


def test_token_type_difference_only_warns(pair: tuple[Path, Path], tmp_path: Path) -> None:
    vocab = tiny_vocab()
    types = list(vocab.types)
    types[300] = USER_DEFINED
    draft = write_tiny_llama(
        tmp_path / "retyped.gguf", vocab=dataclasses.replace(vocab, types=tuple(types)), seed=3
    )
    report = check(pair[0], draft)
    assert any("token 300" in w and "type" in w for w in report.warnings), report.warnings


def test_eot_difference_warns(pair: tuple[Path, Path], target: GGUFInfo) -> None:
    draft = dataclasses.replace(small(read_gguf_info(pair[1]), target), eot_id=2)
    report = check_draft_pairing(target, draft, *pair)
    assert len(report.warnings) == 1 and "end-of-turn" in report.warnings[0]


def test_same_file_is_refused(pair: tuple[Path, Path], target: GGUFInfo, tmp_path: Path) -> None:
    with pytest.raises(DraftError, match="own file"):
        check_draft_pairing(target, target, pair[0], pair[0])
    link = tmp_path / "link.gguf"
    link.symlink_to(pair[0])
    with pytest.raises(DraftError, match="own file"):
        check_draft_pairing(target, target, pair[0], link)
    # a byte-identical copy is a different file: allowed (pointless, but lossless)
    copy = tmp_path / "copy.gguf"
    shutil.copy(pair[0], copy)
    check(pair[0], copy)


def test_projector_is_not_a_draft(pair: tuple[Path, Path], target: GGUFInfo) -> None:
    projector = dataclasses.replace(read_gguf_info(pair[1]), general_type="mmproj")
    with pytest.raises(DraftError, match="'mmproj' file, not a language model"):
        check_draft_pairing(target, projector, *pair)


def test_mtp_drafter_must_match_the_target_family(
    pair: tuple[Path, Path], target: GGUFInfo
) -> None:
    assistant = dataclasses.replace(read_gguf_info(pair[1]), architecture="gemma4-assistant")
    with pytest.raises(DraftError, match="MTP drafter for 'gemma4' models"):
        check_draft_pairing(target, assistant, *pair)
    # A relabelled llama file is no assistant: it declares no hidden-state width to read
    # (a real pair passes: tests/test_engine_assistant.py).
    gemma4 = dataclasses.replace(target, architecture="gemma4")
    with pytest.raises(DraftError, match="reads hidden states of width None"):
        check_draft_pairing(gemma4, small(assistant, target), *pair)


def test_mtp_target_checks(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    with pytest.raises(DraftError, match=r"has no MTP \(NextN\) heads: use DRAFT ngram"):
        check_mtp_target(read_gguf_info(pair[0]))
    one = read_gguf_info(write_tiny_mtp(tmp_path / "mtp1.gguf"))
    check_mtp_target(one)
    check_mtp_target(read_gguf_info(write_tiny_mtp(tmp_path / "mtp2.gguf", heads=2)))
    trunk = read_gguf_info(write_tiny_mtp(tmp_path / "trunk.gguf", trunk_only=True))
    with pytest.raises(DraftError, match="NextN tensors are not in the file"):
        check_mtp_target(trunk)
    with pytest.raises(DraftError, match="cannot run MTP heads for architecture 'glm4'"):
        check_mtp_target(dataclasses.replace(one, architecture="glm4"))


@pytest.mark.slow
def test_real_models_of_different_families_are_refused() -> None:
    smol, gemma = realmodels.smollm2_q4_1(), realmodels.gemma3_270m()
    with pytest.raises(DraftError, match="tokenizer model"):
        check(gemma, smol)
    with pytest.raises(DraftError, match="tokenizer model"):
        check(smol, gemma)
