"""Resumable download state on disk, Ollama style, and its cleanup.

Next to where a blob will land (``blobs/sha256-<hex>``) a download keeps:

* ``sha256-<hex>-partial``: the data, created at its full size (sparse) and filled by parts;
* ``sha256-<hex>-partial-<N>``: one small JSON per part, ``{"N","Offset","Size","Completed"}``.

The store's own prune treats both names as debris after its grace period. The process that
writes a partial holds an exclusive ``flock`` on the data file, so a second process (or
``prune_partials``) can tell a live download from an abandoned one. Partial paths are derived
from ``Store.blob_path``, the single validated digest -> path function (SEC-02).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from modelhub.store import Store
from modelhub.store.blobs import FILE_MODE, PARTIAL_SUFFIX, fsync_dir, temp_name

STATE_LIMIT = 4096  # a part's state is ~60 bytes; anything larger is not ours
TEMP_DIR_PREFIX = ".pull-"  # per-pull scratch directories in the store root (pypi wheels)
SCRATCH_LOCK = ".lock"  # held inside a scratch directory while a pull uses it
_GROUP = re.compile(r"sha256-([0-9a-f]{64})" + re.escape(PARTIAL_SUFFIX) + r"(?:-([0-9]{1,6}))?")


@dataclass
class Part:
    index: int
    offset: int
    size: int
    completed: int = 0

    @property
    def done(self) -> bool:
        return self.completed >= self.size

    def to_json(self) -> bytes:
        doc = {"N": self.index, "Offset": self.offset, "Size": self.size}
        doc["Completed"] = self.completed
        return json.dumps(doc).encode()


def plan_parts(total: int, part_size: int) -> list[Part]:
    """Split ``total`` bytes into consecutive parts of ``part_size`` (the last one shorter)."""
    if total == 0:
        return [Part(0, 0, 0)]
    return [
        Part(i, offset, min(part_size, total - offset))
        for i, offset in enumerate(range(0, total, part_size))
    ]


class PartialFiles:
    """The partial data file and part-state files of one blob download."""

    def __init__(self, store: Store, key: str) -> None:
        final = store.blob_path(key)  # InvalidDigestError for anything but sha256:<hex>
        self.blobs_dir = final.parent
        self.data = final.with_name(final.name + PARTIAL_SUFFIX)

    def state_path(self, index: int) -> Path:
        return self.data.with_name(f"{self.data.name}-{index}")

    def state_indexes(self) -> list[int]:
        prefix = self.data.name + "-"
        found = []
        with os.scandir(self.blobs_dir) as entries:
            for entry in entries:
                tail = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
                if tail.isdigit() and len(tail) <= 6:
                    found.append(int(tail))
        return sorted(found)

    def load_parts(self, total: int) -> list[Part] | None:
        """Saved parts if they tile ``[0, total)`` exactly and the data file has that size."""
        try:
            if os.stat(self.data).st_size != total:
                return None
        except FileNotFoundError:
            return None
        parts = []
        for index in self.state_indexes():
            try:
                with open(self.state_path(index), "rb") as handle:
                    doc = json.loads(handle.read(STATE_LIMIT))
                part = Part(doc["N"], doc["Offset"], doc["Size"], doc["Completed"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            values = (part.index, part.offset, part.size, part.completed)
            if not all(type(v) is int and v >= 0 for v in values) or part.completed > part.size:
                return None
            parts.append(part)
        parts.sort(key=lambda p: p.offset)
        expected = 0
        for i, part in enumerate(parts):
            if part.index != i or part.offset != expected:
                return None
            expected += part.size
        return parts if parts and expected == total else None

    def save_parts(self, parts: list[Part]) -> None:
        """Write every part's state atomically (temp file + rename) and drop extra ones."""
        for part in parts:
            temp = self.blobs_dir / temp_name()
            try:
                with open(temp, "wb") as handle:
                    handle.write(part.to_json())
                os.replace(temp, self.state_path(part.index))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    temp.unlink()
        for index in self.state_indexes():
            if index >= len(parts):
                with contextlib.suppress(FileNotFoundError):
                    self.state_path(index).unlink()

    def remove_state(self) -> None:
        for index in self.state_indexes():
            with contextlib.suppress(FileNotFoundError):
                self.state_path(index).unlink()

    def remove_all(self) -> None:
        self.remove_state()
        with contextlib.suppress(FileNotFoundError):
            self.data.unlink()
        fsync_dir(self.blobs_dir)

    def completed_on_disk(self) -> int:
        """Bytes another process has recorded as downloaded (for a waiter's progress)."""
        total = 0
        for index in self.state_indexes():
            try:
                with open(self.state_path(index), "rb") as handle:
                    total += int(json.loads(handle.read(STATE_LIMIT))["Completed"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return total


def try_lock(path: Path, *, create: bool = True) -> int | None:
    """Open ``path`` and take an exclusive non-blocking flock; None when another holds it.

    Returns an fd that refers to the file currently at ``path`` (a file renamed or unlinked
    between our open and our lock is detected and retried).
    """
    flags = os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(5):
        try:
            fd = os.open(path, flags, FILE_MODE)
        except FileNotFoundError:
            if create:
                raise
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the file moved on (finished or pruned) while we waited: reopen
        if not create:
            return None
    raise OSError(f"cannot lock {path}: it keeps being replaced")


@dataclass(frozen=True)
class PartialInfo:
    digest: str
    size_on_disk: int
    completed: int
    modified: float
    live: bool  # a process is writing it now


def partial_downloads(store: Store) -> list[PartialInfo]:
    """Every partial download in the store, live or abandoned (for listing and prune)."""
    out = []
    for digest, names in _groups(store).items():
        files = PartialFiles(store, digest)
        live = False
        size = 0
        if files.data.exists():
            fd = try_lock(files.data, create=False)
            live = fd is None and files.data.exists()
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                size = files.data.stat().st_blocks * 512
        out.append(
            PartialInfo(digest, size, files.completed_on_disk(), _newest(store, names), live)
        )
    return sorted(out, key=lambda info: info.digest)


def prune_partials(store: Store, older_than: float) -> list[str]:
    """Delete abandoned partial downloads untouched for ``older_than`` seconds.

    A partial whose data file is locked by a live process is never touched, whatever its
    age; ``older_than=0`` therefore removes every abandoned partial. Stale per-pull scratch
    directories in the store root go too. Returns the names removed.
    """
    cutoff = time.time() - older_than
    removed: list[str] = []
    for digest, names in _groups(store).items():
        files = PartialFiles(store, digest)
        fd = try_lock(files.data, create=False) if files.data.exists() else None
        if fd is None and files.data.exists():
            continue  # live download (or it just finished and was renamed)
        try:
            if _newest(store, names) >= cutoff:
                continue
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    (store.blobs_dir / name).unlink()
                    removed.append(name)
        finally:
            if fd is not None:
                os.close(fd)
    if removed:
        fsync_dir(store.blobs_dir)
    for entry in _entries(store.root):
        if not entry.name.startswith(TEMP_DIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_mtime < cutoff and not _dir_locked(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return sorted(removed)


def _dir_locked(directory: str) -> bool:
    """Whether a live pull holds the scratch directory's lock file."""
    lock = Path(directory, SCRATCH_LOCK)
    fd = try_lock(lock, create=False)
    if fd is None:
        return lock.exists()
    os.close(fd)
    return False


def _groups(store: Store) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for entry in _entries(store.blobs_dir):
        match = _GROUP.fullmatch(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            groups.setdefault("sha256:" + match.group(1), []).append(entry.name)
    return groups


def _newest(store: Store, names: list[str]) -> float:
    newest = 0.0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, (store.blobs_dir / name).stat().st_mtime)
    return newest


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as listing:
            return list(listing)
    except FileNotFoundError:
        return []
