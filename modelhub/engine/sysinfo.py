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

    from modelhub.engine.native import ensure_backend

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
    from modelhub.engine.devices import list_devices

    return [d.as_json() for d in list_devices()]


def main() -> None:
    json.dump(system_info(), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
