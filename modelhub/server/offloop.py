"""Costly work on request text, off the event loop (RUN-09; issue 26, item 14).

Parsing a Modelfile TEMPLATE runs in Python at a few microseconds per character: a 2 MB one
takes seconds. On the event loop that would hold every other request (``/api/version``
included) for as long. Such work runs here instead, in a pool of its own with two threads: many
costly requests queue behind each other rather than filling the default pool that other
handlers' short blocking calls use, and the loop gets the GIL back every few milliseconds
(the interpreter's switch interval) while they run.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

WORKERS = 1
_POOL = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="modelhub-offloop")


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the pool; its exception, if any, is raised here."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
