"""Layers for a new model: stored blobs checked and typed as GGUF layers, small text and JSON
layers written to the store, and a model layer quantized into a new blob.

:class:`LayerBuilder` also remembers which digests the request stored for the first time, so
the progress stream can say "creating new layer" rather than "using existing layer".
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from modelhub.errors import GGUFError, InputError, ModelhubError, NotFoundError
from modelhub.gguf.info import GGUFInfo, is_gguf
from modelhub.gguf.projector import is_projector
from modelhub.library.create_request import quant_type
from modelhub.library.views import ModelView, ModelViews
from modelhub.pull.base import Progress, ProgressEvent
from modelhub.store import (
    MEDIA_ADAPTER,
    MEDIA_MODEL,
    MEDIA_PROJECTOR,
    Layer,
    Store,
    parse_name,
)

FLOAT_TYPES = {"F32", "F16", "BF16"}


class LayerBuilder:
    def __init__(self, store: Store, views: ModelViews, progress: Progress) -> None:
        self.store = store
        self.views = views
        self.progress = progress
        self.created: set[str] = set()  # digests this request stored for the first time

    def status(
        self,
        text: str,
        *,
        digest: str | None = None,
        total: int | None = None,
        completed: int | None = None,
    ) -> None:
        self.progress(ProgressEvent(text, digest, total, completed))

    def warn(self, text: str) -> None:
        """A warning in the stream (its own field; the status reads ``warning: <text>``)."""
        self.progress(ProgressEvent.warn(text))

    def stored_model(self, ref: str, directive: str, *, not_a_name: str, missing: str) -> ModelView:
        """The stored model ``ref`` names; errors name the directive and what to do instead."""
        try:
            name = parse_name(ref)
        except ModelhubError as exc:
            raise InputError(f"{directive} {ref!r}: {not_a_name} ({exc})") from exc
        try:
            return self.views.get(name, with_info=False)
        except NotFoundError as exc:
            raise NotFoundError(
                f"{directive} {ref}: model '{name.display}' not found; {missing}"
            ) from exc

    def layers_from_files(self, files: dict[str, str], media: str) -> list[Layer]:
        layers: list[Layer] = []
        for fname, digest in files.items():
            if not self.store.has_blob(digest):
                raise InputError(
                    f"{fname}: blob {digest} not found; "
                    f"upload it first with POST /api/blobs/{digest}"
                )
            path = self.store.blob_path(digest)
            if fname.endswith(".safetensors"):
                raise InputError(f"{fname}: safetensors import is not supported; convert to GGUF")
            if not is_gguf(path):
                raise InputError(f"{fname}: supplied file was not in GGUF format")
            self.status("parsing GGUF")
            info = self._info(digest, fname)
            if (info.split_count or 1) > 1:
                raise InputError(
                    f"{fname}: split GGUF files are not supported; merge the parts first"
                )
            kind = media
            if media == MEDIA_MODEL and info.general_type == "adapter":
                kind = MEDIA_ADAPTER
            elif media == MEDIA_MODEL and is_projector(info):
                kind = MEDIA_PROJECTOR
            layers.append(Layer(kind, digest, path.stat().st_size, from_=fname))
        return layers

    def _info(self, digest: str, fname: str) -> GGUFInfo:
        try:
            return self.views.gguf_info(digest)
        except GGUFError as exc:
            raise GGUFError(f"{fname}: {exc}") from exc

    # -- quantisation -----------------------------------------------------------------
    def quantize(self, layer: Layer, qtype: str, *, draft: bool = False) -> Layer:
        from modelhub.gguf.quantize import quantize_gguf

        key = quant_type(qtype)
        info = self.views.gguf_info(layer.digest)
        requantize = info.file_type.upper() not in FLOAT_TYPES
        if requantize and draft:
            raise InputError(
                f"draft quantization requires an unquantized draft model, got {info.file_type}"
            )
        if requantize:
            # Ollama refuses this; we allow it (a requantised copy is a useful speculative
            # target for its quantised self) but say what it means.
            self.warn(
                f"requantizing a {info.file_type} model: the {key.upper()} copy keeps "
                f"the rounding of {info.file_type} (quantize from F16/BF16/F32 for full quality)"
            )
        if info.file_type.upper() == key.upper():
            return layer
        self.status(
            f"quantizing {info.file_type} model to {key.upper()}",
            digest="0" * 19,
            total=layer.size,
            completed=0,
        )
        with self.store.work_dir("quantize") as tmp:
            out = tmp / "out.gguf"
            quantize_gguf(self.store.blob_path(layer.digest), out, key, allow_requantize=requantize)
            self.status("verifying conversion")
            digest, size = self.store.import_file(out)
        self.created.add(digest)
        return Layer(layer.media_type, digest, size, from_=layer.from_)

    # -- small layers -----------------------------------------------------------------
    def put_text(self, text: str, media: str) -> Layer:
        return self._put(text.encode("utf-8"), media)

    def put_json(self, value: Any, media: str) -> Layer:
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return self._put(data, media)

    def _put(self, data: bytes, media: str) -> Layer:
        existed = self.store.has_blob("sha256:" + hashlib.sha256(data).hexdigest())
        digest, size = self.store.put_bytes(data)
        if not existed:
            self.created.add(digest)
        return Layer(media, digest, size)
