"""How many of a model's layers go to the offload devices (GPUs, RPC workers), as Ollama's
``num_gpu``: ``0`` CPU only, ``n`` that many layers, ``-1`` (the default) as many as fit in the
devices' free memory with headroom, weights, KV cache and compute buffers counted.

What llama.cpp then allocated, per device, is read back from its log (:func:`placement`): the
truth that ``/api/ps`` (``size_vram``) and ``modelhub ps`` (PROCESSOR) report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from modelhub.engine import devices
from modelhub.engine.cpu import RepackDecision
from modelhub.engine.devices import Device
from modelhub.engine.llama import LoadPlacement
from modelhub.engine.native import allocated_buffers, offloaded_layers
from modelhub.engine.protocol import PlacementReport
from modelhub.gguf.info import read_gguf_info

log = logging.getLogger("modelhub.offload")

_F16 = 2
_F32 = 4
_ALL_LAYERS = 999  # more than any model has: llama.cpp then offloads everything


@dataclass
class Offload:
    n_gpu_layers: int  # llama.cpp's n_gpu_layers (n_layer + 1: everything)
    devices: list[Device]  # where layers may go
    reason: str  # why this many, for the log and /api/show

    @property
    def draft_devices(self) -> list[Device]:
        """The devices a draft file goes to (see :meth:`draft`)."""
        return [d for d in self.devices if not d.is_rpc] if self.n_gpu_layers else []

    def kv_cache_type(self, requested: str) -> str:
        """The target's KV cache type: ``auto`` is F16 where its layers are on a local GPU.

        ``auto``'s Q8_0 keys make verification bit-exact on the CPU only (a GPU's batched
        kernels differ anyway: bench/exactness.py), and a stock CUDA build has no
        flash-attention kernel for Q8_0 keys with F16 values: it converts the cache at every
        step (on an H200, F16 decoded 1.15x faster at 4k-8k tokens: bench/README.md)."""
        return "f16" if requested == "auto" and self.draft_devices else requested

    def draft(self, repack: RepackDecision) -> LoadPlacement:
        """Where a draft file goes: wholly on the local accelerators when the target uses
        them (a draft must be cheap, so never on RPC workers: a round trip per drafted
        token), else on the CPU."""
        local = tuple(d.handle for d in self.draft_devices)
        if not local:
            return LoadPlacement(repack.enabled, cpu_only=True)
        return LoadPlacement(repack.enabled, n_gpu_layers=_ALL_LAYERS, devices=local)


@dataclass
class Placement:
    """What llama.cpp reported allocating: bytes per buffer name and the layers offloaded."""

    by_buffer: dict[str, int] = field(default_factory=dict)
    layers: tuple[int, int] | None = None  # (offloaded, total)

    @property
    def device_bytes(self) -> int:
        """Bytes on offload devices: not in CPU buffers, nor in a backend's pinned host
        memory (``CUDA_Host``, ``Vulkan_Host``)."""
        return sum(n for name, n in self.by_buffer.items() if not _on_host(name))

    @property
    def total_bytes(self) -> int:
        return sum(self.by_buffer.values())

    def report(self) -> PlacementReport:
        """As the ``loaded`` event carries it to the daemon."""
        return PlacementReport(
            buffers=dict(self.by_buffer),
            layers_offloaded=self.layers[0] if self.layers else 0,
            layers_total=self.layers[1] if self.layers else 0,
            size_device=self.device_bytes,
            size=self.total_bytes,
        )


def _on_host(buffer: str) -> bool:
    return buffer.startswith("CPU") or buffer.endswith("_Host")


def placement() -> Placement:
    """The allocations logged since ``llama.clear_allocation_log()``."""
    by_buffer: dict[str, int] = {}
    for name, _what, size in allocated_buffers():
        by_buffer[name] = by_buffer.get(name, 0) + size
    return Placement(by_buffer, offloaded_layers())


def plan_offload(
    model_path: Path,
    num_gpu: int,
    rpc_servers: list[str],
    n_ctx_total: int,
    n_batch: int,
) -> Offload:
    """Register the RPC workers, then choose ``n_gpu_layers`` for the target."""
    if num_gpu == 0:  # not even a worker that is down may stop a CPU-only model
        return Offload(0, [], "num_gpu 0: CPU only")
    devices.add_rpc_servers(rpc_servers)
    targets = [d for d in devices.list_devices() if d.offloads]
    if not targets:
        return Offload(0, [], "no GPU or RPC device in this build and configuration")
    names = ", ".join(d.label for d in targets)
    if num_gpu > 0:
        return Offload(num_gpu, targets, f"num_gpu {num_gpu} -> {names}")
    info = read_gguf_info(model_path)
    n_layer = max(1, (info.block_count or 1) - max(0, info.nextn_layers))
    elements = sum(t.n_elements for t in info.tensors) or 1
    in_blocks = sum(t.n_elements for t in info.tensors if t.name.startswith("blk."))
    block_weights = info.file_size * in_blocks / elements
    n_embd = info.embedding_length or 0
    heads = info.hyperparameter("attention.head_count") or 1
    heads_kv = info.hyperparameter("attention.head_count_kv") or heads
    k_len = info.hyperparameter("attention.key_length") or n_embd // max(1, heads)
    v_len = info.hyperparameter("attention.value_length") or n_embd // max(1, heads)
    kv_per_layer = n_ctx_total * heads_kv * (k_len + v_len) * _F16
    compute = n_batch * (info.vocab_size + 4 * n_embd) * _F32
    layer = int(block_weights / n_layer + kv_per_layer)
    rest = int(info.file_size - block_weights + compute)
    free = sum(d.memory_free for d in targets)
    n = devices.layers_that_fit(n_layer, layer, rest, free)
    return Offload(
        n,
        targets,
        f"automatic: {min(n, n_layer)}/{n_layer} layers fit in {free >> 20} MiB free on {names}",
    )
