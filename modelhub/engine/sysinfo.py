"""What this llama-cpp-python build can do on this machine, as JSON (``modelhub info``).

Run as ``python -m modelhub.engine.sysinfo``: the daemon asks a child process, so that loading
llama.cpp's libraries (and whatever a GPU driver does when probed) never happens in the daemon.
"""

from __future__ import annotations

import json
import platform
import sys
from typing import Any

from modelhub.engine.cpu import amx_advertised, cpu_flags, repack_default

# CPU features worth showing (what ggml's CPU kernels pick from), in this order.
_SHOWN_FLAGS = [
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "sve",
    "sve2",
    "i8mm",
    "dotprod",
]


def system_info() -> dict[str, Any]:
    import llama_cpp

    from modelhub.engine.llama import ensure_backend

    ensure_backend()
    flags = cpu_flags()
    repack = repack_default()
    raw = llama_cpp.llama_print_system_info()
    build = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return {
        "llama_cpp_python": getattr(llama_cpp, "__version__", "unknown"),
        "build": build.strip(),
        "backends": _backends(build),
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
        "rpc": bool(llama_cpp.llama_supports_rpc()),
        "devices": _devices(),
        "machine": platform.machine(),
        "cpu_features": [f for f in _SHOWN_FLAGS if f in flags],
        "amx_advertised": amx_advertised(flags),
        "repack_default": repack.enabled,
        "repack_reason": repack.reason,
    }


def _backends(build: str) -> list[str]:
    """Backend names from llama.cpp's system info (``CPU : ... | CUDA : ...``)."""
    names = []
    for part in build.split("|"):
        name, sep, _ = part.partition(":")
        name = name.strip()
        if sep and name and name.isupper() and " " not in name and name not in names:
            names.append(name)
    return names or ["CPU"]


def _devices() -> list[dict[str, Any]]:
    """ggml's backend devices with their memory (CPU always; GPUs where compiled in)."""
    import ctypes

    import llama_cpp

    lib = getattr(llama_cpp, "_lib", None) or getattr(llama_cpp.llama_cpp, "_lib", None)
    needed = ("ggml_backend_dev_count", "ggml_backend_dev_get", "ggml_backend_dev_name")
    if lib is None or not all(hasattr(lib, n) for n in needed):
        return []
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
    kinds = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
    devices = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            {
                "name": (lib.ggml_backend_dev_name(dev) or b"").decode("utf-8", "replace"),
                "description": (lib.ggml_backend_dev_description(dev) or b"").decode(
                    "utf-8", "replace"
                ),
                "type": kinds.get(int(lib.ggml_backend_dev_type(dev)), "other"),
                "memory_free": int(free.value),
                "memory_total": int(total.value),
            }
        )
    return devices


def main() -> None:
    json.dump(system_info(), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
