"""Images in requests: decoded and checked in the daemon (Pillow), before any runner work.

Every API carries images the Ollama way inside the daemon: a message's ``images`` list of base64
strings (``/v1`` ``image_url`` data URLs and ``/v1/responses`` ``input_image`` parts are turned
into it by their routes). Each image is decoded here with Pillow, in the off-loop pool, with
bounds: an encoded image of at most ``MAX_IMAGE_BYTES``, at most ``MAX_PIXELS`` pixels (checked
from the header, before the pixels are decoded: a decompression bomb costs nothing), no 0x0
image, no truncated file, nothing that is not an image. A bad one is refused with a 400 that
names the message and the image index. PNG, JPEG, WebP and GIF (its first frame) are read, and
anything Pillow reads besides; the pixels go to the runner as RGB, scaled down so that the
longer side is at most ``MAX_SIDE`` (every projector resizes to its own input size anyway).

In the prompt an image is a marker, ``<|image-NONCE-i|>``, put before the text of its message
(as Ollama puts its ``[img-i]`` tags); the nonce is new for each request, so no text a user
sends can pass for an image. The runner splits the prompt at the markers (``engine.vision``).

Audio clips ride in the same lists and markers (``server.audio``): an entry that is a WAV or an
MP3 is read as audio when the model's projector has an audio encoder.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Any

from modelhub.errors import InputError
from modelhub.server import audio

MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_PIXELS = 50_000_000  # about 7000 x 7000
MAX_SIDE = 1536
MAX_IMAGES = 64


@dataclass
class RequestImages:
    """A request's images, in order, and the markers that stand for them in its prompt."""

    nonce: str = field(default_factory=lambda: secrets.token_hex(6))
    pixels: list[dict[str, Any]] = field(default_factory=list)

    def marker(self, index: int) -> str:
        return f"<|image-{self.nonce}-{index}|>"

    @property
    def pattern(self) -> str:
        return rf"<\|image-{self.nonce}-(\d+)\|>"

    def runner_fields(self) -> dict[str, Any]:
        """What the runner's ``generate`` op takes (nothing when there is no image)."""
        if not self.pixels:
            return {}
        return {
            "image_marker": self.pattern,
            "images": {str(i): p for i, p in enumerate(self.pixels)},
        }

    def count_fields(self) -> dict[str, Any]:
        """What the runner's ``count`` op takes to count each marker as its image's positions
        (the projector's tokens for an image of that size): nothing when there is no image."""
        if not self.pixels:
            return {}
        sizes = {str(i): [p["width"], p["height"]] for i, p in enumerate(self.pixels) if "rgb" in p}
        clips = {
            str(i): [p["frames"], p["sample_rate"]]
            for i, p in enumerate(self.pixels)
            if "audio" in p
        }
        return {"image_marker": self.pattern, "image_sizes": sizes, "audio_frames": clips}


@dataclass(frozen=True)
class Senses:
    """What a model's projector reads: images (``vision``), audio clips (``audio``)."""

    vision: bool = False
    audio: bool = False

    def __bool__(self) -> bool:
        return self.vision or self.audio


def media_bytes(data: str, where: str) -> bytes:
    """The bytes of one base64 entry of an ``images`` list (a data: URL's payload too)."""
    if data.startswith(("http://", "https://")):
        raise InputError(f"{where}: remote image URLs are not fetched; send the image as data")
    if data.startswith("data:"):
        data = data.partition(",")[2]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{where}: invalid base64 data") from None


def decode_media(data: str, where: str, senses: Senses, model: str) -> dict[str, Any]:
    """One entry of an ``images`` list: an audio clip (``server.audio``) when it is a WAV or
    an MP3, otherwise an image; refused when the projector does not read that kind."""
    raw = media_bytes(data, where)
    if audio.audio_format(raw) is not None:
        if not senses.audio:
            raise InputError(
                f"{where}: {model} cannot read audio: its projector has no audio encoder"
            )
        return audio.decode_audio(raw, where)
    if not senses.vision:
        raise InputError(
            f"{where}: not WAV or MP3 audio, and {model} cannot read images: "
            "its projector has no vision encoder"
        )
    return image_from_bytes(raw, where)


def image_from_bytes(raw: bytes, where: str) -> dict[str, Any]:
    """An encoded image, checked and decoded to RGB."""
    from PIL import Image, ImageFile, UnidentifiedImageError

    if len(raw) > MAX_IMAGE_BYTES:
        raise InputError(f"{where}: the image is {len(raw)} bytes, more than {MAX_IMAGE_BYTES}")
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
            w, h = img.size
            if w <= 0 or h <= 0:
                raise InputError(f"{where}: the image is empty ({w}x{h})")
            if w * h > MAX_PIXELS:
                raise InputError(
                    f"{where}: the image is {w}x{h} pixels, more than {MAX_PIXELS} in all"
                )
            img.seek(0)  # a GIF's or WebP's first frame
            img.load()
            rgb = img.convert("RGB")
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(
            f"{where}: the image has too many pixels (a decompression bomb?); "
            f"at most {MAX_PIXELS} are read"
        ) from None
    except UnidentifiedImageError:
        raise InputError(f"{where}: not an image that can be read (PNG, JPEG, WebP, GIF)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InputError(f"{where}: the image is damaged or truncated ({exc})") from None
    if max(rgb.size) > MAX_SIDE:
        rgb.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.BICUBIC)
    return {
        "width": rgb.size[0],
        "height": rgb.size[1],
        "rgb": base64.b64encode(rgb.tobytes()).decode("ascii"),
    }


