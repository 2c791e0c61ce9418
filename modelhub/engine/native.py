"""llama.cpp's process-wide state: the backend, initialised once, and its log.

Its log lines go to ``logging`` (logger ``modelhub.llama``); its recent warnings and errors are
kept per thread, to explain a failed call with its own messages
(:func:`native_log_mark`, :func:`native_messages_since`), and what it says it allocated on
which device is collected for ``offload`` (llama.cpp has no API for that).
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import os
import re
import threading
from typing import Any

import llama_cpp

log = logging.getLogger("modelhub.llama")

_backend_lock = threading.Lock()
_backend_ready = False
# llama.cpp's recent warnings and errors: (number, thread, text), to explain a failure with
# what the failing call logged (see native_messages_since).
_recent_messages: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=32)
_message_numbers = itertools.count(1)
_last_message = 0
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation.
_LEVELS = {3: logging.WARNING, 4: logging.ERROR}


# "load_tensors:   CPU_Mapped model buffer size =    92.00 MiB", "... RPC0[host:port] KV ...":
# what llama.cpp allocated on which device (it has no API for this).
_BUFFER_LINE = re.compile(r"(\S+) (model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
_buffers: list[tuple[str, str, int]] = []  # (buffer name, what, bytes) since the last clear
_OFFLOADED_LINE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_offloaded: list[tuple[int, int]] = []


def _on_native_log(level: int, text: bytes, _user_data: Any) -> None:
    global _last_message
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    if (m := _BUFFER_LINE.search(message)) is not None:
        _buffers.append((m[1], m[2], int(float(m[3]) * 1024 * 1024)))
    elif (m := _OFFLOADED_LINE.search(message)) is not None:
        _offloaded.append((int(m[1]), int(m[2])))
    if level in _LEVELS:
        _last_message = next(_message_numbers)
        _recent_messages.append((_last_message, threading.get_ident(), message))
        log.log(_LEVELS[level], "%s", message)
    else:
        log.debug("%s", message)


# Kept at module level: llama.cpp holds the pointer for the life of the process.
_log_callback = llama_cpp.llama_log_callback(_on_native_log)


def ensure_backend() -> None:
    """Initialise llama.cpp once per process and route its log into ``logging``."""
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def allocated_buffers() -> list[tuple[str, str, int]]:
    """The buffers llama.cpp reported allocating since :func:`clear_allocation_log`: (buffer
    name such as ``CPU_Mapped`` or ``RPC0[127.0.0.1:50052]``, model/KV/RS/compute/output,
    bytes)."""
    return list(_buffers)


def offloaded_layers() -> tuple[int, int] | None:
    """(offloaded, total) layers of the last model loaded since the clear, as llama.cpp said."""
    return _offloaded[-1] if _offloaded else None


def clear_allocation_log() -> None:
    _buffers.clear()
    _offloaded.clear()


def native_log_mark() -> int:
    """A mark to pass to :func:`native_messages_since` after a llama.cpp call."""
    return _last_message


def native_messages_since(mark: int) -> str:
    """The warnings/errors llama.cpp logged on this thread since ``mark`` (to explain a failed
    call with its own messages, never an earlier call's or another thread's)."""
    me = threading.get_ident()
    return " | ".join(
        text for n, thread, text in list(_recent_messages) if n > mark and thread == me
    )


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
