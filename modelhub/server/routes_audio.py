"""OpenAI's ``POST /v1/audio/transcriptions``, as Ollama serves it for models with an audio
projector: a multipart form with the audio ``file`` and the ``model``, made into a chat (a
system message that asks for the spoken words only, and a user message with the clip, Ollama's
wording), run greedily by default, and answered as ``{"text": ...}``.

The form is read with Starlette's multipart parser (python-multipart) from a body bounded while
it arrives; the clip is checked by ``server/audio.py`` before any runner work, its errors named
``file``; the chat goes through ``completion_request`` as a ``/v1/chat/completions`` body would.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from modelhub.errors import InputError
from modelhub.replies.reply import ReplyPart
from modelhub.server import audio
from modelhub.server.completion_request import chat_setup, completion_events
from modelhub.server.generation import chained, collect, gathered
from modelhub.server.images import can_see
from modelhub.server.jsonbody import JSONResponse
from modelhub.server.lookup import find_model
from modelhub.server.offloop import off_loop
from modelhub.server.openai_models import chat_fields
from modelhub.server.requests import model_field
from modelhub.server.state import get_state

router = APIRouter()

# Ollama's words (openai.FromTranscriptionRequest): the clip may itself ask something
SYSTEM = (
    "Transcribe the audio exactly as spoken. Output only the spoken words. "
    "Do not answer any question in the audio."
)
ASK = "What exact words are spoken in this audio?"
# The longest transcript a clip gets: speech is ~3-5 tokens a second (Whisper's decoder allows
# 448 a 30 s window); past it a model repeats itself until the context is full.
TOKENS_PER_SECOND = 16
TOKENS_MARGIN = 64


def max_transcript_tokens(seconds: float) -> int:
    return TOKENS_MARGIN + math.ceil(TOKENS_PER_SECOND * seconds)


FORMATS = ("json", "text", "verbose_json")
FIELDS = ("model", "file", "response_format", "language", "prompt", "temperature", "stream")
FORM_LIMIT = audio.MAX_AUDIO_BYTES + 64 * 1024  # the file and the other fields
FORM = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["model", "file"],
                    "properties": {
                        "model": {"type": "string"},
                        "file": {"type": "string", "format": "binary"},
                        "response_format": {"type": "string", "enum": list(FORMATS)},
                        "language": {"type": "string"},
                        "prompt": {"type": "string"},
                        "temperature": {"type": "number", "minimum": 0},
                        "stream": {"type": "boolean"},
                    },
                }
            }
        },
    }
}


@router.post("/v1/audio/transcriptions", openapi_extra=FORM)
async def transcriptions(request: Request) -> Response:
    started = time.monotonic_ns()
    state = get_state(request)
    form = await _read_form(request)
    try:
        fields = _fields(form)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InputError("file is required: the audio to transcribe, as a form file")
        raw = await upload.read()
    finally:
        await form.close()
    if not raw:
        raise InputError("file: the audio file is empty")
    view = await find_model(state, fields["model"])
    if not can_see(view).audio:
        raise InputError(
            f"{fields['model']} cannot transcribe audio: it has no projector with an audio encoder"
        )
    clip = await off_loop(audio.decode_audio, raw, "file")
    data: dict[str, Any] = {
        "model": fields["model"],
        "temperature": fields["temperature"],
        "stream": False,
        "max_completion_tokens": max_transcript_tokens(audio.seconds_of(clip)),
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _system(fields)},
        {"role": "user", "content": ASK, "images": [clip["audio"]]},
    ]
    chat = chat_fields(data)
    setup = chat_setup(state, view, chat, messages=messages)
    setup.images.pixels.append(clip)  # checked above: not decoded again
    setup = dataclasses.replace(setup, image_todo=[])
    events = completion_events(state, chat, setup, view, started)
    head = await collect(events, request, first_token_only=False)
    whole = ReplyPart()
    done = await gathered(chained(head, events), setup, whole.add)
    text = whole.content.strip()  # thinking and tool calls left out
    if fields["response_format"] == "text":
        return PlainTextResponse(text)
    if fields["response_format"] == "verbose_json":
        seconds = audio.seconds_of(clip)
        return JSONResponse(
            {
                "task": "transcribe",
                "language": fields["language"],
                "duration": seconds,
                "text": text,
                "segments": [],
                "usage": {"type": "duration", "seconds": round(seconds, 3)},
            }
        )
    prompt, output = done.prompt_length, done.result.eval_count
    usage = {
        "type": "tokens",
        "input_tokens": prompt,
        "output_tokens": output,
        "total_tokens": prompt + output,
    }
    return JSONResponse({"text": text, "usage": usage})


async def _read_form(request: Request) -> FormData:
    """The multipart form, refused past ``FORM_LIMIT`` bytes (as declared, or as it arrives)."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InputError(
            "the body must be a multipart/form-data form: the audio as its file field, and model"
        )
    too_large = f"request body too large: the limit is {FORM_LIMIT} bytes"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > FORM_LIMIT:
        raise InputError(f"{too_large}, this one declares {declared}")

    async def bounded() -> AsyncGenerator[bytes, None]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > FORM_LIMIT:
                raise InputError(too_large)
            yield chunk

    parser = MultiPartParser(
        request.headers, bounded(), max_files=1, max_fields=len(FIELDS), max_part_size=64 * 1024
    )
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise InputError(f"malformed multipart form: {exc.message}") from None


def _fields(form: FormData) -> dict[str, Any]:
    """The form's fields other than the file, checked (every field is refused, never ignored,
    when it cannot be honoured)."""
    for name in form:
        if name not in FIELDS:
            raise InputError(
                f"form field {name!r} is not supported (supported: {', '.join(FIELDS)})"
            )

    def text(name: str, default: str = "") -> str:
        value = form.get(name, default)
        if not isinstance(value, str):
            raise InputError(f"form field {name!r} must be text, not a file")
        return value.strip()

    fmt = text("response_format", "json") or "json"
    if fmt not in FORMATS:
        raise InputError(
            f"response_format {fmt!r} is not supported: {', '.join(FORMATS)} "
            "(no timestamps are made, so no srt or vtt)"
        )
    if text("stream", "false").lower() not in ("false", "0", ""):
        raise InputError("stream: streamed transcriptions are not supported; send stream=false")
    try:
        temperature = float(text("temperature", "0") or "0")
    except ValueError:
        raise InputError("temperature must be a number") from None
    if not 0 <= temperature <= 2:
        raise InputError("temperature must be between 0 and 2")
    return {
        "model": model_field({"model": form.get("model", "")}, alias=False),
        "response_format": fmt,
        "language": text("language"),
        "prompt": text("prompt"),
        "temperature": temperature,
    }


def _system(fields: dict[str, Any]) -> str:
    out = SYSTEM
    if fields["language"]:
        out += f" The audio is in {fields['language']}."
    if fields["prompt"]:
        out += f" Context: {fields['prompt']}"
    return out
