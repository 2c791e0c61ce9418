"""Download one blob: parallel ranged parts, resume, retries, hashing in order, atomic rename.

The data goes into ``sha256-<hex>-partial`` (see partials.py) at each part's offset. A hasher
thread follows the contiguous prefix of downloaded bytes and feeds it to sha256 as it grows,
so the digest is known moments after the last byte arrives, with no second pass over the
file; it reads the bytes back from the page cache. A resumed download re-hashes the bytes
already on disk the same way, so nothing is trusted without being hashed in this run.

Only when the whole blob has the expected size and digest is it fsynced and renamed to its
final name; a digest mismatch deletes the partial (an error says so). No space left on the
device stops every part at once, without retries, and keeps the partial for a later resume.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import random
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import httpx

from modelhub.errors import (
    DigestMismatchError,
    NoSpaceError,
    RequestCancelledError,
    SourceUnavailableError,
    StoreError,
)
from modelhub.pull.base import (
    DownloadPolicy,
    RangeNotHonoured,
    TransientError,
    check_cancel,
    short_hex,
)
from modelhub.pull.fetch import HttpBlobSource
from modelhub.pull.http import describe_error
from modelhub.pull.partials import Part, PartialFiles, plan_parts
from modelhub.store import Store
from modelhub.store.blobs import fsync_dir

WRITE_SIZE = 1 << 20  # received bytes are written in runs of up to 1 MiB
HASH_SIZE = 4 << 20
SUPERVISE_POLL = 0.1  # seconds between checks for cancellation and failed parts
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def check_space(store: Store, needed: int, policy: DownloadPolicy, what: str) -> None:
    """Refuse a download up front when the store's filesystem cannot hold it."""
    free = shutil.disk_usage(store.blobs_dir).free
    if needed + policy.space_margin > free:
        raise NoSpaceError(
            f"not enough disk space to pull {what}: {needed} more bytes are needed and "
            f"{free} are free in {store.blobs_dir} (plus a {policy.space_margin} byte margin); "
            "free some space (`modelhub rm`, `modelhub prune`) and pull again"
        )


def no_space(exc: OSError, what: str) -> NoSpaceError:
    return NoSpaceError(
        f"no space left on device while writing {what} ({exc.strerror}); free some space "
        "and pull again to resume, or run `modelhub prune` to drop the partial download"
    )


