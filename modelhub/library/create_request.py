"""The create request as the daemon receives it, and the checks it passes before anything is
streamed or stored (clean relative paths, strict digests, coherent draft and quantize choices,
a template that parses, well-formed messages).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from modelhub import __version__
from modelhub.errors import InputError
from modelhub.library.views import MAX_TEXT_LAYER
from modelhub.modelfile import coerce_option, normalize_requires
from modelhub.modelfile.params import version_at_least
from modelhub.store import ModelName, parse_digest
from modelhub.templates.isolated import check_template


@dataclass
class CreateRequest:
    model: ModelName
    from_: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)
    draft_files: dict[str, str] = field(default_factory=dict)
    draft: str | None = None  # "auto" | "none" | "mtp" | "ngram" | a model name (DRAFT)
    draft_sidecar: bool = False  # draft_files came with a pull: a candidate of DRAFT auto
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    license: list[str] = field(default_factory=list)
    quantize: str | None = None
    draft_quantize: str | None = None
    requires: str | None = None
    renderer: str | None = None
    parser: str | None = None


def validate_file_map(files: dict[str, str], what: str) -> dict[str, str]:
    """Keys must be clean relative paths and values strict digests (400 otherwise)."""
    out: dict[str, str] = {}
    for key, digest in files.items():
        p = PurePosixPath(key)
        if not key or key.startswith(("/", "\\")) or ".." in p.parts or "\\" in key or ":" in key:
            raise InputError(f"{what}: file path must be relative: {key!r}")
        if not isinstance(digest, str) or not digest:
            raise InputError(f"{what}: invalid digest format for {key!r}")
        out[key] = parse_digest(digest)
    return out


def check_request(req: CreateRequest) -> None:
    """Checks that need no store access, done before anything is streamed."""
    if not req.from_ and not req.files:
        raise InputError("neither 'from' or 'files' was specified")
    req.files = validate_file_map(req.files, "files")
    req.adapters = validate_file_map(req.adapters, "adapters")
    req.draft_files = validate_file_map(req.draft_files, "draft_files")
    if req.draft_quantize and not req.draft_files:
        raise InputError("--draft-quantize requires a DRAFT model file")
    if req.draft_files and req.draft:
        raise InputError("give either draft_files or draft, not both")
    if len(req.draft_files) > 1:
        raise InputError("only one DRAFT file is supported (split draft GGUFs are not)")
    if len(req.adapters) > 1:
        raise InputError("only one adapter is currently supported")
    for key, value in req.parameters.items():
        req.parameters[key] = coerce_option(key, value)
    check_stored_sizes(req)
    if req.template:
        check_template(req.template)  # 400 "template error: ... at line L col C"
    if req.quantize:
        quant_type(req.quantize)
    if req.draft_quantize:
        quant_type(req.draft_quantize)
    if req.requires:
        req.requires = check_requires(req.requires)


def check_requires(value: str) -> str:
    """REQUIRES: a semantic version no later than this modelhub's (what ``/api/version``
    answers); the version as stored, without its ``v``."""
    version = normalize_requires(value)
    if not version_at_least(__version__, version):
        raise InputError(
            f"this model requires version {version} or later (REQUIRES {version}), and this is "
            f"modelhub {__version__}: upgrade modelhub, or remove the REQUIRES line if it names "
            "an Ollama version"
        )
    return version


def check_stored_sizes(req: CreateRequest) -> None:
    """Every text the model will store fits in what ``show`` and ``list`` read back
    (``MAX_TEXT_LAYER`` per layer): refused here rather than stored and then unreadable."""
    texts = {"template": req.template, "system": req.system}
    texts.update({f"license[{i}]": text for i, text in enumerate(req.license)})
    texts["messages"] = json.dumps(req.messages) if req.messages else None
    texts["parameters"] = json.dumps(req.parameters) if req.parameters else None
    for what, text in texts.items():
        size = len(text.encode("utf-8")) if text else 0
        if size > MAX_TEXT_LAYER:
            raise InputError(
                f"{what} is {size} bytes; the limit for a stored text is {MAX_TEXT_LAYER} bytes"
            )


def quant_type(name: str) -> str:
    """The --quantize key for ``name`` (lower case); InputError when it is not supported."""
    from modelhub.gguf.quantize import QUANT_TYPES

    key = name.strip().lower()
    if key not in QUANT_TYPES:
        supported = ", ".join(sorted(k.upper() for k in QUANT_TYPES))
        raise InputError(f"unsupported quantization type {name} - supported types are {supported}")
    return key


def clean_message(msg: Any, index: int) -> dict[str, Any]:
    """A request's ``messages[index]`` as stored: a known role and string content only."""
    if not isinstance(msg, dict) or not isinstance(msg.get("content", ""), str):
        raise InputError(f"messages[{index}]: expected an object with role and content")
    role = str(msg.get("role", "")).lower()
    if role not in ("system", "user", "assistant", "tool"):
        raise InputError(f"messages[{index}]: role must be system, user, assistant or tool")
    return {"role": role, "content": msg.get("content", "")}
