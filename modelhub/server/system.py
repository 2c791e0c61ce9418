"""llama.cpp's view of this machine (``python -m modelhub.engine.sysinfo``), asked of a child
process once per daemon, so that loading llama.cpp's libraries (and whatever a GPU driver does
when probed) never happens in the daemon itself."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

_cached: dict[str, Any] | None = None


async def system_info() -> dict[str, Any]:
    """The build, its backends and devices (``{"error": ...}`` when the child fails)."""
    global _cached
    if _cached is None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "modelhub.engine.sysinfo",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"error": "asking llama.cpp about this machine took longer than 60 s"}
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            return {"error": f"llama.cpp could not describe this machine ({tail[0]})"}
        _cached = json.loads(out)
    return _cached


async def has_local_accelerator() -> bool:
    """Whether llama.cpp sees a GPU here (RPC workers are not asked: they are named)."""
    devices = (await system_info()).get("devices") or []
    return any(d.get("type") in ("gpu", "igpu") for d in devices)
