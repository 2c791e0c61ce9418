"""The request bodies of OpenAI's routes (``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``) as pydantic models, on the rules of ``server/request_models.py``: the
OpenAPI document's bodies are generated from them. The routes still read their bodies field by
field (``server/completion_request.py``, ``requests.read_model_request``); parsing them into
these models is the next step (issue 22).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, WithJsonSchema

from modelhub.server.request_models import MESSAGES_SCHEMA, STR_OR_STRS_SCHEMA, NamedBody

StrOrStrs = Annotated[str | list[str], WithJsonSchema(STR_OR_STRS_SCHEMA)]


class OpenAIBody(NamedBody):
    """OpenAI's routes take no ``name`` alias for ``model`` and do not stream by default."""

    name_alias: ClassVar[bool] = False


class SamplingBody(OpenAIBody):
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stop: StrOrStrs | None = None
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    response_format: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None


class ChatCompletionBody(SamplingBody):
    messages: Annotated[list[dict[str, Any]], WithJsonSchema(MESSAGES_SCHEMA)]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    truncate: bool = True  # **extension**, as on /api/chat


class CompletionBody(SamplingBody):
    prompt: StrOrStrs
    suffix: str = ""


class EmbeddingsRequestBody(OpenAIBody):
    input: StrOrStrs
    dimensions: int | None = None
    encoding_format: Literal["float", "base64"] = "float"