class _OrderedHasher(threading.Thread):
    """sha256 of the blob, fed with the contiguous downloaded prefix as it grows."""

    def __init__(self, fd: int, parts: list[Part], cond: threading.Condition) -> None:
        super().__init__(name="pull-hasher", daemon=True)
        self.fd, self.parts, self.cond = fd, parts, cond
        self.total = sum(part.size for part in parts)
        self.stopped = False
        self.digest: str | None = None
        self.error: BaseException | None = None

    def frontier(self) -> int:
        """End of the contiguous downloaded prefix (call with the condition held)."""
        for part in self.parts:
            if not part.done:
                return part.offset + part.completed
        return self.total

    def run(self) -> None:
        hasher = hashlib.sha256()
        position = 0
        try:
            while position < self.total:
                with self.cond:
                    while (end := self.frontier()) <= position and not self.stopped:
                        self.cond.wait(0.5)
                    if self.stopped:
                        return
                while position < end:
                    data = os.pread(self.fd, min(HASH_SIZE, end - position), position)
                    if not data:
                        raise StoreError("the partial download is shorter than recorded")
                    hasher.update(data)
                    position += len(data)
            self.digest = "sha256:" + hasher.hexdigest()
        except BaseException as exc:  # reported by the coordinator
            self.error = exc

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class RangedDownload:
    """Fill a locked partial file from an HTTP source and publish it as a verified blob."""

    def __init__(
        self,
        store: Store,
        files: PartialFiles,
        fd: int,
        source: HttpBlobSource,
        *,
        expected: str | None,
        total: int,
        policy: DownloadPolicy,
        cancel: threading.Event,
    ) -> None:
        self.store, self.files, self.fd, self.source = store, files, fd, source
        self.expected, self.total, self.policy, self.cancel = expected, total, policy, cancel
        self.what = f"blob {short_hex(expected or files.data.name[7:])}"
        self.cond = threading.Condition()
        self.parts: list[Part] = []
        self.completed = 0  # read by waiters for their progress lines
        self._abort = threading.Event()
        self._responses: set[httpx.Response] = set()

    # ----- whole download ----------------------------------------------------------------

    def run(self, *, resume: bool = True) -> str:
        """Download (or resume) and publish; returns the digest of the stored blob."""
        parts = self.files.load_parts(self.total) if resume else None
        resumed = parts is not None and any(part.completed for part in parts)
        if parts is None:
            parts = self._fresh(plan_parts(self.total, self.policy.part_size(self.total)))
        check_space(
            self.store, self.total - sum(p.completed for p in parts), self.policy, self.what
        )
        try:
            try:
                actual = self._transfer(parts)
            except RangeNotHonoured:
                # The server ignores Range: restart from byte 0 as one stream (STO-02).
                actual = self._transfer(self._fresh([Part(0, 0, self.total)]))
        except BaseException:
            if not any(part.completed for part in self.parts):
                self.files.remove_all()  # nothing worth resuming: leave no debris
            raise
        if self.expected is not None and actual != self.expected:
            if resumed:  # bytes from an earlier run were bad: one fresh try
                self.files.remove_state()
                return self.run(resume=False)
            self.files.remove_all()
            raise DigestMismatchError(
                f"digest mismatch, file must be downloaded again: "
                f"want {self.expected}, got {actual}"
            )
        return self._publish(actual)

    def _fresh(self, parts: list[Part]) -> list[Part]:
        try:
            os.ftruncate(self.fd, 0)
            os.ftruncate(self.fd, self.total)  # sparse: blocks are allocated as parts land
        except OSError as exc:
            if exc.errno in NO_SPACE_ERRNOS:
                raise no_space(exc, self.what) from exc
            raise StoreError(f"cannot create the partial download: {exc.strerror}") from exc
        self.files.save_parts(parts)
        return parts

    def _publish(self, digest: str) -> str:
        try:
            os.fsync(self.fd)
            os.replace(self.files.data, self.store.blob_path(digest))
        except OSError as exc:
            raise StoreError(f"cannot store blob {digest}: {exc.strerror or exc}") from exc
        fsync_dir(self.store.blobs_dir)
        self.files.remove_state()
        return digest

    def _transfer(self, parts: list[Part]) -> str:
        """Run the parts (in parallel) with an in-order hasher; returns the digest."""
        self.parts = parts
        self._abort.clear()
        with self.cond:
            self.completed = sum(part.completed for part in parts)
        hasher = _OrderedHasher(self.fd, parts, self.cond)
        hasher.start()
        pending = [part for part in parts if not part.done]
        workers = max(1, min(self.policy.parallel, len(pending)))
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="pull-part") as pool:
                futures = [pool.submit(self._part, part) for part in pending]
                self._supervise(futures)
        except BaseException:
            hasher.stop()
            raise
        finally:
            self._save()
        hasher.join()
        if hasher.error is not None:
            raise hasher.error
        assert hasher.digest is not None
        return hasher.digest

    def _supervise(self, futures: list[Future[None]]) -> None:
        saved, saved_at = -1, time.monotonic()
        try:
            while True:
                # Short waits: a cancel must close the connections within a fraction of a second.
                done, running = wait(futures, timeout=SUPERVISE_POLL, return_when=FIRST_EXCEPTION)
                for future in done:
                    future.result()  # re-raise a part's failure here
                if not running:
                    return
                check_cancel(self.cancel)
                now = time.monotonic()
                if self.completed != saved and now - saved_at >= self.policy.state_interval:
                    saved, saved_at = self.completed, now
                    self._save()
        except BaseException:
            self._stop_parts()
            for future in futures:
                with contextlib.suppress(BaseException):
                    future.result()
            raise

    def _stop_parts(self) -> None:
        """Make every part thread return promptly: flag, then close their connections."""
        self._abort.set()
        with self.cond:
            responses = list(self._responses)
        for response in responses:
            with contextlib.suppress(Exception):
                response.close()

    def _save(self) -> None:
        with self.cond:
            snapshot = [Part(p.index, p.offset, p.size, p.completed) for p in self.parts]
        with contextlib.suppress(OSError):  # state is an optimisation; the data is hashed
            self.files.save_parts(snapshot)

    # ----- one part ------------------------------------------------------------------------

    def _part(self, part: Part) -> None:
        failures = 0
        while not part.done:
            if self._abort.is_set() or self.cancel.is_set():
                raise RequestCancelledError("pull cancelled")
            before = part.completed
            start, end = part.offset + part.completed, part.offset + part.size - 1
            try:
                with self.source.stream(start, end, self.total) as response:
                    with self.cond:
                        self._responses.add(response)
                    try:
                        self._receive(part, response)
                    finally:
                        with self.cond:
                            self._responses.discard(response)
                if not part.done:
                    raise TransientError("the connection closed before the part was complete")
            except (TransientError, httpx.TransportError) as exc:
                if self._abort.is_set() or self.cancel.is_set():
                    raise RequestCancelledError("pull cancelled") from exc
                failures = 1 if part.completed > before else failures + 1
                if failures >= self.policy.attempts:
                    raise SourceUnavailableError(
                        f"download of {self.what} failed after {failures} attempts without "
                        f"progress: {describe_error(exc)} ({self.completed} of {self.total} "
                        "bytes received)"
                    ) from exc
                self._pause(failures)

    def _receive(self, part: Part, response: httpx.Response) -> None:
        buffer = bytearray()
        reaches_end = part.offset + part.size == self.total
        try:
            for chunk in response.iter_raw():
                if self._abort.is_set():
                    raise RequestCancelledError("pull cancelled")
                room = part.size - part.completed - len(buffer)
                if len(chunk) > room:
                    if reaches_end:  # more bytes than the blob has: a lying server (STO-04)
                        raise SourceUnavailableError(
                            f"{self.what}: the server sent more than the {self.total} bytes "
                            "declared; refused"
                        )
                    buffer += chunk[:room]  # a whole-body answer to part 0: keep its bytes
                    break
                buffer += chunk
                if len(buffer) >= WRITE_SIZE:
                    self._write(part, buffer)
                    buffer.clear()
        finally:
            self._write(part, buffer)  # what arrived before a drop is kept for the retry

    def _write(self, part: Part, data: bytearray) -> None:
        view = memoryview(data)
        position = part.offset + part.completed
        while view:
            try:
                written = os.pwrite(self.fd, view, position)
            except OSError as exc:
                if exc.errno in NO_SPACE_ERRNOS:
                    raise no_space(exc, self.what) from exc
                raise StoreError(f"cannot write {self.what}: {exc.strerror or exc}") from exc
            view = view[written:]
            position += written
            with self.cond:
                part.completed += written
                self.completed += written
                self.cond.notify_all()

    def _pause(self, failures: int) -> None:
        delay = min(self.policy.backoff_max, self.policy.backoff * 2 ** (failures - 1))
        delay *= 0.5 + random.random() / 2  # jitter: parts and clients do not retry in step
        if self._abort.wait(delay) or self.cancel.is_set():
            raise RequestCancelledError("pull cancelled")
