"""Manifest JSON (Ollama's schema, §6.3) with strict validation of everything read.

A manifest is the commit record of a model. Reading one checks its shape and every digest
before any of it is used, so a planted or corrupt manifest cannot steer file operations
(SEC-01, SEC-07); reading is bounded (SEC-14).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from modelhub.errors import ManifestFormatError
from modelhub.store.digests import parse_digest

MEDIA_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MEDIA_CONFIG = "application/vnd.docker.container.image.v1+json"
MEDIA_MODEL = "application/vnd.ollama.image.model"
MEDIA_ADAPTER = "application/vnd.ollama.image.adapter"
MEDIA_PROJECTOR = "application/vnd.ollama.image.projector"
MEDIA_DRAFT = "application/vnd.ollama.image.draft"
MEDIA_TEMPLATE = "application/vnd.ollama.image.template"
MEDIA_PROMPT = "application/vnd.ollama.image.prompt"
MEDIA_SYSTEM = "application/vnd.ollama.image.system"
MEDIA_PARAMS = "application/vnd.ollama.image.params"
MEDIA_MESSAGES = "application/vnd.ollama.image.messages"
MEDIA_LICENSE = "application/vnd.ollama.image.license"

MAX_MANIFEST_BYTES = 4 << 20  # real manifests are a few KB; this bounds a hostile one


@dataclass
class Layer:
    media_type: str
    digest: str
    size: int
    from_: str | None = None  # JSON key "from": the source model or file name

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest}
        out["size"] = self.size
        if self.from_ is not None:
            out["from"] = self.from_
        return out

    @classmethod
    def from_dict(cls, obj: object, where: str) -> Layer:
        if not isinstance(obj, dict):
            raise ManifestFormatError(f"invalid manifest: {where} is not an object")
        media_type = obj.get("mediaType")
        if not isinstance(media_type, str) or not media_type:
            raise ManifestFormatError(f"invalid manifest: {where}.mediaType is missing")
        digest = obj.get("digest")
        if not isinstance(digest, str):
            raise ManifestFormatError(f"invalid manifest: {where}.digest is missing")
        parse_digest(digest)  # InvalidDigestError: never let a bad digest near a path
        size = obj.get("size")
        if type(size) is not int or size < 0:
            raise ManifestFormatError(
                f"invalid manifest: {where}.size must be a non-negative integer"
            )
        source = obj.get("from")
        if source is not None and not isinstance(source, str):
            raise ManifestFormatError(f"invalid manifest: {where}.from must be a string")
        return cls(media_type, digest, size, source)


@dataclass
class Manifest:
    config: Layer
    layers: list[Layer] = field(default_factory=list)
    schema_version: int = 2
    media_type: str = MEDIA_MANIFEST

    def to_json(self) -> bytes:
        """Compact JSON in Ollama's field order, with a trailing newline (as Ollama writes)."""
        doc = {
            "schemaVersion": self.schema_version,
            "mediaType": self.media_type,
            "config": self.config.to_dict(),
            "layers": [layer.to_dict() for layer in self.layers],
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Parse and validate; raises ManifestFormatError (400) or InvalidDigest."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ManifestFormatError(
                f"invalid manifest: {len(raw)} bytes is over the {MAX_MANIFEST_BYTES} byte limit"
            )
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestFormatError(f"invalid manifest: not valid JSON ({exc})") from exc
        except RecursionError as exc:
            raise ManifestFormatError("invalid manifest: JSON nested too deeply") from exc
        if not isinstance(doc, dict):
            raise ManifestFormatError("invalid manifest: the top level is not an object")
        version = doc.get("schemaVersion")
        if type(version) is not int or version != 2:
            raise ManifestFormatError(
                f"invalid manifest: schemaVersion must be 2, got {json.dumps(version)[:40]}"
            )
        media_type = doc.get("mediaType", MEDIA_MANIFEST)
        if not isinstance(media_type, str):
            raise ManifestFormatError("invalid manifest: mediaType must be a string")
        config = Layer.from_dict(doc.get("config"), "config")
        layers_doc = doc.get("layers")
        if not isinstance(layers_doc, list):
            raise ManifestFormatError("invalid manifest: layers must be a list")
        layers = [Layer.from_dict(item, f"layers[{i}]") for i, item in enumerate(layers_doc)]
        return cls(config, layers, version, media_type)

    def layers_of(self, media_type: str) -> list[Layer]:
        return [layer for layer in self.layers if layer.media_type == media_type]

    def digests(self) -> set[str]:
        """Every blob this manifest needs: the config and all layers."""
        return {self.config.digest, *(layer.digest for layer in self.layers)}

    @property
    def total_size(self) -> int:
        """Model size: every blob it needs (layers and config), each counted once, so a file
        listed twice is not counted twice (it is stored once)."""
        sizes = {layer.digest: layer.size for layer in self.layers}
        sizes[self.config.digest] = self.config.size
        return sum(sizes.values())
