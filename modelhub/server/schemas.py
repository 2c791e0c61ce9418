"""Transitional, to be deleted: the ``/v1`` routes' OpenAPI request bodies under the names
``routes_openai.py`` and ``routes_completions.py`` import (they are being split). They are
generated from the models of ``server/openai_models.py``; once those routes say
``openapi_extra=openapi_body(ChatCompletionBody)`` themselves, this module goes.
"""

from __future__ import annotations

from modelhub.server.openai_models import ChatCompletionBody, CompletionBody, EmbeddingsRequestBody
from modelhub.server.request_models import openapi_body

OPENAI_CHAT = openapi_body(ChatCompletionBody)
OPENAI_COMPLETION = openapi_body(CompletionBody)
OPENAI_EMBEDDINGS = openapi_body(EmbeddingsRequestBody)
