"""``GET /api/info`` (a modelhub extension): the build, the devices and the daemon's choices."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from modelhub import __version__
from modelhub.server.state import get_state
from modelhub.server.system import system_info

router = APIRouter()


@router.get("/api/info")
async def info(request: Request) -> Response:
    state = get_state(request)
    sched = state.scheduler
    system = await system_info()
    setting = state.settings.repack
    repack = sched.repack if sched.repack is not None else system.get("repack_default", True)
    if sched.repack_fallback:
        reason = sched.repack_fallback
    elif setting is not None:
        reason = "set by MODELHUB_REPACK"
    else:
        reason = str(system.get("repack_reason", ""))
    return JSONResponse(
        {
            "version": __version__,
            "address": state.settings.base_url,
            "models_dir": str(state.settings.models_dir),
            "system": system,
            "repack": {
                "enabled": repack,
                "setting": {None: "auto", True: "on", False: "off"}[setting],
                "fallback": sched.repack_fallback,
                "reason": reason,
            },
            # the daemon's defaults for every model (a Modelfile may set its own)
            "offload": {
                "num_gpu": state.settings.num_gpu,
                "rpc_servers": list(state.settings.rpc_servers),
                "flash_attention": state.settings.flash_attention,
                "kv_cache_type": state.settings.kv_cache_type,
            },
        }
    )
