"""Blob transfers shared between concurrent pulls, in one process and across processes.

In a process, a transfer is keyed by (store, digest): the first pull that needs a blob starts
it, later ones attach and watch the same byte counter, and it is cancelled only when every
pull waiting for it has gone (STO-06). Across processes, the one writing a blob holds a flock
on its partial file; another process waits for that lock, showing the progress the holder
records on disk, and then finds the blob in the store (STO-05).
"""

from __future__ import annotations

import contextlib
import copy
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from modelhub.errors import ModelhubError, RequestCancelledError, SizeMismatchError, StoreError
from modelhub.pull.base import DownloadPolicy, check_cancel
from modelhub.pull.downloader import (
    NO_SPACE_ERRNOS,
    RangedDownload,
    check_space,
    no_space,
)
from modelhub.pull.fetch import HttpBlobSource
from modelhub.pull.partials import PartialFiles, try_lock
from modelhub.store import Store

LOCK_POLL = 0.2
# What a StreamJob reads from: chunks of the blob, opened with the transfer's cancel event.
Streamed = AbstractContextManager[Iterator[bytes]]


class Job(Protocol):
    """Something that puts one blob into the store and says how far it got."""

    key: str  # the expected digest, or a stand-in naming the partial when it is unknown

    @property
    def completed(self) -> int: ...

    def run(self, cancel: threading.Event) -> str:
        """Store the blob; returns its digest."""
        ...


def _touch(store: Store, digest: str) -> None:
    """Refresh a reused blob's mtime so prune's grace period covers this pull (STO-11)."""
    with contextlib.suppress(OSError):
        os.utime(store.blob_path(digest))


@contextlib.contextmanager
def blob_slot(
    store: Store,
    files: PartialFiles,
    expected: str | None,
    cancel: threading.Event,
    on_wait: Callable[[int], None],
) -> Iterator[int | None]:
    """Hold the cross-process lock for one blob; yields None when the blob is already there."""
    while True:
        if expected is not None and store.has_blob(expected):
            _touch(store, expected)
            yield None
            return
        fd = try_lock(files.data)
        if fd is not None:
            break
        on_wait(files.completed_on_disk())  # another process is downloading it
        if cancel.wait(LOCK_POLL):
            raise RequestCancelledError("pull cancelled")
    try:
        if expected is not None and store.has_blob(expected):
            _drop_if_empty(files, fd)
            _touch(store, expected)
            yield None
        else:
            yield fd
    finally:
        os.close(fd)


def _drop_if_empty(files: PartialFiles, fd: int) -> None:
    """Remove a partial file that this process only created to lock (call while locked)."""
    if os.fstat(fd).st_size == 0 and not files.state_indexes():
        with contextlib.suppress(FileNotFoundError):
            files.data.unlink()


class HttpJob:
    """A blob fetched over HTTP with ranges and resume (registry, Hugging Face, URL)."""

    def __init__(
        self,
        store: Store,
        source: HttpBlobSource,
        *,
        key: str,
        expected: str | None,
        total: int,
        policy: DownloadPolicy,
    ) -> None:
        self.store, self.source, self.policy = store, source, policy
        self.key, self.expected, self.total = key, expected, total
        self._waiting = 0
        self._download: RangedDownload | None = None

    @property
    def completed(self) -> int:
        return self._download.completed if self._download is not None else self._waiting

    def run(self, cancel: threading.Event) -> str:
        files = PartialFiles(self.store, self.key)

        def waiting(done: int) -> None:
            self._waiting = done

        with blob_slot(self.store, files, self.expected, cancel, waiting) as fd:
            if fd is None:
                assert self.expected is not None
                return self.expected
            self._download = RangedDownload(
                self.store,
                files,
                fd,
                self.source,
                expected=self.expected,
                total=self.total,
                policy=self.policy,
                cancel=cancel,
            )
            # Without a known digest, bytes from an earlier run may be of another version.
            return self._download.run(resume=self.expected is not None)


