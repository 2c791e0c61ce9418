"""Types shared by the pull transports and the downloader: policy, progress, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modelhub.errors import RequestCancelledError


@dataclass(frozen=True)
class ProgressEvent:
    """One object of a pull or create stream: Ollama's progress object (``status``, and
    ``digest``/``total``/``completed`` for a transfer), plus ``warning``.

    A warning is typed, not a text prefix: :meth:`warn` makes an event whose ``warning`` is the
    text and whose ``status`` is ``warning: <text>``, so that Ollama's clients, which print
    ``status``, still show it. Whoever needs to know recognises it by ``warning``.
    """

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None
    warning: str | None = None

    @classmethod
    def warn(cls, text: str) -> ProgressEvent:
        return cls(status=f"warning: {text}", warning=text)

    def to_json(self) -> dict[str, Any]:
        """The object as the stream carries it: fields that are not set are left out."""
        out: dict[str, Any] = {"status": self.status}
        for key in ("digest", "total", "completed", "warning"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


Progress = Callable[[ProgressEvent], None]

MB = 1000 * 1000  # Ollama sizes its download parts in decimal megabytes


@dataclass(frozen=True)
class DownloadPolicy:
    """Timeouts, retries and part sizes of a pull. The defaults follow Ollama's downloader."""

    connect_timeout: float = 5.0  # short, so that an unreachable source is left quickly
    stall_timeout: float = 30.0  # no byte for this long: the attempt is retried
    attempts: int = 6  # per part; an attempt that made progress does not count
    backoff: float = 1.0  # first retry pause; doubles, with jitter, up to backoff_max
    backoff_max: float = 30.0
    part_min: int = 100 * MB
    part_max: int = 1000 * MB
    part_target_count: int = 16
    parallel: int = 4  # concurrent ranged requests per blob
    progress_interval: float = 0.06  # Ollama streams progress about every 60 ms
    state_interval: float = 0.5  # how often resume state is written while bytes arrive
    space_margin: int = 64 << 20  # free space kept on top of what a download needs
    max_redirects: int = 10

    def part_size(self, total: int) -> int:
        """Bytes per part: total/16 clamped to [part_min, part_max], as Ollama plans."""
        return max(self.part_min, min(self.part_max, -(-total // self.part_target_count)))


DEFAULT_POLICY = DownloadPolicy()


class TransientError(Exception):
    """One HTTP attempt failed in a way that a retry may fix (dropped, stalled, 5xx)."""


class RangeNotHonoured(Exception):
    """The server answered a ranged request with the whole body: fall back to one stream."""


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise RequestCancelledError("pull cancelled")


def short_hex(digest: str) -> str:
    """The 12 hex characters Ollama shows for a digest (``pulling 8eeb52dfb3bb``)."""
    return digest.split(":", 1)[-1][:12]
