"""Create a model: a CreateRequest becomes layers, a config blob and a manifest.

Everything a request refers to must already be in the store (the CLI uploads local files as
blobs first), so this service never opens a caller-supplied path (SEC-06). The manifest is
written last, only after every layer is stored and verified.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from modelhub.errors import BadRequest, DraftError, GGUFError, ModelhubError, NotFound
from modelhub.gguf.info import GGUFInfo, is_gguf
from modelhub.gguf.pairing import check_draft_pairing, check_mtp_target
from modelhub.library.views import (
    DRAFT_MODEL,
    DRAFT_MTP,
    DRAFT_MTP_DRAFTER,
    DRAFT_NGRAM,
    ModelView,
    ModelViews,
)
from modelhub.modelfile import coerce_option
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
    ModelName,
    Store,
    parse_digest,
    parse_name,
)
from modelhub.templates.gotemplate import parse_template

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]

FLOAT_TYPES = {"F32", "F16", "BF16"}
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


@dataclass
class CreateRequest:
    model: ModelName
    from_: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)
    draft_files: dict[str, str] = field(default_factory=dict)
    draft: str | None = None  # "mtp" | "ngram" | a model name (our DRAFT extension)
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
            raise BadRequest(f"{what}: file path must be relative: {key!r}")
        if not isinstance(digest, str) or not digest:
            raise BadRequest(f"{what}: invalid digest format for {key!r}")
        out[key] = parse_digest(digest)
    return out


def check_request(req: CreateRequest) -> None:
    """Checks that need no store access, done before anything is streamed."""
    if not req.from_ and not req.files:
        raise BadRequest("neither 'from' or 'files' was specified")
    req.files = validate_file_map(req.files, "files")
    req.adapters = validate_file_map(req.adapters, "adapters")
    req.draft_files = validate_file_map(req.draft_files, "draft_files")
    if req.draft_quantize and not req.draft_files:
        raise BadRequest("--draft-quantize requires a DRAFT model file")
    if req.draft_files and req.draft:
        raise BadRequest("give either draft_files or draft, not both")
    if len(req.draft_files) > 1:
        raise BadRequest("only one DRAFT file is supported (split draft GGUFs are not)")
    if len(req.adapters) > 1:
        raise BadRequest("only one adapter is currently supported")
    for key, value in req.parameters.items():
        req.parameters[key] = coerce_option(key, value)
    if req.template:
        parse_template(req.template)  # 400 "template error: ... at line L col C"
    if req.quantize:
        _quant_type(req.quantize)
    if req.draft_quantize:
        _quant_type(req.draft_quantize)


def _quant_type(name: str) -> str:
    from modelhub.gguf.quantize import QUANT_TYPES

    key = name.strip().lower()
    if key not in QUANT_TYPES:
        supported = ", ".join(sorted(k.upper() for k in QUANT_TYPES))
        raise BadRequest(f"unsupported quantization type {name} - supported types are {supported}")
    return key


class Creator:
    def __init__(self, store: Store, views: ModelViews, progress: Progress) -> None:
        self.store = store
        self.views = views
        self.progress = progress
        self.created: set[str] = set()  # digests this request stored for the first time

    def status(self, text: str, **extra: Any) -> None:
        self.progress({"status": text, **extra})

    def run(self, req: CreateRequest) -> None:
        check_request(req)
        layers: list[Layer] = []
        config: dict[str, Any] = {}
        base: ModelView | None = None
        if req.from_:
            base = self._base_from_model(req.from_)
            layers = [layer for layer in base.stored.manifest.layers]
            config = dict(base.config)
        else:
            layers = self._layers_from_files(req.files, MEDIA_MODEL)

        layers = self._apply_adapters(req, layers)
        model_layer = _last(layers, MEDIA_MODEL)
        if model_layer is None:
            raise BadRequest("no base model was found: FROM must name a GGUF model file or model")
        if req.quantize:
            model_layer = self._quantize(model_layer, req.quantize)
            layers = [model_layer if lay.media_type == MEDIA_MODEL else lay for lay in layers]
        target = self.views.gguf_info(model_layer.digest)
        config = self._model_config(config, target)

        layers, config = self._apply_draft(req, layers, config, model_layer, target)
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
        config_layer = self._put_json(_ordered_config(config), MEDIA_CONFIG)
        for layer in layers:
            verb = "creating new" if layer.digest in self.created else "using existing"
            self.status(f"{verb} layer {layer.digest}")
        self.status("writing manifest")
        self.store.write_manifest(req.model, Manifest(config=config_layer, layers=layers))
        self.status("success")

    # -- base -------------------------------------------------------------------------
    def _base_from_model(self, ref: str) -> ModelView:
        return self._stored_model(
            ref,
            "FROM",
            not_a_name="not a model name or uploaded file",
            missing="pull it first or FROM a GGUF file",
        )

    def _stored_model(
        self, ref: str, directive: str, *, not_a_name: str, missing: str
    ) -> ModelView:
        """The stored model ``ref`` names; errors name the directive and what to do instead."""
        try:
            name = parse_name(ref)
        except ModelhubError as exc:
            raise BadRequest(f"{directive} {ref!r}: {not_a_name} ({exc})") from exc
        try:
            return self.views.get(name, with_info=False)
        except NotFound as exc:
            raise NotFound(
                f"{directive} {ref}: model '{name.display}' not found; {missing}"
            ) from exc

    def _layers_from_files(self, files: dict[str, str], media: str) -> list[Layer]:
        layers: list[Layer] = []
        for fname, digest in files.items():
            if not self.store.has_blob(digest):
                raise BadRequest(
                    f"{fname}: blob {digest} not found; "
                    f"upload it first with POST /api/blobs/{digest}"
                )
            path = self.store.blob_path(digest)
            if fname.endswith(".safetensors"):
                raise BadRequest(f"{fname}: safetensors import is not supported; convert to GGUF")
            if not is_gguf(path):
                raise BadRequest(f"{fname}: supplied file was not in GGUF format")
            self.status("parsing GGUF")
            info = self._info(digest, fname)
            if (info.split_count or 1) > 1:
                raise BadRequest(
                    f"{fname}: split GGUF files are not supported; merge the parts first"
                )
            kind = media
            if media == MEDIA_MODEL and info.general_type == "adapter":
                kind = MEDIA_ADAPTER
            elif media == MEDIA_MODEL and info.general_type in ("projector", "mmproj"):
                kind = MEDIA_PROJECTOR
            layers.append(Layer(kind, digest, path.stat().st_size, from_=fname))
        return layers

    def _info(self, digest: str, fname: str) -> GGUFInfo:
        try:
            return self.views.gguf_info(digest)
        except GGUFError as exc:
            raise GGUFError(f"{fname}: {exc}") from exc

    def _apply_adapters(self, req: CreateRequest, layers: list[Layer]) -> list[Layer]:
        if not req.adapters:
            return layers
        new = self._layers_from_files(req.adapters, MEDIA_ADAPTER)
        return [lay for lay in layers if lay.media_type != MEDIA_ADAPTER] + new

    def _model_config(self, config: dict[str, Any], info: GGUFInfo) -> dict[str, Any]:
        config = {k: v for k, v in config.items() if k not in ("architecture", "os")}
        config.update(
            model_format="gguf",
            model_family=info.architecture,
            model_families=[info.architecture],
            model_type=info.parameter_size,
            file_type=info.file_type,
        )
        return config

    # -- quantisation -----------------------------------------------------------------
    def _quantize(self, layer: Layer, qtype: str, *, draft: bool = False) -> Layer:
        from modelhub.gguf.quantize import quantize_gguf

        key = _quant_type(qtype)
        info = self.views.gguf_info(layer.digest)
        requantize = info.file_type.upper() not in FLOAT_TYPES
        if requantize and draft:
            raise BadRequest(
                f"draft quantization requires an unquantized draft model, got {info.file_type}"
            )
        if requantize:
            # Ollama refuses this; we allow it (a requantised copy is a useful speculative
            # target for its quantised self) but say what it means.
            self.status(
                f"warning: requantizing a {info.file_type} model: the {key.upper()} copy keeps "
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
        with tempfile.TemporaryDirectory(dir=self.store.root, prefix=".quantize-") as tmp:
            out = Path(tmp) / "out.gguf"
            quantize_gguf(self.store.blob_path(layer.digest), out, key, allow_requantize=requantize)
            self.status("verifying conversion")
            digest, size = self.store.import_file(out)
        self.created.add(digest)
        return Layer(layer.media_type, digest, size, from_=layer.from_)

    # -- drafts -----------------------------------------------------------------------
    def _apply_draft(
        self,
        req: CreateRequest,
        layers: list[Layer],
        config: dict[str, Any],
        model_layer: Layer,
        target: GGUFInfo,
    ) -> tuple[list[Layer], dict[str, Any]]:
        if not req.draft_files and not req.draft:
            return layers, config  # inherited draft (if any) stays
        layers = [lay for lay in layers if lay.media_type != MEDIA_DRAFT]
        config = {k: v for k, v in config.items() if k != "draft"}
        choice = (req.draft or "").strip()
        if choice.lower() == DRAFT_NGRAM:
            config["draft"] = {"kind": DRAFT_NGRAM}
            return layers, config
        if choice.lower() == DRAFT_MTP:
            check_mtp_target(target)
            config["draft"] = {
                "kind": DRAFT_MTP,
                "architecture": target.architecture,
                "nextn_layers": target.nextn_layers,
            }
            return layers, config

        if req.draft_files:
            ((fname, digest),) = req.draft_files.items()
            (draft_layer,) = self._layers_from_files({fname: digest}, MEDIA_DRAFT)
            if req.draft_quantize:
                draft_layer = self._quantize(draft_layer, req.draft_quantize, draft=True)
        else:
            draft_layer = self._draft_from_model(choice)
        if draft_layer.digest == model_layer.digest:
            raise DraftError(
                "DRAFT is the same file as FROM: a model cannot draft for itself; use a smaller "
                "model with the same tokenizer, `DRAFT mtp` or `DRAFT ngram`"
            )
        draft = self.views.gguf_info(draft_layer.digest)
        kind = DRAFT_MTP_DRAFTER if draft.is_mtp_drafter else DRAFT_MODEL
        report = check_draft_pairing(
            target,
            draft,
            self.store.blob_path(model_layer.digest),
            self.store.blob_path(draft_layer.digest),
        )
        for warning in report.warnings:
            self.status(f"warning: {warning}")
        config["draft"] = {
            "kind": kind,
            "model_format": "gguf",
            "architecture": draft.architecture,
            "parameter_size": draft.parameter_size,
            "file_type": draft.file_type,
        }
        return [*layers, draft_layer], config

    def _draft_from_model(self, ref: str) -> Layer:
        view = self._stored_model(
            ref,
            "DRAFT",
            not_a_name="not mtp, ngram, a file or a model name",
            missing="pull or create it first",
        )
        if view.model_layer is None:
            raise DraftError(f"DRAFT {ref}: model '{view.name.display}' has no GGUF weights")
        layer = view.model_layer
        return Layer(MEDIA_DRAFT, layer.digest, layer.size, from_=view.name.display)

    # -- texts and parameters ---------------------------------------------------------
    def _apply_texts(
        self, req: CreateRequest, layers: list[Layer], base: ModelView | None
    ) -> list[Layer]:
        def replace(media: str, layer: Layer) -> None:
            nonlocal layers
            layers = [lay for lay in layers if lay.media_type != media] + [layer]

        if req.template:
            replace(MEDIA_TEMPLATE, self._put_text(req.template, MEDIA_TEMPLATE))
        if req.system:
            replace(MEDIA_SYSTEM, self._put_text(req.system, MEDIA_SYSTEM))
        for text in req.license:
            if text:
                layers.append(self._put_text(text, MEDIA_LICENSE))
        if req.parameters:
            merged = dict(base.parameters) if base else {}
            merged.update(req.parameters)
            replace(MEDIA_PARAMS, self._put_json(merged, MEDIA_PARAMS))
        if req.messages:
            msgs = [_clean_message(m, i) for i, m in enumerate(req.messages)]
            replace(MEDIA_MESSAGES, self._put_json(msgs, MEDIA_MESSAGES))
        return layers

    def _put_text(self, text: str, media: str) -> Layer:
        return self._put(text.encode("utf-8"), media)

    def _put_json(self, value: Any, media: str) -> Layer:
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return self._put(data, media)

    def _put(self, data: bytes, media: str) -> Layer:
        existed = self.store.has_blob("sha256:" + hashlib.sha256(data).hexdigest())
        digest, size = self.store.put_bytes(data)
        if not existed:
            self.created.add(digest)
        return Layer(media, digest, size)


def _clean_message(msg: Any, index: int) -> dict[str, Any]:
    if not isinstance(msg, dict) or not isinstance(msg.get("content", ""), str):
        raise BadRequest(f"messages[{index}]: expected an object with role and content")
    role = str(msg.get("role", "")).lower()
    if role not in ("system", "user", "assistant", "tool"):
        raise BadRequest(f"messages[{index}]: role must be system, user, assistant or tool")
    return {"role": role, "content": msg.get("content", "")}


def _last(layers: list[Layer], media: str) -> Layer | None:
    found = [lay for lay in layers if lay.media_type == media]
    return found[-1] if found else None


_CONFIG_KEYS = [
    "model_format",
    "model_family",
    "model_families",
    "model_type",
    "file_type",
    "renderer",
    "parser",
    "requires",
    "draft",
]


def _ordered_config(config: dict[str, Any]) -> dict[str, Any]:
    """Ollama's key order, placeholders last (they are OCI requirements, not the host)."""
    out = {k: config[k] for k in _CONFIG_KEYS if config.get(k) not in (None, "", [])}
    out.update(
        {k: v for k, v in config.items() if k not in out and k not in ("architecture", "os")}
    )
    out["architecture"] = "amd64"
    out["os"] = "linux"
    return out
