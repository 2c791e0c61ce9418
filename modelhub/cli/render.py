"""Plain-text rendering for the CLI: sizes, relative times, tables and the `show` summary.

Output follows Ollama's CLI so that scripts written against it keep working: borderless
left-aligned tables with a four-space gap, decimal sizes, "2 days ago"-style times.
Everything here is a pure function of its inputs (``now`` is a parameter) so it can be tested.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

COLUMN_GAP = 4
_SIZE_UNITS = (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("KB", 1000))
# Beyond this a deadline is shown as "Forever" (a keep_alive of -1 becomes a date far ahead).
_FOREVER_SECONDS = 20 * 365 * 24 * 3600


def format_size(size: int | float) -> str:
    """Decimal size as Ollama prints it: ``4.7 GB``, ``637 MB``, ``2 GB``, ``512 B``."""
    if size < 0 or math.isnan(size):
        return "-"
    for unit, factor in _SIZE_UNITS:
        if size >= factor:
            value = size / factor
            if value >= 10 or value == math.trunc(value):
                return f"{math.trunc(value)} {unit}"
            return f"{value:.1f} {unit}"
    return f"{int(size)} B"


def format_duration_words(seconds: float) -> str:
    """A duration in words: ``Less than a second``, ``About a minute``, ``3 days``."""
    whole_seconds = int(seconds)
    if whole_seconds < 1:
        return "Less than a second"
    if whole_seconds == 1:
        return "1 second"
    if whole_seconds < 60:
        return f"{whole_seconds} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)  # rounded, so 1h40m reads "2 hours"
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // (24 * 7)} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // (24 * 30)} months"
    return f"{int(seconds / 3600) // (24 * 365)} years"


def parse_timestamp(text: str) -> datetime | None:
    """RFC 3339 as the API sends it (``Z`` or an offset, up to nanoseconds); None if unreadable."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def format_relative_time(when: datetime | str | None, now: datetime, *, zero: str = "Never") -> str:
    """``2 days ago`` / ``4 minutes from now`` / ``Forever``; ``zero`` when the time is unknown."""
    moment = parse_timestamp(when) if isinstance(when, str) else when
    if moment is None or moment.year <= 1:
        return zero
    delta = (now - moment).total_seconds()
    if delta >= 0:
        return f"{format_duration_words(delta)} ago"
    if -delta > _FOREVER_SECONDS:
        return "Forever"
    return f"{format_duration_words(-delta)} from now"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "") -> str:
    """Left-aligned columns separated by four spaces, no borders, no trailing spaces."""
    all_rows = [list(headers), *[list(row) for row in rows]] if headers else [list(r) for r in rows]
    if not all_rows:
        return ""
    widths = [0] * max(len(row) for row in all_rows)
    for row in all_rows:
        for index, cell in enumerate(row):
            widths[index] = max(widths[index], len(cell))
    lines = []
    for row in all_rows:
        cells = [cell.ljust(widths[index] + COLUMN_GAP) for index, cell in enumerate(row)]
        lines.append((indent + "".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def short_digest(digest: str) -> str:
    """First 12 hex characters of a digest, with or without its ``sha256:`` prefix."""
    return digest.split(":", 1)[-1][:12]


def list_table(models: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The `list` table: NAME, ID, SIZE, MODIFIED, and STATE when a model is damaged (each
    damaged model's ``damage`` then follows the table)."""
    damaged = [m for m in models if m.get("state") == "damaged"]
    rows = []
    for model in models:
        size = model.get("size")
        row = [
            _model_name(model),
            short_digest(str(model.get("digest", ""))),
            format_size(size) if isinstance(size, int | float) and size > 0 else "-",
            format_relative_time(str(model.get("modified_at", "")), now),
        ]
        rows.append([*row, str(model.get("state") or "ok")] if damaged else row)
    headers = ["NAME", "ID", "SIZE", "MODIFIED", *(["STATE"] if damaged else [])]
    notes = "".join(f"\n{m.get('damage') or 'damaged'}\n" for m in damaged)
    return format_table(headers, rows) + notes


def filter_by_prefix(models: Sequence[Mapping[str, Any]], prefix: str) -> list[Mapping[str, Any]]:
    """Models whose display name starts with ``prefix``, compared case-insensitively."""
    wanted = prefix.lower()
    return [m for m in models if _model_name(m).lower().startswith(wanted)]


def _model_name(model: Mapping[str, Any]) -> str:
    return str(model.get("name") or model.get("model") or "")


def format_number(count: int | float) -> str:
    """Large counts the way model cards write them: ``135M``, ``3.2B``, ``1.5K``."""
    for suffix, factor in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= factor:
            value = count / factor
            text = f"{value:.1f}".rstrip("0").rstrip(".") if value < 100 else f"{value:.0f}"
            return f"{text}{suffix}"
    return str(int(count))


def _first_lines(text: str, limit: int = 2) -> list[str]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [*lines[:limit], "..."] if len(lines) > limit else lines


def _section(title: str, rows: Sequence[Sequence[str]]) -> str:
    return f"  {title}\n" + format_table([], rows, indent="    ")


def _value_text(value: Any, *, max_items: int | None = None) -> str:
    """A metadata value on one line; lists longer than ``max_items`` are cut (a real
    vocabulary has 50,000 to 260,000 tokens)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        shown = value if max_items is None else value[:max_items]
        items = [_value_text(item) for item in shown]
        if len(shown) < len(value):
            items.append(f"... ({len(value)} items)")
        return "[" + ", ".join(items) + "]"
    return str(value)


_LENGTH_ROWS = (("context length", "context_length"), ("embedding length", "embedding_length"))


def _model_rows(info: Mapping[str, Any]) -> list[list[str]]:
    details: Mapping[str, Any] = info.get("details") or {}
    model_info: Mapping[str, Any] = info.get("model_info") or {}
    arch = str(model_info.get("general.architecture") or details.get("family") or "")
    rows: list[list[str]] = []
    if arch:
        rows.append(["architecture", arch])
    count = model_info.get("general.parameter_count")
    if details.get("parameter_size"):  # the daemon's own rounding, as `list` and the API show it
        rows.append(["parameters", str(details["parameter_size"])])
    elif isinstance(count, int | float) and count > 0:
        rows.append(["parameters", format_number(count)])
    for label, key in (
        ("context length", "context_length"),
        ("embedding length", "embedding_length"),
    ):
        value = model_info.get(f"{arch}.{key}", details.get(key))
        if value:
            rows.append([label, str(value)])
    if details.get("quantization_level"):
        rows.append(["quantization", str(details["quantization_level"])])
    if info.get("requires"):
        rows.append(["requires", str(info["requires"])])
    return rows


# Keys of the draft summary in display order, with labels; other keys follow as they come.
_DRAFT_LABELS = {
    "kind": "kind",
    "from": "from",
    "architecture": "architecture",
    "parameter_size": "parameters",
    "file_type": "quantization",
    "quantization_level": "quantization",
    "size": "size",
    "nextn_layers": "nextn layers",
    "draft_num_predict": "draft_num_predict",
    "draft_min": "draft_min",
    "draft_p_min": "draft_p_min",
    "draft_adaptive": "draft_adaptive",
}
_DRAFT_HIDDEN = frozenset({"model_format", "digest"})


def _draft_value(key: str, value: Any) -> str:
    if key == "size" and isinstance(value, int | float):
        return format_size(value)
    return _value_text(value)


def _draft_rows(draft: Mapping[str, Any]) -> list[list[str]]:
    present = {k: v for k, v in draft.items() if v not in (None, "", [], {})}
    rows = [
        [label, _draft_value(key, present[key])]
        for key, label in _DRAFT_LABELS.items()
        if key in present
    ]
    rows += [
        [key.replace("_", " "), _value_text(value)]
        for key, value in present.items()
        if key not in _DRAFT_LABELS and key not in _DRAFT_HIDDEN
    ]
    return rows


_MODE_TEXT = {
    "auto": "auto (the drafter is chosen by measurement)",
    "fixed": "the Modelfile's DRAFT",
    "none": "off",
}


def drafting_rows(drafting: Mapping[str, Any]) -> list[list[str]]:
    """``show``'s ``drafting``: the mode, the drafters, the one in use and the evidence."""
    mode = str(drafting.get("mode") or "")
    rows = [["mode", _MODE_TEXT.get(mode, mode)]]
    for d in drafting.get("drafters") or []:
        if isinstance(d, Mapping):
            rows.append(["drafter", f"{d.get('name')} ({d.get('origin')})"])
    measured = drafting.get("measured")
    if not isinstance(measured, Mapping):
        rows.append(["in use", "not measured yet (the first requests measure it)"])
        return rows
    figures = [r for r in measured.get("drafters") or [] if isinstance(r, Mapping)]
    in_use = measured.get("in_use")
    rows.append(["in use", str(in_use) if in_use else "none pays here yet: plain decoding"])
    for r in figures:
        where = " where it had a match" if r.get("rated") else ""
        parts = [f"acceptance {r.get('acceptance')}{where}"]
        if r.get("cost_per_guess") is not None:
            parts.append(f"a guess costs {r['cost_per_guess']} of a target step")
        if r.get("expected_speedup") is not None:
            parts.append(f"expected {r['expected_speedup']}x at length {r.get('best_length')}")
        parts.append(f"rounds drafted: {r.get('rounds', 0)}, requests: {r.get('requests', 0)}")
        rows.append([str(r.get("name")), ", ".join(parts)])
    return rows


_ADAPTER_LABELS = {
    "from": "from",
    "adapter_type": "type",
    "architecture": "architecture",
    "rank": "rank",
    "alpha": "alpha",
    "tensors": "tensors",
    "size": "size",
}


def _adapter_rows(adapter: Mapping[str, Any]) -> list[list[str]]:
    return [
        [label, _draft_value(key, adapter[key])]
        for key, label in _ADAPTER_LABELS.items()
        if adapter.get(key) not in (None, "")
    ]


def _parameter_rows(parameters: str) -> list[list[str]]:
    rows = []
    for line in parameters.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            rows.append([key, value.strip()])
    return rows


def _runtime_rows(runtime: Mapping[str, Any]) -> list[list[str]]:
    """Where llama.cpp put a loaded model (``/api/show``'s ``runtime``)."""
    devices = runtime.get("devices") or []
    rows = [["devices", ", ".join(map(str, devices)) if devices else "CPU"]]
    if devices:
        rows.append(["layers offloaded", str(runtime.get("layers_offloaded", 0))])
        rows.append(["device memory", format_size(int(runtime.get("size_vram") or 0))])
    if runtime.get("draft_devices"):
        rows.append(["draft devices", ", ".join(map(str, runtime["draft_devices"]))])
    if runtime.get("offload"):
        rows.append(["offload", str(runtime["offload"])])
    return rows


def show_summary(info: Mapping[str, Any], *, verbose: bool = False) -> str:
    """The `show MODEL` summary: Model, Capabilities, Projector, Draft, Adapter, Loaded (while
    it is), Parameters, System, License, and with ``verbose`` Metadata and Tensors. Sections
    without content are left out."""
    sections = []
    model_rows = _model_rows(info)
    if model_rows:
        sections.append(_section("Model", model_rows))
    capabilities = info.get("capabilities") or []
    if capabilities:
        sections.append(_section("Capabilities", [[str(c)] for c in capabilities]))
    projector: Mapping[str, Any] = info.get("projector_info") or {}
    if projector:
        arch = str(projector.get("general.architecture", ""))
        rows = [["architecture", arch]] if arch else []
        count = projector.get("general.parameter_count")
        if isinstance(count, int | float) and count > 0:
            rows.append(["parameters", format_number(count)])
        sections.append(_section("Projector", rows))
    # The top-level ``draft`` summary adds the draft knobs to ``details.draft``.
    draft = info.get("draft") or (info.get("details") or {}).get("draft")
    if isinstance(draft, Mapping) and draft:
        sections.append(_section("Draft", _draft_rows(draft)))
    drafting = info.get("drafting")
    if isinstance(drafting, Mapping) and drafting:
        sections.append(_section("Drafting", drafting_rows(drafting)))
    for adapter in info.get("adapters") or []:
        if isinstance(adapter, Mapping):
            sections.append(_section("Adapter", _adapter_rows(adapter)))
    runtime = info.get("runtime")
    if isinstance(runtime, Mapping):
        sections.append(_section("Loaded", _runtime_rows(runtime)))
    if info.get("parameters"):
        sections.append(_section("Parameters", _parameter_rows(str(info["parameters"]))))
    if info.get("system"):
        sections.append(_section("System", [[line] for line in _first_lines(str(info["system"]))]))
    if info.get("license"):
        sections.append(
            _section("License", [[line] for line in _first_lines(str(info["license"]))])
        )
    if verbose:
        metadata: Mapping[str, Any] = info.get("model_info") or {}
        if metadata:
            rows = [[key, _value_text(metadata[key], max_items=5)] for key in sorted(metadata)]
            sections.append(_section("Metadata", rows))
        tensors = info.get("tensors") or []
        if tensors:
            rows = [
                [str(t.get("name", "")), str(t.get("type", "")), _value_text(t.get("shape", []))]
                for t in tensors
            ]
            sections.append(_section("Tensors", rows))
    return "\n".join(sections)


def catalog_table(rows: list[dict[str, Any]]) -> str:
    """``modelhub list --catalog``: what can be pulled by short name, and how far it is trusted."""
    table: list[list[str]] = []
    for row in rows:
        size = row.get("size")
        table.append(
            [
                str(row["name"]),
                format_size(int(size)) if size else "-",
                str(row.get("parameter_size") or "-"),
                str(row.get("quantization_level") or "-"),
                ", ".join(row.get("drafts") or []) or "-",
                "pinned" if row.get("verified") else "not verified here (digest from the source)",
            ]
        )
    return format_table(["NAME", "SIZE", "PARAMS", "QUANT", "DRAFTS", "DIGEST"], table)
