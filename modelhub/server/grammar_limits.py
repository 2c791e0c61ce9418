"""Bounds on what a request asks llama.cpp to parse as a grammar, checked in the daemon.

llama.cpp's GBNF parser and its grammar set-up recurse: one level of C stack per nested group
``( ... )`` and per rule reached through another rule's first element. A request grammar of
some 20,000 nested groups, or a chain of some 100,000 rules, overflows a runner's stack and
kills it (SIGSEGV) with every request it was serving. So every grammar a request decodes under
(a raw ``grammar``, one made from a ``format`` / ``response_format`` schema, or a forced tool
call made from the tools' schemas) is measured here, in plain Python, before any runner sees
it; the JSON schemas are measured before they are converted. The limits sit far above what real
grammars and schemas use and far below what breaks a thread's stack.
"""

from __future__ import annotations

import json
import re
from typing import Any

from modelhub.errors import InputError

MAX_GRAMMAR_BYTES = 1024 * 1024
MAX_GRAMMAR_DEPTH = 64  # nested groups within a rule
MAX_GRAMMAR_RULES = 10_000
MAX_SCHEMA_BYTES = MAX_GRAMMAR_BYTES
MAX_SCHEMA_DEPTH = 64  # nested JSON objects and arrays

# What can hold a parenthesis without opening a group: literals, character classes, token
# references and comments (as llama.cpp's parser reads them).
_OPAQUE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|<[^>\n]*>|#[^\n]*', re.S)
_DEFINITION = re.compile(r"::=")


def check_grammar(gbnf: str, where: str) -> None:
    """Refuse (400, naming ``where`` and the limit) a GBNF text that is too large, has too many
    rules or nests groups too deeply."""
    size = len(gbnf.encode("utf-8", errors="replace"))
    if size > MAX_GRAMMAR_BYTES:
        raise InputError(
            f"{where}: the grammar is {size} bytes; the limit is {MAX_GRAMMAR_BYTES} bytes"
        )
    structure = _OPAQUE.sub(" ", gbnf)
    rules = len(_DEFINITION.findall(structure))
    if rules > MAX_GRAMMAR_RULES:
        raise InputError(
            f"{where}: the grammar has {rules} rules; the limit is {MAX_GRAMMAR_RULES}"
        )
    depth = 0
    for match in re.finditer(r"[()]", structure):
        depth += 1 if match.group() == "(" else -1
        if depth > MAX_GRAMMAR_DEPTH:
            raise InputError(
                f"{where}: the grammar nests groups more than {MAX_GRAMMAR_DEPTH} levels deep "
                f"(the limit); name the inner parts as rules instead"
            )


def check_schema(schema: Any, where: str) -> None:
    """Refuse (400) a JSON schema (or a list of tools holding schemas) too large or too deeply
    nested to be turned into a grammar."""
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", errors="replace"))
    if size > MAX_SCHEMA_BYTES:
        raise InputError(
            f"{where}: the JSON schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES} bytes"
        )
    work: list[tuple[Any, int]] = [(schema, 1)]
    while work:
        value, depth = work.pop()
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise InputError(
                f"{where}: the JSON schema nests objects and arrays more than "
                f"{MAX_SCHEMA_DEPTH} levels deep (the limit); use $defs and $ref instead"
            )
        children = value.values() if isinstance(value, dict) else value
        work.extend((child, depth + 1) for child in children)
