"""Parser for the Go text/template subset: tokens -> syntax tree, with Go's static checks.

Checked here, as Go's parser does: unknown functions, undefined variables, ``break``/``continue``
outside ``range``, misplaced ``else``/``end``, empty pipelines and non-executable pipeline stages.
Named templates (``define``/``template``/``block``) are refused: a Modelfile TEMPLATE is a single
template and Ollama's library does not use them.
"""

from __future__ import annotations

from typing import NoReturn

from modelhub.templates.go_ast import (
    Action,
    Branch,
    Chain,
    Command,
    Dot,
    Expr,
    Field,
    Function,
    Literal,
    LoopControl,
    Node,
    Pipeline,
    Text,
    Variable,
)
from modelhub.templates.go_lexer import Positions, Token, lex, template_error

_PARENS = "parenthesized pipeline"
MAX_NESTING = 100  # control structures and parentheses; keeps recursion far from Python's limit


class _Parser:
    def __init__(self, tokens: list[Token], positions: Positions, functions: frozenset[str]):
        self.tokens = tokens
        self.i = 0
        self.positions = positions
        self.functions = functions
        self.vars: list[str] = ["$"]
        self.range_depth = 0
        self.depth = 0

    def fail(self, offset: int, what: str) -> NoReturn:
        template_error(self.positions, offset, what)

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[self.i + ahead]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect_close(self, what: str) -> None:
        tok = self.next()
        if tok.kind != "close":
            self.fail(tok.offset, f"unexpected {_describe(tok)} in {what}")

    def nest(self, offset: int) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            self.fail(offset, f"template nests deeper than {MAX_NESTING} levels")

    # -- lists of nodes -------------------------------------------------------------------

    def parse_list(self) -> tuple[tuple[Node, ...], Token | None]:
        """Parse nodes up to EOF or an ``{{end}}``/``{{else}}`` (returned, its ``}}`` unread)."""
        nodes: list[Node] = []
        while self.peek().kind != "eof":
            tok = self.next()
            if tok.kind == "text":
                nodes.append(Text(tok.value, tok.offset))
                continue
            first = self.peek()
            if first.kind == "keyword" and first.value in ("end", "else"):
                self.i += 1
                return tuple(nodes), first
            nodes.append(self.parse_action(tok, first))
        return tuple(nodes), None

    def parse_action(self, open_tok: Token, first: Token) -> Node:
        if first.kind != "keyword":
            pipe = self.parse_pipeline("command", open_tok.offset, allow_decl=True, multi=False)
            self.expect_close("command")
            if pipe.decl and not pipe.assign:
                self.vars.extend(pipe.decl)
            return Action(pipe, open_tok.offset)
        self.i += 1
        word = first.value
        if word in ("if", "with", "range"):
            return self.parse_control(word, first.offset)
        if word in ("break", "continue"):
            if self.range_depth == 0:
                self.fail(first.offset, f"{{{{{word}}}}} outside {{{{range}}}}")
            self.expect_close(word)
            return LoopControl(word, first.offset)
        self.fail(
            first.offset,
            f"{{{{{word}}}}} is not supported: a TEMPLATE is one template without named parts",
        )

    def parse_control(self, kind: str, offset: int) -> Branch:
        self.nest(offset)
        mark = len(self.vars)
        pipe = self.parse_pipeline(kind, offset, allow_decl=True, multi=kind == "range")
        self.expect_close(kind)
        if pipe.decl and not pipe.assign:
            self.vars.extend(pipe.decl)
        if kind == "range":
            self.range_depth += 1
        body, stop = self.parse_list()
        if kind == "range":
            self.range_depth -= 1
        if stop is None:
            self.fail(offset, f"{{{{{kind}}}}} is not closed with {{{{end}}}}")
        else_body: tuple[Node, ...] | None = None
        if stop.value == "else":
            nxt = self.peek()
            if nxt.kind == "keyword" and nxt.value == kind and kind in ("if", "with"):
                # {{else if}} / {{else with}}: a nested branch that shares our {{end}}.
                self.i += 1
                else_body = (self.parse_control(kind, nxt.offset),)
            else:
                self.expect_close("else")
                else_body, stop = self.parse_list()
                if stop is None:
                    self.fail(offset, f"{{{{{kind}}}}} is not closed with {{{{end}}}}")
                if stop.value != "end":
                    self.fail(stop.offset, f"more than one {{{{else}}}} in {{{{{kind}}}}}")
                self.expect_close("end")
        else:
            self.expect_close("end")
        del self.vars[mark:]
        self.depth -= 1
        return Branch(kind, pipe, body, else_body, offset)

    # -- pipelines ------------------------------------------------------------------------

    def parse_pipeline(self, context: str, offset: int, allow_decl: bool, multi: bool) -> Pipeline:
        start = self.peek().offset
        decl, assign = self.parse_declaration(allow_decl, multi)
        cmds: list[Command] = []
        while True:
            tok = self.peek()
            if tok.kind == ")" and context != _PARENS:
                self.fail(tok.offset, "unexpected ')' in operand")
            if tok.kind in ("close", ")"):
                break
            cmds.append(self.parse_command())
            if self.peek().kind == "|":
                bar = self.next()
                # Go accepts a dangling '|' before the end of the pipeline, but not '| |'.
                if self.peek().kind == "|":
                    self.fail(bar.offset, "missing command after '|'")
        if not cmds:
            self.fail(self.peek().offset, f"missing value for {context}")
        for n, cmd in enumerate(cmds[1:], start=2):
            if not isinstance(cmd.args[0], Function):
                self.fail(cmd.offset, f"non-executable command in pipeline stage {n}")
        first = cmds[0].args[0]
        if isinstance(first, Literal) and first.value is None:
            self.fail(first.offset, "nil is not a command")
        for cmd in cmds:
            if len(cmd.args) > 1 and not isinstance(cmd.args[0], Function):
                self.fail(cmd.args[1].offset, "can't give argument to non-function")
        return Pipeline(decl, assign, tuple(cmds), start)

    def parse_declaration(self, allow: bool, multi: bool) -> tuple[tuple[str, ...], bool]:
        t0 = self.peek()
        if t0.kind != "var":
            return (), False
        names = [t0.value]
        ahead = 1
        if self.peek(1).kind == "," and self.peek(2).kind == "var":
            names.append(self.peek(2).value)
            ahead = 3
        op = self.peek(ahead)
        if op.kind not in (":=", "="):
            return (), False
        if not allow:
            self.fail(t0.offset, "a variable cannot be declared inside parentheses")
        if len(names) == 2 and not multi:
            self.fail(t0.offset, "too many declarations (only range declares two variables)")
        if op.kind == "=":
            for name in names:
                if name not in self.vars:
                    self.fail(t0.offset, f'undefined variable "{name}"')
        self.i += ahead + 1
        return tuple(names), op.kind == "="

    def parse_command(self) -> Command:
        args: list[Expr] = []
        offset = self.peek().offset
        while self.peek().kind not in ("close", ")", "|"):
            tok = self.peek()
            if args and not tok.space_before and tok.kind != "(":
                self.fail(tok.offset, f"missing space before {_describe(tok)}")
            args.append(self.parse_operand())
        if not args:
            self.fail(offset, "empty command")
        return Command(tuple(args), offset)

    def parse_operand(self) -> Expr:
        tok = self.next()
        kind = tok.kind
        term: Expr
        if kind == "field":
            return Field((tok.value, *self.parse_fields()), tok.offset)
        if kind == "var":
            if tok.value not in self.vars:
                self.fail(tok.offset, f'undefined variable "{tok.value}"')
            return Variable(tok.value, self.parse_fields(), tok.offset)
        if kind == "dot":
            term = Dot(tok.offset)
        elif kind in ("string", "number", "bool", "nil"):
            term = Literal(tok.value, tok.offset)
        elif kind == "ident":
            if tok.value not in self.functions:
                self.fail(tok.offset, f'function "{tok.value}" not defined')
            term = Function(tok.value, tok.offset)
        elif kind == "(":
            self.nest(tok.offset)
            inner = self.parse_pipeline(_PARENS, tok.offset, False, False)
            close = self.next()
            if close.kind != ")":
                self.fail(tok.offset, "unclosed left paren")
            self.depth -= 1
            fields = self.parse_fields()
            return Chain(inner, fields, tok.offset) if fields else inner
        else:
            self.fail(tok.offset, f"unexpected {_describe(tok)} in operand")
        if self.peek().kind == "field" and not self.peek().space_before:
            self.fail(self.peek().offset, f"unexpected field after {_describe(tok)}")
        return term

    def parse_fields(self) -> tuple[str, ...]:
        names: list[str] = []
        while self.peek().kind == "field" and not self.peek().space_before:
            names.append(self.next().value)
        return tuple(names)


def _describe(tok: Token) -> str:
    if tok.kind == "close":
        return "'}}'"
    if tok.kind == "string":
        return f"string {tok.value!r}"
    if tok.kind == "field":
        return f"'.{tok.value}'"
    if tok.kind in ("number", "bool"):
        return f"{tok.kind} {tok.value!r}"
    if tok.kind == "nil":
        return "nil"
    return repr(tok.value)


def parse(text: str, functions: frozenset[str]) -> tuple[tuple[Node, ...], Positions]:
    tokens, positions = lex(text)
    tokens.append(Token("eof", None, len(text)))
    parser = _Parser(tokens, positions, functions)
    nodes, stop = parser.parse_list()
    if stop is not None:
        parser.fail(stop.offset, f"unexpected {{{{{stop.value}}}}}")
    return nodes, positions
