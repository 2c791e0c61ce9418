"""Progress display for long operations (create now; pull later), written to stdout.

Status lines of a stream are printed one per line; lines that carry ``digest``, ``total`` and
``completed`` drive a progress bar per (status, digest); an object with a ``warning`` field is a
warning, printed as ``warning: <text>`` in yellow (its ``status`` is that same line for clients
that know only ``status``).
On a terminal the bars animate; in a pipe or log only their final state is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text


def stdout_console() -> Console:
    return Console(highlight=False, soft_wrap=True)


class ProgressDisplay:
    """One live display for a whole command. Running tasks animate at the bottom; a finished
    task becomes a plain line (``copying file sha256:... 100%``), so the output reads in order
    on a terminal and in a log alike."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or stdout_console()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(),
            console=self.console,
            transient=True,
        )
        self._bars: dict[tuple[str, str], TaskID] = {}
        self._descriptions: dict[TaskID, str] = {}

    def __enter__(self) -> ProgressDisplay:
        # Off a terminal nothing animates: only the final lines are written.
        if self.console.is_terminal:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.console.is_terminal:
            self._progress.stop()

    def line(self, text: str, *, style: str | None = None) -> None:
        """Print a line above the running tasks."""
        self.console.print(Text(text, style=style or ""))

    def warning(self, text: str) -> None:
        """``warning: <text>``, standing out."""
        self.line(f"warning: {text}", style="bold yellow")

    def start_task(
        self, description: str, total: float | None = None, *, final: str | None = None
    ) -> TaskID:
        """Show a running task; ``final`` (default: ``description``) is its closing line."""
        task = self._progress.add_task(description, total=total)
        self._descriptions[task] = final or description
        return task

    def advance_to(self, task: TaskID, completed: float, total: float | None = None) -> None:
        self._progress.update(task, completed=completed, total=total)

    def finish_task(self, task: TaskID, suffix: str = "100%") -> None:
        """Replace a task by its final line."""
        self._progress.remove_task(task)
        description = self._descriptions.pop(task)
        self.line(f"{description} {suffix}" if suffix else description)

    def stream_item(self, item: Mapping[str, Any]) -> None:
        """Show one progress object of a create/pull stream."""
        status = str(item.get("status", "")).strip()
        digest = item.get("digest")
        total = item.get("total")
        warning = item.get("warning")
        if isinstance(warning, str) and warning:
            self.warning(warning)
        elif digest and isinstance(total, int | float) and total > 0:
            key = (status, str(digest))
            completed = item.get("completed") or 0
            if key not in self._bars:
                self._bars[key] = self.start_task(status, total)
            self.advance_to(self._bars[key], completed, total)
            if completed >= total:
                self.finish_task(self._bars[key])
        elif status:
            self.line(status)
