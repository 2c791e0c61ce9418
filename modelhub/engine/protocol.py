"""The runner protocol's messages: one typed class per message, one encode and one decode
for each side of the pipe.

The daemon (``runtime.runner_process``) and a runner (``engine.runner``) exchange JSON lines;
this module is the one definition of what those lines may hold, and it imports neither
llama.cpp nor numpy, so the daemon can use it. The classes are pydantic models: pydantic is
already the daemon's request parser (through FastAPI), it validates a line in one call from
JSON, and ``extra="forbid"`` makes a field one side does not know a loud error instead of a
value dropped in silence (stdlib dataclasses would need that checking written by hand;
msgspec would be another dependency for a few microseconds a line).

- A request (daemon -> runner) that does not validate is refused with a
  ``RunnerProtocolError`` naming the field, by the daemon before it sends it and by the runner
  if it gets one: a misspelt option never reaches the engine as its default.
- An event (runner -> daemon) that does not validate is a protocol error too: the daemon stops
  that runner (``runner_process``).
- An error keeps its class: ``ErrorEvent`` carries the class's name beside its kind
  (``errors.error_name``), and :meth:`ErrorEvent.exception` raises that class again.

``load``'s config is the daemon's load plan itself (``engine.load_config.LoadConfig``) and
``done``'s result is ``GenerateResult``'s fields (``DoneResult``; a test holds them together).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from modelhub.engine.load_config import LoadConfig
from modelhub.errors import (
    ErrorKind,
    ModelhubError,
    RunnerProtocolError,
    error_name,
    rebuilt_error,
)


class Message(BaseModel):
    """A line of the protocol: unknown fields are refused, the values are what was sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def model_post_init(self, context: Any, /) -> None:
        for tag in ("op", "event"):  # the discriminator is always written, default or not
            if tag in type(self).model_fields:
                self.model_fields_set.add(tag)

    def encode(self) -> str:
        """The JSON line (without its newline); fields never set are left out."""
        return self.model_dump_json(exclude_unset=True)

    def wire(self) -> dict[str, Any]:
        """The message as the dict that was sent (fields never set are left out)."""
        return self.model_dump(exclude_unset=True)


# ---- daemon -> runner --------------------------------------------------------------------


