"""A stored model, read back: its layers, config, texts and GGUF metadata.

The server's show/tags handlers and the scheduler all need the same facts about a model;
this module reads them once from the store (small text/JSON layers, the config blob and the
GGUF header of the weights) so that nothing else parses manifests by hand.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from modelhub.errors import GGUFError, StoreError
from modelhub.gguf.adapter import adapter_facts
from modelhub.gguf.info import GGUFInfo, read_gguf_info, read_tokens
from modelhub.library.damage import check_layers, damaged, role
from modelhub.store import (
    MEDIA_ADAPTER,
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
    ModelName,
    Store,
    StoredModel,
)

log = logging.getLogger(__name__)

MAX_TEXT_LAYER = 16 * 1024 * 1024

# Draft kinds recorded in config["draft"]["kind"].
DRAFT_MODEL = "draft_model"
DRAFT_MTP = "mtp"
DRAFT_MTP_DRAFTER = "mtp_drafter"
DRAFT_NGRAM = "ngram"
DRAFT_EAGLE3 = "eagle3"  # an EAGLE-3 head reading target layers' hidden states
DRAFT_DFLASH = "dflash"  # a DFlash block drafter reading target layers' hidden states
DRAFT_AUTO = "auto"  # choose among the model's drafters by measurement (the default)
DRAFT_NONE = "none"  # no drafting


@dataclass
class ModelView:
    stored: StoredModel
    config: dict[str, Any]
    model_layer: Layer | None
    draft_layer: Layer | None
    adapters: list[Layer]
    projectors: list[Layer]
    template: str | None
    system: str | None
    parameters: dict[str, Any]
    messages: list[dict[str, Any]]
    licenses: list[str]
    model_path: Path | None
    draft_path: Path | None
    adapter_paths: list[Path] = field(default_factory=list)
    projector_paths: list[Path] = field(default_factory=list)
    info: GGUFInfo | None = None
    draft_info: GGUFInfo | None = None
    adapter_infos: list[GGUFInfo] = field(default_factory=list)  # with the info, in order
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> ModelName:
        return self.stored.name

    @property
    def draft(self) -> dict[str, Any] | None:
        draft = self.config.get("draft")
        return draft if isinstance(draft, dict) else None

    @property
    def modified_at(self) -> str:
        return rfc3339_local(self.stored.modified)

    def details(self) -> dict[str, Any]:
        """Ollama's ``details`` object, plus ``draft`` when the model has one."""
        cfg = self.config
        info = self.info
        family = cfg.get("model_family") or (info.architecture if info else "")
        details: dict[str, Any] = {
            "parent_model": self.model_layer.from_
            if self.model_layer and self.model_layer.from_
            else "",
            "format": cfg.get("model_format") or "gguf",
            "family": family,
            "families": cfg.get("model_families") or ([family] if family else None),
            "parameter_size": cfg.get("model_type") or (info.parameter_size if info else ""),
            "quantization_level": cfg.get("file_type") or (info.file_type if info else ""),
        }
        if self.draft:
            details["draft"] = dict(self.draft)
        if self.adapters:
            details["adapters"] = [a.from_ or a.digest for a in self.adapters]
        return details

    def adapter_summaries(self) -> list[dict[str, Any]]:
        """Each adapter's layer (digest, file name, size) and, when read, its header facts."""
        out = []
        for i, layer in enumerate(self.adapters):
            entry: dict[str, Any] = {
                "digest": layer.digest,
                "from": layer.from_ or "",
                "size": layer.size,
            }
            if i < len(self.adapter_infos):
                entry.update(adapter_facts(self.adapter_infos[i]).as_dict())
            out.append(entry)
        return out


