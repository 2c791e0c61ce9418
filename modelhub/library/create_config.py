"""The config blob of a new model: the model's facts from its GGUF header, in Ollama's key order."""

from __future__ import annotations

from typing import Any

from modelhub.gguf.info import GGUFInfo

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


def model_config(config: dict[str, Any], info: GGUFInfo) -> dict[str, Any]:
    """``config`` (inherited or empty) with the facts of the model ``info`` describes."""
    config = {k: v for k, v in config.items() if k not in ("architecture", "os")}
    config.update(
        model_format="gguf",
        model_family=info.architecture,
        model_families=[info.architecture],
        model_type=info.parameter_size,
        file_type=info.file_type,
    )
    return config


def ordered_config(config: dict[str, Any]) -> dict[str, Any]:
    """Ollama's key order, placeholders last (they are OCI requirements, not the host)."""
    out = {k: config[k] for k in _CONFIG_KEYS if config.get(k) not in (None, "", [])}
    out.update(
        {k: v for k, v in config.items() if k not in out and k not in ("architecture", "os")}
    )
    out["architecture"] = "amd64"
    out["os"] = "linux"
    return out