class RunnerOptions(Message):
    """A generation's options: ``GenerateOptions``'s fields that cross the pipe (the grammar
    travels beside them; the acceptance rule is a test's parameter, not the daemon's)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_predict: int | None = None
    num_keep: int | None = None
    shift: bool | None = None
    seed: int | None = None
    stop: list[str] | None = None
    draft_num_predict: int | None = None
    draft: str | None = None
    sampling_verify: Literal["auto", "rejection", "coupled", "compare"] | None = None
    top_logprobs: int | None = None

    def given(self) -> dict[str, Any]:
        """The options the daemon set (the engine's defaults stand for the others)."""
        return {k: v for k, v in self.wire().items() if v is not None}


class ImagePixels(Message):
    width: int
    height: int
    rgb: str  # base64 of width * height * 3 bytes


class AudioClip(Message):
    audio: str  # base64 of a WAV or MP3 file, checked by the daemon (server/audio.py)
    frames: int  # its length at sample_rate, for counting
    sample_rate: int


class Load(Message):
    op: Literal["load"] = "load"
    config: LoadConfig


class Generate(Message):
    op: Literal["generate"] = "generate"
    id: str = ""
    prompt: str = ""
    context: list[int] | None = None
    options: RunnerOptions = Field(default_factory=RunnerOptions)
    prediction: str | None = None
    grammar: str | None = None
    image_marker: str | None = None  # a regex with one group: the image's index
    images: dict[str, ImagePixels | AudioClip] | None = None  # audio clips share the markers


class Embed(Message):
    op: Literal["embed"] = "embed"
    id: str = ""
    texts: list[str]


class Tokenize(Message):
    op: Literal["tokenize"] = "tokenize"
    id: str = ""
    text: str = ""
    add_special: bool = True


class Count(Message):
    op: Literal["count"] = "count"
    id: str = ""
    texts: list[str]
    add_special: bool = True
    image_marker: str | None = None
    image_sizes: dict[str, tuple[int, int]] | None = None
    audio_frames: dict[str, tuple[int, int]] | None = None  # [frames, sample_rate] by index


class Drafting(Message):
    op: Literal["drafting"] = "drafting"
    id: str = ""


class Cancel(Message):
    op: Literal["cancel"] = "cancel"
    id: str


class Shutdown(Message):
    op: Literal["shutdown"] = "shutdown"


Request = Annotated[
    Load | Generate | Embed | Tokenize | Count | Drafting | Cancel | Shutdown,
    Field(discriminator="op"),
]
# The requests that are answered by events of their own id (the others steer the runner).
Job = Generate | Embed | Tokenize | Count | Drafting
_REQUEST: TypeAdapter[Request] = TypeAdapter(Request)


def decode_request(line: str | bytes | dict[str, Any]) -> Request:
    """One request (a line, or the dict the daemon built), or a ``RunnerProtocolError``
    naming what is wrong in it (a field it does not know, a value of the wrong type)."""
    try:
        if isinstance(line, dict):
            return _REQUEST.validate_python(line)
        return _REQUEST.validate_json(line)
    except ValidationError as exc:
        raise RunnerProtocolError(f"runner protocol: {_describe(exc)}") from None


def runner_options(options: dict[str, Any]) -> RunnerOptions:
    """A plan's options as a ``generate`` request carries them, or a ``RunnerProtocolError``
    naming the option the runner would not know (the only part of a request the daemon
    builds from a dict: the others are typed where they are made)."""
    try:
        return RunnerOptions.model_validate(options)
    except ValidationError as exc:
        raise RunnerProtocolError(f"runner protocol: generate.options.{_describe(exc)}") from None


def request_id(line: str | bytes | dict[str, Any]) -> str:
    """The ``id`` of a line that did not decode, to answer it with its error ("" if none)."""
    try:
        raw = line if isinstance(line, dict) else TypeAdapter(dict[str, Any]).validate_json(line)
    except ValidationError:
        return ""
    return str(raw.get("id") or "")


# ---- runner -> daemon ----------------------------------------------------------------------


class Alive(Message):
    event: Literal["alive"] = "alive"


class PlacementReport(Message):
    """What llama.cpp allocated for the target, per buffer (``engine.offload.Placement``)."""

    buffers: dict[str, int] = Field(default_factory=dict)
    layers_offloaded: int = 0
    layers_total: int = 0
    size_device: int = 0  # bytes on offload devices (a GPU, RPC workers)
    size: int = 0  # bytes in all buffers


class Loaded(Message):
    event: Literal["loaded"] = "loaded"
    pid: int
    n_ctx: int
    rss: int = 0
    repack: bool = False
    repack_reason: str = ""
    n_parallel: int = 1
    kv_cache_type: str = ""
    placement: PlacementReport = Field(default_factory=PlacementReport)
    offload: str = ""
    devices: list[str] = Field(default_factory=list)
    draft_devices: list[str] = Field(default_factory=list)
    drafters: list[str] = Field(default_factory=list)
    default_drafters: list[str] = Field(default_factory=list)


class _Failure(Message):
    """What failed, with the kind and the class it keeps across the pipe."""

    message: str
    kind: str = ErrorKind.INTERNAL.label
    error: str | None = None  # the class's name (``errors.error_name``)

    @classmethod
    def of(cls, exc: ModelhubError, **fields: Any) -> Any:
        return cls(message=exc.message, kind=exc.kind.label, error=error_name(exc), **fields)

    def exception(self, prefix: str = "") -> ModelhubError:
        """The error the runner raised, as the same class (``errors.rebuilt_error``)."""
        return rebuilt_error(self.error, ErrorKind.named(self.kind), prefix + self.message)


class LoadError(_Failure):
    event: Literal["load_error"] = "load_error"


class ErrorEvent(_Failure):
    event: Literal["error"] = "error"
    id: str = ""


class Prompt(Message):
    event: Literal["prompt"] = "prompt"
    id: str
    prompt_tokens: int


class Token(Message):
    event: Literal["token"] = "token"
    id: str
    text: str
    drafted: bool = False
    logprob: dict[str, Any] | None = None  # {"token", "logprob", "bytes", "top": [...]}


class DoneResult(Message):
    """``GenerateResult``'s fields (see its docstring) less ``tokens``, and ``context``: the
    prompt's and the answer's token ids, for the next request of a conversation."""

    text: str
    done_reason: Literal["stop", "length", "cancel"]
    prompt_eval_count: int
    prompt_eval_duration_ns: int
    eval_count: int
    eval_duration_ns: int
    draft_count: int = 0
    draft_accepted_count: int = 0
    draft_steps: int = 0
    draft_time_ns: int = 0
    verify_time_ns: int = 0
    drafter: str | None = None
    drafter_name: str | None = None
    draft_count_by_position: list[int] = Field(default_factory=list)
    draft_accepted_by_position: list[int] = Field(default_factory=list)
    plain_estimate_ns: int = 0
    stop_sequence: str | None = None
    context: list[int] = Field(default_factory=list)


class Done(Message):
    event: Literal["done"] = "done"
    id: str
    result: DoneResult


class Vectors(Message):
    event: Literal["vectors"] = "vectors"
    id: str
    embeddings: list[list[float]]


class Embeddings(Message):
    event: Literal["embeddings"] = "embeddings"
    id: str
    embeddings: list[list[float]]
    prompt_eval_count: int = 0


class Tokens(Message):
    event: Literal["tokens"] = "tokens"
    id: str
    tokens: list[int]


class Counts(Message):
    event: Literal["counts"] = "counts"
    id: str
    counts: list[int]


class DraftingReport(Message):
    event: Literal["drafting"] = "drafting"
    id: str
    report: dict[str, Any]


Event = Annotated[
    Alive
    | Loaded
    | LoadError
    | ErrorEvent
    | Prompt
    | Token
    | Done
    | Vectors
    | Embeddings
    | Tokens
    | Counts
    | DraftingReport,
    Field(discriminator="event"),
]
_EVENT: TypeAdapter[Event] = TypeAdapter(Event)
# The events that end a request.
_FINAL = (Done, ErrorEvent, Embeddings, Tokens, Counts, DraftingReport)


def is_final(event: Message) -> bool:
    """The event ends its request (a result, or an error)."""
    return isinstance(event, _FINAL)


def decode_event(line: str | bytes | dict[str, Any]) -> Event:
    """One event from a runner, or a ``RunnerProtocolError`` naming what is wrong in it."""
    try:
        if isinstance(line, dict):
            return _EVENT.validate_python(line)
        return _EVENT.validate_json(line)
    except ValidationError as exc:
        raise RunnerProtocolError(f"runner protocol: {_describe(exc)}") from None


def raise_if_error(event: Message) -> None:
    """Raise the error an ``error`` event carries, as the class it was raised as."""
    if isinstance(event, ErrorEvent):
        raise event.exception()


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg"))
