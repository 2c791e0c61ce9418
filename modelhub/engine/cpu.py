"""What this CPU lets llama.cpp do: the AMX probe, weight repacking, and a deliberate fault.

ggml's CPU backend moves weights into "extra" buffer types when the CPU advertises the features
for them: AMX tiles on recent Intel Xeons, repacked layouts for the AVX2/AVX-512/NEON kernels.
Some virtual machines advertise AMX (``amx_tile`` in ``/proc/cpuinfo``) without the hypervisor
enabling it; a llama-cpp-python built there (``-march=native``) then dies of SIGILL on its first
matrix multiply. Loading with ``use_extra_bufts = False`` (no repacking) avoids those kernels.

Two defences use this module. Before loading, :func:`repack_default` runs the AMX instructions
in a throw-away child process when the CPU advertises them, and turns repacking off if the child
faults. After a fault, the daemon restarts the runner once without repacking (the scheduler).
:func:`inject_fault` lets tests make a runner fault the same way on any machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass

# The environment variable tests set to make a runner execute an illegal instruction on its
# warm-up decode: "sigill-with-repack" (only while repacking is on, as the AMX fault does) or
# "sigill" (always, as a build for another CPU does).
FAULT_ENV = "MODELHUB_TEST_FAULT"

REINSTALL_HINT = (
    "reinstall llama-cpp-python for this CPU: "
    'CMAKE_ARGS="-DGGML_NATIVE=off" CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" '
    'CXXFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" '
    "pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python "
    "'llama-cpp-python>=0.3.36,<0.4'"
)

_X86 = platform.machine().lower() in ("x86_64", "amd64")
_ARM64 = platform.machine().lower() in ("aarch64", "arm64")

# x86-64: ldtilecfg [rdi]; tilezero tmm0; tilerelease; xor eax, eax; ret
_AMX_CODE = bytes.fromhex("c4e2784907c4e27b49c0c4e27849c031c0c3")
_ARCH_PRCTL = 158  # x86-64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def cpu_flags() -> frozenset[str]:
    """The feature flags Linux reports for the first CPU (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def amx_advertised(flags: frozenset[str] | None = None) -> bool:
    return "amx_tile" in (cpu_flags() if flags is None else flags)


@dataclass(frozen=True)
class RepackDecision:
    enabled: bool
    reason: str  # why, in words for the log, `ps` and `info`


@functools.cache
def repack_default() -> RepackDecision:
    """Whether to let ggml repack weights here: off only where AMX is advertised but faults."""
    if not (_X86 and sys.platform.startswith("linux") and amx_advertised()):
        return RepackDecision(True, "default")
    if amx_faults():
        return RepackDecision(
            False,
            "this CPU advertises AMX but executing it faults (a VM that does not enable it): "
            "weights are not repacked",
        )
    return RepackDecision(True, "AMX advertised and usable")


def amx_faults() -> bool:
    """Execute AMX tile instructions in a child process; True when the child dies of SIGILL."""
    code = "from modelhub.engine.cpu import _amx_probe_child; _amx_probe_child()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == -signal.SIGILL


def _amx_probe_child() -> None:
    """In the probe's child: ask Linux for AMX state (as ggml does), then use a tile."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
        sys.exit(1)  # the kernel refuses: ggml will not use AMX either
    config = (ctypes.c_uint8 * 64)()
    config[0] = 1  # palette 1
    config[16] = 64  # tmm0: 64 bytes per row (colsb[0], little-endian u16)
    config[48] = 16  # tmm0: 16 rows
    _call_machine_code(_AMX_CODE, ctypes.addressof(config))
    sys.exit(0)


def _call_machine_code(code: bytes, arg: int = 0) -> int:
    """Run ``code`` as a C function ``int f(void *arg)`` (x86-64 System V / AArch64)."""
    prot = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=prot)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    function = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(address)
    return int(function(arg))


def illegal_instruction() -> None:
    """Execute an undefined instruction, so that this process dies of a real SIGILL."""
    code = bytes.fromhex("0f0b") if _X86 else bytes(4) if _ARM64 else b""  # ud2; udf #0
    if code:
        with contextlib.suppress(OSError, ValueError):  # no W+X pages here: raise it instead
            _call_machine_code(code)
    signal.signal(signal.SIGILL, signal.SIG_DFL)
    signal.raise_signal(signal.SIGILL)


def inject_fault(repack: bool) -> None:
    """The test hook: fault like the AMX VM when :data:`FAULT_ENV` asks for it."""
    mode = os.environ.get(FAULT_ENV, "")
    if mode == "sigill" or (mode == "sigill-with-repack" and repack):
        illegal_instruction()
