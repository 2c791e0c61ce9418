"""The draft of a new model: ``DRAFT auto``, ``DRAFT none``, ``DRAFT ngram``, ``DRAFT mtp``, a
draft GGUF file (optionally quantized) or a stored model's weights, checked against the target
and recorded as a draft layer plus the ``draft`` entry of the config blob. A drafter a pull
attached (``CreateRequest.draft_sidecar``) is recorded as one of ``auto``'s candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelhub.errors import DraftError
from modelhub.gguf.info import GGUFInfo
from modelhub.gguf.pairing import PairingReport, check_draft_pairing, check_mtp_target
from modelhub.library.create_layers import LayerBuilder
from modelhub.library.create_request import CreateRequest
from modelhub.library.views import (
    DRAFT_AUTO,
    DRAFT_DFLASH,
    DRAFT_EAGLE3,
    DRAFT_MODEL,
    DRAFT_MTP,
    DRAFT_MTP_DRAFTER,
    DRAFT_NGRAM,
    DRAFT_NONE,
)
from modelhub.store import MEDIA_DRAFT, Layer


def apply_draft(
    builder: LayerBuilder,
    req: CreateRequest,
    layers: list[Layer],
    config: dict[str, Any],
    model_layer: Layer,
    target: GGUFInfo,
) -> tuple[list[Layer], dict[str, Any]]:
    """``layers`` and ``config`` with the request's draft in place of any inherited one."""
    if not req.draft_files and not req.draft:
        return layers, config  # inherited draft (if any) stays
    layers = [lay for lay in layers if lay.media_type != MEDIA_DRAFT]
    config = {k: v for k, v in config.items() if k != "draft"}
    choice = (req.draft or "").strip()
    if choice.lower() in (DRAFT_AUTO, DRAFT_NONE):
        config["draft"] = {"kind": choice.lower()}
        return layers, config
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
        (draft_layer,) = builder.layers_from_files({fname: digest}, MEDIA_DRAFT)
        if req.draft_quantize:
            draft_layer = builder.quantize(draft_layer, req.draft_quantize, draft=True)
    else:
        draft_layer = _draft_from_model(builder, choice)
    if draft_layer.digest == model_layer.digest:
        raise DraftError(
            "DRAFT is the same file as FROM: a model cannot draft for itself; use a smaller "
            "model with the same tokenizer, `DRAFT mtp` or `DRAFT ngram`"
        )
    draft = builder.views.gguf_info(draft_layer.digest)
    kind = _draft_kind(draft)
    target_path = builder.store.blob_path(model_layer.digest)
    draft_path = builder.store.blob_path(draft_layer.digest)
    shown = next(iter(req.draft_files), None) if req.draft_files else choice
    try:
        report = _check_pairing(kind, target, draft, target_path, draft_path)
    except DraftError as exc:  # the checks name blobs; say which DRAFT line they are about
        raise DraftError(f"DRAFT {shown}: {exc}") from None
    for warning in report.warnings:
        builder.warn(warning)
    config["draft"] = {
        "kind": kind,
        "model_format": "gguf",
        "architecture": draft.architecture,
        "parameter_size": draft.parameter_size,
        "file_type": draft.file_type,
    }
    if req.draft_sidecar:
        config["draft"]["sidecar"] = True
    return [*layers, draft_layer], config


def _check_pairing(
    kind: str, target: GGUFInfo, draft: GGUFInfo, target_path: Path, draft_path: Path
) -> PairingReport:
    if kind in (DRAFT_EAGLE3, DRAFT_DFLASH):
        from modelhub.gguf.info import read_gguf_info
        from modelhub.gguf.pairing_layers import check_dflash_pairing, check_eagle3_pairing

        check = check_eagle3_pairing if kind == DRAFT_EAGLE3 else check_dflash_pairing
        # these end with the tokenizer comparison of check_draft_pairing
        return check(
            read_gguf_info(target_path, with_tokens=True),
            read_gguf_info(draft_path, with_tokens=True),
        )
    return check_draft_pairing(target, draft, target_path, draft_path)


def _draft_kind(draft: GGUFInfo) -> str:
    """What a draft file is, from its architecture: the drafter that will read it."""
    if draft.architecture == "eagle3":
        return DRAFT_EAGLE3
    if draft.architecture == "dflash":
        return DRAFT_DFLASH
    return DRAFT_MTP_DRAFTER if draft.is_mtp_drafter else DRAFT_MODEL


def _draft_from_model(builder: LayerBuilder, ref: str) -> Layer:
    view = builder.stored_model(
        ref,
        "DRAFT",
        not_a_name="not auto, none, mtp, ngram, a file or a model name",
        missing="pull or create it first",
    )
    if view.model_layer is None:
        raise DraftError(f"DRAFT {ref}: model '{view.name.display}' has no GGUF weights")
    layer = view.model_layer
    return Layer(MEDIA_DRAFT, layer.digest, layer.size, from_=view.name.display)
