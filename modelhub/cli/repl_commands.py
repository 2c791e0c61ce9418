"""The terminal-free half of the interactive chat: what `modelhub run MODEL` decides.

The session state (``ReplState``), the assembly of typed lines into inputs
(``MultilineAssembler``, ``Submission``), command parsing and ``/set`` handling, the help
texts, and the ``/api/create`` request of ``/save``: plain functions and classes, tested
without a terminal. Messages follow Ollama's REPL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelhub.errors import ModelhubError
from modelhub.modelfile import check_parameter, format_parameters, parse_parameter

PROMPT = ">>> "
CONTINUATION = "... "
QUOTES = '"""'

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
  /set think [level]     Reason before answering (thinking models; low, medium, high, max)
  /set nothink           Answer without reasoning
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
  /set parameter draft_adaptive <bool>    false: always draft draft_num_predict tokens
"""

_HELP_TOPICS = {"": HELP, "set": HELP_SET, "show": HELP_SHOW, "shortcuts": HELP_SHORTCUTS}


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
    think: bool | str | None = None  # unset: the model decides (thinking models think)
    hide_thinking: bool = False

    def chat_body(self) -> dict[str, Any]:
        """The ``/api/chat`` request for the conversation so far."""
        body: dict[str, Any] = {"model": self.model, "messages": self.messages, "stream": True}
        if self.options:
            body["options"] = self.options
        if self.format:
            body["format"] = self.format
        if self.think is not None:
            body["think"] = self.think
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
    if what == "think":
        effort = args[1].lower() if len(args) > 1 else ""
        if effort not in ("", "low", "medium", "high", "max"):
            raise ReplError(f"Invalid think level '{args[1]}': use low, medium, high or max")
        state.think = effort or True
        return f"Set 'think' mode{f' to {effort}' if effort else ''}."
    if what == "nothink":
        state.think = False
        return "Set 'nothink' mode."
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
