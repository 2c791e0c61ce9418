"""The reply of a ``/v1/responses`` request as output items, whole or as the typed events of
its stream.

Items: ``reasoning`` (when the model thinks), ``message`` (``output_text``) and
``function_call``; streamed, each item is opened, filled by deltas and closed as the model's
reply comes, every event numbered by ``sequence_number``.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from modelhub.replies.reply import ReplyPart
from modelhub.replies.tool_calls import ToolCall
from modelhub.server.generation import Finished
from modelhub.server.jsonbody import sse
from modelhub.server.responses_request import ResponsesBody


@dataclass
class Reply:
    """One response being built: its ids, output items and the stream's sequence numbers."""

    request: ResponsesBody
    ident: str = field(default_factory=lambda: "resp_" + secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = field(default_factory=list)
    sequence: int = 0
    open_kind: str | None = None  # the item being streamed: "reasoning" or "message"
    previous: str | None = None  # previous_response_id
    stored: bool = False  # kept for previous_response_id, GET and input_items

    def event(self, kind: str, **body: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **body}
        self.sequence += 1
        return f"event: {kind}\n".encode() + sse(payload)

    def response(self, status: str, done: Finished | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.ident,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.request.model,
            "output": self.output,
            "instructions": self.request.instructions,
            "tools": self.request.tools,
            "tool_choice": self.request.tool_choice or "auto",
            "parallel_tool_calls": True,
            "temperature": _or(self.request.temperature, 1.0),
            "top_p": _or(self.request.top_p, 1.0),
            "max_output_tokens": self.request.max_output_tokens,
            "previous_response_id": self.previous,
            "store": self.stored,
            "truncation": self.request.truncation,
            "reasoning": self.request.reasoning or {"effort": None, "summary": None},
            "text": self.request.text or {"format": {"type": "text"}},
            "error": None,
            "incomplete_details": None,
            "metadata": self.request.metadata,
            "usage": None,
        }
        if done is not None:
            prompt, generated = done.prompt_length, done.result.eval_count
            body["usage"] = {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": generated,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + generated,
                # Extensions, as on /v1/messages: the guesses drafting checked and kept.
                "draft_count": done.result.draft_count,
                "draft_accepted_count": done.result.draft_accepted_count,
            }
            if done.result.done_reason == "length":
                body["status"] = "incomplete"
                body["incomplete_details"] = {"reason": "max_output_tokens"}
        return body


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _reasoning_item(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": "rs_" + secrets.token_hex(12),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    )
    return {
        "type": "message",
        "id": "msg_" + secrets.token_hex(12),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + secrets.token_hex(12),
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments, ensure_ascii=False),
        "status": "completed",
    }


def whole_reply(reply: Reply, part: ReplyPart) -> None:
    """The output items of a finished, unstreamed reply."""
    if part.thinking:
        reply.output.append(_reasoning_item(part.thinking))
    if part.content or not part.calls:
        reply.output.append(_message_item(part.content))
    reply.output.extend(_call_item(c) for c in part.calls)


class Streamer:
    """Reply parts -> the Responses stream's events, items opened and closed as they come."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.text = ""
        self.final: dict[str, Any] | None = None  # the response, once finished

    def part(self, part: ReplyPart) -> list[bytes]:
        out: list[bytes] = []
        if part.thinking:
            out += self._open("reasoning")
            out.append(self._delta("response.reasoning_text.delta", part.thinking))
        if part.content:
            out += self._open("message")
            out.append(self._delta("response.output_text.delta", part.content))
        for call in part.calls:
            out += self._close()
            item = _call_item(call)
            index = len(self.reply.output)
            self.reply.output.append(item)
            added = {**item, "arguments": "", "status": "in_progress"}
            out.append(
                self.reply.event("response.output_item.added", output_index=index, item=added)
            )
            ids = {"item_id": item["id"], "output_index": index}
            out.append(
                self.reply.event(
                    "response.function_call_arguments.delta", **ids, delta=item["arguments"]
                )
            )
            out.append(
                self.reply.event(
                    "response.function_call_arguments.done", **ids, arguments=item["arguments"]
                )
            )
            out.append(self.reply.event("response.output_item.done", output_index=index, item=item))
        return out

    def _open(self, kind: str) -> list[bytes]:
        if self.reply.open_kind == kind:
            return []
        out = self._close()
        item = _reasoning_item("") if kind == "reasoning" else _message_item("", "in_progress")
        if kind == "reasoning":
            item = {**item, "content": [], "status": "in_progress"}
        index = len(self.reply.output)
        self.reply.output.append(item)
        self.reply.open_kind, self.text = kind, ""
        out.append(self.reply.event("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                self.reply.event(
                    "response.content_part.added", **self._ids(), content_index=0, part=part
                )
            )
        return out

    def _ids(self) -> dict[str, Any]:
        index = len(self.reply.output) - 1
        return {"item_id": self.reply.output[index]["id"], "output_index": index}

    def _delta(self, kind: str, text: str) -> bytes:
        self.text += text
        return self.reply.event(kind, **self._ids(), content_index=0, delta=text)

    def _close(self) -> list[bytes]:
        kind, self.reply.open_kind = self.reply.open_kind, None
        if kind is None:
            return []
        index = len(self.reply.output) - 1
        ids = self._ids()
        if kind == "reasoning":
            done = _reasoning_item(self.text) | {"id": ids["item_id"]}
            out = [
                self.reply.event(
                    "response.reasoning_text.done", **ids, content_index=0, text=self.text
                )
            ]
        else:
            done = _message_item(self.text) | {"id": ids["item_id"]}
            part = done["content"][0]
            out = [
                self.reply.event(
                    "response.output_text.done", **ids, content_index=0, text=self.text
                ),
                self.reply.event("response.content_part.done", **ids, content_index=0, part=part),
            ]
        self.reply.output[index] = done
        out.append(self.reply.event("response.output_item.done", output_index=index, item=done))
        return out

    def finish(self, done: Finished) -> list[bytes]:
        out = self._close()
        if not self.reply.output:  # an empty answer is still a message
            out += self._open("message") + self._close()
        response = self.reply.response("completed", done)
        self.final = response
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*out, self.reply.event(kind, response=response)]
