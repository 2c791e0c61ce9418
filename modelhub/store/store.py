"""The on-disk model store: Ollama's layout (``blobs/``, ``manifests/``) with safe writes and GC.

Invariants: a blob's name is the digest of its bytes (``BlobWriter``); a manifest is written
last, atomically, and only when every blob it names exists with the declared size; anything
that deletes or writes manifests holds one cross-process lock (``<root>/.lock``). Garbage
collection fails closed: if any manifest cannot be read, it deletes nothing (STO-09).

:class:`Store` is the facade; the manifest tree (:mod:`~modelhub.store.manifest_tree`), garbage
collection (:mod:`~modelhub.store.gc`) and the invariant's checks (:mod:`~modelhub.store.verify`)
live beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import filelock

from modelhub.errors import InputError, ModelhubError, NotFoundError, StoreError
from modelhub.store.blobs import DIR_MODE, BlobWriter, fsync_dir
from modelhub.store.content import RECORD_NAME, ContentChecks
from modelhub.store.digests import CHUNK_SIZE, blob_path_in, state_path_in
from modelhub.store.gc import (
    DRAFTING_DIR,
    WORK_DIR,
    clean_manifest_tree,
    clean_work_area,
    migrate_legacy_names,
    references,
    remove_drafting_state,
    remove_orphan_drafting_state,
    remove_stale_blobs,
    unlink_blobs,
)
from modelhub.store.manifest_tree import ManifestTree, StoredModel
from modelhub.store.manifests import Layer, Manifest
from modelhub.store.names import ModelName
from modelhub.store.verify import (
    blob_issues,
    blobs_dir_problems,
    layer_issues,
    manifest_problems,
    rehash_problems,
)

__all__ = ["DEFAULT_LOCK_TIMEOUT", "DEFAULT_READ_LIMIT", "Store", "StoredModel"]

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT = 120.0
DEFAULT_READ_LIMIT = 16 << 20  # small layers (template, params, config) are read into memory


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
                directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the model store at {self.root}: {exc}") from exc
        self._tree = ManifestTree(self.manifests_dir)
        self._content = ContentChecks(self.blobs_dir, self.root / RECORD_NAME)
        # thread_local: each thread takes the OS lock itself, so threads sharing this Store
        # exclude each other as separate processes do.
        self._lock = filelock.FileLock(
            str(self.root / ".lock"), timeout=lock_timeout, thread_local=True
        )
        migrate_legacy_names(self.blobs_dir)

    # ----- blobs -------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Path of a blob; InvalidDigest unless ``digest`` is strictly ``sha256:<hex>``."""
        return blob_path_in(self.blobs_dir, digest)

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def drafting_dir(self, digest: str) -> Path:
        """Where drafting keeps what it learned for the weights blob ``digest`` (the n-gram
        pool, the controller's figures): ``<root>/drafting/<hex>/``. Not created here; removed
        with the blob (``delete``, ``write_manifest`` and ``copy`` freeing it, ``prune``)."""
        return state_path_in(self.root / DRAFTING_DIR, digest)

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
            raise InputError(f"cannot read {source}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"cannot import {source}: not a regular file")
        try:
            with open(source, "rb") as handle, self.blob_writer() as writer:
                while chunk := handle.read(CHUNK_SIZE):
                    writer.write(chunk)
                return writer.commit()
        except OSError as exc:
            raise InputError(f"cannot read {source}: {exc.strerror or exc}") from exc

    def read_blob_bytes(self, digest: str, max_size: int = DEFAULT_READ_LIMIT) -> bytes:
        path = self.blob_path(digest)
        try:
            with open(path, "rb") as handle:
                data = handle.read(max_size + 1)
        except FileNotFoundError as exc:
            raise NotFoundError(f'blob "{digest}" not found') from exc
        if len(data) > max_size:
            raise StoreError(f'blob "{digest}" is larger than {max_size} bytes; not read')
        return data

    # ----- names and manifests -------------------------------------------------------------

    def resolve(self, name: ModelName) -> ModelName | None:
        """The stored spelling of ``name`` (case-insensitive per part), or None if absent."""
        spelled = self._tree.spelled(name)
        path = self._tree.path(spelled)
        try:
            return spelled if stat.S_ISREG(path.lstat().st_mode) else None
        except OSError:
            return None

    def get(self, name: ModelName) -> StoredModel:
        resolved = self.resolve(name)
        if resolved is None:
            raise NotFoundError(f"model '{name.display}' not found")
        try:
            return self._tree.load(resolved)
        except FileNotFoundError as exc:  # deleted since resolve()
            raise NotFoundError(f"model '{name.display}' not found") from exc

    def list_models(self) -> list[StoredModel]:
        """Every readable model, newest first; unreadable manifests are logged and skipped."""
        models, unreadable = self.scan_models()
        for name, _modified, problem in unreadable:
            log.warning("skipping the unreadable manifest of %s: %s", name.display, problem)
        return models

    def scan_models(self) -> tuple[list[StoredModel], list[tuple[ModelName, float, str]]]:
        """Every readable model, newest first, and every manifest that cannot be read, as
        (name, modification time, what is wrong)."""
        models = []
        unreadable = []
        for name, path in self._tree.files():
            if name is None:
                continue
            try:
                models.append(self._tree.load(name))
            except FileNotFoundError:
                continue
            except (ModelhubError, OSError) as exc:
                with contextlib.suppress(OSError):
                    unreadable.append((name, path.stat().st_mtime, str(exc)))
        models.sort(key=lambda model: model.modified, reverse=True)
        return models, unreadable

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
            target = self._tree.spelled(name)
            path = self._tree.path(target)
            old = self._read_quietly(target)
            self._tree.write_atomic(path, data)
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
                raise NotFoundError(f"model '{name.display}' not found")
            old = self._read_quietly(target)
            path = self._tree.path(target)
            path.unlink()
            fsync_dir(path.parent)
            self._tree.remove_empty_dirs(path.parent)
            return [] if old is None else self._remove_unreferenced(old.digests())

    def copy(self, src: ModelName, dst: ModelName) -> list[str]:
        """Copy the manifest bytes verbatim (blobs shared); same path is a no-op.

        An overwritten destination frees its own unreferenced blobs unless ``noprune``.
        """
        with self._locked():
            source = self.resolve(src)
            if source is None:
                raise NotFoundError(f"model '{src.display}' not found")
            target = self._tree.spelled(dst)
            if self._tree.path(source) == self._tree.path(target):
                return []
            model = self._tree.load(source)
            self._check_blobs(model.manifest)
            old = self._read_quietly(target)
            self._tree.write_atomic(self._tree.path(target), model.raw)
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
            migrate_legacy_names(self.blobs_dir)
            referenced, problems = references(self._tree)
            if problems:
                log.warning("prune skipped, unreadable manifests: %s", "; ".join(problems))
                return []
            cutoff = time.time() - grace_seconds
            removed = remove_stale_blobs(self.blobs_dir, referenced, cutoff)
            remove_orphan_drafting_state(self.root, self.blobs_dir)
            clean_manifest_tree(self._tree, cutoff)
            clean_work_area(self.root, cutoff)
            return removed

    @contextlib.contextmanager
    def work_dir(self, what: str) -> Iterator[Path]:
        """A private folder for a long write (``what``: lower-case letters), removed when done;
        if the process dies meanwhile, ``clean_work_area`` (prune, daemon start) removes it."""
        folder = self.root / WORK_DIR / f"{what}-{os.getpid()}-{secrets.token_hex(4)}"
        folder.mkdir(mode=DIR_MODE, parents=True)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def clean_work_area(self) -> list[str]:
        """What dead processes left in the work area (a killed quantize's partial output)."""
        return clean_work_area(self.root, time.time() - 3600)

    def layer_issues(self, manifest: Manifest) -> list[tuple[Layer, str]]:
        """The layers of ``manifest`` whose blob is missing or has another size than declared
        (one ``stat`` each), with what is wrong."""
        return layer_issues(self.blobs_dir, manifest)

    def check_content(self, digest: str, *, rehash: bool = False) -> str | None:
        """None when the blob ``digest`` hashes to its name, else what is wrong. It is hashed
        once per state of its file (:mod:`~modelhub.store.content`), or now with ``rehash``.
        A blob whose content does not match is removed, so that a pull or create (which never
        rewrite an existing blob) can bring the right bytes back."""
        problem = self._content.check(digest, rehash=rehash)
        if problem is None or not problem.corrupt:
            return None if problem is None else problem.message
        with self._locked():
            unlink_blobs(self.blobs_dir, {digest})
        log.warning("removed the corrupt blob %s: %s", digest, problem.message)
        return f"{problem.message}; it was removed from the store"

    def verify(self, *, rehash: bool = False) -> list[str]:
        """Check the store invariant; returns a description of every problem found.

        With ``rehash`` every blob is re-hashed against its name (slow for large models).
        """
        with self._locked():
            problems = manifest_problems(self._tree, self.blobs_dir)
            stray, blob_names = blobs_dir_problems(self.blobs_dir)
            problems.extend(stray)
        if rehash:
            problems.extend(rehash_problems(self.blobs_dir, blob_names))
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

    def _read_quietly(self, name: ModelName) -> Manifest | None:
        """The manifest stored under ``name``, or None when absent or unreadable (logged)."""
        try:
            return self._tree.load(name).manifest
        except FileNotFoundError:
            return None
        except (ModelhubError, OSError) as exc:
            log.warning("ignoring the unreadable manifest of %s: %s", name.display, exc)
            return None

    def _check_blobs(self, manifest: Manifest) -> None:
        issues = blob_issues(self.blobs_dir, manifest)
        if issues:
            raise StoreError("cannot write the manifest: " + "; ".join(issues))

    def _remove_unreferenced(self, candidates: set[str]) -> list[str]:
        """Unlink those of ``candidates`` no manifest references, with their drafting state;
        fails closed (STO-09)."""
        if not candidates:
            return []
        referenced, problems = references(self._tree)
        if problems:
            log.warning("not freeing blobs, unreadable manifests: %s", "; ".join(problems))
            return []
        removed = unlink_blobs(self.blobs_dir, candidates - referenced)
        remove_drafting_state(self.root, candidates - referenced)
        return removed
