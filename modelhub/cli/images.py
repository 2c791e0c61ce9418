"""Image and audio files named in a prompt, attached as ``ollama run`` does.

``modelhub run MODEL "describe ./photo.png"`` (and a line typed or pasted in the chat) sends the
file as an image when the model can read images: a path that starts with ``/``, ``./``,
``../``, ``~/`` or a drive letter, ends in ``.png``, ``.jpg``, ``.jpeg``, ``.webp`` or ``.gif``
and names an existing file. A ``.wav`` or ``.mp3`` path is attached the same way, as an audio
clip, when the model's projector has an audio encoder (``show`` lists ``audio``); the API takes
clips in the same ``images`` list (docs/api.md#audio). Spaces in a path are written ``\\ ``
or the path is quoted (what a terminal pastes when a file is dragged in). An attached path is
taken out of the prompt; one that names no file stays in it as text. A file that exists but is
not of its kind (by its first bytes) or is larger than :data:`MAX_IMAGE_BYTES` (an image) or
:data:`MAX_AUDIO_BYTES` (a clip) is an error. The daemon decodes and checks the pixels and the
sound (docs/api.md#images).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhub.errors import InputError

MAX_IMAGE_BYTES = 100 << 20  # what ollama run reads at most
MAX_AUDIO_BYTES = 25 << 20  # what the daemon takes (docs/api.md#audio)
_EXT = r"\.(?:png|jpe?g|webp|gif|wav|mp3)"
AUDIO_SUFFIXES = (".wav", ".mp3")
_PATH = re.compile(
    rf"""(?P<q>['"])(?P<quoted>[^'"\n]+?{_EXT})(?P=q)"""
    rf"""|(?<![^\s(\[{{<,;:])(?P<bare>(?:[A-Za-z]:)?(?:~|\.{{1,2}})?[/\\](?:\\ |[^\s'"])*?{_EXT})"""
    r"(?![A-Za-z0-9_])",
    re.IGNORECASE,
)
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)


@dataclass
class Attached:
    """A prompt with the image paths taken out, and the images they named."""

    prompt: str
    paths: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)  # base64, as the API takes them
    kinds: list[str] = field(default_factory=list)  # "image" or "audio", by path


def can_see(info: dict[str, Any]) -> bool:
    """Whether ``/api/show``'s answer says the model reads images."""
    return "vision" in (info.get("capabilities") or [])


def can_hear(info: dict[str, Any]) -> bool:
    """Whether ``/api/show``'s answer says the model takes audio clips."""
    return "audio" in (info.get("capabilities") or [])


def is_audio(head: bytes) -> bool:
    """A WAV or an MP3 by the file's first bytes (as the daemon tells them apart)."""
    wav = head[:4] == b"RIFF" and head[8:12] == b"WAVE"
    return wav or head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] >= 0xE0)


def read_audio(path: Path, shown: str) -> bytes:
    """The file's bytes if it is a WAV or an MP3 within the daemon's size (InputError
    otherwise); the daemon decodes and checks the sound."""
    try:
        size = path.stat().st_size
        if size > MAX_AUDIO_BYTES:
            raise InputError(f"audio {shown} is {size} bytes: more than {MAX_AUDIO_BYTES >> 20} MB")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read audio {shown}: {exc.strerror or exc}") from exc
    if not is_audio(data[:16]):
        raise InputError(f"{shown} is not audio (WAV or MP3)")
    return data


def image_kind(head: bytes) -> str | None:
    """``PNG``, ``JPEG``, ``GIF`` or ``WebP`` by the file's first bytes; None otherwise."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def read_image(path: Path, shown: str) -> bytes:
    """The file's bytes if it is an image of a kind the daemon takes (InputError otherwise)."""
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise InputError(f"image {shown} is {size} bytes: more than {MAX_IMAGE_BYTES >> 20} MB")
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read image {shown}: {exc.strerror or exc}") from exc
    if image_kind(data[:16]) is None:
        raise InputError(f"{shown} is not an image (PNG, JPEG, WebP or GIF)")
    return data


def _file_of(text: str, cwd: Path | None) -> Path | None:
    path = Path(text.replace("\\ ", " ")).expanduser()
    if cwd is not None and not path.is_absolute():
        path = cwd / path
    return path if path.is_file() else None


def extract_images(
    prompt: str, *, cwd: Path | None = None, kinds: tuple[str, ...] = ("image",)
) -> Attached:
    """The image (and, with ``"audio"`` in ``kinds``, audio) files ``prompt`` names (module
    docstring), read and taken out of it; paths of other kinds stay in it as text."""
    out = Attached(prompt)
    kept: list[str] = []
    last = 0
    for match in _PATH.finditer(prompt):
        text = match.group("quoted") or match.group("bare")
        kind = "audio" if text.lower().endswith(AUDIO_SUFFIXES) else "image"
        path = _file_of(text, cwd) if kind in kinds else None
        if path is None:
            continue
        data = read_audio(path, text) if kind == "audio" else read_image(path, text)
        out.images.append(base64.b64encode(data).decode())
        out.paths.append(text)
        out.kinds.append(kind)
        kept.append(prompt[last : match.start()])
        last = match.end()
    if not out.paths:
        return out
    kept.append(prompt[last:])
    out.prompt = re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip()
    return out


def attach(prompt: str, info: dict[str, Any], say: Any) -> Attached:
    """``extract_images`` of the kinds the model reads, images and/or audio (``say`` is told
    each file attached); the prompt unchanged for a model that reads neither."""
    kinds = tuple(k for k, has in (("image", can_see(info)), ("audio", can_hear(info))) if has)
    if not kinds:
        return Attached(prompt)
    found = extract_images(prompt, kinds=kinds)
    for path, kind in zip(found.paths, found.kinds, strict=True):
        say(f"Added {kind} '{path}'")
    return found
