"""Fitting a long conversation into the context: Ollama's ``truncate`` for chat requests.

A rendered chat that has fewer tokens than the context is used whole. One that does not fit
loses its oldest turns: the system messages and the last message always stay, the kept
messages are rendered again, and the first rendering that leaves room for the answer wins.
The room is Ollama's (``contextShiftPromptLimit``): a cut prompt gets at most
``n_ctx - max((n_ctx - num_keep) // 2, 1)`` tokens, so about half the context is left to
generate into, as a first context shift would free. When even the last message (with the
system prompt and the template) has ``n_ctx`` tokens or more, or ``truncate`` is false and the
chat does not fit, the request is refused (400) with the counts and what to do.

Cuts fall on fixed points of the conversation so that the next turn cuts in the same place and
reuses the runner's prompt cache: a new cut point every ``step`` tokens of message content
(``step`` is half the room), counted from the start of the conversation, moved forward to the
next user message so that the kept part starts a turn. Counted from the start, these points do
not move when a turn is appended; the chosen one (the first whose rendering fits the room)
stays until the conversation has grown by up to a quarter of the context past it, and only
then do the oldest kept turns go, a quarter to a half of the context at once. Cutting as little
as possible instead would move the cut, and lose the cache, at every turn.

Tokens are counted by the model's runner (``op: count``), which holds the tokenizer the prompt
is evaluated with, BOS rule included: the daemon loads no llama.cpp code of its own, so a
vocabulary that crashes llama.cpp costs a runner, not the daemon, and the count is exact. It
takes two round trips to the runner for a chat that does not fit (the messages' sizes, then
the candidate renderings) and one for a chat that does. An image counts as the positions the
model's projector gives it (``ChatFit.count_fields``: the runner asks its projector, by the
image's size), not as the text of its marker; an image belongs to its message, so a cut, which
drops whole messages, never falls inside one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from modelhub.errors import InputError

Message = dict[str, Any]
Render = Callable[[list[Message]], str]
# Token counts of texts, with the tokenizer's special tokens (BOS) when the flag is true.
Count = Callable[[list[str], bool], Awaitable[list[int]]]


def prompt_limit(n_ctx: int, num_keep: int = 4) -> int:
    """The most tokens a cut prompt may have: Ollama's limit for a prompt it shortens,
    which leaves about half the context for generation."""
    keep = max(0, min(num_keep, n_ctx - 1))
    return n_ctx - max((n_ctx - keep) // 2, 1)


@dataclass(frozen=True)
class ChatFit:
    """A chat request's prompt, made once its runner is there to count tokens."""

    messages: list[Message]
    render: Render
    truncate: bool = True
    num_keep: int = 4
    # what the runner's count op needs to count image markers as images, asked when counting
    # (the request's images are decoded by then): ``RequestImages.count_fields``
    count_fields: Callable[[], dict[str, Any]] = dict

    def shortest(self) -> str:
        """The least this chat can be rendered to (the last message with the system messages;
        everything without truncate): what a cheap size check may refuse before loading."""
        last = len(self.messages) - 1
        return self.render(kept(self.messages, last) if self.truncate else self.messages)

    async def __call__(self, count: Count, n_ctx: int) -> str:
        return await fit_chat(
            self.messages,
            self.render,
            count,
            n_ctx,
            truncate=self.truncate,
            num_keep=self.num_keep,
        )


async def fit_chat(
    messages: list[Message],
    render: Render,
    count: Count,
    n_ctx: int,
    *,
    truncate: bool = True,
    num_keep: int = 4,
) -> str:
    """``messages`` rendered (with ``render``) so that they fit ``n_ctx`` tokens, the oldest
    turns dropped if needed (see the module docstring)."""
    text = render(messages)
    (n,) = await count([text], True)
    if n < n_ctx:
        return text
    if not truncate:
        raise InputError(
            f"the conversation needs {n} tokens but the context holds {n_ctx}: send fewer or "
            "shorter messages, leave truncate on to drop the oldest ones, or use a larger num_ctx"
        )
    limit = prompt_limit(n_ctx, num_keep)
    sizes = await count([_text(m) for m in messages], False)
    cuts = cut_points(messages, sizes, step=max(1, (n_ctx - limit) // 2), longest=2 * n_ctx)
    texts = [render(kept(messages, cut)) for cut in cuts]
    counts = await count(texts, True)
    for text, n in zip(texts, counts, strict=True):
        if n <= limit:
            return text
    if counts[-1] < n_ctx:  # the last message alone fits, with less room to answer
        return texts[-1]
    raise InputError(
        f"the last message alone needs {counts[-1]} tokens (with the system prompt and the "
        f"template) but the context holds {n_ctx}: shorten it, or load the model with a "
        "larger num_ctx"
    )


def kept(messages: list[Message], cut: int) -> list[Message]:
    """The system messages before ``cut``, then every message from ``cut`` on."""
    return [m for m in messages[:cut] if m.get("role") == "system"] + messages[cut:]


def cut_points(
    messages: Sequence[Message], sizes: Sequence[int], *, step: int, longest: int
) -> list[int]:
    """Candidate cuts (the index of the first message kept after the dropped ones), in order:
    one each time the content of the non-system messages before it passes another multiple of
    ``step`` tokens, moved to the next user message; the last message alone comes last. Cuts
    that keep more than ``longest`` tokens of content cannot fit and are left out."""
    last = len(messages) - 1
    after = _content_after(messages, sizes)
    cuts: list[int] = []
    dropped, mark = 0, step
    for i in range(1, last + 1):
        if messages[i - 1].get("role") != "system":
            dropped += sizes[i - 1]
        if dropped < mark:
            continue
        mark = (dropped // step + 1) * step
        cut = next((j for j in range(i, last) if messages[j].get("role") == "user"), last)
        if (not cuts or cut > cuts[-1]) and after[cut] <= longest:
            cuts.append(cut)
    if not cuts or cuts[-1] != last:
        cuts.append(last)
    return cuts


def _content_after(messages: Sequence[Message], sizes: Sequence[int]) -> list[int]:
    """For each index, the content tokens a cut there keeps (system messages included)."""
    system = sum(s for m, s in zip(messages, sizes, strict=True) if m.get("role") == "system")
    out, tail = [0] * len(messages), 0
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") != "system":
            tail += sizes[i]
        out[i] = tail + system
    return out


def _text(message: Message) -> str:
    """What a message puts into the prompt, besides the template (to count its size)."""
    parts = [str(message.get("content") or ""), str(message.get("thinking") or "")]
    if message.get("tool_calls"):
        parts.append(json.dumps(message["tool_calls"], ensure_ascii=False, default=str))
    return "".join(parts)
