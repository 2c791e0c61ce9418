"""`pull` (download a model through the daemon) and `prune` (drop unreferenced blobs).

The pull display is a function of the ``/api/pull`` progress objects alone, so ``run`` reuses
it when a model is missing and tests can feed it recorded streams.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from modelhub.cli import render
from modelhub.cli.models import connect
from modelhub.client import Client


class PullDisplay:
    """Renders a pull stream: one progress bar per layer (size, speed, ETA), other statuses as
    lines. A finished layer becomes the line ``pulling <12 hex>: 100% <size>``; off a terminal
    only those final lines are written, so logs stay readable."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False, soft_wrap=True)
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._bars: dict[str, TaskID] = {}
        self._finished: set[str] = set()
        self._last_line: str | None = None

    def __enter__(self) -> PullDisplay:
        if self.console.is_terminal:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.console.is_terminal:
            self._progress.stop()

    def _line(self, text: str, style: str = "") -> None:
        self.console.print(Text(text, style=style))
        self._last_line = text

    def item(self, item: Mapping[str, Any]) -> None:
        """Show one progress object of ``/api/pull``."""
        status = str(item.get("status", "")).strip()
        digest = str(item.get("digest") or "")
        total = item.get("total")
        warning = item.get("warning")
        if isinstance(warning, str) and warning:
            # e.g. a failed source before the one that served: worth noticing
            self._line(f"warning: {warning}", "bold yellow")
        elif digest and isinstance(total, int | float) and total > 0:
            self._layer(status, digest, int(total), item.get("completed"))
        elif status and status != self._last_line:  # the same status twice in a row: once
            self._line(status)

    def _layer(self, status: str, digest: str, total: int, completed: Any) -> None:
        if digest in self._finished:
            return
        done = int(completed) if isinstance(completed, int | float) else 0
        label = layer_label(status, digest)
        if digest not in self._bars:
            self._bars[digest] = self._progress.add_task(label, total=total)
        # A 0 after progress is a restarted transfer announcing itself, not a step backwards.
        if done > 0:
            self._progress.update(self._bars[digest], completed=min(done, total), total=total)
        if done >= total:
            self._progress.remove_task(self._bars.pop(digest))
            self._finished.add(digest)
            self._line(f"{label}: 100% {render.format_size(total)}")


def layer_label(status: str, digest: str) -> str:
    """``pulling 8eeb52dfb3bb``: the daemon's status, or one made from the digest."""
    if status.startswith("pulling ") and status != "pulling manifest":
        return status
    return f"pulling {render.short_digest(digest)}"


def pull_model(
    client: Client,
    model: str,
    *,
    insecure: bool = False,
    no_draft: bool = False,
    console: Console | None = None,
) -> None:
    """Pull ``model`` through the daemon, showing progress; raises on the first error."""
    body: dict[str, Any] = {"model": model, "insecure": insecure, "stream": True}
    if no_draft:
        body["no_draft"] = True
    with PullDisplay(console) as display:
        for item in client.stream("POST", "/api/pull", body):
            display.item(item)


@click.command("pull")
@click.argument("model")
@click.option("--insecure", is_flag=True, help="Allow plain HTTP (a private registry).")
@click.option(
    "--no-draft",
    is_flag=True,
    help="Leave out the model's drafter (a Hugging Face sidecar, a registry draft layer).",
)
def pull(model: str, insecure: bool, no_draft: bool) -> None:
    """Pull MODEL from a registry, Hugging Face, a URL or the catalog.

    Each layer gets a progress bar with its size, speed and time left; the command ends with
    `success`. Layers the store already has are not downloaded again. A drafter that comes
    with the model (for speculative decoding) is pulled too, unless --no-draft.
    """
    pull_model(connect(), model, insecure=insecure, no_draft=no_draft)


# -- prune --------------------------------------------------------------------------------------


def prune_report(answer: Mapping[str, Any]) -> list[str]:
    """The lines `prune` prints for the daemon's ``{"removed": [...], "freed": bytes}``."""
    removed: Sequence[Any] = answer.get("removed") or []
    freed = answer.get("freed")
    if not removed:
        return ["nothing to prune"]
    lines = [f"removed {_removed_name(item)}" for item in removed]
    if isinstance(freed, int | float) and freed > 0:
        lines.append(f"freed {render.format_size(freed)}")
    return lines


def _removed_name(item: Any) -> str:
    if isinstance(item, Mapping):  # tolerate {"name"|"digest"|"path": ...} entries
        return str(item.get("name") or item.get("digest") or item.get("path") or item)
    return str(item)


def _echo_lines(lines: Iterable[str]) -> None:
    for line in lines:
        click.echo(line)


@click.command("prune")
def prune() -> None:
    """Remove blobs no model uses and stale partial downloads."""
    answer = connect().request_json("POST", "/api/prune", {}) or {}
    _echo_lines(prune_report(answer if isinstance(answer, Mapping) else {}))
