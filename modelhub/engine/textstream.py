"""Token bytes to streamable text: UTF-8-safe and stop-string-safe.

Pieces arrive as bytes; a character may be split across tokens, so an incremental decoder holds
back incomplete sequences. Stop strings may span tokens (and speculative chunks), so the longest
tail that could still become a stop string is held back too; once a stop string completes, the
text before it is released and nothing after it ever is.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from modelhub.engine.options import DoneReason, GenerateOptions, TokenEvent, TokenLogprob

if TYPE_CHECKING:
    from modelhub.engine.llama import LlamaModel


class TextStream:
    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
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

    def stops_at(self, pieces: Sequence[bytes]) -> int | None:
        """The index of the first of ``pieces`` that, pushed after what came so far, would
        complete a stop string (None: none would); nothing is pushed."""
        if not self.stops or self.stopped:
            return None
        state = self._decoder.getstate()
        text = self._held
        try:
            for i, piece in enumerate(pieces):
                text += self._decoder.decode(piece)
                if any(stop in text for stop in self.stops):
                    return i
        finally:
            self._decoder.setstate(state)
        return None

    def _find_stop(self, text: str) -> int | None:
        best: int | None = None
        for stop in self.stops:
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
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


class Committer:
    """Commits tokens one at a time: stop strings, end of generation, num_predict, cancel."""

    def __init__(
        self,
        model: LlamaModel,
        options: GenerateOptions,
        on_token: Callable[[TokenEvent], None] | None,
        cancel: threading.Event | None,
    ) -> None:
        self._model = model
        self._stream = TextStream(options.stop)
        self._limit = options.num_predict
        self._on_token = on_token
        self._cancel = cancel
        self.generated: list[int] = []
        self.done: DoneReason | None = None

    def commit(self, token: int, drafted: bool, logprob: TokenLogprob | None = None) -> bool:
        """Emit ``token`` (with its log-probability, when asked for); False when generation
        ends with it."""
        if self._model.is_eog(token):
            self.done = "stop"
            return False
        self.generated.append(token)
        text = self._stream.push(self._model.token_piece_bytes(token))
        if self._on_token is not None:
            self._on_token(TokenEvent(token, text, drafted, logprob))
        if self._stream.stopped:
            self.done = "stop"
        elif 0 <= self._limit <= len(self.generated):
            self.done = "length"
        elif self.cancelled():
            self.done = "cancel"
        return self.done is None

    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    def ending_at(self, tokens: Sequence[int]) -> int | None:
        """The index of the first of ``tokens`` (guesses for the positions to come) that
        would end the answer: an end-of-generation token or one completing a stop string."""
        eog = next((i for i, t in enumerate(tokens) if self._model.is_eog(t)), None)
        if not self._stream.stops:
            return eog
        before = tokens if eog is None else tokens[:eog]
        stop = self._stream.stops_at([self._model.token_piece_bytes(t) for t in before])
        return stop if stop is not None else eog

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stream.stop_hit if self._stream.stopped else None

    def finish(self) -> str:
        tail = self._stream.finish()
        if tail and self._on_token is not None:
            self._on_token(TokenEvent(-1, tail, False))
        return self._stream.text

    @property
    def remaining(self) -> int | None:
        return None if self._limit < 0 else self._limit - len(self.generated)
