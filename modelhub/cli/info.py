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
        ("GPU offload", "possible" if system.get("gpu_offload") else "not in this build"),
        ("RPC", "compiled in" if system.get("rpc") else "not in this build"),
        ("CPU", f"{system.get('machine', '?')}, {features}"),
        (
            "weight repacking",
            f"{'on' if repack.get('enabled') else 'off'} (setting {repack.get('setting', 'auto')})"
            + (f": {reason}" if reason and reason != "default" else ""),
        ),
        ("build", str(system.get("build", ""))),
    ]
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


def _lines(pairs: list[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in pairs) + 2
    return "".join(f"{key + ':':<{width}}{value}\n" for key, value in pairs)


@click.command("info")
def info() -> None:
    """Show the llama.cpp build, its backends and devices, and the daemon's CPU choices."""
    answer = connect().request_json("GET", "/api/info") or {}
    click.echo(info_text(answer if isinstance(answer, dict) else {}), nl=False)
