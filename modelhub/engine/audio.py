"""Audio clips in a prompt: libmtmd's audio bitmaps (``engine.vision.Projector`` encodes them).

A clip comes from the daemon as the WAV or MP3 file the client sent, already checked there
(``server/audio.py``). libmtmd decodes it here with its own miniaudio, to mono at its audio
encoder's sample rate (``mtmd_helper_bitmap_init_from_buf``, what llama.cpp's server does), and
cuts it into the encoder's windows: one audio chunk each, so a clip is one or more spans of
embeddings in the prompt, like an image's.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from typing import Any

from llama_cpp import mtmd_cpp as mtmd

from modelhub.engine.native import native_log_mark, native_messages_since
from modelhub.errors import InputError, ModelhubError


@dataclass(frozen=True)
class RawAudio:
    """A clip as the daemon sends it: the encoded file (or, for counting, ``blank`` samples of
    silence at the encoder's rate)."""

    data: bytes = b""
    blank: int = 0

    @property
    def digest(self) -> str:
        return hashlib.sha256(b"audio:" + self.data).hexdigest()


def audio_bitmap(handle: Any, clip: RawAudio) -> Any:
    """libmtmd's bitmap of ``clip`` (to free with ``mtmd_bitmap_free``)."""
    if clip.blank:
        samples = (ctypes.c_float * clip.blank)()
        bitmap = mtmd.mtmd_bitmap_init_from_audio(clip.blank, samples)
    else:
        buf = (ctypes.c_uint8 * len(clip.data)).from_buffer_copy(clip.data)
        mark = native_log_mark()
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(handle, buf, len(clip.data), False)
        if not bitmap:
            raise InputError(
                "the audio cannot be decoded: "
                f"{native_messages_since(mark) or 'libmtmd read no samples'}"
            )
    if not bitmap:
        raise ModelhubError("libmtmd could not allocate an audio clip")
    if not mtmd.mtmd_bitmap_is_audio(bitmap):
        mtmd.mtmd_bitmap_free(bitmap)
        raise InputError("the audio clip was read as something other than audio")
    return bitmap


def samples_at(frames: int, rate: int, encoder_rate: int) -> int:
    """A clip's length in samples once resampled to the encoder's rate (what libmtmd gets)."""
    if rate <= 0 or frames <= 0:
        raise InputError("an audio clip of no samples")
    return max(1, round(frames * encoder_rate / rate))
