"""Writing a streamed answer to the terminal, shared by `run` and its interactive chat.

``AnswerWriter`` prints the pieces of a generate or chat stream as they arrive, wrapping them
at word boundaries (``WordWrapper``) and colouring tokens that came from accepted drafts;
``stream_answer`` feeds it from a stream and ``close_stream`` stops one early. The terminal
facts that decide wrapping and colour (``is_terminal``, ``NO_COLOR``, the width) live here too.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Generator, Iterator, Mapping
from typing import Any, TextIO

from rich.cells import cell_len

# Tokens that came from an accepted draft, when --show-draft colours them (cyan).
DRAFT_COLOUR = "\x1b[36m"
THINKING_COLOUR = "\x1b[90m"  # reasoning, grey as Ollama shows it
RESET = "\x1b[0m"

Segment = tuple[str, bool]  # (text, came from an accepted draft)


# -- terminal facts ----------------------------------------------------------------------------


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (False for streams without ``isatty``, or closed)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def no_colour() -> bool:
    """``NO_COLOR`` is set to anything but empty."""
    return bool(os.environ.get("NO_COLOR"))


def wrap_width(out: TextIO, wordwrap: bool) -> int | None:
    """Width to wrap answers at: the terminal's, less a margin; None when not wrapping."""
    if not wordwrap or not is_terminal(out):
        return None
    columns = shutil.get_terminal_size().columns
    return columns - 1 if columns >= 10 else None


def use_colour(out: TextIO, show_draft: bool) -> bool:
    """Colour drafted tokens: asked for, written to a terminal, and NO_COLOR unset."""
    return show_draft and is_terminal(out) and not no_colour()


# -- streaming output -------------------------------------------------------------------------


class WordWrapper:
    """Breaks streamed text into lines of at most ``width`` cells at spaces, as it arrives.

    A word is held back until the space or newline that ends it, then written on the current
    line if it fits, else on a new one (the spaces before it are dropped, so no line ends in
    blanks); a word longer than a line is cut. Each piece keeps its drafted flag so colours
    survive wrapping.
    """

    def __init__(self, width: int) -> None:
        self.width = max(width, 1)
        self.column = 0
        self._spaces: list[Segment] = []
        self._word: list[Segment] = []
        self._word_cells = 0

    def feed(self, text: str, drafted: bool = False) -> list[Segment]:
        out: list[Segment] = []
        for char in text:
            if char == "\n":
                out += self._emit_word()
                out += self._emit_spaces()
                out.append(("\n", False))
                self.column = 0
            elif char == " ":
                out += self._emit_word()
                self._spaces.append((" ", drafted))
            else:
                cells = cell_len(char)
                self._word.append((char, drafted))
                self._word_cells += cells
                # Wide (CJK) characters may break anywhere: do not hold a line of them back.
                if self._word_cells >= self.width or cells > 1:
                    out += self._emit_word()
        return merge_segments(out)

    def flush(self) -> list[Segment]:
        """What is still held back (end of the answer)."""
        return merge_segments(self._emit_word() + self._emit_spaces())

    def _emit_spaces(self) -> list[Segment]:
        """Spaces that end a line: kept if they fit, dropped if not (they are invisible)."""
        fitting = self._spaces[: max(self.width - self.column, 0)]
        self.column += len(fitting)
        self._spaces = []
        return fitting

    def _emit_word(self) -> list[Segment]:
        if not self._word:
            return []
        out: list[Segment] = []
        if self.column > 0 and self.column + len(self._spaces) + self._word_cells > self.width:
            out.append(("\n", False))
            self.column = 0
        else:
            out += self._spaces
            self.column += len(self._spaces)
        out += self._word
        self.column += self._word_cells
        self._spaces, self._word, self._word_cells = [], [], 0
        return out


def merge_segments(segments: list[Segment]) -> list[Segment]:
    """Join neighbouring pieces with the same drafted flag."""
    merged: list[Segment] = []
    for text, drafted in segments:
        if merged and merged[-1][1] == drafted:
            merged[-1] = (merged[-1][0] + text, drafted)
        else:
            merged.append((text, drafted))
    return merged


