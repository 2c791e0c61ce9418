"""`ps` (what is loaded, and how it drafts) and `stop MODEL` (unload it now)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import click

from modelhub.cli import render
from modelhub.cli.models import connect
from modelhub.errors import NotFoundError

PS_HEADERS = ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "DRAFT"]


def processor_text(size: Any, size_vram: Any) -> str:
    """Where the model's memory is: ``100% CPU``, ``100% GPU``, ``48%/52% CPU/GPU``."""
    total = size if isinstance(size, int | float) else 0
    vram = size_vram if isinstance(size_vram, int | float) else 0
    if vram <= 0:
        return "100% CPU"
    if total <= 0 or vram > total:
        return "Unknown"
    if vram == total:
        return "100% GPU"
    gpu = round(vram / total * 100)
    return f"{100 - gpu}%/{gpu}% CPU/GPU"


def until_text(expires_at: Any, now: datetime) -> str:
    """When the model unloads: ``4 minutes from now``, ``Forever``, or ``Stopping...``."""
    moment = render.parse_timestamp(str(expires_at or ""))
    if moment is None or moment.year <= 1:
        return "-"
    if moment <= now:
        return "Stopping..."
    return render.format_relative_time(moment, now)


def draft_text(draft: Any) -> str:
    """The DRAFT column: ``draft_model ≤4`` (adaptive, at most 4), ``ngram =8`` (always 8:
    ``draft_adaptive false``), ``mtp``, ``auto`` (with the drafter that drafted last:
    ``auto: ngram``), then the acceptance since the load (``82%``), or ``-`` without drafting."""
    if not isinstance(draft, Mapping) or not draft.get("kind"):
        return "-"
    bound = draft.get("draft_num_predict")
    kind = str(draft["kind"])
    if kind == "auto":
        text = f"auto: {draft['in_use']}" if draft.get("in_use") else "auto"
    elif isinstance(bound, int) and not isinstance(bound, bool):
        text = f"{kind} {'=' if draft.get('adaptive') is False else '≤'}{bound}"
    else:
        text = kind
    acceptance = draft.get("acceptance")
    if isinstance(acceptance, int | float) and not isinstance(acceptance, bool):
        text += f" {acceptance:.0%}"
    return text


def ps_table(models: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The `ps` table: Ollama's columns and DRAFT."""
    rows = []
    for model in models:
        size = model.get("size")
        context = model.get("context_length")
        rows.append(
            [
                str(model.get("name") or model.get("model") or ""),
                render.short_digest(str(model.get("digest", ""))),
                render.format_size(size) if isinstance(size, int | float) and size > 0 else "-",
                processor_text(size, model.get("size_vram")),
                str(context) if isinstance(context, int) and context > 0 else "-",
                until_text(model.get("expires_at"), now),
                draft_text(model.get("draft")),
            ]
        )
    return render.format_table(PS_HEADERS, rows)


@click.command("ps")
@click.argument("prefix", required=False)
def ps(prefix: str | None) -> None:
    """List loaded models (optionally only those whose name starts with PREFIX)."""
    answer = connect().request_json("GET", "/api/ps") or {}
    models: list[Any] = list(answer.get("models") or []) if isinstance(answer, dict) else []
    if prefix:
        models = render.filter_by_prefix(models, prefix)
    click.echo(ps_table(models, datetime.now(UTC)), nl=False)
    if any(isinstance(m, Mapping) and m.get("repack") is False for m in models):
        click.echo(
            "Note: weights are not repacked for this CPU (`modelhub info` says why); "
            "generation may be slower than with repacking."
        )


@click.command("stop")
@click.argument("model")
def stop(model: str) -> None:
    """Unload MODEL now (a model that is not loaded is left as it is)."""
    client = connect()
    try:
        client.request_json("POST", "/api/generate", {"model": model, "keep_alive": 0})
    except NotFoundError:
        raise NotFoundError(f'couldn\'t find model "{model}" to stop') from None
