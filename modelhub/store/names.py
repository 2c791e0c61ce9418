"""Model names: Ollama's ``[host/][namespace/]model[:tag]`` grammar.

Every part is checked against a strict ASCII character set and length cap before it is ever
used as a path component, so a parsed name can never hold ``..``, a separator, a drive letter
or an empty part (SEC-04). Case is preserved here; case-insensitive lookup is the store's job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from modelhub.errors import InvalidNameError

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# Scheme prefixes accepted (and dropped) in front of the host, as in ``http://host:5000/ns/m``.
_SCHEMES = ("http://", "https://")

# (pattern, max length, allowed characters in words) per part. The first character is a
# letter, digit or '_', so no part can be '.', '..' or start with '-'.
_PART_RULES: dict[str, tuple[re.Pattern[str], int, str]] = {
    "host": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*"), 350, "letters, digits, _ - . :"),
    "namespace": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*"), 80, "letters, digits, _ -"),
    "model": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80, "letters, digits, _ - ."),
    "tag": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80, "letters, digits, _ - ."),
}

_GRAMMAR_HINT = "expected [host/][namespace/]model[:tag]"


def _quoted(raw: str) -> str:
    """The raw input, JSON-quoted (control characters escaped) and shortened for messages."""
    shown = raw if len(raw) <= 120 else raw[:117] + "..."
    return json.dumps(shown, ensure_ascii=False)


def _part_problem(kind: str, value: str) -> str | None:
    """Why ``value`` is not a valid ``kind`` part, or None when it is."""
    pattern, max_len, allowed = _PART_RULES[kind]
    if not value:
        return f"the {kind} is empty"
    if len(value) > max_len:
        return f"the {kind} is {len(value)} characters long (at most {max_len})"
    if not pattern.fullmatch(value):
        return (
            f"the {kind} {_quoted(value)} may only use {allowed}"
            " and must start with a letter, digit or _"
        )
    return None


@dataclass(frozen=True)
class ModelName:
    """A fully qualified model name; every part is checked when it is constructed."""

    host: str
    namespace: str
    model: str
    tag: str

    def __post_init__(self) -> None:
        # Validated on every construction, so no ModelName can hold an unsafe path part.
        for kind in ("host", "namespace", "model", "tag"):
            problem = _part_problem(kind, getattr(self, kind))
            if problem is not None:
                raise InvalidNameError(f"invalid model name: {problem}")

    @classmethod
    def from_parts(cls, host: str, namespace: str, model: str, tag: str) -> ModelName:
        """Build a name from separate parts (e.g. read back from manifest directories)."""
        return cls(host, namespace, model, tag)

    @property
    def display(self) -> str:
        """Short form: default host omitted, then default namespace; the tag always shown."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    def manifest_relpath(self) -> PurePosixPath:
        """Where this name's manifest lives, relative to the manifests directory."""
        return PurePosixPath(self.host, self.namespace, self.model, self.tag)

    def __str__(self) -> str:
        return self.display


def parse_name(raw: str) -> ModelName:
    """Parse ``[scheme://][host/][namespace/]model[:tag]``, filling Ollama's defaults.

    Parsing runs from the right: a ``:`` after the last ``/`` starts the tag, then ``/``
    splits off model, namespace and host. ``@digest`` references are not supported.
    """
    if not isinstance(raw, str):
        raise InvalidNameError(f"invalid model name: expected a string, got {type(raw).__name__}")
    text = raw.strip()
    if not text:
        raise InvalidNameError("invalid model name: the name is empty")

    def fail(reason: str) -> InvalidNameError:
        return InvalidNameError(f"invalid model name: {_quoted(text)}: {reason}")

    if "@" in text:
        raise fail("digest references (name@sha256:...) are not supported; use name:tag")
    for scheme in _SCHEMES:
        if text.lower().startswith(scheme):
            text = text[len(scheme) :]
            break
    if "://" in text:
        raise fail("only http:// or https:// may prefix the host")

    rest, tag = text, DEFAULT_TAG
    colon, slash = text.rfind(":"), text.rfind("/")
    if colon > slash:
        rest, tag = text[:colon], text[colon + 1 :]

    pieces = rest.split("/")
    if len(pieces) > 3:
        raise fail(f"too many '/' separators ({_GRAMMAR_HINT})")
    model = pieces[-1]
    namespace = pieces[-2] if len(pieces) >= 2 else DEFAULT_NAMESPACE
    host = pieces[-3] if len(pieces) == 3 else DEFAULT_HOST

    for kind, value in (("host", host), ("namespace", namespace), ("model", model), ("tag", tag)):
        problem = _part_problem(kind, value)
        if problem is not None:
            raise fail(problem)
    return ModelName(host, namespace, model, tag)
