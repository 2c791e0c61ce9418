"""The on-disk model store: Ollama's layout (``blobs/``, ``manifests/``) with safe writes and GC.

Invariants: a blob's name is the digest of its bytes (``BlobWriter``); a manifest is written
last, atomically, and only when every blob it names exists with the declared size; anything
that deletes or writes manifests holds one cross-process lock (``<root>/.lock``). Garbage
collection fails closed: if any manifest cannot be read, it deletes nothing (STO-09).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import filelock

from modelhub.errors import BadRequest, ModelhubError, NotFound, StoreError
from modelhub.store.blobs import PARTIAL_SUFFIX, TEMP_PREFIX, BlobWriter, fsync_dir, temp_name
from modelhub.store.digests import CHUNK_SIZE, blob_path_in, digest_from_filename, sha256_file
from modelhub.store.manifests import MAX_MANIFEST_BYTES, Manifest
from modelhub.store.names import ModelName

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT = 120.0
DEFAULT_READ_LIMIT = 16 << 20  # small layers (template, params, config) are read into memory

# Store debris: our temp files, download partials, and legacy colon-named duplicates.
_DEBRIS = re.compile(
    re.escape(TEMP_PREFIX)
    + r"[A-Za-z0-9_-]{1,100}"
    + r"|sha256-[0-9a-f]{64}"
    + re.escape(PARTIAL_SUFFIX)
    + r"(-[0-9]{1,6})?"
    + r"|sha256:[0-9a-f]{64}"
)
_LEGACY = re.compile(r"sha256:([0-9a-f]{64})")
_MANIFEST_TEMP = re.compile(re.escape(TEMP_PREFIX) + r"[A-Za-z0-9_-]{1,100}")


@dataclass
class StoredModel:
    name: ModelName  # the stored spelling
    manifest: Manifest
    raw: bytes
    digest: str  # sha256 hex of the manifest bytes, no prefix (Ollama's model ID)
    modified: float  # manifest mtime
    size: int  # all layers plus the config


class Store:
    def __init__(
        self,
        root: Path | str,
        *,
        noprune: bool = False,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.blobs_dir = self.root / "blobs"
        self.manifests_dir = self.root / "manifests"
        self.noprune = noprune
        try:
            for directory in (self.root, self.blobs_dir, self.manifests_dir):
                directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the model store at {self.root}: {exc}") from exc
        self._manifests_real = self.manifests_dir.resolve()
        # thread_local: each thread takes the OS lock itself, so threads sharing this Store
        # exclude each other as separate processes do.
        self._lock = filelock.FileLock(
            str(self.root / ".lock"), timeout=lock_timeout, thread_local=True
        )
        self._migrate_legacy_names()

    # ----- blobs -------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Path of a blob; InvalidDigest unless ``digest`` is strictly ``sha256:<hex>``."""
        return blob_path_in(self.blobs_dir, digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def blob_writer(self, max_size: int | None = None) -> BlobWriter:
        return BlobWriter(self.blobs_dir, max_size=max_size)

    def put_bytes(self, data: bytes) -> tuple[str, int]:
        """Store a small layer (template, params, config JSON); returns (digest, size)."""
        with self.blob_writer() as writer:
            writer.write(data)
            return writer.commit()

    def import_file(self, path: Path | str) -> tuple[str, int]:
        """Copy a local regular file into the store, hashing while copying."""
        source = Path(path)
        try:
            info = os.stat(source)
        except OSError as exc:
            raise BadRequest(f"cannot read {source}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise BadRequest(f"cannot import {source}: not a regular file")
        try:
            with open(source, "rb") as handle, self.blob_writer() as writer:
                while chunk := handle.read(CHUNK_SIZE):
                    writer.write(chunk)
                return writer.commit()
        except OSError as exc:
            raise BadRequest(f"cannot read {source}: {exc.strerror or exc}") from exc

    def read_blob_bytes(self, digest: str, max_size: int = DEFAULT_READ_LIMIT) -> bytes:
        path = self.blob_path(digest)
        try:
            with open(path, "rb") as handle:
                data = handle.read(max_size + 1)
        except FileNotFoundError as exc:
            raise NotFound(f'blob "{digest}" not found') from exc
        if len(data) > max_size:
            raise StoreError(f'blob "{digest}" is larger than {max_size} bytes; not read')
        return data

    # ----- names and manifests -------------------------------------------------------------

    def resolve(self, name: ModelName) -> ModelName | None:
        """The stored spelling of ``name`` (case-insensitive per part), or None if absent."""
        spelled = self._spelled(name)
        path = self._manifest_path(spelled)
        try:
            return spelled if stat.S_ISREG(path.lstat().st_mode) else None
        except OSError:
            return None

    def get(self, name: ModelName) -> StoredModel:
        resolved = self.resolve(name)
        if resolved is None:
            raise NotFound(f"model '{name.display}' not found")
        try:
            return self._load(resolved)
        except FileNotFoundError as exc:  # deleted since resolve()
            raise NotFound(f"model '{name.display}' not found") from exc

    def list_models(self) -> list[StoredModel]:
        """Every readable model, newest first; unreadable manifests are logged and skipped."""
        models = []
        for name, path in self._manifest_files():
            if name is None:
                continue
            try:
                models.append(self._load(name))
            except FileNotFoundError:
                continue
            except (ModelhubError, OSError) as exc:
                log.warning("skipping unreadable manifest %s: %s", path, exc)
        models.sort(key=lambda model: model.modified, reverse=True)
        return models

    def write_manifest(
        self, name: ModelName, manifest: Manifest, *, raw: bytes | None = None
    ) -> list[str]:
        """Commit ``manifest`` under ``name``; returns the digests of blobs freed by overwriting.

        ``raw`` keeps a registry's bytes verbatim (the model ID is their hash); they must
        parse to ``manifest``.
        """
        data = manifest.to_json() if raw is None else raw
        if raw is not None and Manifest.from_json(raw) != manifest:
            raise StoreError("the raw manifest bytes do not match the manifest given")
        with self._locked():
            self._check_blobs(manifest)
            target = self._spelled(name)
            path = self._manifest_path(target)
            old = self._read_quietly(target)
            self._write_atomic(path, data)
            if old is None or self.noprune:
                return []
            return self._remove_unreferenced(old.digests() - manifest.digests())

    def delete(self, name: ModelName) -> list[str]:
        """Remove a model and the blobs nothing else references (always, as Ollama does).

        Returns the digests of the blobs removed.
        """
        with self._locked():
            target = self.resolve(name)
            if target is None:
                raise NotFound(f"model '{name.display}' not found")
            old = self._read_quietly(target)
            path = self._manifest_path(target)
            path.unlink()
            fsync_dir(path.parent)
            self._remove_empty_dirs(path.parent)
            return [] if old is None else self._remove_unreferenced(old.digests())

    def copy(self, src: ModelName, dst: ModelName) -> list[str]:
        """Copy the manifest bytes verbatim (blobs shared); same path is a no-op.

        An overwritten destination frees its own unreferenced blobs unless ``noprune``.
        """
        with self._locked():
            source = self.resolve(src)
            if source is None:
                raise NotFound(f"model '{src.display}' not found")
            target = self._spelled(dst)
            if self._manifest_path(source) == self._manifest_path(target):
                return []
            model = self._load(source)
            self._check_blobs(model.manifest)
            old = self._read_quietly(target)
            self._write_atomic(self._manifest_path(target), model.raw)
            if old is None or self.noprune:
                return []
            return self._remove_unreferenced(old.digests() - model.manifest.digests())

    # ----- garbage collection and checks -----------------------------------------------------

    def prune(self, *, grace_seconds: float = 3600) -> list[str]:
        """Delete unreferenced blobs and debris older than the grace period.

        Returns the names of the files removed from ``blobs/``. Deletes nothing when any
        manifest is unreadable. Only names this function parsed itself are ever unlinked.
        """
        with self._locked():
            self._migrate_legacy_names()
            referenced, problems = self._references()
            if problems:
                log.warning("prune skipped, unreadable manifests: %s", "; ".join(problems))
                return []
            cutoff = time.time() - grace_seconds
            removed: list[str] = []
            for entry in os.scandir(self.blobs_dir):
                digest = digest_from_filename(entry.name)
                if digest is not None:
                    if digest in referenced:
                        continue
                    path = self.blob_path(digest)
                elif _DEBRIS.fullmatch(entry.name):
                    path = self.blobs_dir / entry.name
                else:
                    continue  # not ours: left alone, reported by verify()
                if _is_old_regular_file(path, cutoff):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed.append(entry.name)
            if removed:
                fsync_dir(self.blobs_dir)
            self._clean_manifest_tree(cutoff)
            return sorted(removed)

    def verify(self, *, rehash: bool = False) -> list[str]:
        """Check the store invariant; returns a description of every problem found.

        With ``rehash`` every blob is re-hashed against its name (slow for large models).
        """
        problems: list[str] = []
        with self._locked():
            for name, path in self._manifest_files():
                where = path.relative_to(self.manifests_dir).as_posix()
                if name is None:
                    if not _MANIFEST_TEMP.fullmatch(path.name):  # a crashed writer's: debris
                        problems.append(f"unexpected file in manifests/: {where}")
                    continue
                try:
                    manifest = self._load(name).manifest
                except (ModelhubError, OSError) as exc:
                    problems.append(f"manifest {where} is unreadable: {exc}")
                    continue
                problems.extend(
                    f"manifest {where}: {issue}" for issue in self._blob_issues(manifest)
                )
            blob_names = []
            for entry in os.scandir(self.blobs_dir):
                if digest_from_filename(entry.name) is not None:
                    if not entry.is_file(follow_symlinks=False):
                        problems.append(f"blobs/{entry.name} is not a regular file")
                    blob_names.append(entry.name)
                elif not _DEBRIS.fullmatch(entry.name):
                    problems.append(f"unexpected file in blobs/: {entry.name}")
        if rehash:
            for blob_name in sorted(blob_names):
                digest = digest_from_filename(blob_name)
                if digest is None:
                    continue
                try:
                    actual, _ = sha256_file(self.blob_path(digest))
                except FileNotFoundError:
                    continue  # pruned since the scan
                if actual != digest:
                    problems.append(f"blob {digest} is corrupt: its content hashes to {actual}")
        return problems

    # ----- internals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._lock.acquire()
        except filelock.Timeout as exc:
            raise StoreError(
                f"the model store at {self.root} is busy: another process has held "
                f"{self._lock.lock_file} for over {self._lock.timeout:.0f}s; try again"
            ) from exc
        try:
            yield
        finally:
            self._lock.release()

    def _manifest_path(self, name: ModelName) -> Path:
        path = self.manifests_dir.joinpath(*name.manifest_relpath().parts)
        if not path.resolve().is_relative_to(self._manifests_real):
            raise StoreError(f"the manifest path of '{name.display}' leaves the store; refused")
        return path

    def _spelled(self, name: ModelName) -> ModelName:
        """``name`` with each part replaced by an existing directory's spelling, level by level."""
        parts = [name.host, name.namespace, name.model, name.tag]
        directory = self.manifests_dir
        for level, part in enumerate(parts):
            match = _match_entry(directory, part, want_dir=level < 3)
            if match is None:
                break
            parts[level] = match
            directory = directory / match
        return ModelName(*parts)

    def _manifest_files(self) -> Iterator[tuple[ModelName | None, Path]]:
        """Every file in the manifest tree; the name is None where it is not a valid name."""
        for host in _subdirs(self.manifests_dir):
            for namespace in _subdirs(host):
                for model in _subdirs(namespace):
                    for entry in _entries(model):
                        if not entry.is_file(follow_symlinks=False):
                            continue
                        parts = (host.name, namespace.name, model.name, entry.name)
                        try:
                            name: ModelName | None = ModelName.from_parts(*parts)
                        except ModelhubError:
                            name = None
                        yield name, Path(entry.path)

    def _load(self, name: ModelName) -> StoredModel:
        path = self._manifest_path(name)
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

    def _read_quietly(self, name: ModelName) -> Manifest | None:
        """The manifest stored under ``name``, or None when absent or unreadable (logged)."""
        try:
            return self._load(name).manifest
        except FileNotFoundError:
            return None
        except (ModelhubError, OSError) as exc:
            log.warning("ignoring the unreadable manifest of %s: %s", name.display, exc)
            return None

    def _blob_issues(self, manifest: Manifest) -> list[str]:
        issues = []
        for layer in [manifest.config, *manifest.layers]:
            try:
                info = self.blob_path(layer.digest).stat()
            except FileNotFoundError:
                issues.append(f'blob "{layer.digest}" is missing from the store')
                continue
            if info.st_size != layer.size:
                issues.append(
                    f'blob "{layer.digest}" has {info.st_size} bytes, '
                    f"the manifest declares {layer.size}"
                )
        return issues

    def _check_blobs(self, manifest: Manifest) -> None:
        issues = self._blob_issues(manifest)
        if issues:
            raise StoreError("cannot write the manifest: " + "; ".join(issues))

    def _write_atomic(self, path: Path, data: bytes) -> None:
        """temp file in the same directory -> fsync -> rename -> fsync the directory (STO-08)."""
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            temp = path.parent / temp_name()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
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

    def _references(self) -> tuple[set[str], list[str]]:
        """Digests referenced by any manifest, and the manifests that could not be read."""
        referenced: set[str] = set()
        problems: list[str] = []
        for name, path in self._manifest_files():
            if name is None:
                continue
            try:
                referenced |= self._load(name).manifest.digests()
            except (ModelhubError, OSError) as exc:
                problems.append(f"{path.relative_to(self.manifests_dir).as_posix()}: {exc}")
        return referenced, problems

    def _remove_unreferenced(self, candidates: set[str]) -> list[str]:
        """Unlink those of ``candidates`` no manifest references; fails closed (STO-09)."""
        if not candidates:
            return []
        referenced, problems = self._references()
        if problems:
            log.warning("not freeing blobs, unreadable manifests: %s", "; ".join(problems))
            return []
        removed = []
        for digest in sorted(candidates - referenced):
            with contextlib.suppress(FileNotFoundError):
                self.blob_path(digest).unlink()
                removed.append(digest)
        if removed:
            fsync_dir(self.blobs_dir)
        return removed

    def _remove_empty_dirs(self, directory: Path) -> None:
        """Remove ``directory`` and its parents while empty, stopping at ``manifests/``."""
        while directory != self.manifests_dir and directory.is_relative_to(self.manifests_dir):
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def _clean_manifest_tree(self, cutoff: float) -> None:
        """Drop stale manifest temp files (crashed writers) and empty directories."""
        for host in _subdirs(self.manifests_dir):
            for namespace in _subdirs(host):
                for model in _subdirs(namespace):
                    for entry in _entries(model):
                        path = Path(entry.path)
                        if _MANIFEST_TEMP.fullmatch(entry.name) and _is_old_regular_file(
                            path, cutoff
                        ):
                            with contextlib.suppress(FileNotFoundError):
                                path.unlink()
                    self._remove_empty_dirs(model)

    def _migrate_legacy_names(self) -> None:
        """Rename old ``sha256:<hex>`` blob names to ``sha256-<hex>`` (as Ollama does at start)."""
        for entry in _entries(self.blobs_dir):
            match = _LEGACY.fullmatch(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            target = self.blob_path("sha256:" + match.group(1))
            if not target.exists():
                with contextlib.suppress(FileNotFoundError):
                    os.rename(entry.path, target)


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as listing:
            return sorted(listing, key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdirs(directory: Path) -> Iterator[Path]:
    for entry in _entries(directory):
        if entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def _match_entry(directory: Path, part: str, *, want_dir: bool) -> str | None:
    """The entry of ``directory`` equal to ``part`` ignoring ASCII case; exact spelling wins."""
    candidates = []
    for entry in _entries(directory):
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


def _is_old_regular_file(path: Path, cutoff: float) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_mtime < cutoff
