"""The ``--verbose`` statistics printed after an answer, by `run` and its interactive chat.

Ollama's timing lines (durations written as Go prints them, token counts and rates) plus,
when anything was drafted, the draft token count and acceptance rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TextIO

from modelhub.cli.answer import RESET, is_terminal, no_colour

STATS_LABEL_WIDTH = 22  # "prompt eval duration: " is the longest label


def format_go_duration(ns: int) -> str:
    """A duration in nanoseconds written as Go prints one: ``1.234567s``, ``130.079ms``,
    ``2m3.5s``, ``1h0m0s``, ``850ns`` (Ollama's --verbose uses this form)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    value = abs(ns)
    if value < 1_000_000_000:
        for unit, scale in (("ms", 1_000_000), ("µs", 1_000)):
            if value >= scale:
                return sign + _decimal(value, scale) + unit
        return f"{sign}{value}ns"
    hours, rest = divmod(value, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = f"{hours}h{minutes}m" if hours else (f"{minutes}m" if minutes else "")
    return sign + text + _decimal(rest, 1_000_000_000) + "s"


def _decimal(value: int, scale: int) -> str:
    whole, fraction = divmod(value, scale)
    digits = str(fraction).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def acceptance_rate(final: Mapping[str, Any]) -> float | None:
    """Accepted draft tokens over proposed ones, or None when nothing was drafted."""
    proposed = _int(final.get("draft_count"))
    if proposed <= 0:
        return None
    return _int(final.get("draft_accepted_count")) / proposed


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _rate(count: int, duration_ns: int) -> str:
    return f"{count / (duration_ns / 1e9):.2f} tokens/s"


def stats_lines(final: Mapping[str, Any]) -> list[str]:
    """The ``--verbose`` lines for a final generate/chat object; a line whose value is zero is
    left out. Draft lines follow Ollama's when anything was drafted."""
    rows: list[tuple[str, str]] = []

    def duration(label: str, key: str) -> None:
        if _int(final.get(key)):
            rows.append((label, format_go_duration(_int(final.get(key)))))

    duration("total duration", "total_duration")
    duration("load duration", "load_duration")
    for prefix, count_key, duration_key in (
        ("prompt eval", "prompt_eval_count", "prompt_eval_duration"),
        ("eval", "eval_count", "eval_duration"),
    ):
        count, spent = _int(final.get(count_key)), _int(final.get(duration_key))
        if count:
            rows.append((f"{prefix} count", f"{count} token(s)"))
        duration(f"{prefix} duration", duration_key)
        if count and spent:
            rows.append((f"{prefix} rate", _rate(count, spent)))
    rate = acceptance_rate(final)
    if rate is not None:
        accepted = _int(final.get("draft_accepted_count"))
        rows.append(("draft tokens", f"{_int(final.get('draft_count'))} token(s)"))
        rows.append(("draft accepted", f"{accepted} token(s) ({rate:.1%} acceptance)"))
    return [f"{label + ':':<{STATS_LABEL_WIDTH}}{value}" for label, value in rows]


def print_stats(final: Mapping[str, Any], err: TextIO) -> None:
    """Write the statistics to ``err``; the acceptance line is bold on a terminal."""
    bold = is_terminal(err) and not no_colour()
    for line in stats_lines(final):
        if bold and line.startswith("draft accepted:"):
            line = f"\x1b[1m{line}{RESET}"
        err.write(line + "\n")
    err.flush()
