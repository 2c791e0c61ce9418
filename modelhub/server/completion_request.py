"""A generating /v1 request, rendered and run: the path every OpenAI-shaped API shares.

The body has been parsed into ``server/openai_models.py``'s models. ``chat_setup`` renders a
chat request (:class:`~modelhub.server.openai_models.ChatFields`: messages with text, image and
audio parts, tools, reasoning, ``response_format``, truncation) into a ``Setup``: the rendered
prompt, grammar, reply parser and truncation; /v1/responses and /v1/messages translate their
requests to it, and /v1/completions builds its own. ``completion_events`` runs a ``Setup`` on
the model's runner with the body's sampling fields (OpenAI's names and defaults, mapped to
Ollama's options by ``ollama_options``) and ``prediction``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from modelhub.engine import protocol as proto
from modelhub.errors import InputError
from modelhub.library.views import ModelView
from modelhub.replies.reply import ReplyParser, ReplyPart
from modelhub.server.generation import Event, Finished, run_on_runner
from modelhub.server.images import RequestImages, can_see, mark, prepare
from modelhub.server.openai_models import ChatFields, SamplingBody
from modelhub.server.prompts import chat_prompt
from modelhub.server.reply_options import reply_parser, request_grammar, thinking, tool_plan
from modelhub.server.state import ServerState
from modelhub.server.truncation import ChatFit


@dataclass(frozen=True)
class Setup:
    """A read and rendered generation request: its prompt, grammar, reply parser, truncation
    and log-probabilities."""

    text: str
    grammar: str | None
    parser: ReplyParser | None
    fit: ChatFit | None
    top: int | None
    images: RequestImages = dataclasses.field(default_factory=RequestImages)
    image_todo: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def parse(self, text: str) -> ReplyPart:
        return self.parser.feed(text) if self.parser is not None else ReplyPart(content=text)

    def finish(self) -> ReplyPart:
        return self.parser.finish() if self.parser is not None else ReplyPart()


def chat_setup(
    state: ServerState,
    view: ModelView,
    body: ChatFields,
    messages: list[dict[str, Any]] | None = None,
) -> Setup:
    """A chat request (also what /v1/responses and /v1/messages translate to), rendered;
    ``messages``, when given, are already in the template's form (/v1/messages), else the
    body's own."""
    think = thinking(view, body.thinking)
    tooling = tool_plan(view, body.tools, body.tool_choice)
    if messages is None:
        if body.messages is None:
            raise InputError("messages must be a non-empty array")
        messages = body.messages
    images = RequestImages()
    messages, todo = mark(images, messages, 0)
    text = chat_prompt(state, view, messages, tooling.tools, think=think)
    grammar = request_grammar(
        {"grammar": body.grammar},
        body.response_format,
        tooling.grammar,
        format_field="response_format",
    )
    fit = ChatFit(  # Ollama's truncate, honoured here too (default true)
        messages,
        lambda kept: chat_prompt(state, view, kept, tooling.tools, think=think),
        truncate=body.truncate,
        count_fields=images.count_fields,  # images are decoded before the fit counts
    )
    parser = reply_parser(view, text, think, tooling.tools)
    return Setup(text, grammar, parser, fit, body.alternatives(), images, todo)


async def completion_events(
    state: ServerState, body: SamplingBody, setup: Setup, view: Any, started: int
) -> AsyncIterator[Event]:
    """The runner's events for a set-up request (metrics recorded at the end)."""
    await prepare(setup.images, setup.image_todo, can_see(view), view.name.display)
    p = state.plan(view, ollama_options(body), prediction=bool(body.prediction))
    top = setup.top
    options = p.options if top is None else {**p.options, "top_logprobs": top}
    msg = proto.Generate(
        prompt=setup.text,
        options=proto.runner_options(options),
        grammar=setup.grammar,
        prediction=body.prediction,
        **setup.images.runner_fields(),
    )
    async for ev in run_on_runner(state, p, body.keep_alive, msg, started, setup.fit):
        if isinstance(ev, Finished):
            state.metrics.record(view.name.display, ev.result)
        yield ev


def ollama_options(body: SamplingBody) -> dict[str, Any]:
    """The body's sampling fields (OpenAI's names and defaults) as Ollama's ``options``."""
    opts: dict[str, Any] = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
    }
    max_tokens = body.max_completion_tokens or body.max_tokens
    extras = {
        "num_predict": max_tokens,
        "seed": body.seed,
        "stop": body.stop,
        # extensions, as in ``options``
        "draft": body.draft,
        "draft_num_predict": body.draft_num_predict,
        "top_k": body.top_k,
    }
    return {**opts, **{key: value for key, value in extras.items() if value is not None}}
