"""Can this draft serve this target? Checked from metadata alone, before any weights load.

A draft model proposes token ids that the target verifies, so both must give every id the
same meaning. The checks, in order, each naming the first difference found:

1. tokenizer model (``tokenizer.ggml.model``) and pre-tokenizer (``tokenizer.ggml.pre``);
2. vocabulary size. Policy: sizes may differ by at most 128 tokens, and only when every extra
   token at the end of the larger vocabulary is special (control, user-defined or unused):
   models of one family are often padded with such tokens. The engine never accepts a draft
   id the target does not have;
3. the text of every token id both vocabularies share (the first differing id is reported
   with both texts). Token *types* that differ only warn;
4. BOS and EOS token ids, and the add-BOS / add-EOS flags.

A draft larger than a tenth of the target is allowed but warned about: it will rarely pay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo, read_tokens

MAX_TRAILING_SPECIAL = 128
SPECIAL_TOKEN_TYPES = frozenset({3, 4, 5})  # control, user-defined, unused
DRAFT_SIZE_RATIO = 10  # warn when the draft has more than 1/10 of the target's parameters

# Architectures for which llama.cpp builds an MTP (NextN) graph. Some others (glm4, exaone4,
# exaone_moe, dots3note) load NextN tensors but never run them.
MTP_GRAPH_ARCHITECTURES = frozenset(
    {
        "bailingmoe3",
        "cohere2moe",
        "deepseek2",
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "glm4moe",
        "glm5-next",
        "hy_v3",
        "mimo2",
        "nemotron_h_moe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "step35",
    }
)

_REMEDY = (
    "a draft must share the target's tokenizer: use a smaller model of the same family "
    "(same vocabulary), or DRAFT ngram"
)


@dataclass
class PairingReport:
    warnings: list[str] = field(default_factory=list)


def _label(info: GGUFInfo, path: str | Path) -> str:
    return f"'{Path(path).name}'" + (f" ({info.name})" if info.name else "")


def _refuse(
    what: str, target_value: object, draft_value: object, names: tuple[str, str]
) -> NoReturn:
    target_name, draft_name = names
    raise DraftError(
        f"draft {draft_name} cannot serve target {target_name}: {what} differs "
        f"(target {target_value!r}, draft {draft_value!r}); {_REMEDY}"
    )


def check_draft_pairing(
    target: GGUFInfo, draft: GGUFInfo, target_path: str | Path, draft_path: str | Path
) -> PairingReport:
    """Raise DraftError naming the first tokenizer difference; return warnings otherwise."""
    names = (_label(target, target_path), _label(draft, draft_path))
    report = PairingReport()
    try:
        same_file = Path(target_path).samefile(draft_path)
    except OSError:
        same_file = False
    if same_file:
        raise DraftError(
            f"the draft {names[1]} is the target's own file: a model cannot draft for itself; "
            "use a smaller model of the same family, DRAFT ngram, or DRAFT mtp"
        )
    if draft.general_type not in (None, "model"):
        raise DraftError(
            f"draft {names[1]} is a {draft.general_type!r} file, not a language model; "
            "DRAFT needs a complete model GGUF"
        )
    if draft.is_mtp_drafter:
        _check_mtp_drafter(target, draft, names)
        if not draft.vocab_size:  # shares the target's embeddings and tokenizer
            return report

    if target.tokenizer_model != draft.tokenizer_model:
        _refuse(
            "tokenizer model (tokenizer.ggml.model)",
            target.tokenizer_model,
            draft.tokenizer_model,
            names,
        )
    target_pre, draft_pre = target.tokenizer_pre or "default", draft.tokenizer_pre or "default"
    if target_pre != draft_pre:
        _refuse("pre-tokenizer (tokenizer.ggml.pre)", target_pre, draft_pre, names)
    if abs(target.vocab_size - draft.vocab_size) > MAX_TRAILING_SPECIAL:
        _refuse("vocabulary size", target.vocab_size, draft.vocab_size, names)
    if target.tokens_fingerprint != draft.tokens_fingerprint:
        _compare_tokens(target_path, draft_path, names, report)

    for what, t_value, d_value in (
        ("BOS token id (tokenizer.ggml.bos_token_id)", target.bos_id, draft.bos_id),
        ("EOS token id (tokenizer.ggml.eos_token_id)", target.eos_id, draft.eos_id),
        ("add-BOS flag (tokenizer.ggml.add_bos_token)", target.add_bos, draft.add_bos),
        ("add-EOS flag (tokenizer.ggml.add_eos_token)", target.add_eos, draft.add_eos),
    ):
        if t_value != d_value:
            _refuse(what, t_value, d_value, names)
    if target.eot_id != draft.eot_id:
        report.warnings.append(
            f"end-of-turn token ids differ (target {target.eot_id}, draft {draft.eot_id}); "
            "the target's decides where generation stops"
        )
    if draft.parameter_count * DRAFT_SIZE_RATIO > target.parameter_count:
        report.warnings.append(
            f"draft {names[1]} has {draft.parameter_size} parameters, more than a tenth of the "
            f"target's {target.parameter_size}: drafting will rarely be faster than the target "
            "alone"
        )
    return report


def _compare_tokens(
    target_path: str | Path,
    draft_path: str | Path,
    names: tuple[str, str],
    report: PairingReport,
) -> None:
    t_texts, t_types = read_tokens(target_path)
    d_texts, d_types = read_tokens(draft_path)
    shared = min(len(t_texts), len(d_texts))
    for i in range(shared):
        if t_texts[i] != d_texts[i]:
            _refuse(f"token text of id {i}", t_texts[i], d_texts[i], names)
    if len(t_texts) != len(d_texts):
        longer, types, side = (
            (t_texts, t_types, "target")
            if len(t_texts) > len(d_texts)
            else (d_texts, d_types, "draft")
        )
        extra = range(shared, len(longer))
        ordinary = [i for i in extra if i >= len(types) or types[i] not in SPECIAL_TOKEN_TYPES]
        if ordinary:
            i = ordinary[0]
            raise DraftError(
                f"draft {names[1]} cannot serve target {names[0]}: vocabulary size differs "
                f"(target {len(t_texts)}, draft {len(d_texts)}) and the {side}'s extra token "
                f"{i} ({longer[i]!r}) is an ordinary token, not trailing special padding; "
                f"{_REMEDY}"
            )
        report.warnings.append(
            f"the {side} has {len(extra)} extra special tokens (ids {shared}-{len(longer) - 1}); "
            "tolerated: drafts of ids the target lacks are never accepted"
        )
    for i in range(min(len(t_types), len(d_types), shared)):
        if t_types[i] != d_types[i]:
            report.warnings.append(
                f"token {i} ({t_texts[i]!r}) has type {t_types[i]} in the target and "
                f"{d_types[i]} in the draft"
            )
            break


def _check_mtp_drafter(target: GGUFInfo, draft: GGUFInfo, names: tuple[str, str]) -> None:
    family = draft.architecture.removesuffix("-assistant").removesuffix("_mtp")
    if target.architecture != family:
        raise DraftError(
            f"draft {names[1]} is an MTP drafter for {family!r} models, but the target "
            f"{names[0]} is a {target.architecture!r} model"
        )
    if draft.architecture == "gemma4-assistant":
        check_assistant_pairing(target, draft, names)
    if draft.is_mtp_only:
        if draft.architecture not in MTP_GRAPH_ARCHITECTURES:
            raise DraftError(
                f"draft {names[1]} holds MTP heads, but llama.cpp cannot run MTP heads for "
                f"architecture {draft.architecture!r}: use DRAFT ngram or a draft model"
            )
        if target.embedding_length != draft.embedding_length:
            raise DraftError(
                f"draft {names[1]} holds MTP heads for hidden size {draft.embedding_length}, but "
                f"the target {names[0]} has hidden size {target.embedding_length}: it belongs to "
                "another model"
            )


def check_assistant_pairing(
    target: GGUFInfo, draft: GGUFInfo, names: tuple[str, str] | None = None
) -> None:
    """Raise DraftError unless a Gemma 4 assistant can read this target's attention cache:
    llama.cpp maps the assistant's sliding-window and full-attention layers onto the target's
    last two layers (which must be one of each; llama.cpp follows a shared-KV layer to its
    source), reads the target's
    hidden state (its width is the assistant's ``embedding_length_out``) and its heads must
    have the target's shape. A mismatch there is undefined behaviour in llama.cpp, so it is
    refused before anything is loaded."""
    t_name, d_name = names or (f"'{target.path.name}'", f"'{draft.path.name}'")
    if target.architecture != "gemma4":
        raise DraftError(
            f"draft {d_name} is a Gemma 4 assistant; the target {t_name} is a "
            f"{target.architecture!r} model, not 'gemma4'"
        )

    def kv(info: GGUFInfo, key: str) -> Any:
        return info.kv.get(f"{info.architecture}.{key}")

    width = kv(draft, "embedding_length_out")
    if width != target.embedding_length:
        raise DraftError(
            f"draft {d_name} reads hidden states of width {width}, but the target {t_name} "
            f"has hidden size {target.embedding_length}: it is the assistant of another model"
        )
    for key in (
        "attention.head_count_kv",
        "attention.key_length",
        "attention.key_length_swa",
        "attention.value_length",
        "attention.value_length_swa",
    ):
        if kv(draft, key) != kv(target, key):
            raise DraftError(
                f"draft {d_name} has {key} {kv(draft, key)}, the target {t_name} "
                f"{kv(target, key)}: it is the assistant of another model"
            )
    pattern = kv(target, "attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) < 2 or list(pattern[-2:]) != [True, False]:
        raise DraftError(
            f"the target {t_name} does not end with a sliding-window and a full-attention layer "
            "(attention.sliding_window_pattern), whose caches a Gemma 4 assistant reads"
        )


def check_mtp_target(target: GGUFInfo) -> None:
    """Raise DraftError unless ``DRAFT mtp`` can use the target's own NextN heads."""
    name = f"'{target.name or target.path.name}'"
    if target.nextn_layers <= 0:
        raise DraftError(f"{name} has no MTP (NextN) heads: use DRAFT ngram or a draft model")
    if not target.has_mtp_heads:
        raise DraftError(
            f"{name} declares {target.nextn_layers} NextN layer(s) but the NextN tensors are not "
            "in the file (converted without MTP?): use a conversion that keeps them, DRAFT "
            "ngram, or a draft model"
        )
    if target.architecture not in MTP_GRAPH_ARCHITECTURES:
        raise DraftError(
            f"{name} has NextN tensors, but llama.cpp cannot run MTP heads for architecture "
            f"{target.architecture!r}: use DRAFT ngram or a draft model"
        )
