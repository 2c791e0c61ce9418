"""A runner whose load first checks the store blobs it will read.

Before the runner process starts, every blob of the store that the load plan names (weights,
draft model, adapters, projector...) is hashed against its name, once per state of its file
(``library.damage.check_load_files``, ``store.content``): a blob changed on disk (a flipped
byte, a truncated copy) is a ``DamagedModelError`` naming the model, the part and the repair,
and is removed from the store so that pulling or creating the model again restores it. Hashing
costs a read of each file at its first load (and again after the file changes); later loads,
in this daemon or the next, compare the file's identity only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from modelhub.engine import protocol as p
from modelhub.engine.load_config import LoadConfig
from modelhub.library.damage import check_load_files
from modelhub.runtime.runner_process import RunnerProcess
from modelhub.store import Store


class CheckedRunner(RunnerProcess):
    """A :class:`RunnerProcess` whose ``start`` checks the blobs of ``config`` first."""

    def __init__(self, label: str, store: Store) -> None:
        super().__init__(label)
        self.store = store

    async def start(self, config: LoadConfig, *args: Any, **kwargs: Any) -> p.Loaded:
        await asyncio.to_thread(check_load_files, self.store, self.label, config.model_dump())
        return await super().start(config, *args, **kwargs)
