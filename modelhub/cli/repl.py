"""The interactive chat of `modelhub run MODEL`: a prompt-toolkit loop over ``/api/chat``.

``Repl`` carries out complete inputs against the daemon (chat turns, ``/show``, ``/load``,
``/save``); ``run_repl`` wires it to prompt-toolkit with the history file and key bindings.
The decisions (state, input assembly, command parsing) are in ``modelhub.cli.repl_commands``.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import platformdirs
from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

from modelhub.cli import render
from modelhub.cli.answer import answer_writer, close_stream, stream_answer
from modelhub.cli.images import attach
from modelhub.cli.repl_commands import (
    CONTINUATION,
    HELP,
    HELP_SET,
    HELP_SHORTCUTS,
    HELP_SHOW,
    PROMPT,
    MultilineAssembler,
    ReplError,
    ReplState,
    Submission,
    apply_set,
    help_text,
    save_request,
    session_parameters,
    set_parameter,
    set_system,
    split_command,
)
from modelhub.cli.stats import print_stats
from modelhub.client import Client
from modelhub.errors import ModelhubError, NotFoundError

# Also re-exports the terminal-free parts, which callers and tests reach through here.
__all__ = [
    "CONTINUATION",
    "EXIT_HINT",
    "HELP",
    "HELP_SET",
    "HELP_SHORTCUTS",
    "HELP_SHOW",
    "PLACEHOLDER",
    "PROMPT",
    "LineInterrupted",
    "MultilineAssembler",
    "Repl",
    "ReplError",
    "ReplState",
    "Submission",
    "SwitchableFileHistory",
    "apply_set",
    "help_text",
    "history_disabled",
    "history_path",
    "preload",
    "run_repl",
    "save_request",
    "session_parameters",
    "set_parameter",
    "set_system",
    "split_command",
]

PLACEHOLDER = "Send a message (/? for help)"
EXIT_HINT = "Use Ctrl + d or /bye to exit."

_SHOW_MISSING = {
    "license": "No license was specified for this model.",
    "modelfile": "No Modelfile was returned for this model.",
    "system": "No system message was specified for this model.",
    "template": "No prompt template was specified for this model.",
}


# -- the session -------------------------------------------------------------------------------


class Repl:
    """Handles complete inputs against the daemon; ``submit`` returns False to end."""

    def __init__(
        self,
        client: Client,
        state: ReplState,
        info: dict[str, Any],
        *,
        out: TextIO | None = None,
        err: TextIO | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.info = info
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def say(self, text: str) -> None:
        self.out.write(text if text.endswith("\n") else text + "\n")
        self.out.flush()

    def submit(self, submission: Submission) -> bool:
        text = submission.text
        try:
            if submission.kind == "system":
                self.say(set_system(self.state, text))
            elif submission.kind == "line" and text.startswith("/"):
                return self.command(text)
            elif text.strip():
                self.chat(text)
        except ReplError as exc:
            self.say(str(exc))
        except ModelhubError as exc:
            self.err.write(f"Error: {exc.message}\n")
        return True

    def command(self, line: str) -> bool:
        name, args = split_command(line)
        if name in ("/bye", "/exit"):
            return False
        if name in ("/?", "/help"):
            self.say(help_text(args))
        elif name == "/set":
            self.say(apply_set(self.state, args, line))
        elif name == "/show":
            self.show(args)
        elif name == "/load":
            self.load(args)
        elif name == "/save":
            self.save(args)
        elif name == "/clear":
            self.state.clear()
            self.say("Cleared session context")
        elif name == "/list":
            self.say(render.list_table(self.client.list(), datetime.now(UTC)))
        else:
            raise ReplError(f"Unknown command '{name}'. Type /? for help")
        return True

    def chat(self, text: str) -> None:
        """One turn: the answer streams to stdout; Ctrl-C stops it and forgets the turn."""
        state = self.state
        found = attach(text, self.info, lambda line: self.err.write(line + "\n"))
        message: dict[str, Any] = {"role": "user", "content": found.prompt}
        if found.images:
            message["images"] = found.images
        state.messages.append(message)
        writer = answer_writer(
            self.out,
            wordwrap=state.wordwrap,
            show_draft=state.show_draft,
            show_thinking=not state.hide_thinking,
        )
        events = self.client.stream("POST", "/api/chat", state.chat_body())
        try:
            final = stream_answer(events, writer, chat=True)
        except KeyboardInterrupt:
            close_stream(events)
            writer.finish()
            state.messages.pop()
            self.say("")
            return
        except ModelhubError as exc:
            writer.finish()
            state.messages.pop()
            self.err.write(f"Error: {exc.message}\n")
            return
        state.messages.append({"role": "assistant", "content": writer.text})
        self.say("")
        if state.verbose and final:
            print_stats(final, self.err)
            self.say("")

    def show(self, args: list[str]) -> None:
        what = args[0].lower() if args else ""
        if what not in ("info", "license", "modelfile", "parameters", "system", "template"):
            self.say(HELP_SHOW)
            return
        # The session's parameters are listed apart, so only the others see them merged.
        options = None if what == "parameters" else self.state.options or None
        info = self.client.show(self.state.model, system=self.state.system, options=options)
        if what == "info":
            self.say(render.show_summary(info))
        elif what == "parameters":
            self.say(session_parameters(str(info.get("parameters") or ""), self.state.options))
        else:
            value = info.get(what)
            self.say(str(value) if value else _SHOW_MISSING[what])

    def load(self, args: list[str]) -> None:
        if len(args) != 1:
            raise ReplError("Usage: /load <model>")
        model = args[0]
        try:
            info = self.client.show(model)
        except NotFoundError:
            raise ReplError(f"Couldn't find model '{model}'") from None
        self.say(f"Loading model '{model}'")
        self.state.switch_model(model)
        self.info = info
        preload(self.client, self.state)

    def save(self, args: list[str]) -> None:
        if len(args) != 1:
            raise ReplError("Usage: /save <model>")
        for _ in self.client.create(save_request(args[0], self.state, self.info)):
            pass
        self.say(f"Created new model '{args[0]}'")


def preload(client: Client, state: ReplState) -> None:
    """Load the model before the first question (an empty generate request)."""
    body: dict[str, Any] = {"model": state.model}
    if state.options:
        body["options"] = state.options
    if state.keep_alive is not None:
        body["keep_alive"] = state.keep_alive
    client.request_json("POST", "/api/generate", body)


# -- the terminal loop -------------------------------------------------------------------------


class LineInterrupted(Exception):
    """Ctrl-C at the prompt; ``had_text`` tells a line being typed from an empty one."""

    def __init__(self, had_text: bool) -> None:
        super().__init__("interrupted")
        self.had_text = had_text


class SwitchableFileHistory(FileHistory):
    """A history file that ``/set nohistory`` stops writing to (lines are still recalled)."""

    def __init__(self, path: Path, state: ReplState) -> None:
        super().__init__(str(path))
        self._state = state

    def store_string(self, string: str) -> None:
        if self._state.history:
            super().store_string(string)


def history_disabled() -> bool:
    """``MODELHUB_NOHISTORY``: any value but empty, 0, false, no, off."""
    value = os.environ.get("MODELHUB_NOHISTORY", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def history_path() -> Path:
    return Path(platformdirs.user_data_dir("modelhub")) / "history"


def _history(state: ReplState) -> History:
    if history_disabled():
        state.history = False
        return InMemoryHistory()
    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    except OSError:
        return InMemoryHistory()  # a read-only home must not stop the chat
    return SwitchableFileHistory(path, state)


def _key_bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("c-c")
    def _interrupt(event: KeyPressEvent) -> None:
        event.app.exit(exception=LineInterrupted(bool(event.current_buffer.text)))

    return bindings


def run_repl(client: Client, state: ReplState, info: dict[str, Any]) -> None:
    """The interactive chat until /bye or Ctrl-D."""
    try:
        preload(client, state)
    except KeyboardInterrupt:
        return
    repl = Repl(client, state, info)
    session: PromptSession[str] = PromptSession(
        history=_history(state), key_bindings=_key_bindings()
    )
    placeholder = FormattedText([("fg:ansibrightblack", PLACEHOLDER)])
    assembler = MultilineAssembler()
    while True:
        try:
            line = session.prompt(
                # None would keep the last placeholder: clear it on continuation lines
                assembler.prompt,
                placeholder=FormattedText([]) if assembler.collecting else placeholder,
            )
        except LineInterrupted as exc:
            if not exc.had_text and not assembler.collecting:
                repl.say(EXIT_HINT)
            assembler.reset()
            continue
        except EOFError:
            return
        submission = assembler.feed(line)
        try:
            if submission is not None and not repl.submit(submission):
                return
        except KeyboardInterrupt:  # during /show, /load, /save: back to the prompt
            repl.say("")
