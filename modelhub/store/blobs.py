"""Writing blobs: hash while writing to a temp file, rename only verified bytes (SEC-03, STO-01).

A blob's final name is its digest, so "the file exists" means "these bytes were verified when
written". Temp files live inside ``blobs/`` (same filesystem, so the rename is atomic) under a
name that can never parse as a digest; a writer killed mid-way leaves only such a temp file,
which ``Store.prune`` removes after its grace period.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from pathlib import Path
from types import TracebackType

from modelhub.errors import DigestMismatchError, InputError, StoreError
from modelhub.store.digests import blob_path_in, parse_digest

# What the store creates is its owner's alone: models may be private, and a blob copied from a
# readable system file must not become readable by everyone.
FILE_MODE = 0o600
DIR_MODE = 0o700

TEMP_PREFIX = ".tmp-"
# Names that pull code may use for resumable downloads; prune treats them as debris.
PARTIAL_SUFFIX = "-partial"


def temp_name() -> str:
    """A fresh temp file name: unique per writer, never a valid blob name."""
    return f"{TEMP_PREFIX}{uuid.uuid4().hex}"


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic
    finally:
        os.close(fd)


class BlobWriter:
    """Stream bytes into the store; :meth:`commit` verifies and publishes them atomically."""

    def __init__(self, blobs_dir: Path, *, max_size: int | None = None) -> None:
        self.blobs_dir = blobs_dir
        self.max_size = max_size
        self.size = 0
        self._hasher = hashlib.sha256()
        self.temp_path = blobs_dir / temp_name()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(self.temp_path, flags, FILE_MODE)
        except OSError as exc:
            raise StoreError(f"cannot create a temp file in {blobs_dir}: {exc.strerror}") from exc
        self._file = os.fdopen(fd, "wb")
        self._done = False

    def write(self, data: bytes) -> None:
        if self._done:
            raise StoreError("blob writer used after commit or abort")
        if self.max_size is not None and self.size + len(data) > self.max_size:
            self.abort()
            raise InputError(f"blob is larger than the limit of {self.max_size} bytes")
        try:
            self._file.write(data)
        except OSError as exc:
            self.abort()
            raise StoreError(f"cannot write blob data: {exc.strerror or exc}") from exc
        self._hasher.update(data)
        self.size += len(data)

    @property
    def digest(self) -> str:
        """The digest of the bytes written so far."""
        return "sha256:" + self._hasher.hexdigest()

    def commit(self, expected: str | None = None) -> tuple[str, int]:
        """Verify against ``expected`` (if given) and move into place; returns (digest, size)."""
        if self._done:
            raise StoreError("blob writer used after commit or abort")
        try:
            if expected is not None:
                parse_digest(expected)
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        except OSError as exc:
            self.abort()
            raise StoreError(f"cannot write blob data: {exc.strerror or exc}") from exc
        except BaseException:
            self.abort()
            raise
        actual = self.digest
        if expected is not None and actual != expected:
            self.abort()
            raise DigestMismatchError(f'digest mismatch, expected "{expected}", got "{actual}"')
        final = blob_path_in(self.blobs_dir, actual)
        self._done = True
        try:
            # Existing blob: its name proves it was verified; refresh its mtime so that a
            # concurrent prune's grace period protects it until our manifest is written.
            os.utime(final)
        except FileNotFoundError:
            try:
                os.replace(self.temp_path, final)
            except OSError as exc:
                self._remove_temp()
                raise StoreError(f"cannot store blob {actual}: {exc.strerror or exc}") from exc
            fsync_dir(self.blobs_dir)
        else:
            self._remove_temp()
        return actual, self.size

    def abort(self) -> None:
        """Drop everything written; safe to call more than once."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self._file.close()
        self._remove_temp()

    def _remove_temp(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.temp_path.unlink()

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Without a commit the bytes are never published, exception or not.
        self.abort()