def rfc3339_local(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().isoformat()


class ModelViews:
    """Builds ModelViews, caching GGUF headers by blob digest (blobs never change)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._infos: dict[str, GGUFInfo] = {}
        self._specials: dict[str, tuple[str, str]] = {}
        self._longest: dict[str, int] = {}
        self._lock = threading.Lock()

    def gguf_info(self, digest: str) -> GGUFInfo:
        with self._lock:
            cached = self._infos.get(digest)
        if cached is not None:
            return cached
        info = read_gguf_info(self.store.blob_path(digest))
        with self._lock:
            if len(self._infos) > 256:
                self._infos.clear()
            self._infos[digest] = info
        return info

    def special_tokens(self, digest: str) -> tuple[str, str]:
        """BOS and EOS token texts of a GGUF (for chat templates that print them)."""
        cached = self._specials.get(digest)
        if cached is not None:
            return cached
        info = self.gguf_info(digest)
        texts, _types = read_tokens(self.store.blob_path(digest))

        def text(i: int | None) -> str:
            return texts[i] if i is not None and 0 <= i < len(texts) else ""

        pair = (text(info.bos_id), text(info.eos_id))
        self._specials[digest] = pair
        self._longest[digest] = max((len(t.encode("utf-8")) for t in texts), default=1) or 1
        return pair

    def max_token_bytes(self, digest: str) -> int:
        """The most bytes one token of this GGUF's vocabulary spells (as llama.cpp's token
        texts count them): a text of n bytes has at least n / this many tokens."""
        if digest not in self._longest:
            self.special_tokens(digest)
        return self._longest[digest]

    def get(self, name: ModelName, *, with_info: bool = True) -> ModelView:
        return self.view(self.store.get(name), with_info=with_info)

    def view(self, stored: StoredModel, *, with_info: bool = True) -> ModelView:
        """DamagedModelError (naming the part and the repair) when a blob of the model is
        missing or mis-sized, or its weights are not a readable GGUF."""
        store = self.store
        manifest = stored.manifest
        check_layers(store, stored.name.display, manifest)
        config = self._json(stored.manifest.config.digest, {})
        if not isinstance(config, dict):
            raise StoreError(f"model '{stored.name.display}': config blob is not a JSON object")

        def last(media: str) -> Layer | None:
            found = manifest.layers_of(media)
            return found[-1] if found else None

        template_layer = last(MEDIA_TEMPLATE) or last(MEDIA_PROMPT)
        system_layer = last(MEDIA_SYSTEM)
        params_layer = last(MEDIA_PARAMS)
        messages_layer = last(MEDIA_MESSAGES)
        model_layer = last(MEDIA_MODEL)
        draft_layer = last(MEDIA_DRAFT)
        params = self._json(params_layer.digest, {}) if params_layer else {}
        messages = self._json(messages_layer.digest, []) if messages_layer else []
        view = ModelView(
            stored=stored,
            config=config,
            model_layer=model_layer,
            draft_layer=draft_layer,
            adapters=manifest.layers_of(MEDIA_ADAPTER),
            projectors=manifest.layers_of(MEDIA_PROJECTOR),
            template=self._text(template_layer.digest) if template_layer else None,
            system=self._text(system_layer.digest) if system_layer else None,
            parameters=params if isinstance(params, dict) else {},
            messages=messages if isinstance(messages, list) else [],
            licenses=[self._text(layer.digest) for layer in manifest.layers_of(MEDIA_LICENSE)],
            model_path=store.blob_path(model_layer.digest) if model_layer else None,
            draft_path=store.blob_path(draft_layer.digest) if draft_layer else None,
            adapter_paths=[store.blob_path(a.digest) for a in manifest.layers_of(MEDIA_ADAPTER)],
            projector_paths=[
                store.blob_path(p.digest) for p in manifest.layers_of(MEDIA_PROJECTOR)
            ],
        )
        if with_info and model_layer is not None:
            view.info = self._header(stored, model_layer)
            if draft_layer is not None:
                view.draft_info = self._header(stored, draft_layer)
            view.adapter_infos = [self._header(stored, a) for a in view.adapters]
        return view

    def _header(self, stored: StoredModel, layer: Layer) -> GGUFInfo:
        """The GGUF facts of a stored blob; one that is no readable GGUF (changed since create
        checked it, or not a GGUF as a registry served it) damages the model."""
        try:
            return self.gguf_info(layer.digest)
        except GGUFError as exc:
            problem = f'its {role(layer)} blob "{layer.digest}" is not a readable GGUF ({exc})'
            raise damaged(stored.name.display, [problem]) from None

    def _text(self, digest: str) -> str:
        return self.store.read_blob_bytes(digest, MAX_TEXT_LAYER).decode("utf-8", "replace")

    def _json(self, digest: str, default: Any) -> Any:
        try:
            return json.loads(self.store.read_blob_bytes(digest, MAX_TEXT_LAYER))
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("blob %s is not valid JSON: %s", digest, exc)
            return default