class AnswerWriter:
    """Writes one streamed answer: wrapped when ``width`` is set, drafted tokens coloured when
    ``colour`` is set. ``text`` is the whole answer as the model wrote it (unwrapped)."""

    def __init__(
        self,
        out: TextIO,
        *,
        width: int | None = None,
        colour: bool = False,
        grey: bool = False,
        show_thinking: bool = True,
    ) -> None:
        self.out = out
        self.colour = colour
        self.grey = grey  # reasoning in grey
        self.show_thinking = show_thinking
        self.text = ""
        self.thinking = ""
        self._wrapper = WordWrapper(width) if width else None
        self._last_char = "\n"
        self._in_thinking = False

    def think(self, piece: str) -> None:
        """Reasoning (``thinking``): shown between "Thinking..." and "...done thinking."
        unless hidden, never part of ``text``."""
        self.thinking += piece
        if not self.show_thinking:
            return
        if not self._in_thinking:
            self._in_thinking = True
            self._plain("Thinking...\n")
        self._emit(self._wrapper.feed(piece) if self._wrapper else [(piece, False)], grey=True)

    def _end_thinking(self) -> None:
        if self._in_thinking:
            self._in_thinking = False
            if self._wrapper:
                self._emit(self._wrapper.flush(), grey=True)
                self._wrapper.column = 0
            self._plain(("\n" if self._last_char != "\n" else "") + "...done thinking.\n\n")

    def _plain(self, text: str) -> None:
        self.out.write(text)
        self._last_char = text[-1]

    def write(self, piece: str, drafted: bool = False) -> None:
        self._end_thinking()
        self.text += piece
        segments = self._wrapper.feed(piece, drafted) if self._wrapper else [(piece, drafted)]
        self._emit(segments)

    def finish(self) -> None:
        """Write what wrapping held back and end the last line."""
        self._end_thinking()
        if self._wrapper:
            self._emit(self._wrapper.flush())
        if self._last_char != "\n":
            self.out.write("\n")
            self._last_char = "\n"
        self.out.flush()

    def _emit(self, segments: list[Segment], grey: bool = False) -> None:
        for text, drafted in segments:
            if not text:
                continue
            if grey and self.grey:
                self.out.write(THINKING_COLOUR + text + RESET)
            elif drafted and self.colour:
                self.out.write(DRAFT_COLOUR + text + RESET)
            else:
                self.out.write(text)
            self._last_char = text[-1]
        self.out.flush()


def stream_answer(
    events: Iterator[dict[str, Any]], writer: AnswerWriter, *, chat: bool
) -> dict[str, Any] | None:
    """Write each streamed piece of a generate (``response``) or chat (``message.content``)
    answer; return the final object (with the counters), or None if the stream had none."""
    final: dict[str, Any] | None = None
    for item in events:
        message = item.get("message") if chat else None
        piece = message.get("content", "") if isinstance(message, Mapping) else ""
        thinking = message.get("thinking", "") if isinstance(message, Mapping) else ""
        if not chat:
            piece, thinking = item.get("response", ""), item.get("thinking", "")
        if isinstance(thinking, str) and thinking:
            writer.think(thinking)
        if isinstance(piece, str) and piece:
            writer.write(piece, bool(item.get("drafted")))
        if item.get("done"):
            final = item
    writer.finish()
    return final


def close_stream(events: Iterator[dict[str, Any]]) -> None:
    """Close a stream that is being read: the connection closes and the daemon stops
    generating for it at its next decode step."""
    if isinstance(events, Generator):
        events.close()


def answer_writer(
    out: TextIO, *, wordwrap: bool, show_draft: bool, show_thinking: bool = True
) -> AnswerWriter:
    """The writer for one answer to ``out``, wrapped and coloured as the terminal allows."""
    return AnswerWriter(
        out,
        width=wrap_width(out, wordwrap),
        colour=use_colour(out, show_draft),
        grey=is_terminal(out) and not no_colour(),
        show_thinking=show_thinking,
    )
