"""Does this LoRA adapter fit this base model? Checked from the two headers alone.

llama.cpp refuses a mismatched adapter only when a runner loads it, with a terse message; this
module checks, at create time, what its loader (``llama_adapter_lora_init``) checks, and says
what differs and what to do:

1. ``general.type`` is ``adapter`` and ``adapter.type`` is ``lora`` (activated LoRA, which only
   acts after its invocation tokens, is not supported);
2. ``general.architecture`` equals the base's;
3. every tensor is half of a ``<base tensor>.lora_a`` / ``.lora_b`` pair (``*_norm.weight``
   tensors are ignored, as llama.cpp does), and the base has that tensor;
4. the shapes fit (ggml order, ``ne0`` first): ``lora_a`` is ``[base ne0, rank]`` and
   ``lora_b`` is ``[rank, base ne1]``; for ``token_embd.weight`` (applied to rows, not as a
   matrix product) ``lora_a`` is ``[rank, base ne1]`` and ``lora_b`` ``[rank, base ne0]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelhub.errors import InputError
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.reader import TensorInfo

_A, _B = ".lora_a", ".lora_b"
_EXACT_F32_RANK = 16
_REMEDY = "use an adapter trained for this base model (or FROM the model it was trained for)"


@dataclass(frozen=True)
class AdapterFacts:
    """What ``show`` tells about an adapter."""

    architecture: str
    adapter_type: str
    alpha: float | None
    rank: int
    tensors: int  # adapted base tensors (one lora_a/lora_b pair each)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architecture": self.architecture,
            "adapter_type": self.adapter_type,
            "rank": self.rank,
            "tensors": self.tensors,
        }
        if self.alpha is not None:
            out["alpha"] = self.alpha
        return out


def adapter_facts(info: GGUFInfo) -> AdapterFacts:
    """The adapter's type, architecture, alpha, rank (the largest) and number of pairs."""
    alpha = info.kv.get("adapter.lora.alpha")
    pairs = _pairs(info, strict=False)
    ranks = [b.shape[0] for _, b in pairs.values() if b.shape]  # lora_b is [rank, ...]
    return AdapterFacts(
        architecture=info.architecture,
        adapter_type=str(info.kv.get("adapter.type") or ""),
        alpha=float(alpha) if isinstance(alpha, int | float) else None,
        rank=max(ranks, default=0),
        tensors=len(pairs),
    )


def exactness_warning(info: GGUFInfo) -> str | None:
    """Why greedy drafting with this adapter may not be token-exact, or None. llama.cpp's CPU
    kernels give batched and one-token decoding the same bits with F16 LoRA tensors, but with
    F32 ones only when the rank is a multiple of 16 (AVX-512's width; measured: an F32 rank-8
    adapter on SmolLM2 moves a logit by up to 1.5, F16 or rank 16 by 0.0)."""
    ranks = sorted(
        {
            b.shape[0]
            for a, b in _pairs(info, strict=False).values()
            if "F32" in (a.type_name, b.type_name)
        }
    )
    odd = [r for r in ranks if r % _EXACT_F32_RANK]
    if not odd:
        return None
    return (
        f"F32 LoRA tensors of rank {odd[0]} make batched decoding differ slightly from one "
        "token at a time, so with a DRAFT greedy output can differ from the model alone at a "
        "near-tie; an F16 adapter keeps drafting exact (convert_lora_to_gguf.py --outtype f16)"
    )


def check_adapter(base: GGUFInfo, adapter: GGUFInfo, name: str) -> AdapterFacts:
    """Raise InputError (naming the adapter ``name`` and what differs) unless ``adapter`` is a
    LoRA that llama.cpp can apply to ``base``."""
    what = f"ADAPTER {name}"
    if adapter.general_type != "adapter":
        raise InputError(
            f"{what}: not an adapter (general.type is {adapter.general_type or 'missing'!r}, "
            "expected 'adapter'); ADAPTER takes a GGUF LoRA adapter (llama.cpp's "
            "convert_lora_to_gguf.py makes one), a model goes in FROM"
        )
    kind = adapter.kv.get("adapter.type")
    if kind != "lora":
        raise InputError(
            f"{what}: adapter.type is {kind or 'missing'!r}; only LoRA adapters ('lora') "
            "are supported"
        )
    if "adapter.alora.invocation_tokens" in adapter.kv:
        raise InputError(f"{what}: activated LoRA (aLoRA) adapters are not supported")
    if adapter.architecture != base.architecture:
        raise InputError(
            f"{what}: the adapter is for a {adapter.architecture!r} model but the base model "
            f"is {base.architecture!r}; {_REMEDY}"
        )
    pairs = _pairs(adapter, strict=True, what=what)
    if not pairs:
        raise InputError(f"{what}: the adapter has no LoRA tensors (*.lora_a / *.lora_b)")
    base_tensors = {t.name: t for t in base.tensors}
    for target, (a, b) in sorted(pairs.items()):
        _check_pair(what, target, a, b, base_tensors.get(target), base)
    return adapter_facts(adapter)


def _pairs(
    info: GGUFInfo, *, strict: bool, what: str = ""
) -> dict[str, tuple[TensorInfo, TensorInfo]]:
    """Base tensor name -> (lora_a, lora_b); with ``strict``, a stray tensor or a half pair is
    an InputError."""
    halves: dict[str, dict[str, TensorInfo]] = {}
    for t in info.tensors:
        suffix = t.name[-len(_A) :]
        if suffix in (_A, _B):
            halves.setdefault(t.name[: -len(_A)], {})[suffix] = t
        elif strict and not t.name.endswith("_norm.weight"):
            raise InputError(
                f"{what}: tensor {t.name!r} is not a LoRA tensor (names end in .lora_a or "
                ".lora_b); the file is not a llama.cpp LoRA adapter"
            )
    pairs = {}
    for target, half in halves.items():
        if _A in half and _B in half:
            pairs[target] = (half[_A], half[_B])
        elif strict:
            missing = _B if _A in half else _A
            raise InputError(f"{what}: tensor {target + missing!r} is missing (a LoRA pair)")
    return pairs


def _check_pair(
    what: str,
    target: str,
    a: TensorInfo,
    b: TensorInfo,
    base_tensor: TensorInfo | None,
    base: GGUFInfo,
) -> None:
    if base_tensor is None:
        raise InputError(
            f"{what}: it adapts tensor {target!r}, which the base model does not have "
            f"(the base has {base.block_count or '?'} blocks); {_REMEDY}"
        )
    if len(a.shape) != 2 or len(b.shape) != 2 or len(base_tensor.shape) != 2:
        raise InputError(f"{what}: tensor {target!r} and its LoRA pair must be 2-dimensional")
    if target.endswith("token_embd.weight"):
        # llama.cpp applies the embedding's pair swapped (see llm_build_inp_embd).
        rank = a.shape[0]
        expect_a, expect_b = (rank, base_tensor.shape[1]), (rank, base_tensor.shape[0])
    else:
        rank = a.shape[1]
        expect_a, expect_b = (base_tensor.shape[0], rank), (rank, base_tensor.shape[1])
    for half, got, expected in ((_A, a.shape, expect_a), (_B, b.shape, expect_b)):
        if tuple(got) != expected:
            raise InputError(
                f"{what}: tensor {target + half!r} has shape {list(got)}, but the base's "
                f"{target!r} is {list(base_tensor.shape)}, so {list(expected)} was expected "
                f"(the base's embedding width is {base.embedding_length}): the adapter was "
                f"made for another base model; {_REMEDY}"
            )
