"""The manifest tree on disk, ``manifests/<host>/<namespace>/<model>/<tag>``: finding, listing,
loading and atomically writing the manifests in it.

Names match stored directories case-insensitively, part by part (the exact spelling wins), and
no manifest path may leave the tree. Locking is the caller's (:class:`~modelhub.store.Store`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from modelhub.errors import ModelhubError, StoreError
from modelhub.store.blobs import DIR_MODE, FILE_MODE, fsync_dir, temp_name
from modelhub.store.manifests import MAX_MANIFEST_BYTES, Manifest
from modelhub.store.names import ModelName


@dataclass
class StoredModel:
    name: ModelName  # the stored spelling
    manifest: Manifest
    raw: bytes
    digest: str  # sha256 hex of the manifest bytes, no prefix (Ollama's model ID)
    modified: float  # manifest mtime
    size: int  # all layers plus the config


class ManifestTree:
    """The ``manifests/`` directory of a store (which must exist)."""

    def __init__(self, manifests_dir: Path) -> None:
        self.root = manifests_dir
        self._real = manifests_dir.resolve()

    def path(self, name: ModelName) -> Path:
        path = self.root.joinpath(*name.manifest_relpath().parts)
        if not path.resolve().is_relative_to(self._real):
            raise StoreError(f"the manifest path of '{name.display}' leaves the store; refused")
        return path

    def spelled(self, name: ModelName) -> ModelName:
        """``name`` with each part replaced by an existing directory's spelling, level by level."""
        parts = [name.host, name.namespace, name.model, name.tag]
        directory = self.root
        for level, part in enumerate(parts):
            match = match_entry(directory, part, want_dir=level < 3)
            if match is None:
                break
            parts[level] = match
            directory = directory / match
        return ModelName(*parts)

    def files(self) -> Iterator[tuple[ModelName | None, Path]]:
        """Every file in the manifest tree; the name is None where it is not a valid name."""
        for host in subdirs(self.root):
            for namespace in subdirs(host):
                for model in subdirs(namespace):
                    for entry in entries(model):
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        parts = (host.name, namespace.name, model.name, entry.name)
                        try:
                            name: ModelName | None = ModelName.from_parts(*parts)
                        except ModelhubError:
                            name = None
                        yield name, Path(entry.path)

    def load(self, name: ModelName) -> StoredModel:
        path = self.path(name)
        with open(path, "rb") as handle:
            modified = os.fstat(handle.fileno()).st_mtime
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
        try:
            manifest = Manifest.from_json(raw)
        except ModelhubError as exc:
            raise StoreError(
                f"the manifest of '{name.display}' is unreadable ({exc}); "
                f"remove it with `modelhub rm {name.display}` or pull the model again"
            ) from exc
        digest = hashlib.sha256(raw).hexdigest()
        return StoredModel(name, manifest, raw, digest, modified, manifest.total_size)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """temp file in the same directory -> fsync -> rename -> fsync the directory (STO-08)."""
        try:
            path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            temp = path.parent / temp_name()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    temp.unlink()
                raise
            fsync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"cannot write the manifest {path}: {exc.strerror or exc}") from exc

    def remove_empty_dirs(self, directory: Path) -> None:
        """Remove ``directory`` and its parents while empty, stopping at ``manifests/``."""
        while directory != self.root and directory.is_relative_to(self.root):
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent


def entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as listing:
            return sorted(listing, key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def subdirs(directory: Path) -> Iterator[Path]:
    for entry in entries(directory):
        if entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def match_entry(directory: Path, part: str, *, want_dir: bool) -> str | None:
    """The entry of ``directory`` equal to ``part`` ignoring ASCII case; exact spelling wins."""
    candidates = []
    for entry in entries(directory):
        if not entry.name.isascii() or entry.name.lower() != part.lower():
            continue
        right_kind = (
            entry.is_dir(follow_symlinks=False)
            if want_dir
            else entry.is_file(follow_symlinks=False)
        )
        if right_kind:
            candidates.append(entry.name)
    if part in candidates:
        return part
    return candidates[0] if candidates else None
