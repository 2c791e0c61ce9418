"""Token bytes to streamable text: UTF-8-safe and stop-string-safe.

Pieces arrive as bytes; a character may be split across tokens, so an incremental decoder holds
back incomplete sequences. Stop strings may span tokens (and speculative chunks), so the longest
tail that could still become a stop string is held back too; once a stop string completes, the
text before it is released and nothing after it ever is.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self._stops = [s for s in stops if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""
        self.text = ""  # everything released so far
        self.stopped = False
        self.stop_hit: str | None = None

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that is now safe to show."""
        if self.stopped:
            return ""
        return self._release(self._held + self._decoder.decode(piece))

    def finish(self) -> str:
        """End of generation (not by a stop string): release whatever is held back."""
        if self.stopped:
            return ""
        tail = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        cut = self._find_stop(tail)
        if cut is not None:
            tail = tail[:cut]
            self.stopped = True
        self.text += tail
        return tail

    def _find_stop(self, text: str) -> int | None:
        best: int | None = None
        for stop in self._stops:
            at = text.find(stop)
            if at != -1 and (best is None or at < best):
                best, self.stop_hit = at, stop
        return best

    def _release(self, pending: str) -> str:
        cut = self._find_stop(pending)
        if cut is not None:
            out = pending[:cut]
            self._held = ""
            self.stopped = True
            self.text += out
            return out
        keep = self._partial_stop_length(pending)
        out, self._held = pending[: len(pending) - keep], pending[len(pending) - keep :]
        self.text += out
        return out

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
