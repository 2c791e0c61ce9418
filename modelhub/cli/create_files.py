"""The local side of `modelhub create`: the Modelfile and the files it names.

Reads the Modelfile (``-f``, ``./Modelfile`` or an implicit ``FROM .``), resolves FROM /
ADAPTER / DRAFT paths relative to the Modelfile's directory (absolute, ``~`` and relative
forms), scans directories for GGUF files, names files for the request, and hashes them.
Nothing here talks to the daemon.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from modelhub.errors import InputError, ModelfileError
from modelhub.modelfile import Command
from modelhub.store.digests import sha256_file

DEFAULT_MODELFILE = "Modelfile"
# A Modelfile is a short text; anything this large is almost surely a model passed to -f.
MAX_MODELFILE_BYTES = 16 * 1024 * 1024


@dataclass
class ModelfileSource:
    """The Modelfile text, the directory its relative paths start from, and how to name it."""

    text: str | bytes
    base_dir: Path
    label: str


# -- reading the Modelfile ---------------------------------------------------------------------


def load_modelfile(file_option: str | None, cwd: Path) -> ModelfileSource:
    """The Modelfile named by ``-f`` (relative to ``cwd``), else ``./Modelfile``, else an
    implicit ``FROM .`` when the current directory holds GGUF files."""
    if file_option is not None:
        path = _absolute(Path(os.path.expanduser(file_option)), cwd)
        if not path.exists():
            raise InputError(f"Modelfile not found: {file_option} (looked for {path})")
        if path.is_dir():
            raise InputError(f"{file_option} is a directory: pass the Modelfile's path to -f")
        return ModelfileSource(_read_modelfile(path, file_option), path.parent, file_option)
    default = cwd / DEFAULT_MODELFILE
    if default.is_file():
        return ModelfileSource(_read_modelfile(default, DEFAULT_MODELFILE), cwd, DEFAULT_MODELFILE)
    if not any(p.is_file() for p in cwd.glob("*.gguf")):
        raise InputError(
            f"no Modelfile in {cwd} (and no GGUF file to use as an implicit `FROM .`): "
            "write a Modelfile or pass one with -f FILE"
        )
    return ModelfileSource("FROM .\n", cwd, "(implicit FROM .)")


def _read_modelfile(path: Path, label: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_MODELFILE_BYTES:
            raise InputError(
                f"{label} is {size} bytes, too large for a Modelfile; to use a model file, "
                f"write a Modelfile containing `FROM {label}`"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read Modelfile {label}: {exc.strerror or exc}") from exc
    if data.startswith(b"GGUF"):
        raise InputError(
            f"{label} is a GGUF model, not a Modelfile: write a Modelfile containing `FROM {label}`"
        )
    return data


# -- paths ---------------------------------------------------------------------------------------


def _absolute(path: Path, base_dir: Path) -> Path:
    return Path(os.path.normpath(path if path.is_absolute() else base_dir / path))


def expand_path(value: str, base_dir: Path) -> Path:
    """Expand a FROM/ADAPTER/DRAFT value: absolute as is, ``~``/``~user`` to a home
    directory, anything else relative to ``base_dir`` (the Modelfile's directory)."""
    return _absolute(Path(os.path.expanduser(value)), base_dir)


def path_exists(path: Path, command: Command) -> bool:
    """Whether ``path`` exists; a ModelfileError on ``command``'s line when it cannot be
    checked (a permission error, say)."""
    try:
        path.stat()
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False
    except OSError as exc:
        raise ModelfileError(
            f"{command.args}: cannot access {path}: {exc.strerror or exc}", command.line
        ) from exc
    return True


def scan_gguf_directory(directory: Path) -> list[Path]:
    """The ``*.gguf`` files directly inside ``directory``, sorted by name."""
    return sorted(p for p in directory.glob("*.gguf") if p.is_file())


def relative_names(paths: Sequence[Path]) -> dict[str, Path]:
    """Request names for files: their path relative to the common parent of all of them
    (a single file is named by its base name), with forward slashes."""
    if not paths:
        return {}
    if len(paths) == 1:
        return {paths[0].name: paths[0]}
    parent = Path(os.path.commonpath([p.parent for p in paths]))
    return {p.relative_to(parent).as_posix(): p for p in paths}


@dataclass
class LocalRef:
    """A FROM/ADAPTER/DRAFT value that named an existing file or directory."""

    command: Command
    path: Path
    canonical: Path


def local_ref(command: Command, base_dir: Path) -> LocalRef | None:
    """The local reference ``command``'s value makes, or None when no such path exists."""
    path = expand_path(command.args, base_dir)
    if not path_exists(path, command):
        return None
    return LocalRef(command, path, Path(os.path.realpath(path)))


def files_of(ref: LocalRef, exclude: set[Path], keyword: str) -> list[Path]:
    """The files a reference stands for; a directory scan skips files that another
    instruction names on its own (``FROM .`` next to ``DRAFT ./draft.gguf``)."""
    if not ref.path.is_dir():
        if not ref.path.is_file():  # a FIFO or a device (/dev/zero) would be read forever
            raise ModelfileError(
                f"{keyword} {ref.command.args}: {ref.path} is not a regular file",
                ref.command.line,
            )
        return [ref.path]
    found = [p for p in scan_gguf_directory(ref.path) if Path(os.path.realpath(p)) not in exclude]
    if found:
        return found
    if any(ref.path.glob("*.safetensors")):
        problem = "holds safetensors weights, which modelhub cannot import; convert them to GGUF"
    elif scan_gguf_directory(ref.path):
        problem = "holds no GGUF file besides those other instructions name"
    else:
        problem = "holds no GGUF file"
    raise ModelfileError(
        f"{keyword} {ref.command.args}: directory {ref.path} {problem}", ref.command.line
    )


# -- hashing -------------------------------------------------------------------------------------


def hash_files(
    paths: Sequence[Path], on_done: Callable[[Path, str, int], None] | None = None
) -> dict[Path, str]:
    """``sha256:<hex>`` of each file (two at a time: hashing is I/O and C code)."""

    def one(path: Path) -> tuple[Path, str, int]:
        try:
            digest, size = sha256_file(path)
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
        return path, digest, size

    digests: dict[Path, str] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for path, digest, size in pool.map(one, paths):
            digests[path] = digest
            if on_done is not None:
                on_done(path, digest, size)
    return digests
