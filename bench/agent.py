"""A coding agent's turn through Anthropic's Messages API and OpenAI's stateful Responses API
(``--agent`` of bench/serving.py).

    python bench/agent.py [--model smollm2-q4_1|smollm2-q8_0|PATH] [--threads 2] [--repeats 5]

What Claude Code does when it edits a file: the edit benchmark's prompt (rename a variable in
a function it was shown) with a ``write_file`` tool, the call forced by ``tool_choice`` (the
code comes back inside the call's JSON), then the ``tool_result`` and the model's closing
words. Both turns stream through ``POST /v1/messages``, greedy, once with drafting on by
default (``DRAFT auto``) and once with ``"draft": "off"`` in the body, taking turns for
``--repeats`` rounds. Per configuration: the decode rate a client sees on the first turn
(output tokens after the first / time from ``message_start``, which the daemon sends with the
first token, to ``message_stop``: a forced call arrives whole at its end, so its deltas cannot
time it), the turn's wall time, the drafts ``usage`` reports, and whether the two
configurations wrote the same call. The same flow then runs as Codex does, through
``POST /v1/responses``: the forced ``write_file`` function call, then its
``function_call_output`` continuing the stored response by ``previous_response_id``.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import serving

MODEL = "bench-agent"
# SmolLM2's own template has no place for tools: a ChatML one that shows them and their calls.
TOOLS_TEMPLATE = """{{- if .Tools }}<|im_start|>system
To call a tool, reply with only <tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools:
{{ range .Tools }}{{ json .Function }}
{{ end }}<|im_end|>
{{ end }}
{{- range .Messages }}<|im_start|>{{ if eq .Role "tool" }}user
<tool_response>{{ .Content }}</tool_response>{{ else }}{{ .Role }}
{{ if .ToolCalls }}<tool_call>
{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}
{{ end }}</tool_call>{{ else }}{{ .Content }}{{ end }}{{ end }}<|im_end|>
{{ end }}<|im_start|>assistant
"""
SYSTEM = "You are a coding agent. Change files by calling write_file with their whole new text."
WRITE_FILE = {
    "name": "write_file",
    "description": "Write the whole new content of a file",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


def _turn(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed turn: its blocks, usage and the client-side decode rate."""
    started, first, blocks, usage = time.perf_counter(), 0.0, [], {}
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            kind = event["type"]
            if kind == "message_start":  # sent once the first token is there
                first = time.perf_counter()
            elif kind == "content_block_start":
                blocks.append({**event["content_block"], "text_or_json": ""})
            elif kind == "content_block_delta":
                delta = event["delta"]
                blocks[-1]["text_or_json"] += delta.get("text") or delta.get("partial_json") or ""
            elif kind == "message_delta":
                usage = event["usage"]
            elif kind == "error":
                raise RuntimeError(f"stream error: {event['error']}")
    ended = time.perf_counter()
    tokens = int(usage.get("output_tokens") or 0)
    rate = (tokens - 1) / (ended - first) if first and ended > first and tokens > 1 else 0.0
    return {"blocks": blocks, "usage": usage, "rate": rate, "seconds": ended - started}


