"""Vision/audio projector (mmproj) GGUFs: what they are, and whether one fits a model.

A projector is a GGUF of architecture ``clip`` (``general.type`` ``mmproj`` or ``projector``).
Its output width (the embeddings it hands the text model) must be the model's embedding width,
and its projector type one that llama.cpp's libmtmd knows; ``create`` checks both with
:func:`check_projector`, before anything is written, so a mismatch is an error at create time
and not at the first image.
"""

from __future__ import annotations

from typing import Any

from modelhub.errors import InputError
from modelhub.gguf.info import GGUFInfo

# projector types of the libmtmd that llama-cpp-python 0.3.36 ships (clip-impl.h)
KNOWN_TYPES = frozenset(
    [
        "mlp",
        "mlp_norm",
        "ldp",
        "ldpv2",
        "resampler",
        "adapter",
        "qwen2vl_merger",
        "qwen2.5vl_merger",
        "qwen3vl_merger",
        "step3vl",
        "gemma3",
        "gemma3nv",
        "gemma3na",
        "gemma4v",
        "gemma4a",
        "phi4",
        "idefics3",
        "pixtral",
        "ultravox",
        "internvl",
        "llama4",
        "qwen2a",
        "qwen3a",
        "glma",
        "qwen2.5o",
        "voxtral",
        "meralion",
        "musicflamingo",
        "lfm2",
        "kimivl",
        "paddleocr",
        "lightonocr",
        "cogvlm",
        "janus_pro",
        "dots_ocr",
        "deepseekocr",
        "lfm2a",
        "glm4v",
        "youtuvl",
        "yasa2",
        "kimik25",
        "nemotron_v2_vl",
        "hunyuanocr",
        "hunyuanvl",
        "parakeet",
        "gemma4ua",
        "granite_speech",
        "dots3note_a",
        "mimo_audio",
    ]
)
# the types libmtmd's ``init_audio`` takes audio input with (speech and sound encoders; not the
# speaker encoders of its text-to-speech models)
AUDIO_TYPES = frozenset(
    [
        "ultravox",
        "qwen2a",
        "qwen3a",
        "glma",
        "qwen2.5o",
        "voxtral",
        "meralion",
        "musicflamingo",
        "lfm2a",
        "gemma4a",
        "gemma4ua",
        "granite_speech",
        "parakeet",
        "dots3note_a",
        "mimo_audio",
    ]
)
# the types whose positions are M-RoPE (Qwen-VL family): the engine does not place them yet
MROPE_TYPES = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "qwen2.5o"})


def is_projector(info: GGUFInfo) -> bool:
    return info.architecture == "clip" or info.general_type in ("projector", "mmproj")


def projector_type(info: GGUFInfo, modality: str = "vision") -> str | None:
    value = info.kv.get(f"clip.{modality}.projector_type") or info.kv.get("clip.projector_type")
    return str(value) if value is not None else None


def has_vision(info: GGUFInfo) -> bool:
    return bool(info.kv.get("clip.has_vision_encoder"))


def has_audio(info: GGUFInfo) -> bool:
    """An audio encoder of a type libmtmd takes audio input with."""
    return bool(info.kv.get("clip.has_audio_encoder")) and (
        projector_type(info, "audio") in AUDIO_TYPES
    )


def output_width(info: GGUFInfo) -> int | None:
    """The width of the embeddings it produces: ``projection_dim`` as converters write it, or
    the last projection matrix's rows (``mm.2.weight`` for LLaVA-style MLPs)."""
    for key in ("clip.vision.projection_dim", "clip.audio.projection_dim"):
        value = info.kv.get(key)
        if isinstance(value, int) and value > 0:
            return value
    for tensor in info.tensors:
        if tensor.name in ("mm.2.weight", "mm.model.fc.weight", "mm.input_projection.weight"):
            return int(tensor.shape[-1]) if tensor.shape else None
    return None


def check_projector(model: GGUFInfo, projector: GGUFInfo, name: str) -> None:
    """Refuse a projector that cannot serve ``model`` (``name`` is its file, for the error)."""
    for modality in ("vision", "audio"):
        kind = projector_type(projector, modality)
        if kind is not None and kind not in KNOWN_TYPES:
            raise InputError(
                f"projector {name}: projector type {kind!r} is not known to this llama.cpp"
            )
    width = output_width(projector)
    if width is not None and model.embedding_length and width != model.embedding_length:
        raise InputError(
            f"projector {name} produces embeddings of width {width} but the model's embedding "
            f"width is {model.embedding_length}: this projector belongs to another model"
        )


def projector_info(info: GGUFInfo) -> dict[str, Any]:
    """``projector_info`` of ``/api/show``, as Ollama prints it: the header's ``clip.*`` and
    ``general.architecture``/``general.parameter_count`` keys."""
    out: dict[str, Any] = {
        "general.architecture": info.architecture,
        "general.parameter_count": info.parameter_count,
    }
    for key, value in info.kv.items():
        if key.startswith("clip.") and not isinstance(value, list):
            out[key] = value
    return out


def capabilities_of(info: GGUFInfo) -> list[str]:
    """``vision`` and/or ``audio``, when this projector can serve them here."""
    if projector_type(info) in MROPE_TYPES:
        return []
    return [c for c, has in (("vision", has_vision(info)), ("audio", has_audio(info))) if has]
