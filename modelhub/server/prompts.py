"""The text a model is given: a request's prompt or messages rendered with the model's template.

A Modelfile TEMPLATE (Go syntax) wins; without one the GGUF's own chat template (Jinja) is used.
The model's SYSTEM and MESSAGE history come first, as Ollama does.
"""

from __future__ import annotations

from typing import Any

from modelhub.errors import InputError
from modelhub.library.views import ModelView
from modelhub.server.state import ServerState
from modelhub.templates.isolated import render_generate
from modelhub.templates.prompt import build_chat_prompt, build_generate_prompt


def chat_prompt(
    state: ServerState,
    view: ModelView,
    messages: list[dict[str, Any]],
    tools: list[Any] | None = None,
    *,
    think: bool | str | None = None,
) -> str:
    """Model MESSAGEs + request messages (+ the model's SYSTEM unless one is given), rendered."""
    history = list(view.messages) + messages
    if view.system and (not messages or messages[0]["role"] != "system"):
        history = [{"role": "system", "content": view.system}, *history]
    bos, eos = _special(state, view)
    return build_chat_prompt(
        go_template=view.template,
        jinja_template=None if view.template else _jinja(view),
        messages=history,
        tools=tools or None,
        bos_token=bos,
        eos_token=eos,
        think=think,
        tokenizer_adds_bos=_adds_bos(view),
    )


def generate_prompt(
    state: ServerState,
    view: ModelView,
    prompt: str,
    *,
    system: str = "",
    template: str = "",
    suffix: str = "",
    with_history: bool = True,
    think: bool | str | None = None,
) -> str:
    """The prompt of a generate request; the request's own ``template``, when large, is parsed
    and rendered in a child process (``templates.isolated``): call this off the event loop
    when there is one."""
    bos, eos = _special(state, view)
    go = template or view.template
    args: dict[str, Any] = {
        "go_template": go,
        "jinja_template": None if go else _jinja(view),
        "prompt": prompt,
        "system": system or view.system,
        "history": view.messages if with_history else [],
        "suffix": suffix or None,
        "bos_token": bos,
        "eos_token": eos,
        "think": think,
        "tokenizer_adds_bos": _adds_bos(view),
    }
    if template:
        return render_generate(args)
    return build_generate_prompt(**args)


def _special(state: ServerState, view: ModelView) -> tuple[str, str]:
    if view.model_layer is None:
        return "", ""
    return state.views.special_tokens(view.model_layer.digest)


def _jinja(view: ModelView) -> str | None:
    return view.info.chat_template if view.info else None


def _adds_bos(view: ModelView) -> bool:
    return not (view.info is not None and view.info.add_bos is False)


def check_prompt_fits(state: ServerState, weights: str, text: str, n_ctx: int) -> None:
    """Refuse, before any runner work, a prompt whose byte length alone proves it cannot fit
    the model ``weights`` (a digest): one token spells at most ``max_token_bytes`` bytes (the
    runner checks the exact count)."""
    longest = state.views.max_token_bytes(weights)
    at_least = -(-len(text.encode("utf-8")) // longest)
    if at_least >= n_ctx:
        raise InputError(
            f"the prompt has at least {at_least} tokens but the context holds {n_ctx}: "
            "shorten the prompt or load the model with a larger num_ctx"
        )
