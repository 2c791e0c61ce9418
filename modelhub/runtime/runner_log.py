"""A runner's stderr as the daemon keeps it: the last lines, each with the requests it may
belong to (from the marks the runner writes, ``engine.liveness``), so that the message of a
runner's death quotes only what the failing requests logged, never an earlier request's
error."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from modelhub.engine.liveness import parse_mark

KEEP = 50  # lines kept (the end of a crash's output is what explains it)


@dataclass
class RunnerLog:
    lines: collections.deque[tuple[int, str, frozenset[str]]] = field(
        default_factory=lambda: collections.deque(maxlen=KEEP)
    )
    _open: set[str] = field(default_factory=set)
    _current: str | None = None  # the request the runner is handling alone (begin .. run/end)
    _count: int = 0  # lines seen
    _last_mark: int = 0  # ``_count`` at the latest mark

    def feed(self, line: str) -> bool:
        """Take one stderr line; False for a mark (not a line of the log)."""
        mark = parse_mark(line)
        if mark is not None:
            kind, request = mark
            if kind == "begin":
                self._open.add(request)
                self._current = request
            else:
                if kind == "end":
                    self._open.discard(request)
                if self._current == request:
                    self._current = None
            self._last_mark = self._count
            return False
        self._count += 1
        owners = frozenset({self._current} if self._current else self._open)
        self.lines.append((self._count, line, owners))
        return True

    def lines_of(self, failing: Iterable[str]) -> list[str]:
        """The kept lines that may be the ``failing`` requests' own: logged while one of them
        ran, or while none ran after the latest mark (a crash between requests, at start-up)."""
        wanted = set(failing)
        return [
            line
            for n, line, owners in self.lines
            if owners & wanted or (not owners and n > self._last_mark)
        ]

    def explanation(self, failing: Iterable[str]) -> str:
        """What the ``failing`` requests' lines say about a death: their last error line, or
        a stopped RPC worker ("" when they say nothing)."""
        lines = self.lines_of(failing)
        rpc = next((line for line in reversed(lines) if "RPC" in line), "")
        if rpc:  # ggml aborts the process when a worker goes away mid-computation
            said = re.sub(r"^\S+\.(?:c|cc|cpp|h):\d+: ", "", rpc.strip())  # the source path
            return (
                f"{said} (an RPC worker of this model stopped or cannot be reached; "
                "restart it, then try again)"
            )
        return next((line for line in reversed(lines) if "error" in line.lower()), "")
