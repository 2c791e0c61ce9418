"""Quantize a GGUF file with llama.cpp (``modelhub create --quantize`` and the test models).

The work runs in a child process (``python -m modelhub.gguf.quantize SRC DST TYPE``): llama.cpp
reports some failures with a C assertion, which would otherwise abort the daemon. The output is
written to a temporary name beside ``dst`` and renamed only when the quantizer succeeded, so a
failure never leaves a half-written model behind.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from modelhub.errors import GGUFError, InputError, ModelhubError, NotFoundError

# Names accepted by --quantize (lower case) -> llama.cpp ``llama_ftype`` values (llama.h).
QUANT_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "q5_0": 8,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k_s": 11,
    "q3_k_m": 12,
    "q3_k_l": 13,
    "q4_k_s": 14,
    "q4_k_m": 15,
    "q5_k_s": 16,
    "q5_k_m": 17,
    "q6_k": 18,
    "bf16": 32,
}

# ggml tensor types (GGMLQuantizationType) that hold unquantized weights.
_FLOAT_TENSOR_TYPES = {"F32", "F16", "BF16"}
_ERROR_PREFIX = "modelhub-quantize-error: "
_LOG_TAIL_LINES = 15
_EXIT_BAD_REQUEST = 2
_EXIT_LLAMA_FAILED = 3


def ftype_for(qtype: str) -> int:
    """The llama_ftype for a quantization name (case-insensitive), or a BadRequest naming them."""
    ftype = QUANT_TYPES.get(qtype.strip().lower())
    if ftype is None:
        supported = ", ".join(name.upper() for name in QUANT_TYPES)
        raise InputError(f"unknown quantization type {qtype!r}; supported types: {supported}")
    return ftype


def source_weight_type(src: Path) -> str | None:
    """The most common quantized weight type in ``src`` (e.g. ``"Q4_1"``); None for float."""
    from gguf import GGUFReader  # imported lazily: the reader maps the whole file

    try:
        reader = GGUFReader(src)
    except (ValueError, OSError, IndexError) as exc:
        raise GGUFError(f"{src} is not a readable GGUF file: {exc}") from exc
    counts = Counter(str(t.tensor_type.name) for t in reader.tensors)
    quantized = [name for name, _ in counts.most_common() if name not in _FLOAT_TENSOR_TYPES]
    return quantized[0] if quantized else None


def check_request(src: Path, dst: Path, qtype: str, allow_requantize: bool) -> int:
    """Validate everything we can before starting llama.cpp; return the llama_ftype."""
    ftype = ftype_for(qtype)
    if not src.is_file():
        raise NotFoundError(f"model file to quantize not found: {src}")
    if not dst.parent.is_dir():
        raise InputError(f"output directory does not exist: {dst.parent}")
    if dst.resolve() == src.resolve():
        raise InputError(f"refusing to quantize {src} onto itself; choose another output path")
    quantized = source_weight_type(src)
    if quantized is not None and not allow_requantize:
        raise InputError(
            "quantization is only supported for F16, BF16 and F32 models "
            f"({src.name} already holds {quantized} weights)"
        )
    return ftype


def _die_with_parent() -> None:
    """In the quantize child (Linux): the kernel kills it when the thread that started it, and
    so the daemon, dies; a killed daemon leaves no quantizer running."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def quantize_gguf(
    src: Path, dst: Path, qtype: str, *, allow_requantize: bool = False, threads: int = 0
) -> None:
    """Write ``src`` quantized to ``qtype`` at ``dst`` (replacing it atomically on success).

    ``threads=0`` lets llama.cpp use every core. Raises ModelhubError subclasses with a message
    for a person; llama.cpp's own log tail is included when the quantizer itself fails.
    """
    src, dst = Path(src), Path(dst)
    check_request(src, dst, qtype, allow_requantize)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.partial")
    cmd = [sys.executable, "-m", "modelhub.gguf.quantize", str(src), str(tmp), qtype]
    cmd += ["--threads", str(threads)]
    if allow_requantize:
        cmd.append("--allow-requantize")
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])  # the directory holding modelhub/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, env=env, check=False, preexec_fn=_die_with_parent
        )
        if result.returncode != 0:
            raise _child_failure(src, qtype, result)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _child_failure(src: Path, qtype: str, result: subprocess.CompletedProcess[str]) -> Exception:
    lines = result.stderr.strip().splitlines()
    reported = [
        line.removeprefix(_ERROR_PREFIX) for line in lines if line.startswith(_ERROR_PREFIX)
    ]
    if result.returncode == _EXIT_BAD_REQUEST and reported:
        return InputError(reported[0])
    log_tail = "\n".join(line for line in lines[-_LOG_TAIL_LINES:] if line not in reported)
    if reported:
        summary = reported[0]
    elif result.returncode < 0:
        summary = f"quantizing {src.name} to {qtype.upper()} crashed (signal {-result.returncode})"
    else:
        summary = f"quantizing {src.name} to {qtype.upper()} failed (exit {result.returncode})"
    return ModelhubError(f"{summary}; llama.cpp said:\n{log_tail}" if log_tail else summary)


def _run_llama_quantize(
    src: Path, dst: Path, ftype: int, allow_requantize: bool, threads: int
) -> None:
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    params.allow_requantize = allow_requantize
    status = llama_cpp.llama_model_quantize(
        str(src).encode(), str(dst).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise ModelhubError(f"llama.cpp could not quantize {src.name} (status {status})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m modelhub.gguf.quantize", description="Quantize a GGUF model with llama.cpp."
    )
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("type", help=f"one of: {', '.join(QUANT_TYPES)}")
    parser.add_argument("--allow-requantize", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        ftype = check_request(args.src, args.dst, args.type, args.allow_requantize)
    except ModelhubError as exc:
        print(_ERROR_PREFIX + exc.message.replace("\n", " "), file=sys.stderr)
        return _EXIT_BAD_REQUEST
    try:
        _run_llama_quantize(args.src, args.dst, ftype, args.allow_requantize, args.threads)
    except ModelhubError as exc:
        print(_ERROR_PREFIX + exc.message.replace("\n", " "), file=sys.stderr)
        return _EXIT_LLAMA_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
