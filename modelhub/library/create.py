"""Create a model: a CreateRequest becomes layers, a config blob and a manifest.

Everything a request refers to must already be in the store (the CLI uploads local files as
blobs first), so this service never opens a caller-supplied path (SEC-06). The manifest is
written last, only after every layer is stored and verified.

:class:`Creator` runs the steps; the request and its checks are in
:mod:`~modelhub.library.create_request`, layer building and quantizing in
:mod:`~modelhub.library.create_layers`, the draft in :mod:`~modelhub.library.create_draft` and
the config blob in :mod:`~modelhub.library.create_config`.
"""

from __future__ import annotations

import logging
from typing import Any

from modelhub.errors import InputError
from modelhub.gguf.adapter import check_adapter, exactness_warning
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.projector import check_projector
from modelhub.library.create_config import model_config, ordered_config
from modelhub.library.create_draft import apply_draft
from modelhub.library.create_layers import FLOAT_TYPES, LayerBuilder
from modelhub.library.create_request import (
    CreateRequest,
    check_request,
    clean_message,
    validate_file_map,
)
from modelhub.library.views import ModelView
from modelhub.pull.base import Progress, ProgressEvent
from modelhub.store import (
    MEDIA_ADAPTER,
    MEDIA_CONFIG,
    MEDIA_DRAFT,
    MEDIA_LICENSE,
    MEDIA_MESSAGES,
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_PROJECTOR,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    Layer,
    Manifest,
)

__all__ = [
    "FLOAT_TYPES",
    "CreateRequest",
    "Creator",
    "Progress",
    "ProgressEvent",
    "check_request",
    "validate_file_map",
]

log = logging.getLogger(__name__)

# Layer order as Ollama writes it: weights first, then texts and parameters.
_ORDER = [
    MEDIA_MODEL,
    MEDIA_PROJECTOR,
    MEDIA_ADAPTER,
    MEDIA_DRAFT,
    MEDIA_TEMPLATE,
    MEDIA_SYSTEM,
    MEDIA_LICENSE,
    MEDIA_PARAMS,
    MEDIA_MESSAGES,
]


class Creator(LayerBuilder):
    def run(self, req: CreateRequest) -> None:
        check_request(req)
        layers: list[Layer] = []
        config: dict[str, Any] = {}
        base: ModelView | None = None
        if req.from_:
            base = self._base_from_model(req.from_)
            layers = [layer for layer in base.stored.manifest.layers]
            config = dict(base.config)
            if req.files:  # FROM <model name> with FROM <projector file>: replaces its projector
                added = self.layers_from_files(req.files, MEDIA_MODEL)
                if any(lay.media_type != MEDIA_PROJECTOR for lay in added):
                    raise InputError("FROM a model name takes only projector files beside it")
                layers = [lay for lay in layers if lay.media_type != MEDIA_PROJECTOR] + added
        else:
            layers = self.layers_from_files(req.files, MEDIA_MODEL)

        layers = self._apply_adapters(req, layers)
        model_layer = _last(layers, MEDIA_MODEL)
        if model_layer is None:
            raise InputError("no base model was found: FROM must name a GGUF model file or model")
        self._check_adapters(layers, self.views.gguf_info(model_layer.digest))  # before quantizing
        for layer in layers:
            if layer.media_type == MEDIA_PROJECTOR:
                self.status("checking projector")
                info = self.views.gguf_info(layer.digest)
                check_projector(self.views.gguf_info(model_layer.digest), info, layer.from_ or "")
        if req.quantize:
            model_layer = self.quantize(model_layer, req.quantize)
            layers = [model_layer if lay.media_type == MEDIA_MODEL else lay for lay in layers]
        target = self.views.gguf_info(model_layer.digest)
        config = model_config(config, target)

        layers, config = apply_draft(self, req, layers, config, model_layer, target)
        layers = self._apply_texts(req, layers, base)
        for key in ("requires", "renderer", "parser"):
            value = getattr(req, key)
            if value:
                config[key] = value

        layers = sorted(
            layers,
            key=lambda lay: (
                _ORDER.index(lay.media_type) if lay.media_type in _ORDER else len(_ORDER)
            ),
        )
        config_layer = self.put_json(ordered_config(config), MEDIA_CONFIG)
        for layer in layers:
            verb = "creating new" if layer.digest in self.created else "using existing"
            self.status(f"{verb} layer {layer.digest}")
        self.status("writing manifest")
        self.store.write_manifest(req.model, Manifest(config=config_layer, layers=layers))
        self.status("success")

    # -- base -------------------------------------------------------------------------
    def _base_from_model(self, ref: str) -> ModelView:
        return self.stored_model(
            ref,
            "FROM",
            not_a_name="not a model name or uploaded file",
            missing="pull it first or FROM a GGUF file",
        )

    def _apply_adapters(self, req: CreateRequest, layers: list[Layer]) -> list[Layer]:
        if not req.adapters:
            return layers
        new = self.layers_from_files(req.adapters, MEDIA_ADAPTER)
        return [lay for lay in layers if lay.media_type != MEDIA_ADAPTER] + new

    def _check_adapters(self, layers: list[Layer], target: GGUFInfo) -> None:
        """Every adapter (new or inherited) must fit the base, as llama.cpp will apply it."""
        for layer in layers:
            if layer.media_type == MEDIA_ADAPTER:
                self.status("checking adapter")
                name = layer.from_ or layer.digest
                info = self._info(layer.digest, name)
                check_adapter(target, info, name)
                if (warning := exactness_warning(info)) is not None:
                    self.warn(f"ADAPTER {name}: {warning}")

    # -- texts and parameters ---------------------------------------------------------
    def _apply_texts(
        self, req: CreateRequest, layers: list[Layer], base: ModelView | None
    ) -> list[Layer]:
        def replace(media: str, layer: Layer) -> None:
            nonlocal layers
            layers = [lay for lay in layers if lay.media_type != media] + [layer]

        if req.template:
            replace(MEDIA_TEMPLATE, self.put_text(req.template, MEDIA_TEMPLATE))
        if req.system:
            replace(MEDIA_SYSTEM, self.put_text(req.system, MEDIA_SYSTEM))
        for text in req.license:
            if text:
                layers.append(self.put_text(text, MEDIA_LICENSE))
        if req.parameters:
            merged = dict(base.parameters) if base else {}
            merged.update(req.parameters)
            replace(MEDIA_PARAMS, self.put_json(merged, MEDIA_PARAMS))
        if req.messages:
            msgs = [clean_message(m, i) for i, m in enumerate(req.messages)]
            replace(MEDIA_MESSAGES, self.put_json(msgs, MEDIA_MESSAGES))
        return layers


def _last(layers: list[Layer], media: str) -> Layer | None:
    found = [lay for lay in layers if lay.media_type == media]
    return found[-1] if found else None
