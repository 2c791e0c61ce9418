"""Damaged models (STO-16): what is wrong with a stored model, and how to repair it.

A model is damaged when a blob its manifest names is missing or has another size than declared
(one ``stat`` per layer, each time the model is read), when the content of a blob a load reads
does not hash to its name (checked before each load, hashing a file once per state of it as
``store.content`` records; ``modelhub verify`` hashes every blob), when its weights cannot be
read as a GGUF, or when its manifest cannot be read. Such a model stays listed (``/api/tags``,
``modelhub list``) with what is wrong; a request for it is a
:class:`~modelhub.errors.DamagedModelError` naming the damaged part and the repair: pull or
create the model again (a corrupt blob is removed from the store when found, so that the pull
or create brings the right bytes back), or remove it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from modelhub.errors import DamagedModelError
from modelhub.store import (
    MEDIA_ADAPTER,
    MEDIA_CONFIG,
    MEDIA_DRAFT,
    MEDIA_LICENSE,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_PROJECTOR,
    MEDIA_PROMPT,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
    Store,
    digest_from_filename,
)

# What each layer is, in the words of a message.
ROLES = {
    MEDIA_MODEL: "weights",
    MEDIA_DRAFT: "draft model",
    MEDIA_ADAPTER: "adapter",
    MEDIA_PROJECTOR: "projector",
    MEDIA_TEMPLATE: "template",
    MEDIA_PROMPT: "template",
    MEDIA_SYSTEM: "system message",
    MEDIA_PARAMS: "parameters",
    MEDIA_MESSAGES: "messages",
    MEDIA_LICENSE: "license",
    MEDIA_CONFIG: "config",
}
# The same for the files of a load plan, by their key.
_CONFIG_ROLES = {"model_path": "weights", "draft_path": "draft model", "adapter_paths": "adapter"}


def repair_hint(name: str) -> str:
    """How to repair the model displayed as ``name``."""
    return (
        f"pull it again (`modelhub pull {name}`) or create it again from its Modelfile "
        f"(`modelhub create {name} -f Modelfile`); `modelhub rm {name}` removes it"
    )


def damaged(name: str, problems: list[str]) -> DamagedModelError:
    """The error for a request naming the damaged model ``name``."""
    return DamagedModelError(
        f"model '{name}' is damaged: {'; '.join(problems)}; {repair_hint(name)}", problems
    )


def role(layer: Layer) -> str:
    return ROLES.get(layer.media_type, layer.media_type)


def layer_problems(store: Store, manifest: Manifest) -> list[str]:
    """Each layer of ``manifest`` whose blob is missing or mis-sized, said with its role."""
    return [f"its {role(layer)} {issue}" for layer, issue in store.layer_issues(manifest)]


def check_layers(store: Store, name: str, manifest: Manifest) -> None:
    """DamagedModelError unless every blob of ``manifest`` is there with its declared size."""
    problems = layer_problems(store, manifest)
    if problems:
        raise damaged(name, problems)


def content_problems(store: Store, manifest: Manifest) -> list[str]:
    """Each layer of ``manifest`` whose blob is missing or does not hash to its name (every
    blob hashed now, whatever was recorded: ``modelhub verify``); corrupt blobs are removed."""
    problems = []
    seen = set()
    for layer in [manifest.config, *manifest.layers]:
        if layer.digest in seen:
            continue
        seen.add(layer.digest)
        problem = store.check_content(layer.digest, rehash=True)
        if problem is not None:
            problems.append(f"its {role(layer)} {problem}")
    return problems


def check_load_files(store: Store, name: str, config: Mapping[str, Any]) -> None:
    """Before a load: every store blob the load plan ``config`` names hashes to its name
    (each file hashed once per state of it); DamagedModelError naming the others (which are
    removed from the store when corrupt)."""
    problems = []
    seen = set()
    for key, digest in _blobs_named(store, config):
        if digest in seen:
            continue
        seen.add(digest)
        problem = store.check_content(digest)
        if problem is not None:
            what = _CONFIG_ROLES.get(key) or key.removesuffix("s").removesuffix("_path")
            problems.append(f"its {what.replace('_', ' ')} {problem}")
    if problems:
        raise damaged(name, problems)


def _blobs_named(store: Store, config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(top-level key, digest) of every path to a store blob anywhere in ``config``."""
    for key, value in config.items():
        for text in _strings(value):
            path = Path(text)
            digest = digest_from_filename(path.name)
            if digest is not None and path.parent == store.blobs_dir:
                yield str(key), digest


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
