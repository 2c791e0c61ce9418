"""The interactive chat of `modelhub run MODEL`: a prompt-toolkit loop over ``/api/chat``.

The parts that decide things are plain functions and classes (input assembly, command
parsing, ``/set`` handling, the session state) so they can be tested without a terminal;
``run_repl`` only wires them to prompt-toolkit. Messages follow Ollama's REPL.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import platformdirs
from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

from modelhub.cli import render
from modelhub.cli.run import answer_writer, close_stream, print_stats, stream_answer
from modelhub.client import Client, ResponseError
from modelhub.errors import ModelhubError
from modelhub.modelfile import check_parameter, format_parameters, parse_parameter

PROMPT = ">>> "
CONTINUATION = "... "
PLACEHOLDER = "Send a message (/? for help)"
QUOTES = '"""'
EXIT_HINT = "Use Ctrl + d or /bye to exit."

HELP = """\
Available commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /list           List local models
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""

HELP_SET = """\
Available commands:
  /set parameter ...     Set a parameter (without arguments: the list)
  /set system <string>   Set the system message (\"\"\" for several lines)
  /set history           Save what you type in the history file
  /set nohistory         Stop saving what you type
  /set wordwrap          Wrap answers at word boundaries
  /set nowordwrap        Do not wrap answers
  /set format json       Answer in JSON
  /set noformat          Answer in free text
  /set verbose           Show timings and draft acceptance after each answer
  /set quiet             Do not show them
"""

HELP_SHOW = """\
Available commands:
  /show info         Details of this model
  /show license      The model's license
  /show modelfile    The Modelfile of this session's model
  /show parameters   Parameters of the model and of this session
  /show system       The system message
  /show template     The prompt template
"""

HELP_SHORTCUTS = """\
Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line
  Ctrl + e            Move to the end of the line
  Alt + b / Alt + f   Move back / forward a word
  Ctrl + k            Delete the text after the cursor
  Ctrl + u            Delete the text before the cursor
  Ctrl + w            Delete the word before the cursor
  Up / Down           Walk through the history
  Ctrl + r            Search the history
  Ctrl + c            Stop the answer being written, or clear the line
  Ctrl + d            Exit (on an empty line)
"""

HELP_PARAMETERS = """\
Available parameters:
  /set parameter seed <int>               Random seed (same seed, same answer)
  /set parameter num_predict <int>        Most tokens to generate (-1: until a stop)
  /set parameter top_k <int>              Sample from the k most likely tokens
  /set parameter top_p <float>            Sample from the smallest set with this probability
  /set parameter min_p <float>            Drop tokens below this fraction of the best one
  /set parameter num_ctx <int>            Context window in tokens
  /set parameter temperature <float>      Randomness (0: always the most likely token)
  /set parameter repeat_penalty <float>   Penalise repeated tokens (1: no penalty)
  /set parameter repeat_last_n <int>      How far back to look for repetitions
  /set parameter stop <string> ...        Stop at any of these strings
  /set parameter draft_num_predict <int>  Longest draft per step (0: no drafting)
  /set parameter draft_p_min <float>      Stop a draft below this confidence
"""

_HELP_TOPICS = {"": HELP, "set": HELP_SET, "show": HELP_SHOW, "shortcuts": HELP_SHORTCUTS}
_SHOW_MISSING = {
    "license": "No license was specified for this model.",
    "modelfile": "No Modelfile was returned for this model.",
    "system": "No system message was specified for this model.",
    "template": "No prompt template was specified for this model.",
}


class ReplError(Exception):
    """A message for the user of the REPL (printed as is; the session goes on)."""


@dataclass
class ReplState:
    """Everything a chat session remembers between turns."""

    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    format: str | None = None
    verbose: bool = False
    wordwrap: bool = True
    show_draft: bool = False
    history: bool = True
    keep_alive: str | float | None = None

    def chat_body(self) -> dict[str, Any]:
        """The ``/api/chat`` request for the conversation so far."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": True}
        if self.options:
            body["options"] = self.options
        if self.format:
            body["format"] = self.format
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        return body

    def set_system(self, text: str) -> None:
        """Replace a system message that ends the history, else append one."""
        self.system = text
        message = {"role": "system", "content": text}
        if self.messages and self.messages[-1].get("role") == "system":
            self.messages[-1] = message
        else:
            self.messages.append(message)

    def clear(self) -> None:
        """Forget the conversation; the system message set in this session stays."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def switch_model(self, model: str) -> None:
        self.model = model
        self.messages = []
        self.system = None


# -- input assembly ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """One complete input: ``kind`` is ``line`` (a message or a /command as typed),
    ``message`` (a multi-line message) or ``system`` (a multi-line /set system)."""

    kind: str
    text: str


class MultilineAssembler:
    """Joins lines into inputs. A line starting with three double quotes opens a multi-line
    message that the first line ending with them closes (both on one line: a one-line
    message); ``/set system`` followed by the quotes does the same for the system message."""

    def __init__(self) -> None:
        self._kind: str | None = None
        self._lines: list[str] = []

    @property
    def collecting(self) -> bool:
        return self._kind is not None

    @property
    def prompt(self) -> str:
        return CONTINUATION if self.collecting else PROMPT

    def reset(self) -> None:
        self._kind, self._lines = None, []

    def feed(self, line: str) -> Submission | None:
        """Take one typed line; return the input it completes, or None while collecting."""
        if self._kind is not None:
            body = line.rstrip()
            if not body.endswith(QUOTES):
                self._lines.append(line)
                return None
            self._lines.append(body[: -len(QUOTES)])
            return self._done(self._kind)
        stripped = line.strip()
        kind, rest = "message", stripped
        words = stripped.split(maxsplit=2)
        if len(words) == 3 and words[:2] == ["/set", "system"] and words[2].startswith(QUOTES):
            kind, rest = "system", words[2]
        if not rest.startswith(QUOTES):
            return Submission("line", stripped)
        rest = rest[len(QUOTES) :]
        if rest.endswith(QUOTES):
            return Submission(kind, rest[: -len(QUOTES)].strip("\n"))
        self._kind, self._lines = kind, [rest]
        return None

    def _done(self, kind: str) -> Submission:
        text = "\n".join(self._lines).strip("\n")
        self.reset()
        return Submission(kind, text)


# -- commands ------------------------------------------------------------------------------------


def split_command(line: str) -> tuple[str, list[str]]:
    """``/set parameter top_k 5`` -> (``/set``, [``parameter``, ``top_k``, ``5``])."""
    words = line.split()
    return (words[0].lower(), words[1:]) if words else ("", [])


def set_parameter(options: dict[str, Any], args: list[str]) -> str:
    """``/set parameter NAME VALUE...``: type the value as a Modelfile PARAMETER would be,
    store it in ``options`` and return the confirmation; ReplError when it is refused."""
    if not args:
        return HELP_PARAMETERS
    name, values = args[0], args[1:]
    try:
        if not values:
            raise ModelhubError(f"missing value for parameter '{name}'")
        if name == "stop":
            typed: Any = [parse_parameter(name, value) for value in values]
            for value in typed:
                check_parameter(name, value)
        else:
            if len(values) > 1:
                raise ModelhubError(f"parameter '{name}' takes one value, got {len(values)}")
            typed = parse_parameter(name, values[0])
            check_parameter(name, typed)
    except ModelhubError as exc:
        raise ReplError(f'Couldn\'t set parameter: "{exc.message}"') from None
    options[name] = typed
    return f"Set parameter '{name}' to '{', '.join(values)}'"


_MODES = {
    "verbose": ("verbose", True),
    "quiet": ("verbose", False),
    "wordwrap": ("wordwrap", True),
    "nowordwrap": ("wordwrap", False),
    "history": ("history", True),
    "nohistory": ("history", False),
}


def apply_set(state: ReplState, args: list[str], raw: str = "") -> str:
    """Carry out ``/set ...`` on ``state``; return what to print. ``raw`` is the typed line
    (for ``/set system``, whose text keeps its spacing)."""
    if not args:
        return HELP_SET
    what = args[0].lower()
    if what == "parameter":
        return set_parameter(state.options, args[1:])
    if what == "system":
        words = raw.split(None, 2)
        return set_system(state, words[2] if len(words) == 3 else " ".join(args[1:]))
    if what in _MODES:
        attribute, value = _MODES[what]
        setattr(state, attribute, value)
        return f"Set '{what}' mode."
    if what == "format":
        if args[1:] != ["json"]:
            shown = " ".join(args[1:])
            raise ReplError(f"Invalid or unknown format '{shown}': only 'json' is supported")
        state.format = "json"
        return "Set format to 'json' mode."
    if what == "noformat":
        state.format = None
        return "Disabled format."
    raise ReplError(f"Unknown command '/set {args[0]}'. Type /? set for help")


def set_system(state: ReplState, text: str) -> str:
    if not text.strip():
        raise ReplError("Usage: /set system <message>")
    state.set_system(text)
    return "Set system message."


def help_text(args: list[str]) -> str:
    topic = args[0].lstrip("/").lower() if args else ""
    return _HELP_TOPICS.get(topic, f"Unknown help topic '{topic}'. Type /? for help")


def session_parameters(model_parameters: str, options: dict[str, Any]) -> str:
    """``/show parameters``: the model's PARAMETER lines, then those set in this session."""
    parts = []
    if model_parameters.strip():
        parts.append("Model defined parameters:\n" + model_parameters.rstrip("\n"))
    else:
        parts.append("No parameters were specified for this model.")
    if options:
        parts.append("User defined parameters:\n" + format_parameters(options))
    return "\n\n".join(parts)


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
        state.messages.append({"role": "user", "content": text})
        writer = answer_writer(self.out, wordwrap=state.wordwrap, show_draft=state.show_draft)
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
        except ResponseError as exc:
            if exc.status == 404:
                raise ReplError(f"Couldn't find model '{model}'") from None
            raise
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


def save_request(name: str, state: ReplState, info: dict[str, Any]) -> dict[str, Any]:
    """The ``/api/create`` request of ``/save``: the model this session runs (so its weights,
    template and draft carry over), with the session's system message, parameters and
    conversation after the model's own MESSAGEs."""
    loaded = [m for m in info.get("messages") or [] if isinstance(m, dict)]
    said = [m for m in state.messages if m.get("role") != "system"]
    request: dict[str, Any] = {"model": name, "from": state.model}
    if state.system:
        request["system"] = state.system
    if state.options:
        request["parameters"] = dict(state.options)
    if loaded or said:
        request["messages"] = [
            {"role": m.get("role", ""), "content": m.get("content", "")} for m in loaded + said
        ]
    return request


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
