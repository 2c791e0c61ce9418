"""One exception hierarchy for every failure a person can cause or meet.

Each error carries a message meant for a person (what was wrong, where, what to do) and an
``ErrorKind``. The kind decides everything else in one place each: the server turns it into
Ollama's or OpenAI's status and body (``server/errors.py``), the runner protocol carries it
by name, the client turns a status back into the class of its kind (:func:`error_for_status`),
and the CLI branches on the class and picks its exit code.

Where an error crosses a process boundary (the runner pipe, the daemon's HTTP answers) its
class travels by name too (:func:`error_name`, :func:`rebuilt_error`), so that the other side
raises the same class: a ``RunnerCrashedError`` stays one, not the base class of its status.
"""

from __future__ import annotations

import functools
from enum import Enum


class ErrorKind(Enum):
    """What went wrong, in the API's words; ``status`` is the HTTP status the daemon answers."""

    INVALID = ("invalid_request", 400)  # the request, or a file or setting it names
    UNAUTHORIZED = ("unauthorized", 401)  # a registry wants credentials
    FORBIDDEN = ("forbidden", 403)
    NOT_FOUND = ("not_found", 404)
    CONFLICT = ("conflict", 409)
    CANCELLED = ("cancelled", 499)  # the client went away, or asked to stop
    INTERNAL = ("internal", 500)
    RESOURCES = ("insufficient_resources", 500)  # memory: 500 as Ollama answers it
    UPSTREAM = ("upstream", 502)  # a pull source failed
    BUSY = ("busy", 503)  # too many requests waiting
    UNREACHABLE = ("unreachable", 503)  # the daemon (seen from the client)
    NO_SPACE = ("no_space", 507)

    def __init__(self, label: str, status: int) -> None:
        self.label = label
        self.status = status

    @classmethod
    def named(cls, label: str) -> ErrorKind:
        """The kind with this label (the runner protocol's ``kind``); unknown: internal."""
        return next((k for k in cls if k.label == label), cls.INTERNAL)


class ModelhubError(Exception):
    """Base class: a failure with a user message and a kind (``INTERNAL`` unless said)."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind

    @property
    def status(self) -> int:
        return self.kind.status

    def __str__(self) -> str:
        return self.message


# ---- the request or what it names is wrong (400) ------------------------------------------


class InputError(ModelhubError):
    """A request, a file or a setting that is malformed or out of range."""

    kind = ErrorKind.INVALID


class InvalidNameError(InputError):
    """A model name that does not follow the host/namespace/model:tag grammar."""


class InvalidDigestError(InputError):
    """A digest that is not ``sha256:`` followed by 64 lowercase hex characters."""


class DigestMismatchError(InputError):
    """Bytes whose sha256 differs from the digest they were announced with."""


class SizeMismatchError(InputError):
    """A blob whose size differs from what its source or manifest declares."""


class GGUFError(InputError):
    """A file that is not a well-formed GGUF, or a header that lies about its sizes."""


class ManifestFormatError(InputError):
    """A manifest that is not valid JSON of Ollama's manifest schema."""


class ModelfileError(InputError):
    """A Modelfile syntax or typing error; ``line`` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"(line {line}): {message}" if line is not None else message)


class DraftError(InputError):
    """A DRAFT pairing that cannot work (different tokenizer, no MTP heads, same file...)."""


# ---- what it names does not exist or may not be used ---------------------------------------


class NotFoundError(ModelhubError):
    """A model, blob or source file that does not exist."""

    kind = ErrorKind.NOT_FOUND


class ResponseNotFoundError(NotFoundError):
    """A stored response (``/v1/responses/{id}``, ``previous_response_id``) that does not
    exist: never stored, deleted or evicted. ``param`` names the request field, as OpenAI's
    error does."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnauthorizedError(ModelhubError):
    """A registry that asks for credentials modelhub does not have."""

    kind = ErrorKind.UNAUTHORIZED


class ForbiddenError(ModelhubError):
    """Something refused on purpose: a foreign Origin or Host, a redirect to a private host."""

    kind = ErrorKind.FORBIDDEN


class ConflictError(ModelhubError):
    kind = ErrorKind.CONFLICT


# ---- the request was stopped, or could not be served now ------------------------------------


class RequestCancelledError(ModelhubError):
    """The client hung up or cancelled (a pull, a generation) before the work was done."""

    kind = ErrorKind.CANCELLED


class ServerBusyError(ModelhubError):
    """Too many requests are waiting for runners; retry later."""

    kind = ErrorKind.BUSY


