"""Image files named in a prompt, attached as ``ollama run`` does.

``modelhub run MODEL "describe ./photo.png"`` (and a line typed or pasted in the chat) sends the
file as an image when the model can read images: a path that starts with ``/``, ``./``,
``../``, ``~/`` or a drive letter, ends in ``.png``, ``.jpg``, ``.jpeg``, ``.webp`` or ``.gif``
and names an existing file. Spaces in a path are written ``\\ `` or the path is quoted (what a
terminal pastes when a file is dragged in). An attached path is taken out of the prompt; one
that names no file stays in it as text. A file that exists but is not an image (by its first
bytes) or is larger than :data:`MAX_IMAGE_BYTES` is an error. The daemon decodes and checks
the pixels (docs/api.md#images).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhub.errors import InputError

MAX_IMAGE_BYTES = 100 << 20  # what ollama run reads at most
_EXT = r"\.(?:png|jpe?g|webp|gif)"
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


def can_see(info: dict[str, Any]) -> bool:
    """Whether ``/api/show``'s answer says the model reads images."""
    return "vision" in (info.get("capabilities") or [])


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


def extract_images(prompt: str, *, cwd: Path | None = None) -> Attached:
    """The image files ``prompt`` names (module docstring), read and taken out of it."""
    out = Attached(prompt)
    kept: list[str] = []
    last = 0
    for match in _PATH.finditer(prompt):
        text = match.group("quoted") or match.group("bare")
        path = _file_of(text, cwd)
        if path is None:
            continue
        out.images.append(base64.b64encode(read_image(path, text)).decode())
        out.paths.append(text)
        kept.append(prompt[last : match.start()])
        last = match.end()
    if not out.paths:
        return out
    kept.append(prompt[last:])
    out.prompt = re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip()
    return out


def attach(prompt: str, info: dict[str, Any], say: Any) -> Attached:
    """``extract_images`` for a model that reads images (``say`` is told each file attached);
    the prompt unchanged for one that does not."""
    if not can_see(info):
        return Attached(prompt)
    found = extract_images(prompt)
    for path in found.paths:
        say(f"Added image '{path}'")
    return found
