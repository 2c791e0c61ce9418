"""ggml's backend devices: which exist, their memory, RPC workers as devices, and how many of a
model's layers fit on them.

llama.cpp offloads layers to every registered device that is not the CPU (GPUs of a CUDA,
Metal, Vulkan or ROCm build, and the workers of ggml's RPC backend, which it treats as GPUs).
RPC workers are registered per process (:func:`add_rpc_servers`), before a model is loaded.
The calls are ggml's C API, bound here by symbol (llama-cpp-python binds few of them).
"""

from __future__ import annotations

import ctypes
import math
import socket
from dataclasses import dataclass
from typing import Any

from modelhub.errors import ModelhubError

_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
# Device memory kept free when choosing how many layers to offload: drivers, fragmentation,
# and what the estimate misses (Ollama keeps a similar margin).
HEADROOM = 0.10
_CONNECT_TIMEOUT_S = 3.0
NO_RPC = (
    "this llama-cpp-python build has no RPC backend; reinstall it with "
    'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir '
    "llama-cpp-python (docs/distributed.md)"
)
_registered: set[str] = set()


@dataclass(frozen=True)
class Device:
    index: int  # ggml's device index (what main_gpu and tensor_split count among non-CPU)
    name: str  # e.g. "CPU", "CUDA0", "RPC0[127.0.0.1:50052]"
    description: str
    kind: str  # cpu, gpu, igpu, accel
    memory_free: int
    memory_total: int
    handle: int = 0

    @property
    def offloads(self) -> bool:
        """Whether llama.cpp puts model layers on it (GPUs and RPC workers, not the CPU)."""
        return self.kind in ("gpu", "igpu")

    @property
    def is_rpc(self) -> bool:
        return self.name.startswith("RPC")

    @property
    def label(self) -> str:
        """The name llama.cpp gives its buffers: ``CUDA0``, ``RPC0[10.0.0.2:50052]``."""
        return f"{self.name}[{self.description}]" if self.is_rpc else self.name

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.label,
            "description": self.description,
            "type": self.kind,
            "memory_free": self.memory_free,
            "memory_total": self.memory_total,
        }


def _lib() -> Any:
    import llama_cpp

    from modelhub.engine.native import ensure_backend

    ensure_backend()
    lib = getattr(llama_cpp, "_lib", None) or llama_cpp.llama_cpp._lib
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    return lib


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def list_devices() -> list[Device]:
    """Every device ggml knows in this process (the CPU first), with its memory now."""
    lib = _lib()
    devices = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            Device(
                index=i,
                name=_text(lib.ggml_backend_dev_name(dev)),
                description=_text(lib.ggml_backend_dev_description(dev)),
                kind=_KINDS.get(int(lib.ggml_backend_dev_type(dev)), "other"),
                memory_free=int(free.value),
                memory_total=int(total.value),
                handle=int(dev or 0),
            )
        )
    return devices


def rpc_supported() -> bool:
    """Whether this llama-cpp-python build has ggml's RPC backend (``-DGGML_RPC=on``)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_rpc()) and bool(_lib().ggml_backend_reg_by_name(b"RPC"))


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:port``) -> (host, port), with a clear error otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ModelhubError(f"RPC server {text!r}: expected host:port, e.g. 127.0.0.1:50052")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    import ipaddress

    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def add_rpc_servers(endpoints: list[str]) -> list[Device]:
    """Register RPC workers as devices of this process (each once); returns them.

    ggml aborts the process when a worker cannot be reached, so each is first dialled here:
    an unreachable worker is an error that names it."""
    if not endpoints:
        return []
    if not rpc_supported():
        raise ModelhubError(
            "RPC servers are configured (MODELHUB_RPC_SERVERS or PARAMETER rpc_servers), but "
            + NO_RPC
        )
    lib = _lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    add = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(add)
    for endpoint in endpoints:
        if endpoint in _registered:
            continue
        host, port = parse_endpoint(endpoint)
        try:
            with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            raise ModelhubError(
                f"RPC worker {endpoint} is not reachable ({exc.strerror or exc}); start it "
                f"there with `modelhub rpc-worker --host {endpoint}` or remove it from "
                "MODELHUB_RPC_SERVERS"
            ) from None
        server_reg = add_server(endpoint.encode())
        if not server_reg:
            raise ModelhubError(f"llama.cpp could not add the RPC worker {endpoint}")
        lib.ggml_backend_register(server_reg)
        _registered.add(endpoint)
    return [d for d in list_devices() if d.is_rpc and d.description in endpoints]


def serve_rpc(endpoint: str, n_threads: int, cache_dir: str | None) -> None:
    """Run ggml's RPC server on ``endpoint`` with this machine's CPU device (blocks; one
    client at a time, as llama.cpp's ``rpc-server``)."""
    if not rpc_supported():
        raise ModelhubError(NO_RPC)
    lib = _lib()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    start = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_start_server")
    start_server = ctypes.CFUNCTYPE(
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )(start)
    cpu = lib.ggml_backend_dev_by_type(0)
    devices = (ctypes.c_void_p * 1)(cpu)
    start_server(
        endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1, devices
    )


def layers_that_fit(
    n_layers: int, layer_bytes: int, rest_bytes: int, free_bytes: int, headroom: float = HEADROOM
) -> int:
    """llama.cpp's ``n_gpu_layers`` for devices with ``free_bytes`` between them: ``n_layers
    + 1`` (every layer and the output layer) when all of it fits, each layer costing
    ``layer_bytes`` (weights, KV cache, its share of compute buffers) and the rest (output
    layer, embeddings) ``rest_bytes``; otherwise as many repeating layers as fit."""
    budget = free_bytes * (1.0 - headroom)
    if budget >= n_layers * layer_bytes + rest_bytes:
        return n_layers + 1
    if layer_bytes <= 0:
        return 0
    return max(0, min(n_layers, math.floor(budget / layer_bytes)))
