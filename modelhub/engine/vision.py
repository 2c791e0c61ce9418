"""Images in a prompt: a projector (mmproj) GGUF loaded with llama.cpp's libmtmd, images turned
into embeddings once, and those embeddings evaluated into a sequence's KV cache.

A prompt with images is a token list in which each image holds ``n_tokens`` positions filled
with a placeholder token (so that everything that reads a request's tokens, samplers, n-gram
and draft-model drafters, sees ordinary token ids: a draft model sees text only), plus one
:class:`ImageSpan` per image with its embeddings. The prompt cache compares spans by the
image's digest as well as by tokens, so a different image at the same place is never reused,
and a reuse point never falls inside an image.

Encoding runs on the runner's request thread (before the request joins the batch); the spans
are evaluated on the batch thread, one ``llama_decode`` of embeddings per image, just before
the text that follows them (``sequence.Generation``'s prefill).

Audio clips take the same path (``engine.audio``): a projector with an audio encoder turns a
clip into audio chunks, each one span of embeddings like an image's.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import mtmd_cpp as mtmd

from modelhub.engine.audio import RawAudio, audio_bitmap, samples_at
from modelhub.engine.context import LlamaContext
from modelhub.engine.llama import LlamaModel
from modelhub.engine.native import native_log_mark, native_messages_since
from modelhub.errors import GGUFError, InputError, ModelhubError

log = logging.getLogger("modelhub.vision")
MAX_COUNTED_PIXELS = 64_000_000  # the daemon sends at most 1536 x 1536
IMAGES_WITH_OBSERVERS = (  # every drafter modelhub has follows them (``vision_drafting``)
    "images with a drafter that cannot follow the target's states at an image's positions are "
    'not supported: send options {"draft": "off"}, or use DRAFT mtp, ngram or a draft model'
)


@dataclass(frozen=True)
class ImageSpan:
    """One image's place in a prompt: ``n_tokens`` positions from ``start``."""

    start: int
    n_tokens: int
    digest: str  # of the pixels and their size: the prompt cache's identity of the image
    embd: npt.NDArray[np.float32]  # (n_tokens, n_embd)
    non_causal: bool = False

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    def same_as(self, other: ImageSpan) -> bool:
        return (self.start, self.n_tokens, self.digest) == (
            other.start,
            other.n_tokens,
            other.digest,
        )


@dataclass(frozen=True)
class RawImage:
    """Decoded pixels as the daemon sends them: RGB, 8 bits a channel, row by row."""

    width: int
    height: int
    rgb: bytes


