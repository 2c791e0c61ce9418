"""What the project asks about a GGUF model: architecture, sizes, tokenizer, MTP heads, ...

:func:`read_gguf_info` reads the header through :mod:`modelhub.gguf.reader` (bounds-checked,
tensor data never read) and keeps what the store, the Modelfile checks, ``show`` and the engine
need, in a :class:`GGUFInfo`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from modelhub.errors import GGUFError
from modelhub.gguf.reader import (
    GGUF_MAGIC,
    SHORT_ARRAY,
    TOKEN_TYPES_KEY,
    ArraySummary,
    TensorInfo,
    read_header_file,
)

# Architectures that are external MTP drafters (their layers attend to a target's KV cache).
MTP_DRAFTER_ARCHITECTURES = frozenset({"gemma4-assistant"})


@dataclass
class GGUFInfo:
    path: Path
    file_size: int
    version: int
    architecture: str
    name: str | None
    general_type: str | None
    parameter_count: int
    file_type: str
    context_length: int | None
    embedding_length: int | None
    block_count: int | None
    nextn_layers: int
    pooling_type: int | None
    tokenizer_model: str | None
    tokenizer_pre: str | None
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    tokens_fingerprint: str
    chat_template: str | None
    kv: dict[str, Any]
    tensors: list[TensorInfo]
    split_count: int | None
    split_no: int | None
    tokens: list[str] | None = field(default=None, repr=False)  # only with with_tokens=True
    token_types: list[int] | None = field(default=None, repr=False)
    data_offset: int = 0  # where tensor data starts (aligned)

    @property
    def parameter_size(self) -> str:
        return format_parameter_count(self.parameter_count)

    def hyperparameter(self, key: str) -> int | None:
        """The integer ``<architecture>.<key>``; a per-layer array counts as its largest value."""
        value: Any = self.kv.get(f"{self.architecture}.{key}")
        if isinstance(value, list):
            value = max((v for v in value if isinstance(v, int)), default=None)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def has_mtp_heads(self) -> bool:
        if self.nextn_layers <= 0:
            return False
        names = {t.name for t in self.tensors}
        if self.block_count:
            # Trunk-only conversions keep the metadata key but drop the head's tensors.
            return f"blk.{self.block_count - 1}.nextn.eh_proj.weight" in names
        return any(_NEXTN_TENSOR.match(n) for n in names)

    @property
    def is_mtp_only(self) -> bool:
        """Only the NextN (MTP) blocks of a model, no trunk: the separate MTP file that a
        conversion can export next to a trunk-only target (llama.cpp's own test: the first
        block's attention norm is absent)."""
        names = {t.name for t in self.tensors}
        return self.has_mtp_heads and "blk.0.attn_norm.weight" not in names

    @property
    def is_mtp_drafter(self) -> bool:
        """A file that drafts through the target's hidden states: an MTP-only file or an
        assistant architecture such as gemma4-assistant."""
        arch = self.architecture
        return (
            arch in MTP_DRAFTER_ARCHITECTURES
            or arch.endswith("-assistant")
            or arch.endswith("_mtp")
            or self.is_mtp_only
        )


_NEXTN_TENSOR = re.compile(r"blk\.\d+\.nextn\.")


def format_parameter_count(n: int) -> str:
    """Human form of a parameter count as Ollama shows it: 8.0B, 7B, 22.57M, 137M, 12K, 999."""
    if n >= 1_000_000_000:
        value, unit, decimals = n / 1e9, "B", 1
    elif n >= 1_000_000:
        value, unit, decimals = n / 1e6, "M", 2
    elif n >= 1_000:
        return f"{n / 1e3:.0f}K"
    else:
        return str(n)
    if value == int(value):
        return f"{value:.0f}{unit}"
    return f"{value:.{decimals}f}{unit}"


def _get(kv: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = kv.get(key)
    if isinstance(value, bool) and kind is int:
        return None
    return value if isinstance(value, kind) else None


def _file_type_name(kv: dict[str, Any], tensors: list[TensorInfo]) -> str:
    ftype = _get(kv, "general.file_type", int)
    if ftype is not None and ftype != LlamaFileType.GUESSED:
        try:
            return LlamaFileType(ftype).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    weight: dict[str, int] = {}
    for t in tensors:
        weight[t.type_name] = weight.get(t.type_name, 0) + t.n_elements
    return max(weight, key=lambda k: weight[k]) if weight else "unknown"


def read_gguf_info(
    path: str | Path, *, with_tokens: bool = False, full_arrays: bool = False
) -> GGUFInfo:
    """Read a GGUF's metadata and tensor table; raise GGUFError if the file is malformed.

    ``with_tokens`` also returns the token texts and types; ``full_arrays`` keeps every
    metadata array in ``kv`` instead of a short summary for arrays longer than 5 items.
    """
    path = Path(path)
    header, size = read_header_file(path, full_arrays, with_tokens)
    meta = header.meta
    kv = meta.kv
    arch = _get(kv, "general.architecture", str) or ""
    if not arch:
        raise GGUFError(f"{path.name}: GGUF file has no general.architecture")
    tokens = [t.decode("utf-8", errors="replace") for t in meta.token_bytes or []]
    types = kv.get(TOKEN_TYPES_KEY)
    vocab_size = meta.token_count or _get(kv, f"{arch}.vocab_size", int) or 0
    return GGUFInfo(
        path=path,
        file_size=size,
        version=header.version,
        architecture=arch,
        name=_get(kv, "general.name", str),
        general_type=_get(kv, "general.type", str),
        parameter_count=sum(t.n_elements for t in header.tensors),
        file_type=_file_type_name(kv, header.tensors),
        context_length=_get(kv, f"{arch}.context_length", int),
        embedding_length=_get(kv, f"{arch}.embedding_length", int),
        block_count=_get(kv, f"{arch}.block_count", int),
        nextn_layers=_get(kv, f"{arch}.nextn_predict_layers", int) or 0,
        pooling_type=_get(kv, f"{arch}.pooling_type", int),
        tokenizer_model=_get(kv, "tokenizer.ggml.model", str),
        tokenizer_pre=_get(kv, "tokenizer.ggml.pre", str),
        vocab_size=vocab_size,
        bos_id=_get(kv, "tokenizer.ggml.bos_token_id", int),
        eos_id=_get(kv, "tokenizer.ggml.eos_token_id", int),
        eot_id=_get(kv, "tokenizer.ggml.eot_token_id", int),
        pad_id=_get(kv, "tokenizer.ggml.padding_token_id", int),
        add_bos=_get(kv, "tokenizer.ggml.add_bos_token", bool),
        add_eos=_get(kv, "tokenizer.ggml.add_eos_token", bool),
        tokens_fingerprint=meta.tokens_digest,
        chat_template=_get(kv, "tokenizer.chat_template", str),
        kv=kv,
        tensors=header.tensors,
        split_count=_get(kv, "split.count", int),
        split_no=_get(kv, "split.no", int),
        tokens=tokens if with_tokens else None,
        token_types=list(types) if with_tokens and isinstance(types, list) else None,
        data_offset=header.data_offset,
    )


def read_tokens(path: str | Path) -> tuple[list[str], list[int]]:
    """Token texts and token types (empty when the file has none), read with the same bounds."""
    info = read_gguf_info(path, with_tokens=True)
    return info.tokens or [], info.token_types or []


def is_gguf(path_or_first_bytes: str | Path | bytes) -> bool:
    """True when the bytes (or the file) start with the GGUF magic. Never raises."""
    if isinstance(path_or_first_bytes, bytes):
        return path_or_first_bytes[:4] == GGUF_MAGIC
    try:
        with open(path_or_first_bytes, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


_NOT_IN_MODEL_INFO = ("general.name", "tokenizer.chat_template")


def model_info_for_show(info: GGUFInfo, verbose: bool) -> dict[str, Any]:
    """``model_info`` of /api/show: all metadata but the name and chat template.

    Arrays longer than 5 items become ``[]`` unless ``verbose``; then the file is read again
    with full arrays if ``info`` was read with summaries.
    """
    kv = info.kv
    if verbose and any(isinstance(v, ArraySummary) for v in kv.values()):
        kv = read_gguf_info(info.path, full_arrays=True).kv
    out: dict[str, Any] = {}
    for key, value in kv.items():
        if key in _NOT_IN_MODEL_INFO:
            continue
        long_array = isinstance(value, ArraySummary) or (
            isinstance(value, list) and len(value) > SHORT_ARRAY
        )
        out[key] = [] if long_array and not verbose else _json_safe(value)
    out["general.parameter_count"] = info.parameter_count
    return out


def _json_safe(value: Any) -> Any:
    # JSON has no NaN or infinity; a crafted file must not break the response.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


_TOOLS = re.compile(r"\.Tools\b|\btools\b|\btool_calls\b")
_THINKING = re.compile(r"\.Think(ing)?\b|<think>|enable_thinking|reasoning_content")


def capabilities(info: GGUFInfo, template: str | None) -> list[str]:
    """Capabilities as /api/show derives them from the model and its template text: only what
    the daemon serves (no ``vision``: images are refused, whatever the model could see).

    ``template`` is the Go TEMPLATE or Jinja chat template in use; None means the GGUF's own.
    """
    text = template if template is not None else (info.chat_template or "")
    caps: list[str] = []
    if info.pooling_type is not None:
        caps.append("embedding")
    else:
        caps.append("completion")
        if _TOOLS.search(text):
            caps.append("tools")
        if ".Suffix" in text:
            caps.append("insert")
        if _THINKING.search(text):
            caps.append("thinking")
    return caps
