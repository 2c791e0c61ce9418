"""``/api/create``'s ``modelfile`` field: a Modelfile's text sent whole, as Ollama's API took it
before 0.5 (and as the web page sends what is typed in its text area).

The text becomes the request's fields (``from``, ``draft``, ``template``, ``system``,
``parameters``, ``messages``, ``license``, ``requires``, ``renderer``, ``parser``); fields the
body sets itself win. Every error names the line of the instruction it is about,
``(line N): ...``. ``create`` never opens a path named in a request, so FROM, DRAFT and ADAPTER
name stored models (or DRAFT's ``auto``/``none``/``mtp``/``ngram``) here: a local file goes
through the CLI, which uploads it as a blob first.
"""

from __future__ import annotations

from typing import Any

from modelhub.errors import InputError, InvalidNameError, ModelfileError
from modelhub.modelfile import Command, parameters_from_commands, parse_modelfile
from modelhub.modelfile.fields import add_text_fields
from modelhub.store.names import parse_name

DRAFT_KEYWORDS = frozenset({"auto", "none", "mtp", "ngram"})
_FILE_HINT = "a local file cannot be named in the modelfile field; use `modelhub create -f`"


def with_modelfile(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the fields of its ``modelfile`` text added (``data`` itself when absent)."""
    text = data.get("modelfile")
    if text is None:
        return data
    if not isinstance(text, str):
        raise InputError('field "modelfile" must be a string')
    fields = modelfile_fields(text)
    return {**fields, **{k: v for k, v in data.items() if k != "modelfile"}}


def modelfile_fields(text: str) -> dict[str, Any]:
    """A Modelfile's instructions as ``/api/create`` fields; ModelfileError with the line."""
    commands = parse_modelfile(text)
    fields: dict[str, Any] = {}
    for command in commands:
        name, value = command.name, command.args
        if name == "model":
            fields["from"] = _model_name("FROM", command)
        elif name == "draft":
            word = value.strip()
            fields["draft"] = (
                word.lower() if word.lower() in DRAFT_KEYWORDS else _model_name("DRAFT", command)
            )
        elif name == "adapter":
            raise ModelfileError(f"ADAPTER {value.strip()}: {_FILE_HINT}", command.line)
    if "from" not in fields:
        raise ModelfileError("no FROM line")
    parameters, _warnings = parameters_from_commands(commands)
    if parameters:
        fields["parameters"] = parameters
    add_text_fields(commands, fields)
    return fields


def _model_name(keyword: str, command: Command) -> str:
    raw = command.args.strip()
    if raw.startswith(("/", "./", "../", "~")) or raw.lower().endswith(
        (".gguf", ".safetensors", ".bin")
    ):
        raise ModelfileError(f"{keyword} {raw}: {_FILE_HINT}", command.line)
    try:
        parse_name(raw)
    except InvalidNameError as exc:
        raise ModelfileError(
            f"{keyword} {raw}: not a model name ({exc.message})", command.line
        ) from exc
    return raw