class Projector:
    """A loaded projector paired with the target model (libmtmd checks the widths again)."""

    def __init__(self, model: LlamaModel, path: Path, n_threads: int, use_gpu: bool) -> None:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        mark = native_log_mark()
        handle = mtmd.mtmd_init_from_file(str(path).encode(), model.handle, params)
        if not handle:
            detail = native_messages_since(mark) or "no details"
            raise GGUFError(f"libmtmd could not load the projector {path.name}: {detail}")
        self.handle: Any = handle
        self.model = model
        if mtmd.mtmd_decode_use_mrope(handle):
            self.close()
            raise InputError(
                f"projector {path.name} uses M-RoPE positions (Qwen-VL family): "
                "not supported by this engine yet"
            )
        self.vision = bool(mtmd.mtmd_support_vision(handle))
        self.audio = bool(mtmd.mtmd_support_audio(handle))
        if not (self.vision or self.audio):
            self.close()
            raise InputError(f"projector {path.name} has no vision or audio encoder")
        self.sample_rate = int(mtmd.mtmd_get_audio_sample_rate(handle)) if self.audio else 0
        # any id the tokenizer has: what drafters and samplers see at image positions
        self.placeholder = model.bos if 0 <= model.bos < model.n_vocab else 0
        self._sizes: dict[tuple[int, int], int] = {}  # image_tokens by image size
        self._clips: dict[int, int] = {}  # audio_tokens by samples at the encoder's rate

    def encode(self, media: RawImage | RawAudio) -> list[list[int] | ImageSpan]:
        """The pieces an image or a clip becomes: token lists (a projector's begin/end
        tokens, if it has any) and its spans (``start`` 0: placed by the caller): one for an
        image, one for each of the audio encoder's windows for a clip."""
        if isinstance(media, RawAudio):
            digest = media.digest
        else:
            if len(media.rgb) != media.width * media.height * 3:
                raise InputError("image pixels do not match its size")
            size = f"{media.width}x{media.height}:".encode()
            digest = hashlib.sha256(size + media.rgb).hexdigest()
        with self._chunks(media) as chunks:
            return [
                self._piece(mtmd.mtmd_input_chunks_get(chunks, i), digest)
                for i in range(mtmd.mtmd_input_chunks_size(chunks))
            ]

    def audio_tokens(self, frames: int, rate: int) -> int:
        """The positions a clip of ``frames`` at ``rate`` takes in a prompt, without encoding
        it (a silent clip of that length is cut into the encoder's windows)."""
        if not self.audio:
            raise InputError("this model's projector has no audio encoder")
        n = samples_at(frames, rate, self.sample_rate)
        if n not in self._clips:
            if len(self._clips) > 256:
                self._clips.clear()
            with self._chunks(RawAudio(blank=n)) as chunks:
                self._clips[n] = _positions(chunks)
        return self._clips[n]

    def image_tokens(self, width: int, height: int) -> int:
        """The positions an image of this size takes in a prompt (its image tokens and the
        projector's begin/end tokens), without encoding it: what truncation counts."""
        key = (width, height)
        if key not in self._sizes:
            blank = RawImage(width, height, bytes(width * height * 3))
            with self._chunks(blank) as chunks:
                self._sizes[key] = _positions(chunks)
        return self._sizes[key]

    def _bitmap(self, media: RawImage | RawAudio) -> Any:
        if isinstance(media, RawAudio):
            if not self.audio:
                raise InputError("this model's projector has no audio encoder")
            return audio_bitmap(self.handle, media)
        if not self.vision:
            raise InputError("this model's projector has no vision encoder")
        if width_height_bad(media.width, media.height):
            raise InputError(f"an image of {media.width}x{media.height} pixels")
        buf = (ctypes.c_uint8 * len(media.rgb)).from_buffer_copy(media.rgb)
        return mtmd.mtmd_bitmap_init(media.width, media.height, buf)

    @contextmanager
    def _chunks(self, media: RawImage | RawAudio) -> Iterator[Any]:
        """libmtmd's chunks of an image or a clip (preprocessed, not encoded), freed
        afterwards."""
        what = "audio clip" if isinstance(media, RawAudio) else "image"
        bitmap = self._bitmap(media)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            if not bitmap or not chunks:
                raise ModelhubError(f"libmtmd could not allocate an {what}")
            part = mtmd.mtmd_input_part(None, bitmap)
            parts = (ctypes.POINTER(mtmd.mtmd_input_part) * 1)(ctypes.pointer(part))
            mark = native_log_mark()
            if mtmd.mtmd_tokenize_from_parts(self.handle, chunks, parts, 1, False) != 0:
                raise InputError(
                    f"the projector cannot take this {what}: "
                    f"{native_messages_since(mark) or 'no details'}"
                )
            yield chunks
        finally:
            if chunks:
                mtmd.mtmd_input_chunks_free(chunks)
            if bitmap:
                mtmd.mtmd_bitmap_free(bitmap)

    def _piece(self, chunk: Any, digest: str) -> list[int] | ImageSpan:
        kind = mtmd.mtmd_input_chunk_get_type(chunk)
        if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t(0)
            ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return [int(ids[i]) for i in range(n.value)]
        if kind not in (mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE, mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO):
            raise InputError("the projector made something other than image or audio chunks")
        mark = native_log_mark()
        if mtmd.mtmd_encode_chunk(self.handle, chunk) != 0:
            raise ModelhubError(f"encoding failed: {native_messages_since(mark)}")
        n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
        out = mtmd.mtmd_get_output_embd(self.handle)
        dim = self.model.n_embd
        embd = np.ctypeslib.as_array(out, shape=(n_tokens * dim,)).reshape(n_tokens, dim).copy()
        causal = not mtmd.mtmd_decode_use_non_causal(self.handle, chunk)
        return ImageSpan(0, n_tokens, digest, embd, non_causal=not causal)

    def close(self) -> None:
        if self.handle:
            mtmd.mtmd_free(self.handle)
            self.handle = None


def _positions(chunks: Any) -> int:
    """The prompt positions of libmtmd's chunks (text, image and audio)."""
    return sum(
        int(mtmd.mtmd_input_chunk_get_n_tokens(mtmd.mtmd_input_chunks_get(chunks, i)))
        for i in range(mtmd.mtmd_input_chunks_size(chunks))
    )


def open_projector(model: LlamaModel, cfg: Any, n_threads: int, devices: Any) -> Projector | None:
    """The configured projector (``EngineConfig.projector_path``), on the GPU when the model
    is offloaded to one."""
    if cfg.projector_path is None:
        return None
    return Projector(model, Path(cfg.projector_path), n_threads, use_gpu=bool(devices))


def build_prompt(
    projector: Projector, pieces: list[list[int] | RawImage | RawAudio]
) -> tuple[list[int], list[ImageSpan]]:
    """Token ids and image (and audio) spans of a prompt given as text token lists, images
    and audio clips."""
    tokens: list[int] = []
    spans: list[ImageSpan] = []
    for piece in pieces:
        parts = projector.encode(piece) if isinstance(piece, RawImage | RawAudio) else [piece]
        for part in parts:
            if isinstance(part, ImageSpan):
                span = replace(part, start=len(tokens))
                spans.append(span)
                tokens.extend([projector.placeholder] * span.n_tokens)
            else:
                tokens.extend(part)
    if spans and spans[-1].end >= len(tokens):
        raise InputError("the prompt cannot end with an image: text must follow it")
    return tokens, spans