def image_list(value: Any, where: str) -> list[str]:
    """A message's ``images`` field: a list of base64 strings (or none)."""
    if value in (None, []):
        return []
    if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
        raise InputError(f'field "{where}images" must be an array of base64 strings')
    return value


def mark(
    images: RequestImages, messages: list[dict[str, Any]], offset: int
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The messages with a marker for each image before their content, and the images to
    decode as (where, data); ``offset`` is added to message indexes in errors."""
    out: list[dict[str, Any]] = []
    todo: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        found = image_list(message.get("images"), f"messages[{i + offset}].")
        if not found:
            out.append(message)
            continue
        markers = ""
        for j, data in enumerate(found):
            markers += images.marker(len(todo))
            todo.append((f"messages[{i + offset}].images[{j}]", data))
        out.append({**message, "content": markers + str(message.get("content") or "")})
    return out, todo


async def prepare(
    images: RequestImages, todo: list[tuple[str, str]], senses: Senses, model: str
) -> None:
    """Decode the images and audio clips off the event loop (refusing the first bad one), or
    refuse them all when the model has no projector."""
    from modelhub.server.offloop import off_loop

    if not todo:
        return
    if not senses:
        raise InputError(
            f"{todo[0][0]}: {model} cannot read images or audio: it has no vision or audio "
            "projector"
        )
    if len(todo) > MAX_IMAGES:
        raise InputError(f"{len(todo)} images in one request: at most {MAX_IMAGES}")
    for where, data in todo:
        images.pixels.append(await off_loop(decode_media, data, where, senses, model))
        if "audio" in images.pixels[-1]:
            audio.check_total([p for p in images.pixels if "audio" in p], where)


def mark_prompt(
    images: RequestImages, prompt: str, value: Any
) -> tuple[str, list[tuple[str, str]]]:
    """A generate request's prompt with markers for its ``images`` first."""
    found = image_list(value, "")
    markers = "".join(images.marker(j) for j in range(len(found)))
    return markers + prompt, [(f"images[{j}]", d) for j, d in enumerate(found)]


def check_markers(images: RequestImages, text: str) -> None:
    """Each marker of the rendered prompt stands for one of the request's images."""
    for index in re.findall(images.pattern, text):
        if int(index) >= len(images.pixels):
            raise InputError("the prompt refers to an image the request does not have")


def projector_facts(view: Any) -> tuple[list[str], dict[str, Any] | None]:
    """The capabilities a model's projector gives it (``vision``) and its ``projector_info``
    for ``/api/show``; none when it has no readable projector."""
    from modelhub.errors import ModelhubError
    from modelhub.gguf.info import read_gguf_info
    from modelhub.gguf.projector import capabilities_of, projector_info

    if not view.projector_paths:
        return [], None
    try:
        info = read_gguf_info(view.projector_paths[-1])
    except (ModelhubError, OSError):
        return [], None
    return capabilities_of(info), projector_info(info)


def can_see(view: Any) -> Senses:
    """What the model's projector reads (false when it has none): images, audio or both."""
    found = projector_facts(view)[0]
    return Senses(vision="vision" in found, audio="audio" in found)


MEDIA_PART_TYPES = ("image_url", "input_audio")  # the chat content parts read by openai_images


def openai_images(content: Any, where: str) -> list[str]:
    """The images and audio clips of an OpenAI message's content parts, in order, as base64
    strings: ``image_url`` (a data URL or an ``{"url": ...}`` object; remote URLs are refused)
    and ``input_audio`` (``{"data": base64, "format": "wav" | "mp3"}``)."""
    if not isinstance(content, list):
        return []
    out: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in MEDIA_PART_TYPES:
            continue
        if part["type"] == "input_audio":
            out.append(audio.openai_audio(part, f"{where}.content[{j}]"))
        else:
            out.append(image_url_data(part.get("image_url"), f"{where}.content[{j}]"))
    return out


def image_url_data(value: Any, where: str) -> str:
    """The base64 data of an OpenAI image URL (``image_url`` of a chat part, a string or an
    ``{"url": ...}`` object; ``image_url`` of a Responses ``input_image``): a data: URL only,
    remote URLs refused."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str):
        raise InputError(f"{where}.image_url must have a url string")
    if url.startswith(("http://", "https://")):
        raise InputError(
            f"{where}: remote image URLs are not fetched; send the image "
            "as a data: URL (data:image/png;base64,...)"
        )
    if not url.startswith("data:"):
        raise InputError(f"{where}: the image URL must be a data: URL")
    return url.partition(",")[2]
