"""How much memory a runner will need, and how much there is (reliability RUN-02, SPEC-13).

The estimate is made from the GGUF headers before a runner is started, so a model that cannot fit
is refused with a message instead of being killed by the OS halfway through loading (or taking
the machine down with it). It counts, for the target and for a draft model alike:

- the weights (the file's size: llama.cpp maps them whole);
- the KV cache at the context size: layers x context x (key + value width) x 2 bytes (F16),
  once per parallel sequence and scaled to the KV cache type in use (``with_sequences``);
- compute buffers, roughly: a batch of logits and a batch of the widest activations, in F32.

LoRA adapters add their file sizes (``adapters_estimate``).

Recurrent state (Mamba-style models) is small next to the weights and is not counted. The
figures are estimates meant to catch what cannot work, not to pack memory to the last byte.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from modelhub.gguf.info import GGUFInfo

_F16, _F32 = 2, 4
# Bytes of one key plus one value element for each KV cache type (Q8_0: 34 bytes per 32).
KV_BYTES = {"f16": 4.0, "auto": 34 / 32 + 2, "q8_0": 2 * 34 / 32, "q4_0": 2 * 18 / 32}
_GIB = 1 << 30


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int = 0
    kv_cache: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    def with_sequences(self, n: int, kv_cache_type: str = "f16") -> MemoryEstimate:
        """The same model serving ``n`` sequences, one KV cache each (this estimate is one, in
        F16), in ``kv_cache_type`` (``engine.llama.KV_TYPES``)."""
        kv = self.kv_cache * n * KV_BYTES.get(kv_cache_type, 4.0) / KV_BYTES["f16"]
        return MemoryEstimate(self.weights, int(kv), self.compute)

    def scaled(self, share: float) -> MemoryEstimate:
        """The part ``share`` (0..1) of this, e.g. what stays in host memory when llama.cpp
        put the rest on offload devices."""
        share = min(1.0, max(0.0, share))
        return MemoryEstimate(
            int(self.weights * share), int(self.kv_cache * share), int(self.compute * share)
        )

    def __add__(self, other: MemoryEstimate) -> MemoryEstimate:
        return MemoryEstimate(
            self.weights + other.weights,
            self.kv_cache + other.kv_cache,
            self.compute + other.compute,
        )


def estimate(info: GGUFInfo, n_ctx: int, n_batch: int) -> MemoryEstimate:
    """What one model loaded with this context and batch size needs."""
    n_layer = (info.block_count or 0) - max(0, info.nextn_layers)
    n_embd = info.embedding_length or 0
    n_head = info.hyperparameter("attention.head_count") or 0
    n_head_kv = info.hyperparameter("attention.head_count_kv") or n_head  # an array -> its largest
    kv = 0
    if n_head > 0 and n_layer > 0:
        k_len = info.hyperparameter("attention.key_length") or n_embd // n_head
        v_len = info.hyperparameter("attention.value_length") or n_embd // n_head
        kv = n_layer * n_ctx * n_head_kv * (k_len + v_len) * _F16
    n_ff = info.hyperparameter("feed_forward_length") or 4 * n_embd
    compute = n_batch * (info.vocab_size + 4 * max(n_embd, n_ff)) * _F32
    return MemoryEstimate(weights=info.file_size, kv_cache=kv, compute=compute)


def adapters_estimate(sizes: list[int]) -> MemoryEstimate:
    """LoRA adapters: llama.cpp copies each file's tensors into memory of their own."""
    return MemoryEstimate(weights=sum(sizes))


def available_bytes() -> int | None:
    """Memory the system can give without swapping (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: int) -> str:
    return f"{n / _GIB:.1f} GiB"
