"""What ``modelhub bench`` measures and how it shows it: a configuration, one request's
outcome, a row of the table; the table for rich and the JSON of ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich import box
from rich.table import Table


@dataclass(frozen=True)
class Config:
    """One way of running: ``draft_num_predict`` 0 is off, None the model's own setting;
    ``adaptive`` False drafts the bound every step (``draft_adaptive``), None as the model."""

    label: str
    draft_num_predict: int | None
    adaptive: bool | None = None
    drafter: str | None = None  # the request's ``draft`` option (None: the model's default)


@dataclass(frozen=True)
class Run:
    """The outcome of one request."""

    prompt: int  # index into the prompt list
    config: str
    eval_count: int
    eval_duration_ns: int
    draft_count: int
    draft_accepted_count: int
    text: str
    drafter: str | None = None  # the drafter that guessed most (the answer's ``drafter``)


@dataclass(frozen=True)
class Row:
    """One line of the table: a prompt (or ``all``) under one configuration."""

    prompt: str
    config: str
    tokens: int
    tokens_per_second: float | None
    acceptance: float | None
    speedup: float | None
    identical: bool | None  # None for the baseline itself


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _identical(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def bench_table(rows: Sequence[Row], title: str) -> Table:
    """The side-by-side table for rich; fits 80 columns."""
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("prompt", max_width=24, no_wrap=True, overflow="ellipsis")
    table.add_column("draft", no_wrap=True)
    for header in ("tokens", "tok/s", "accept", "speed-up"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("identical", justify="center", no_wrap=True)
    previous = None
    for row in rows:
        if previous is not None and row.prompt != previous:
            table.add_section()
        rate = "-" if row.tokens_per_second is None else f"{row.tokens_per_second:.2f}"
        table.add_row(
            row.prompt if row.prompt != previous else "",
            row.config,
            str(row.tokens),
            rate,
            _percent(row.acceptance),
            _times(row.speedup),
            _identical(row.identical),
            style="bold red" if row.identical is False else None,
        )
        previous = row.prompt
    return table


def bench_json(
    model: str,
    prompts: Sequence[str],
    configs: Sequence[Config],
    rows: Sequence[Row],
    runs: Sequence[Run],
    *,
    num_predict: int,
    repeat: int,
) -> dict[str, Any]:
    """Everything measured: settings, configurations (``draft_num_predict`` null means the
    model's own), the table's rows and every run."""
    return {
        "model": model,
        "num_predict": num_predict,
        "repeat": repeat,
        "prompts": list(prompts),
        "configs": [asdict(c) for c in configs],
        "rows": [asdict(r) for r in rows],
        "runs": [asdict(r) for r in runs],
    }
