"""`run MODEL [PROMPT...]`: a one-shot answer streamed to stdout, or the interactive chat.

The output side lives here and is shared with the REPL: word wrapping while streaming,
colouring of tokens that came from accepted drafts, and the ``--verbose`` statistics
(Ollama's timing lines plus the draft acceptance rate).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Generator, Iterator, Mapping
from typing import Any, TextIO

import click
from rich.cells import cell_len

from modelhub.cli.models import connect
from modelhub.cli.pull import pull_model
from modelhub.client import Client, ResponseError
from modelhub.config import parse_duration
from modelhub.errors import BadRequest, ModelhubError

# Tokens that came from an accepted draft, when --show-draft colours them (cyan).
DRAFT_COLOUR = "\x1b[36m"
RESET = "\x1b[0m"
STATS_LABEL_WIDTH = 22  # "prompt eval duration: " is the longest label

Segment = tuple[str, bool]  # (text, came from an accepted draft)


# -- statistics ---------------------------------------------------------------------------------


def format_go_duration(ns: int) -> str:
    """A duration in nanoseconds written as Go prints one: ``1.234567s``, ``130.079ms``,
    ``2m3.5s``, ``1h0m0s``, ``850ns`` (Ollama's --verbose uses this form)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    value = abs(ns)
    if value < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("µs", 1_000)):
            if value >= scale:
                return sign + _decimal(value, scale) + unit
        return f"{sign}{value}ns"
    hours, rest = divmod(value, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = f"{hours}h{minutes}m" if hours else (f"{minutes}m" if minutes else "")
    return sign + text + _decimal(rest, 1_000_000_000) + "s"


def _decimal(value: int, scale: int) -> str:
    whole, fraction = divmod(value, scale)
    digits = str(fraction).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def acceptance_rate(final: Mapping[str, Any]) -> float | None:
    """Accepted draft tokens over proposed ones, or None when nothing was drafted."""
    proposed = _int(final.get("draft_count"))
    if proposed <= 0:
        return None
    return _int(final.get("draft_accepted_count")) / proposed


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _rate(count: int, duration_ns: int) -> str:
    return f"{count / (duration_ns / 1e9):.2f} tokens/s"


def stats_lines(final: Mapping[str, Any]) -> list[str]:
    """The ``--verbose`` lines for a final generate/chat object; a line whose value is zero is
    left out. Draft lines follow Ollama's when anything was drafted."""
    rows: list[tuple[str, str]] = []

    def duration(label: str, key: str) -> None:
        if _int(final.get(key)):
            rows.append((label, format_go_duration(_int(final.get(key)))))

    duration("total duration", "total_duration")
    duration("load duration", "load_duration")
    for prefix, count_key, duration_key in (
        ("prompt eval", "prompt_eval_count", "prompt_eval_duration"),
        ("eval", "eval_count", "eval_duration"),
    ):
        count, spent = _int(final.get(count_key)), _int(final.get(duration_key))
        if count:
            rows.append((f"{prefix} count", f"{count} token(s)"))
        duration(f"{prefix} duration", duration_key)
        if count and spent:
            rows.append((f"{prefix} rate", _rate(count, spent)))
    rate = acceptance_rate(final)
    if rate is not None:
        accepted = _int(final.get("draft_accepted_count"))
        rows.append(("draft tokens", f"{_int(final.get('draft_count'))} token(s)"))
        rows.append(("draft accepted", f"{accepted} token(s) ({rate:.1%} acceptance)"))
    return [f"{label + ':':<{STATS_LABEL_WIDTH}}{value}" for label, value in rows]


def print_stats(final: Mapping[str, Any], err: TextIO) -> None:
    """Write the statistics to ``err``; the acceptance line is bold on a terminal."""
    bold = _is_terminal(err) and not _no_colour()
    for line in stats_lines(final):
        if bold and line.startswith("draft accepted:"):
            line = f"\x1b[1m{line}{RESET}"
        err.write(line + "\n")
    err.flush()


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

    def __init__(self, out: TextIO, *, width: int | None = None, colour: bool = False) -> None:
        self.out = out
        self.colour = colour
        self.text = ""
        self._wrapper = WordWrapper(width) if width else None
        self._last_char = "\n"

    def write(self, piece: str, drafted: bool = False) -> None:
        self.text += piece
        segments = self._wrapper.feed(piece, drafted) if self._wrapper else [(piece, drafted)]
        self._emit(segments)

    def finish(self) -> None:
        """Write what wrapping held back and end the last line."""
        if self._wrapper:
            self._emit(self._wrapper.flush())
        if self._last_char != "\n":
            self.out.write("\n")
            self._last_char = "\n"
        self.out.flush()

    def _emit(self, segments: list[Segment]) -> None:
        for text, drafted in segments:
            if not text:
                continue
            if drafted and self.colour:
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
        if not chat:
            piece = item.get("response", "")
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


# -- terminal facts ----------------------------------------------------------------------------


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _no_colour() -> bool:
    return bool(os.environ.get("NO_COLOR"))


def wrap_width(out: TextIO, wordwrap: bool) -> int | None:
    """Width to wrap answers at: the terminal's, less a margin; None when not wrapping."""
    if not wordwrap or not _is_terminal(out):
        return None
    columns = shutil.get_terminal_size().columns
    return columns - 1 if columns >= 10 else None


def use_colour(out: TextIO, show_draft: bool) -> bool:
    return show_draft and _is_terminal(out) and not _no_colour()


def answer_writer(out: TextIO, *, wordwrap: bool, show_draft: bool) -> AnswerWriter:
    return AnswerWriter(out, width=wrap_width(out, wordwrap), colour=use_colour(out, show_draft))


# -- the command --------------------------------------------------------------------------------

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def keep_alive_value(text: str) -> str | float:
    """``--keepalive``: a Go duration (``5m``, ``1h30m``, ``-1m``) is sent as written, a plain
    number as seconds (``300``; negative keeps the model loaded forever)."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        return float(value)
    try:
        parse_duration(value)
    except BadRequest:
        raise BadRequest(
            f"invalid --keepalive {text!r}: use a duration such as 30s, 5m or 1h, "
            "a number of seconds, or -1 to keep the model loaded"
        ) from None
    return value


def ensure_model(client: Client, model: str, *, insecure: bool = False) -> dict[str, Any]:
    """``/api/show`` for ``model``, pulling it first when the daemon does not have it."""
    try:
        return client.show(model)
    except ResponseError as exc:
        if exc.status != 404:
            raise
    pull_model(client, model, insecure=insecure)
    return client.show(model)


def generate_body(
    model: str, prompt: str, *, fmt: str | None, keep_alive: str | float | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": True}
    if fmt:
        body["format"] = fmt
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    return body


def one_shot(
    client: Client,
    body: dict[str, Any],
    *,
    verbose: bool,
    wordwrap: bool,
    show_draft: bool,
    out: TextIO,
    err: TextIO,
) -> None:
    """Stream one ``/api/generate`` answer to ``out`` (statistics to ``err`` if verbose).

    Ctrl-C closes the stream, which makes the daemon stop generating, and exits with 130.
    """
    writer = answer_writer(out, wordwrap=wordwrap, show_draft=show_draft)
    events = client.stream("POST", "/api/generate", body)
    try:
        final = stream_answer(events, writer, chat=False)
    except KeyboardInterrupt:
        close_stream(events)
        writer.finish()
        sys.exit(130)
    except ModelhubError:
        writer.finish()  # the error line starts on a line of its own
        raise
    if verbose and final:
        print_stats(final, err)


RUN_ENVIRONMENT = """\b
Environment:
  MODELHUB_HOST        Address of the daemon (default 127.0.0.1:11435)
  MODELHUB_NOHISTORY   Do not keep a history file for the interactive chat
  NO_COLOR             No colours (--show-draft has no effect)"""


@click.command("run", epilog=RUN_ENVIRONMENT)
@click.argument("model")
@click.argument("prompt", nargs=-1)
@click.option("--verbose", is_flag=True, help="Show timings and draft acceptance after answers.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json"]),
    help="Answer in JSON (the only format the CLI offers).",
)
@click.option(
    "--keepalive",
    metavar="DURATION",
    help="How long the model stays loaded afterwards (5m, 1h; -1 keeps it loaded).",
)
@click.option("--nowordwrap", is_flag=True, help="Do not wrap long lines at word boundaries.")
@click.option("--show-draft", is_flag=True, help="Colour tokens that came from accepted drafts.")
@click.option("--insecure", is_flag=True, help="Allow plain HTTP when the model must be pulled.")
def run(
    model: str,
    prompt: tuple[str, ...],
    verbose: bool,
    fmt: str | None,
    keepalive: str | None,
    nowordwrap: bool,
    show_draft: bool,
    insecure: bool,
) -> None:
    """Run MODEL: answer PROMPT, or chat interactively when no prompt is given.

    Text piped on stdin is put before PROMPT. A model the daemon does not have is pulled
    first. In the chat, type /? for help.
    """
    keep_alive = keep_alive_value(keepalive) if keepalive is not None else None
    parts = list(prompt)
    interactive = not parts and _is_terminal(sys.stdin) and _is_terminal(sys.stdout)
    if not _is_terminal(sys.stdin):
        piped = sys.stdin.read()
        if piped:
            parts.insert(0, piped)
    client = connect()
    info = ensure_model(client, model, insecure=insecure)
    if interactive:
        from modelhub.cli.repl import ReplState, run_repl  # prompt-toolkit only when needed

        state = ReplState(
            model=model,
            format=fmt,
            verbose=verbose,
            wordwrap=not nowordwrap,
            show_draft=show_draft,
            keep_alive=keep_alive,
        )
        run_repl(client, state, info)
        return
    body = generate_body(model, " ".join(parts), fmt=fmt, keep_alive=keep_alive)
    one_shot(
        client,
        body,
        verbose=verbose,
        wordwrap=not nowordwrap,
        show_draft=show_draft,
        out=sys.stdout,
        err=sys.stderr,
    )
