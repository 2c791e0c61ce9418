"""Can this EAGLE-3 head / DFlash drafter serve this target? Checked from metadata alone.

Both read hidden states from inside the target: the inputs of some of its layers
(``{arch}.target_layers``). llama.cpp aborts the process on a layer id past the target's last
block or on a target architecture whose graph does not expose layer inputs, and reads rows of
the wrong width as garbage, so every such mismatch is refused here, before native code runs,
naming what differs. The tokenizer is checked as for any draft model
(:func:`modelhub.gguf.pairing.check_draft_pairing`).
"""

from __future__ import annotations

from typing import Any

from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.pairing import PairingReport, check_draft_pairing

# Target architectures whose llama.cpp graph records each layer's input (t_layer_inp); the
# others abort when asked for it.
LAYER_INPUT_ARCHITECTURES = frozenset(
    {
        "bailingmoe3",
        "deepseek4",
        "gemma4",
        "gpt-oss",
        "hunyuan_vl",
        "lfm2",
        "llama",
        "mimo2",
        "minimax-01",
        "minimax-m2",
        "muse-glimmer",
        "nanbeige",
        "nemotron_h",
        "qwen3",
        "qwen35",
        "qwen35moe",
        "qwen3moe",
        "qwen3next",
        "qwen4exp",
    }
)
EAGLE3_N_LAYERS = 3  # llama.cpp's EAGLE-3 driver wants exactly three target layers
DFLASH_DEFAULT_BLOCK = 16


def _names(target: GGUFInfo, draft: GGUFInfo) -> tuple[str, str]:
    """Each file's ``general.name`` where it has one (store blobs are named by digest)."""
    return f"'{target.name or target.path.name}'", f"'{draft.name or draft.path.name}'"


def _kv(info: GGUFInfo, key: str) -> Any:
    return info.kv.get(f"{info.architecture}.{key}")


def _check_target(target: GGUFInfo, draft: GGUFInfo, kind: str) -> None:
    t_name, d_name = _names(target, draft)
    if draft.architecture != kind:
        raise DraftError(f"{d_name} is a {draft.architecture!r} model, not a {kind!r} drafter")
    if target.architecture not in LAYER_INPUT_ARCHITECTURES:
        raise DraftError(
            f"the target {t_name} is a {target.architecture!r} model, whose llama.cpp graph does "
            f"not expose layer inputs, which a {kind} drafter reads; use DRAFT ngram or a draft "
            "model"
        )


def _target_layers(target: GGUFInfo, draft: GGUFInfo, allow_last: bool) -> list[int]:
    """The drafter's target layer ids, each checked against the target's block count."""
    t_name, d_name = _names(target, draft)
    ids = _kv(draft, "target_layers")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DraftError(
            f"{d_name} has no readable {draft.architecture}.target_layers (the target layers "
            "it reads)"
        )
    n_layer = target.block_count or 0
    for lid in ids:
        if lid < 0 or lid > n_layer or (lid == n_layer and not allow_last):
            raise DraftError(
                f"{d_name} reads target layer {lid}, but the target {t_name} has "
                f"{n_layer} blocks (layers 0..{n_layer - 1}): it is the drafter of another model"
            )
        if lid == n_layer:
            raise DraftError(
                f"{d_name} reads layer {lid}, the target {t_name}'s final hidden state, which "
                "this engine does not feed to drafters (only layer inputs 0.."
                f"{n_layer - 1})"
            )
    return ids


def _check_width(target: GGUFInfo, draft: GGUFInfo, what: str, width: Any) -> None:
    t_name, d_name = _names(target, draft)
    if width != target.embedding_length:
        raise DraftError(
            f"{d_name} expects {what} {width}, but the target {t_name} has hidden size "
            f"{target.embedding_length}: it is the drafter of another model"
        )


def check_eagle3_pairing(target: GGUFInfo, draft: GGUFInfo) -> PairingReport:
    """Raise DraftError unless the EAGLE-3 head ``draft`` can read ``target``'s layers."""
    _check_target(target, draft, "eagle3")
    ids = _target_layers(target, draft, allow_last=True)
    d_name = _names(target, draft)[1]
    if len(ids) != EAGLE3_N_LAYERS:
        raise DraftError(
            f"{d_name} lists {len(ids)} target layers; an EAGLE-3 head reads exactly "
            f"{EAGLE3_N_LAYERS}"
        )
    _check_width(target, draft, "target hidden size", _kv(draft, "target_hidden_size"))
    tensors = {t.name for t in draft.tensors}
    if {"token_embd.weight", "output.weight"} - tensors:
        # It borrows the target's embeddings or lm_head, which must then fit its width.
        _check_width(target, draft, "hidden size", draft.embedding_length)
    return check_draft_pairing(target, draft, target.path, draft.path)


def check_dflash_pairing(target: GGUFInfo, draft: GGUFInfo) -> PairingReport:
    """Raise DraftError unless the DFlash drafter ``draft`` can read ``target``'s layers."""
    _check_target(target, draft, "dflash")
    d_name = _names(target, draft)[1]
    tensors = {t.name for t in draft.tensors}
    if "markov_w1.weight" in tensors or (_kv(draft, "selector_top_k") or 0) > 0:
        raise DraftError(
            f"{d_name} is a DSpark / DFlash2 drafter, which this engine does not drive (plain "
            "DFlash only); use DRAFT ngram or a draft model"
        )
    _target_layers(target, draft, allow_last=False)
    _check_width(target, draft, "hidden size", draft.embedding_length)
    block = _kv(draft, "block_size")
    block = DFLASH_DEFAULT_BLOCK if block is None else block
    if not isinstance(block, int) or block < 2:
        raise DraftError(f"{d_name} has dflash.block_size {block!r}; it must be at least 2")
    mask = draft.kv.get("tokenizer.ggml.mask_token_id")
    if not isinstance(mask, int) or not 0 <= mask < draft.vocab_size:
        raise DraftError(
            f"{d_name} has no valid mask token (tokenizer.ggml.mask_token_id {mask!r}), which "
            "DFlash drafts with"
        )
    return check_draft_pairing(target, draft, target.path, draft.path)
