"""One exception hierarchy for every user-facing failure.

Each error carries the HTTP status the API answers with and a message meant for a person:
what was wrong, where, and what to do. The server turns these into ``{"error": ...}``;
the CLI prints ``Error: ...`` and exits non-zero.
"""

from __future__ import annotations


class ModelhubError(Exception):
    """Base class: a failure with a user message and an HTTP status."""

    status: int = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status

    def __str__(self) -> str:
        return self.message


class BadRequest(ModelhubError):
    status = 400


class NotFound(ModelhubError):
    status = 404


class Forbidden(ModelhubError):
    status = 403


class Conflict(ModelhubError):
    status = 409


class InvalidName(BadRequest):
    """A model name that does not follow the host/namespace/model:tag grammar."""


class InvalidDigest(BadRequest):
    """A digest that is not ``sha256:`` followed by 64 lowercase hex characters."""


class DigestMismatch(BadRequest):
    """Bytes whose sha256 differs from the digest they were announced with."""


class GGUFError(BadRequest):
    """A file that is not a well-formed GGUF, or a header that lies about its sizes."""


class ModelfileError(BadRequest):
    """A Modelfile syntax or typing error; ``line`` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"(line {line}): {message}" if line is not None else message)


class DraftError(BadRequest):
    """A DRAFT pairing that cannot work (different tokenizer, no MTP heads, same file...)."""


class StoreError(ModelhubError):
    """The store on disk is inconsistent or could not be written."""


class ServerUnavailable(ModelhubError):
    """The CLI could not reach (or start) the daemon."""

    status = 503