class StreamJob:
    """A blob copied from a local stream (a file, a wheel member) through a BlobWriter."""

    def __init__(
        self,
        store: Store,
        opener: Callable[[threading.Event], Streamed],
        *,
        key: str,
        expected: str | None,
        total: int | None,
        policy: DownloadPolicy,
        label: str,
    ) -> None:
        self.store, self.opener, self.policy, self.label = store, opener, policy, label
        self.key, self.expected, self.total = key, expected, total
        self.completed = 0

    def run(self, cancel: threading.Event) -> str:
        files = PartialFiles(self.store, self.key)

        def waiting(done: int) -> None:
            self.completed = done

        with blob_slot(self.store, files, self.expected, cancel, waiting) as fd:
            if fd is None:
                assert self.expected is not None
                return self.expected
            try:
                return self._copy(cancel)
            finally:
                _drop_if_empty(files, fd)

    def _copy(self, cancel: threading.Event) -> str:
        if self.total is not None:
            check_space(self.store, self.total, self.policy, self.label)
        self.completed = 0
        with self.store.blob_writer() as writer, self.opener(cancel) as chunks:
            for chunk in chunks:
                check_cancel(cancel)
                if self.total is not None and writer.size + len(chunk) > self.total:
                    raise SizeMismatchError(
                        f"{self.label} is larger than the {self.total} bytes expected"
                    )
                try:
                    writer.write(chunk)
                except StoreError as exc:
                    cause = exc.__cause__
                    if isinstance(cause, OSError) and cause.errno in NO_SPACE_ERRNOS:
                        raise no_space(cause, self.label) from exc
                    raise
                self.completed = writer.size
            if self.total is not None and writer.size != self.total:
                raise SizeMismatchError(
                    f"{self.label} has {writer.size} bytes, {self.total} were expected"
                )
            digest, _ = writer.commit(self.expected)
            return digest


class _Transfer:
    def __init__(self, job: Job) -> None:
        self.job = job
        self.cancel = threading.Event()
        self.done = threading.Event()
        self.waiters = 0
        self.result: str | None = None
        self.error: BaseException | None = None


_lock = threading.Lock()
_active: dict[tuple[str, str], _Transfer] = {}


def obtain(
    store: Store,
    job: Job,
    *,
    report: Callable[[int], None],
    cancel: threading.Event | None,
    interval: float,
) -> str:
    """Get ``job``'s blob into the store, sharing a transfer already running for it.

    ``report(completed)`` is called about every ``interval`` seconds while waiting.
    """
    key = (str(store.root), job.key)
    with _lock:
        transfer = _active.get(key)
        if transfer is None or transfer.cancel.is_set():
            transfer = _Transfer(job)
            _active[key] = transfer
            threading.Thread(
                target=_run, args=(key, transfer), name=f"pull-{job.key[7:19]}", daemon=True
            ).start()
        transfer.waiters += 1
    try:
        while not transfer.done.wait(interval):
            report(transfer.job.completed)
            check_cancel(cancel)
        if transfer.error is not None:
            raise _copy_error(transfer.error) from transfer.error
        assert transfer.result is not None
        return transfer.result
    finally:
        with _lock:
            transfer.waiters -= 1
            if transfer.waiters == 0 and not transfer.done.is_set():
                transfer.cancel.set()  # the last waiter left: stop, keep the partial


def _run(key: tuple[str, str], transfer: _Transfer) -> None:
    try:
        transfer.result = transfer.job.run(transfer.cancel)
    except BaseException as exc:
        transfer.error = exc
    finally:
        with _lock:
            if _active.get(key) is transfer:
                del _active[key]
        transfer.done.set()


def _copy_error(error: BaseException) -> BaseException:
    """A fresh exception per waiter (one instance raised in many threads shares a traceback)."""
    if isinstance(error, ModelhubError):
        try:
            return copy.copy(error)
        except Exception:
            return ModelhubError(error.message, error.kind)
    if isinstance(error, OSError):
        return StoreError(f"cannot store the blob: {error}")
    return ModelhubError(f"internal error while pulling: {error!r}")


__all__ = ["HttpJob", "Job", "StreamJob", "obtain"]
