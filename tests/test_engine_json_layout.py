"""Where JSON grammars let whitespace go (``engine.json_layout``), checked in llama.cpp's own
grammar sampler over SmolLM2's vocabulary: a text is in the grammar when each of its tokens is
allowed in turn and the end of generation is allowed after the last."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from devtools.realmodels import smollm2_q8_0
from modelhub.engine.gbnf import json_grammar, schema_grammar
from modelhub.engine.grammar import GrammarConstraint
from modelhub.engine.llama import LlamaModel
from modelhub.replies.tool_calls import forced_call_grammar


@pytest.fixture(scope="module")
def vocab() -> Iterator[LlamaModel]:
    yield LlamaModel(Path(smollm2_q8_0()), vocab_only=True)


def _accepts(model: LlamaModel, gbnf: str, text: str) -> bool:
    grammar = GrammarConstraint(model, gbnf)
    try:
        for token in model.tokenize(text, add_special=False, parse_special=False):
            if not grammar.allows(token):
                return False
            grammar.accept(token)
        return grammar.allows(int(llama_cpp.llama_vocab_eos(model.vocab)))
    finally:
        grammar.close()


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "colour": {"type": "string"},
        "n": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["colour"],
}


@pytest.mark.parametrize(
    ("text", "allowed"),
    [
        ('{"colour": "coral"}', True),
        ('{"colour":"coral"}', True),
        ('{\n  "colour": "coral"\n}', True),
        ('{\n\t"colour": "coral",\n\t"n": [\n\t\t1,\n\t\t2\n\t]\n}', True),
        ('{ "colour": "coral", "n": [1, 2] }', True),
        ('{"colour": "coral", "n": []}', True),
        ('{"colour"\n\n:\n\n"coral"\n\n}', False),  # what a small model wrote before
        ('{"colour" : "coral"}', False),  # nothing before ":"
        ('{"colour":  "coral"}', False),  # one space at most after it
        ('{"colour": "coral" , "n": []}', False),  # nothing before ","
        ('{\n\n  "colour": "coral"}', False),  # one newline, no blank lines
        ('{"colour": "coral", "n": [ ]}', False),  # an empty array stays []
        ('{"colour": "coral"}\n', False),  # nothing after the value
        ('{"colour": "co\nral"}', False),  # no raw control characters in strings
        ('{"colour": "co\\nral"}', True),  # escapes stay
    ],
)
def test_schema_grammar_whitespace_goes_where_pretty_json_has_it(
    vocab: LlamaModel, text: str, allowed: bool
) -> None:
    assert _accepts(vocab, schema_grammar(SCHEMA), text) is allowed


def test_format_json_is_laid_out_the_same_way(vocab: LlamaModel) -> None:
    grammar = json_grammar()
    assert _accepts(vocab, grammar, '{\n  "a": [1, {"b": null}],\n  "c": true\n}')
    assert _accepts(vocab, grammar, "{}")
    assert not _accepts(vocab, grammar, '{"a": 1}\n\n')
    assert not _accepts(vocab, grammar, '{"a"\n: 1}')


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_a_forced_call_is_compact_and_ends_at_the_call(vocab: LlamaModel) -> None:
    call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    tagged = forced_call_grammar([WEATHER], "<tool_call>")
    assert _accepts(vocab, tagged, f"<tool_call>\n{call}\n</tool_call>")
    assert _accepts(vocab, tagged, f"<tool_call>\n{call.replace(': ', ':')}\n</tool_call>")
    assert not _accepts(vocab, tagged, f"<tool_call>\n{call}\n</tool_call>\n\n")
    assert not _accepts(vocab, tagged, f"<tool_call>\n{call[:1]}\n  {call[1:]}\n</tool_call>")
    bare = forced_call_grammar([WEATHER], None)
    assert _accepts(vocab, bare, call)
    assert not _accepts(vocab, bare, call + "\n\n")
    assert not _accepts(vocab, bare, call.replace(", ", ",\n\t"))