def _flow(client: httpx.Client, edit: str, extra: dict[str, Any]) -> dict[str, Any]:
    user = {"role": "user", "content": edit}
    base = {"model": MODEL, "system": SYSTEM, "temperature": 0, **extra}
    first = _turn(
        client,
        {
            **base,
            "messages": [user],
            "tools": [WRITE_FILE],
            "tool_choice": {"type": "tool", "name": "write_file"},
            "max_tokens": 512,
        },
    )
    call = next(b for b in first["blocks"] if b["type"] == "tool_use")
    arguments = json.loads(call["text_or_json"])
    use = {"type": "tool_use", "id": call["id"], "name": call["name"], "input": arguments}
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "written"}
    messages = [
        user,
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    second = _turn(client, {**base, "messages": messages, "tools": [WRITE_FILE], "max_tokens": 64})
    return {"call": arguments, "first": first, "second": second}


WRITE_FUNCTION = {
    "type": "function",
    "name": WRITE_FILE["name"],
    "description": WRITE_FILE["description"],
    "parameters": WRITE_FILE["input_schema"],
}


def _responses_turn(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed Responses turn, measured as :func:`_turn` measures a Messages one (from
    ``response.created``, sent with the first token, to ``response.completed``)."""
    started, first, response = time.perf_counter(), 0.0, {}
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.created":
                first = time.perf_counter()
            elif event["type"] in ("response.completed", "response.incomplete"):
                response = event["response"]
            elif event["type"] in ("error", "response.failed"):
                raise RuntimeError(f"stream error: {event}")
    ended = time.perf_counter()
    usage = response.get("usage") or {}
    tokens = int(usage.get("output_tokens") or 0)
    rate = (tokens - 1) / (ended - first) if first and ended > first and tokens > 1 else 0.0
    blocks = [
        {"type": "tool_use", "id": item["call_id"], "text_or_json": item["arguments"]}
        for item in response.get("output", [])
        if item.get("type") == "function_call"
    ]
    return {
        "blocks": blocks,
        "usage": usage,
        "rate": rate,
        "seconds": ended - started,
        "id": response.get("id"),
    }


def _responses_flow(client: httpx.Client, edit: str, extra: dict[str, Any]) -> dict[str, Any]:
    base = {"model": MODEL, "temperature": 0, "tools": [WRITE_FUNCTION], **extra}
    first = _responses_turn(
        client,
        {
            **base,
            "instructions": SYSTEM,
            "input": edit,
            "tool_choice": {"type": "function", "name": "write_file"},
            "max_output_tokens": 512,
        },
    )
    call = first["blocks"][0]
    output = {"type": "function_call_output", "call_id": call["id"], "output": "written"}
    body = {**base, "previous_response_id": first["id"], "input": [output]}
    second = _responses_turn(client, {**body, "max_output_tokens": 64})
    return {"call": json.loads(call["text_or_json"]), "first": first, "second": second}


def bench_agent(url: str, source_model: str, edit: str, repeats: int) -> dict[str, Any]:
    """The section's figures, for a daemon at ``url`` that has ``source_model``: the flow
    through /v1/messages, then through /v1/responses."""
    with httpx.Client(base_url=url, timeout=900) as client:
        create = {"model": MODEL, "from": source_model, "template": TOOLS_TEMPLATE}
        client.post("/api/create", json={**create, "stream": False}).raise_for_status()
        out = _measure(client, _flow, edit, repeats)
        out["responses"] = _measure(client, _responses_flow, edit, repeats)
    return out


def _measure(client: httpx.Client, flow: Any, edit: str, repeats: int) -> dict[str, Any]:
    configs = {"draft auto": {}, "draft off": {"draft": "off"}}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for extra in configs.values():
        flow(client, edit, extra)  # warm-up: loads, and lets auto measure its drafters
    for _ in range(repeats):
        for name, extra in configs.items():
            runs[name].append(flow(client, edit, extra))
    out: dict[str, Any] = {"repeats": repeats, "configs": {}}
    for name, flows in runs.items():
        usage = flows[-1]["first"]["usage"]
        out["configs"][name] = {
            "decode_tok_s": round(statistics.median(f["first"]["rate"] for f in flows), 2),
            "turn_s": round(statistics.median(f["first"]["seconds"] for f in flows), 2),
            "output_tokens": usage.get("output_tokens"),
            "draft_count": usage.get("draft_count"),
            "draft_accepted_count": usage.get("draft_accepted_count"),
            "second_turn_s": round(statistics.median(f["second"]["seconds"] for f in flows), 2),
        }
    auto, off = out["configs"]["draft auto"], out["configs"]["draft off"]
    out["speedup"] = (
        round(auto["decode_tok_s"] / off["decode_tok_s"], 2) if off["decode_tok_s"] else None
    )
    out["same_call"] = all(
        a["call"] == b["call"] for a, b in zip(runs["draft auto"], runs["draft off"], strict=True)
    )
    return out


def print_section(section: dict[str, Any], api: str = "/v1/messages") -> None:
    print(f"\n== coding agent through {api} (edit prompt, forced write_file call)")
    head = ("config", "decode tok/s", "turn s", "tokens", "drafted", "kept")
    print("   {:<12} {:>12} {:>7} {:>6} {:>7} {:>5}".format(*head))
    for name, c in section["configs"].items():
        print(
            f"   {name:<12} {c['decode_tok_s']:>12} {c['turn_s']:>7} {c['output_tokens']:>6} "
            f"{c['draft_count']:>7} {c['draft_accepted_count']:>5}"
        )
    print(f"   speed-up (auto / off): {section['speedup']}x; same call: {section['same_call']}")
    if "responses" in section:
        print_section(section["responses"], "/v1/responses (previous_response_id)")


def run(model: Path, settings: serving.Settings, repeats: int) -> dict[str, Any]:
    """The section on a daemon of its own (bench/serving.py's, drafting on by default)."""
    from speculative import EDIT

    print(f"\n== {model.name}: coding agent through /v1/messages and /v1/responses", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        d = serving.DaemonTarget(model, settings, Path(tmp))
        try:
            section = bench_agent(d.daemon.url, d.model_name, EDIT, repeats)
        finally:
            d.close()
    print_section(section)
    section["model"] = model.name
    return section


def main() -> int:
    # SIGTERM unwinds like Ctrl-C, so the daemon and its temporary store are cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="smollm2-q4_1")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    settings = serving.Settings(args.threads, 2048, 128)
    section = run(serving.resolve_model(args.model), settings, args.repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(section, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