class SourceUnavailableError(ModelhubError):
    """A pull source answered, but not with what was asked (an HTTP error, a bad archive)."""

    kind = ErrorKind.UPSTREAM


class DaemonUnreachableError(ModelhubError):
    """The client could not reach (or start) the daemon, or lost it mid-request."""

    kind = ErrorKind.UNREACHABLE


# ---- the machine or the daemon failed -------------------------------------------------------


class StoreError(ModelhubError):
    """The store on disk is inconsistent or could not be written."""


class DamagedModelError(StoreError):
    """A stored model whose manifest or blobs are missing, mis-sized, corrupt or unreadable;
    the message says which and how to repair it (pull or create it again, or remove it).
    ``problems`` lists what is wrong, each on its own."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems else [message]


class NoSpaceError(StoreError):
    """The disk holding the store is full (or would be)."""

    kind = ErrorKind.NO_SPACE


class InsufficientMemoryError(ModelhubError):
    """A model that cannot fit in the memory modelhub may use, refused before it loads."""

    kind = ErrorKind.RESOURCES


class RunnerCrashedError(ModelhubError):
    """A model runner process died (a crash, an abort, an OOM kill) or did not load in time."""


class RunnerProtocolError(ModelhubError):
    """A message between the daemon and a runner that the other side does not understand (a
    field or option it does not know, a value of the wrong type): a bug, refused loudly."""


_BY_KIND: dict[ErrorKind, type[ModelhubError]] = {
    ErrorKind.INVALID: InputError,
    ErrorKind.UNAUTHORIZED: UnauthorizedError,
    ErrorKind.FORBIDDEN: ForbiddenError,
    ErrorKind.NOT_FOUND: NotFoundError,
    ErrorKind.CONFLICT: ConflictError,
    ErrorKind.CANCELLED: RequestCancelledError,
    ErrorKind.RESOURCES: InsufficientMemoryError,
    ErrorKind.UPSTREAM: SourceUnavailableError,
    ErrorKind.BUSY: ServerBusyError,
    ErrorKind.UNREACHABLE: DaemonUnreachableError,
    ErrorKind.NO_SPACE: NoSpaceError,
}


def error_for_kind(kind: ErrorKind, message: str) -> ModelhubError:
    """The error of this kind's class (for errors that crossed a process boundary)."""
    cls = _BY_KIND.get(kind)
    return cls(message) if cls is not None else ModelhubError(message, kind)


def error_name(error: ModelhubError) -> str:
    """The name ``error``'s class crosses a process boundary with (:func:`rebuilt_error`)."""
    name = type(error).__name__
    return name if _classes().get(name) is type(error) else ModelhubError.__name__


def rebuilt_error(name: str | None, kind: ErrorKind, message: str) -> ModelhubError:
    """The error a boundary carried as (class ``name``, ``kind``, ``message``): the class of
    that name when it is one of ours and of that kind, else the class of the kind (an older
    peer, or a name this version does not have)."""
    cls = _classes().get(name or "")
    if cls is None or (cls is not ModelhubError and cls.kind is not kind):
        return error_for_kind(kind, message)
    error = cls.__new__(cls)
    ModelhubError.__init__(error, message, kind if cls is ModelhubError else None)
    for attr, value in _WIRE_DEFAULTS.get(cls, {}).items():  # fields of their own: defaults
        setattr(error, attr, value(message) if callable(value) else value)
    return error


@functools.cache
def _classes() -> dict[str, type[ModelhubError]]:
    """Every class of the hierarchy, by name (all of them live in this module)."""
    found: dict[str, type[ModelhubError]] = {ModelhubError.__name__: ModelhubError}
    todo: list[type[ModelhubError]] = [ModelhubError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__ == __name__ and sub.__name__ not in found:
                found[sub.__name__] = sub
                todo.append(sub)
    return found


def error_for_status(status: int, message: str) -> ModelhubError:
    """The error an HTTP status from the daemon stands for (the inverse of ``kind.status``;
    a 500 stays a plain ``ModelhubError``, as several kinds answer it)."""
    kind = next((k for k in _BY_KIND if k.status == status and k not in _AMBIGUOUS), None)
    return error_for_kind(kind, message) if kind is not None else ModelhubError(message)


_AMBIGUOUS = (ErrorKind.RESOURCES, ErrorKind.UNREACHABLE)  # share 500 / 503 with other kinds
# Attributes some classes set in their own ``__init__``, for one rebuilt from its message.
_WIRE_DEFAULTS: dict[type[ModelhubError], dict[str, object]] = {
    ModelfileError: {"line": None},
    ResponseNotFoundError: {"param": None},
    DamagedModelError: {"problems": lambda message: [message]},
}