def reusable(cached: list[ImageSpan], wanted: list[ImageSpan], reuse: int) -> int:
    """How much of a sequence's cache a prompt may keep, given ``reuse`` matching tokens: no
    further than the first image that differs, never inside an image."""
    for had, want in zip(cached, wanted, strict=False):
        if not had.same_as(want):
            reuse = min(reuse, had.start, want.start)
            break
    else:
        if len(cached) > len(wanted):
            reuse = min(reuse, cached[len(wanted)].start)
        elif len(wanted) > len(cached):
            reuse = min(reuse, wanted[len(cached)].start)
    for span in (*cached, *wanted):
        if span.start < reuse < span.end:
            reuse = span.start
    return reuse


def decode_embeddings(
    ctx: LlamaContext, span: ImageSpan, seq: int, after: Callable[[int, int], None] | None = None
) -> None:
    """Evaluate an image's embeddings into sequence ``seq`` at its positions (no logits);
    ``after(offset, rows)`` follows each decode (drafters that read the target's states)."""
    n, dim = span.embd.shape
    step = n if span.non_causal else max(1, ctx.n_batch)
    if span.non_causal and n > ctx.n_batch:
        raise InputError(f"an image of {n} tokens needs num_batch >= {n} with this projector")
    batch = llama_cpp.llama_batch_init(step, dim, 1)
    try:
        for off in range(0, n, step):
            m = min(step, n - off)
            rows = np.ascontiguousarray(span.embd[off : off + m], dtype=np.float32)
            ctypes.memmove(batch.embd, rows.ctypes.data, rows.nbytes)
            for i in range(m):
                batch.pos[i] = span.start + off + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = 0
            batch.n_tokens = m
            if span.non_causal:
                llama_cpp.llama_set_causal_attn(ctx.handle, False)
            mark = native_log_mark()
            rc = llama_cpp.llama_decode(ctx.handle, batch)
            if span.non_causal:
                llama_cpp.llama_set_causal_attn(ctx.handle, True)
            if rc != 0:
                raise ModelhubError(
                    f"evaluating an image failed (llama_decode {rc}): "
                    f"{native_messages_since(mark) or 'no details'}"
                )
            if after is not None:
                after(off, m)
    finally:
        llama_cpp.llama_batch_free(batch)


def width_height_bad(width: int, height: int) -> bool:
    return width <= 0 or height <= 0 or width * height > MAX_COUNTED_PIXELS


def count_tokens(
    engine: Any, text: str, msg: dict[str, Any], add_special: bool, cancel: Any
) -> int:
    """The positions ``text`` takes in a prompt, each match of the count request's
    ``image_marker`` counted as the image of that index takes (``image_sizes``: index ->
    [width, height]) or the audio clip (``audio_frames``: index -> [frames, sample_rate]);
    plain text when the request has no marker or the model no projector."""
    marker = str(msg.get("image_marker") or "")
    projector: Projector | None = engine.projector
    if not marker or projector is None:
        return len(engine.tokenize(text, add_special=add_special, cancel=cancel))
    sizes = msg.get("image_sizes") or {}
    clips = msg.get("audio_frames") or {}
    n = 0
    for i, part in enumerate(re.split(marker, text)):
        if i % 2 == 0:
            if part or i == 0:
                n += len(engine.tokenize(part, add_special=add_special and i == 0, cancel=cancel))
            continue
        clip = clips.get(part)
        if isinstance(clip, list | tuple) and len(clip) == 2:
            n += projector.audio_tokens(int(clip[0]), int(clip[1]))
            continue
        size = sizes.get(part)
        if not isinstance(size, list | tuple) or len(size) != 2:
            raise InputError(f"image {part} of the text to count was not sent")
        n += projector.image_tokens(int(size[0]), int(size[1]))
    return n


def prompt_with_images(
    engine: Any, text: str, context: list[int], msg: dict[str, Any], cancel: Any
) -> tuple[list[int], list[ImageSpan]]:
    """A generate request's prompt whose ``image_marker`` matches stand for its ``images``
    (see the runner protocol): the text between markers tokenized, each image encoded."""
    import base64

    projector: Projector | None = engine.projector
    if projector is None:
        raise InputError("this model cannot read images: it has no vision projector")
    images = msg.get("images") or {}
    pieces: list[list[int] | RawImage | RawAudio] = [list(context)] if context else []
    parts = re.split(str(msg.get("image_marker") or ""), text)
    for i, part in enumerate(parts):
        if i % 2 == 0:
            if part or i == 0:
                first = i == 0 and not context
                pieces.append(engine.tokenize(part, add_special=first, cancel=cancel))
            continue
        image = images.get(part)
        if not isinstance(image, dict):
            raise InputError(f"image {part} of the prompt was not sent")
        if "audio" in image:  # an audio clip (``engine.audio``)
            pieces.append(RawAudio(base64.b64decode(str(image["audio"]))))
            continue
        rgb = base64.b64decode(str(image.get("rgb") or ""))
        pieces.append(RawImage(int(image["width"]), int(image["height"]), rgb))
    return build_prompt(projector, pieces)
