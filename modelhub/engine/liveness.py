"""How a runner shows the daemon it is alive, and which of its log lines belong to which request.

Heartbeat: a thread of the runner writes ``{"event": "alive"}`` on the protocol channel every
``interval`` seconds, whatever the other threads are doing (a long load or prefill runs in
native code, which leaves Python's lock to this thread). A runner the daemon has not heard
from for longer than its bound is stopped (SIGSTOP), deadlocked with the interpreter lock held,
or starved by swapping: the daemon kills and replaces it (``runtime.runner_process``).

Log marks: llama.cpp and Python write the runner's log to stderr, and the daemon quotes its
lines when a runner dies. So that a message quotes only the failing requests' lines, the
runner writes marks into the same stream, in order with the log:

- ``begin ID``: the runner starts handling request ID (or ``load``); until ``run ID`` or
  ``end ID`` every line is that request's own (the one thread that reads requests is busy with
  it);
- ``run ID``: the request goes on in the engine's batch beside the others that are running;
- ``end ID``: the request has had its final event.

Lines written outside a ``begin``/``run`` window belong to every request running then.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Literal

ALIVE_EVENT = "alive"
LOAD_MARK = "load"  # the request name of loading in the marks
MARK_PREFIX = "\x1fmodelhub-runner "
Mark = Literal["begin", "run", "end"]


def heartbeat_interval(bound: float) -> float:
    """How often a runner watched with silence bound ``bound`` seconds says it is alive."""
    return max(0.05, min(1.0, bound / 4))


class Heartbeat:
    """A daemon thread that calls ``send({"event": "alive"})`` every ``interval`` seconds."""

    def __init__(self, send: Callable[[dict[str, Any]], None], interval: float) -> None:
        self._send = send
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:  # the first at once: the daemon's clock starts at the first line
            try:
                self._send({"event": ALIVE_EVENT})
            except (OSError, ValueError):  # the daemon is gone (or the channel closed)
                return
            if self._stop.wait(self._interval):
                return


def write_mark(kind: Mark, request: str) -> None:
    """Write a log mark on stderr (see the module docstring)."""
    try:
        sys.stderr.write(f"{MARK_PREFIX}{kind} {request}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def parse_mark(line: str) -> tuple[str, str] | None:
    """``(kind, request)`` of a mark line; None for any other line."""
    if not line.startswith(MARK_PREFIX):
        return None
    kind, _, request = line[len(MARK_PREFIX) :].strip().partition(" ")
    if kind not in ("begin", "run", "end") or not request:
        return None
    return kind, request
