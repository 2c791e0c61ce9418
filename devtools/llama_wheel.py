"""Build (once) and install llama-cpp-python with extra CMake options, e.g. ggml's RPC backend.

    python -m devtools.llama_wheel --cmake-args=-DGGML_RPC=on [--vulkan]

``--vulkan`` adds ggml's Vulkan backend (the software GPU lane: Mesa's lavapipe; needs Debian's
``mesa-vulkan-drivers libvulkan-dev glslc spirv-headers``), with ``vulkan_compat/`` ahead of
the system headers for Vulkan-Hpp releases older than this llama.cpp expects.

pip's own wheel cache is keyed by the source archive only: a wheel built with other CMAKE_ARGS,
or on another CPU (the build compiles for the machine it runs on), would be handed back
silently. So the wheel is cached here under a key made of the version, the CMake options and
this CPU's feature flags, and rebuilt whenever any of them differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # the llama.cpp the engine's bindings are written against
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "modelhub-wheels"


def cpu_key() -> str:
    """What the compiler targets with -march=native here: the CPU's flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def wheel_dir(cmake_args: str) -> Path:
    key = "\n".join([VERSION, cmake_args, platform.machine(), sys.version[:4], cpu_key()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return CACHE / f"llama_cpp_python-{VERSION}-{digest}"


def build(cmake_args: str, dest: Path) -> Path:
    env = {**os.environ, "CMAKE_ARGS": cmake_args}
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-cache-dir",
                "--no-binary",
                "llama-cpp-python",
                f"llama-cpp-python=={VERSION}",
                "-w",
                tmp,
            ],
            env=env,
            check=True,
        )
        (built,) = Path(tmp).glob("llama_cpp_python-*.whl")
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / built.name
        shutil.move(str(built), target.with_suffix(".part"))
        target.with_suffix(".part").rename(target)  # complete wheels only
        return target


def vulkan_args() -> str:
    """CMake options for the Vulkan backend, the compatibility headers copied to a path that
    depends only on their content (so that the cache key does not depend on the checkout)."""
    source = Path(__file__).resolve().parent / "vulkan_compat"
    files = sorted(p for p in source.rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]
    stable = CACHE / f"vulkan-compat-{digest}"
    if not stable.exists():
        shutil.copytree(source, stable)
    return f"-DGGML_VULKAN=on -DCMAKE_CXX_FLAGS=-I{stable}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmake-args", required=True, help='e.g. "-DGGML_RPC=on"')
    parser.add_argument("--vulkan", action="store_true", help="add the Vulkan backend")
    args = parser.parse_args()
    if args.vulkan:
        args.cmake_args = f"{args.cmake_args} {vulkan_args()}".strip()
    dest = wheel_dir(args.cmake_args)
    wheels = sorted(dest.glob("llama_cpp_python-*.whl"))
    if wheels:
        wheel = wheels[-1]
        print(f"llama-cpp-python {VERSION} ({args.cmake_args}): cached wheel {wheel.name}")
    else:
        print(f"llama-cpp-python {VERSION} ({args.cmake_args}): building (minutes)", flush=True)
        wheel = build(args.cmake_args, dest)
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)]
    subprocess.run(pip, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
