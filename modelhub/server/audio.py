"""Audio in requests: recognised, checked and measured in the daemon, before any runner work.

Audio travels the way images do, as Ollama carries it: a message's ``images`` list holds base64
files, and an entry whose bytes are a WAV (``RIFF....WAVE``) or an MP3 (``ID3`` or an MPEG
frame sync) is audio (Ollama's ``llm.AudioFormat``); ``input_audio`` parts of
``/v1/chat/completions`` and the file of ``/v1/audio/transcriptions`` become such entries.

Each clip is read here with miniaudio (the decoder llama.cpp's libmtmd uses too), in the
off-loop pool, with bounds: at most ``MAX_AUDIO_BYTES`` encoded, at most ``MAX_AUDIO_SECONDS``
of sound in one request (measured from the header, or by counting MP3 frames, before anything
is decoded into memory), no empty clip, no WAV whose data chunk is cut short, nothing miniaudio
cannot decode. A bad clip is refused with a 400 that names the message and its index. The file
itself goes to the runner, where libmtmd decodes it again, resampled to its encoder's rate
(``mtmd_helper_bitmap_init_from_buf``), and turns it into audio chunks.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any

from modelhub.errors import InputError

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # OpenAI's upload limit, and Ollama's multipart limit
MAX_AUDIO_SECONDS = 300.0  # in one request, all clips together
AUDIO_FORMATS = ("wav", "mp3")


def audio_format(raw: bytes) -> str | None:
    """``wav`` or ``mp3`` when ``raw`` starts as one (Ollama's sniffing), else None."""
    if len(raw) >= 12 and raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return "wav"
    if raw[:3] == b"ID3" or (len(raw) >= 2 and raw[0] == 0xFF and raw[1] & 0xE0 == 0xE0):
        return "mp3"
    return None


def _wav_cut_short(raw: bytes) -> bool:
    """Whether the WAV's ``data`` chunk declares more bytes than the file has (a streamed WAV
    that declares 0 or 0xFFFFFFFF does not know its length, and is read as far as it goes)."""
    pos = 12
    while pos + 8 <= len(raw):
        chunk, size = raw[pos : pos + 4], struct.unpack_from("<I", raw, pos + 4)[0]
        if chunk == b"data":
            return size not in (0, 0xFFFFFFFF) and pos + 8 + size > len(raw)
        pos += 8 + size + (size & 1)
    return True  # no data chunk before the end


def decode_audio(raw: bytes, where: str) -> dict[str, Any]:
    """One clip, checked: what the runner's ``generate`` op takes for it (the file, base64)
    and its length (``frames`` at ``sample_rate``, for truncation's token counts)."""
    import miniaudio

    if len(raw) > MAX_AUDIO_BYTES:
        raise InputError(f"{where}: the audio is {len(raw)} bytes, more than {MAX_AUDIO_BYTES}")
    kind = audio_format(raw)
    if kind is None:
        raise InputError(f"{where}: not audio that can be read (WAV or MP3)")
    if kind == "wav" and _wav_cut_short(raw):
        raise InputError(f"{where}: the WAV audio is truncated (its data chunk is cut short)")
    try:
        info = miniaudio.wav_get_info(raw) if kind == "wav" else miniaudio.mp3_get_info(raw)
        if info.sample_rate <= 0:
            raise InputError(f"{where}: the audio has no sample rate")
        seconds = info.num_frames / info.sample_rate
        if seconds > MAX_AUDIO_SECONDS:
            raise InputError(
                f"{where}: the audio is {seconds:.1f} s long, more than {MAX_AUDIO_SECONDS:g} s"
            )
        sound = miniaudio.decode(
            raw, miniaudio.SampleFormat.SIGNED16, nchannels=1, sample_rate=info.sample_rate
        )
    except miniaudio.MiniaudioError as exc:
        detail = exc.args[0] if exc.args else "cannot be decoded"
        raise InputError(f"{where}: the {kind.upper()} audio is damaged ({detail})") from None
    frames = len(sound.samples)
    if frames == 0:
        raise InputError(f"{where}: the audio is empty (no samples)")
    return {
        "audio": base64.b64encode(raw).decode("ascii"),
        "frames": frames,
        "sample_rate": int(info.sample_rate),
    }


def seconds_of(clip: dict[str, Any]) -> float:
    return float(clip["frames"]) / float(clip["sample_rate"])


def check_total(clips: list[dict[str, Any]], where: str) -> None:
    """Refuse a request whose clips add up to more than ``MAX_AUDIO_SECONDS``."""
    total = sum(seconds_of(c) for c in clips)
    if total > MAX_AUDIO_SECONDS:
        raise InputError(
            f"{where}: the request's audio adds up to {total:.1f} s, "
            f"more than {MAX_AUDIO_SECONDS:g} s"
        )


def openai_audio(part: dict[str, Any], where: str) -> str:
    """The base64 data of an OpenAI ``input_audio`` part (``{"data", "format"}``), with what
    can be told without decoding checked here, named as the client sent it."""
    body = part.get("input_audio")
    if not isinstance(body, dict) or not isinstance(body.get("data"), str) or not body["data"]:
        raise InputError(f"{where}.input_audio must be an object with base64 data")
    fmt = body.get("format")
    if fmt is not None and fmt not in AUDIO_FORMATS:
        raise InputError(f"{where}.input_audio.format {fmt!r} is not supported: wav or mp3")
    data: str = body["data"]
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        head = base64.b64decode(data[:64], validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{where}.input_audio: invalid base64 data") from None
    if audio_format(head) is None:
        raise InputError(f"{where}.input_audio: the data is not WAV or MP3 audio")
    return data
