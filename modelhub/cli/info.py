"""``modelhub info``: what llama.cpp can do here, and what the daemon chose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from modelhub.cli import render
from modelhub.cli.models import connect


def info_text(answer: Mapping[str, Any]) -> str:
    """The report: one ``key: value`` line each, devices as a table."""
    system: Mapping[str, Any] = answer.get("system") or {}
    repack: Mapping[str, Any] = answer.get("repack") or {}
    offload: Mapping[str, Any] = answer.get("offload") or {}
    pairs = [
        ("modelhub", f"{answer.get('version', '?')} at {answer.get('address', '?')}"),
        ("models", str(answer.get("models_dir", "?"))),
    ]
    if "error" in system:
        pairs.append(("llama.cpp", f"unavailable: {system['error']}"))
        return _lines(pairs)
    reason = str(repack.get("reason") or "")
    features = " ".join(system.get("cpu_features") or []) or "no notable features reported"
    pairs += [
        ("llama-cpp-python", str(system.get("llama_cpp_python", "?"))),
        ("backends", ", ".join(system.get("backends") or []) or "-"),
        ("GPU offload", _offload_text(system)),
        ("RPC", "compiled in" if system.get("rpc") else "not in this build"),
        ("CPU", f"{system.get('machine', '?')}, {features}"),
        (
            "weight repacking",
            f"{'on' if repack.get('enabled') else 'off'} (setting {repack.get('setting', 'auto')})"
            + (f": {reason}" if reason and reason != "default" else ""),
        ),
    ]
    if offload:
        num_gpu = int(offload.get("num_gpu", -1))
        pairs += [
            ("num_gpu", "-1 (as many layers as fit)" if num_gpu < 0 else str(num_gpu)),
            ("RPC workers", ", ".join(offload.get("rpc_servers") or []) or "none"),
            (
                "attention",
                f"flash attention {'on' if offload.get('flash_attention', True) else 'off'}, "
                f"KV cache {offload.get('kv_cache_type', 'auto')}",
            ),
        ]
    pairs.append(("build", str(system.get("build", ""))))
    text = _lines(pairs)
    devices = system.get("devices") or []
    if devices:
        rows = [
            [
                str(d.get("name", "")),
                str(d.get("type", "")),
                str(d.get("description", "")),
                render.format_size(d["memory_free"]) if d.get("memory_total") else "-",
                render.format_size(d["memory_total"]) if d.get("memory_total") else "-",
            ]
            for d in devices
        ]
        table = render.format_table(["DEVICE", "TYPE", "DESCRIPTION", "FREE", "TOTAL"], rows)
        text += "\n" + table
    return text


def _offload_text(system: Mapping[str, Any]) -> str:
    """Whether layers can leave the CPU: a build with a GPU backend may still see no device."""
    if not system.get("gpu_offload"):
        return "not in this build"
    devices = system.get("devices") or []
    targets = [str(d.get("name")) for d in devices if d.get("type") in ("gpu", "igpu")]
    if targets:
        return "possible: " + ", ".join(targets)
    return (
        "compiled in, but no GPU device found (check the driver; llama.cpp hides software "
        "Vulkan devices unless GGML_VK_VISIBLE_DEVICES names them)"
    )


def _lines(pairs: list[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in pairs) + 2
    return "".join(f"{key + ':':<{width}}{value}\n" for key, value in pairs)


@click.command("info")
def info() -> None:
    """Show the llama.cpp build, its backends and devices, and the daemon's CPU choices."""
    answer = connect().request_json("GET", "/api/info") or {}
    click.echo(info_text(answer if isinstance(answer, dict) else {}), nl=False)
