"""What the scheduler needs of a runner: the interface that ``RunnerProcess`` (a real runner
subprocess) and the tests' fake runner (``tests/fakes/runner.py``, in-process, no llama.cpp)
both implement.

A handle is made by the scheduler's ``runner_factory(label)``, started once with the load
config (``engine.protocol.Load``'s), then serves requests until it is closed or dies. A
request is one of ``engine.protocol``'s typed jobs (``Generate``, ``Embed``, ``Count``, ...,
built where the request is made, so a field the runner does not know fails there); ``request``
gives it an id, sends it and yields its events, the protocol's typed messages, up to the
final one (an ``ErrorEvent`` carries its class: ``engine.protocol.raise_if_error``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from modelhub.engine import protocol as p
from modelhub.engine.load_config import LoadConfig


class RunnerHandle(Protocol):
    label: str
    dead: bool  # the runner ended (crashed, killed, closed): the scheduler starts another

    @property
    def pid(self) -> int | None:
        """The runner's process (None before it starts; the daemon's own for a fake)."""

    @property
    def illegal_instruction(self) -> bool:
        """It died of SIGILL (``engine.cpu``'s repacking fault: load again without it)."""

    async def start(
        self, config: LoadConfig, timeout: float = 300, *, silence_limit: float = 0
    ) -> p.Loaded:
        """Load; the ``loaded`` event, or the load's error (nothing left running)."""

    def request(self, msg: p.Job) -> AsyncIterator[p.Event]:
        """Send one request and yield its events until the final one."""

    async def close(self) -> None:
        """Shut the runner down (a dead one: nothing to do)."""
