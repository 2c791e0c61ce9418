"""`run MODEL [PROMPT...]`: a one-shot answer streamed to stdout, or the interactive chat.

The command itself, ``--keepalive`` parsing, pulling a missing model and the one-shot
``/api/generate`` answer; the answer's output (wrapping, draft colours) is in
``modelhub.cli.answer``, the ``--verbose`` statistics in ``modelhub.cli.stats``, the chat in
``modelhub.cli.repl``.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

import click

from modelhub.cli.answer import (
    DRAFT_COLOUR,
    RESET,
    AnswerWriter,
    WordWrapper,
    answer_writer,
    close_stream,
    is_terminal,
    stream_answer,
    use_colour,
    wrap_width,
)
from modelhub.cli.images import attach
from modelhub.cli.models import connect
from modelhub.cli.pull import pull_model
from modelhub.cli.stats import acceptance_rate, format_go_duration, print_stats, stats_lines
from modelhub.client import Client
from modelhub.config import parse_duration
from modelhub.errors import InputError, ModelhubError, NotFoundError

# Also re-exports the answer and statistics helpers, which callers and tests reach through here.
__all__ = [
    "DRAFT_COLOUR",
    "RESET",
    "RUN_ENVIRONMENT",
    "AnswerWriter",
    "WordWrapper",
    "acceptance_rate",
    "close_stream",
    "ensure_model",
    "format_go_duration",
    "generate_body",
    "keep_alive_value",
    "one_shot",
    "print_stats",
    "run",
    "stats_lines",
    "stream_answer",
    "think_value",
    "use_colour",
    "wrap_width",
]

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


def keep_alive_value(text: str) -> str | float:
    """``--keepalive``: a Go duration (``5m``, ``1h30m``, ``-1m``) is sent as written, a plain
    number as seconds (``300``; negative keeps the model loaded forever)."""
    value = text.strip()
    if _NUMBER.fullmatch(value):
        return float(value)
    try:
        parse_duration(value)
    except InputError:
        raise InputError(
            f"invalid --keepalive {text!r}: use a duration such as 30s, 5m or 1h, "
            "a number of seconds, or -1 to keep the model loaded"
        ) from None
    return value


def ensure_model(client: Client, model: str, *, insecure: bool = False) -> dict[str, Any]:
    """``/api/show`` for ``model``, pulling it first when the daemon does not have it."""
    try:
        return client.show(model)
    except NotFoundError:
        pass
    pull_model(client, model, insecure=insecure)
    return client.show(model)


def generate_body(
    model: str,
    prompt: str,
    *,
    fmt: str | None,
    keep_alive: str | float | None,
    think: bool | str | None = None,
    images: list[str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "stream": True}
    if images:
        body["images"] = images
    if fmt:
        body["format"] = fmt
    if think is not None:
        body["think"] = think
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
    show_thinking: bool = True,
) -> None:
    """Stream one ``/api/generate`` answer to ``out`` (statistics to ``err`` if verbose).

    Ctrl-C closes the stream, which makes the daemon stop generating, and exits with 130.
    """
    writer = answer_writer(
        out, wordwrap=wordwrap, show_draft=show_draft, show_thinking=show_thinking
    )
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
@click.option(
    "--think",
    type=click.Choice(["true", "false", "low", "medium", "high", "max"]),
    is_flag=False,
    flag_value="true",
    default=None,
    help="Let a thinking model reason first (a level: low, medium, high, max); false: do not.",
)
@click.option("--hidethinking", is_flag=True, help="Think, but show only the answer.")
@click.option("--nowordwrap", is_flag=True, help="Do not wrap long lines at word boundaries.")
@click.option("--show-draft", is_flag=True, help="Colour tokens that came from accepted drafts.")
@click.option("--insecure", is_flag=True, help="Allow plain HTTP when the model must be pulled.")
def run(
    model: str,
    prompt: tuple[str, ...],
    verbose: bool,
    fmt: str | None,
    keepalive: str | None,
    think: str | None,
    hidethinking: bool,
    nowordwrap: bool,
    show_draft: bool,
    insecure: bool,
) -> None:
    """Run MODEL: answer PROMPT, or chat interactively when no prompt is given.

    Text piped on stdin is put before PROMPT. A model the daemon does not have is pulled
    first. For a model that reads images, image files named in the prompt (./photo.png,
    /path/to/a.jpg) are attached; for a model that reads audio, audio files (./clip.wav,
    ~/talk.mp3) too. In the chat, type /? for help.
    """
    keep_alive = keep_alive_value(keepalive) if keepalive is not None else None
    thinking = think_value(think)
    parts, interactive = _prompt_parts(prompt)
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
            think=thinking,
            hide_thinking=hidethinking,
        )
        run_repl(client, state, info)
        return
    found = attach(" ".join(parts), info, lambda line: click.echo(line, err=True))
    body = generate_body(
        model, found.prompt, fmt=fmt, keep_alive=keep_alive, think=thinking, images=found.images
    )
    one_shot(
        client,
        body,
        verbose=verbose,
        wordwrap=not nowordwrap,
        show_draft=show_draft,
        out=sys.stdout,
        err=sys.stderr,
        show_thinking=not hidethinking,
    )


def _prompt_parts(prompt: tuple[str, ...]) -> tuple[list[str], bool]:
    """The prompt's words with text piped on stdin first, and whether to chat instead (no
    prompt, a terminal on both ends)."""
    parts = list(prompt)
    interactive = not parts and is_terminal(sys.stdin) and is_terminal(sys.stdout)
    if not is_terminal(sys.stdin):
        piped = sys.stdin.read()
        if piped:
            parts.insert(0, piped)
    return parts, interactive


def think_value(flag: str | None) -> bool | str | None:
    """``--think`` as the API's ``think``: true/false, an effort, or unset."""
    if flag is None:
        return None
    return {"true": True, "false": False}.get(flag, flag)
