"""The text instructions of a Modelfile as ``/api/create`` fields: one reading for the CLI's
``create`` (which also uploads the files a Modelfile names) and the API's ``modelfile`` field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelhub.modelfile.params import normalize_requires
from modelhub.modelfile.parser import Command


def add_text_fields(commands: Sequence[Command], fields: dict[str, Any]) -> None:
    """Put the instructions that are text (TEMPLATE, RENDERER, PARSER, SYSTEM, LICENSE, MESSAGE,
    REQUIRES) into ``/api/create`` fields."""
    licenses: list[str] = []
    messages: list[dict[str, str]] = []
    for command in commands:
        name, value = command.name, command.args
        if name in ("template", "renderer", "parser"):
            fields[name] = value
        elif name == "system":
            if value:  # an empty SYSTEM means "not given", as in Ollama
                fields["system"] = value
        elif name == "license":
            licenses.append(value)
        elif name == "message":
            role, separator, content = value.partition(": ")
            if not separator:
                role, _, content = value.partition(":")
            messages.append({"role": role.strip().lower(), "content": content})
        elif name == "requires":
            fields["requires"] = normalize_requires(command.args.strip(), command.line)
    if licenses:
        fields["license"] = licenses
    if messages:
        fields["messages"] = messages
