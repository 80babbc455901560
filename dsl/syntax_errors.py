"""Syntax errors and input limits as diagnostics: what the parser says when it cannot go on.

Syntax errors read like the language ("expected a name, '{'"), never like lark's
internal terminal names; the common mistakes of `mistakes.py` are recognised by
example (lark's `match_examples`) and get their own codes.

Input limits are checked on the parse tree without recursion, before anything
recurses over it, so no input can exhaust the stack or build unbounded integers:
integer literals of at most `MAX_INT_DIGITS` digits, expressions at most
`MAX_EXPR_DEPTH` deep, paths of at most `MAX_PATH_STEPS` steps.
"""

from __future__ import annotations

import functools

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from duplexcadence.dsl.diagnostics import Diagnostic, Span, error
from duplexcadence.dsl.mistakes import MISTAKES

MAX_INT_DIGITS = 15  # 10**15 < 2**53: every literal is exact wherever it goes
MAX_EXPR_DEPTH = 32
MAX_PATH_STEPS = 32
# rules that nest expressions (`(e)` is inlined by the grammar's `?atom`)
_EXPR_RULES = frozenset({"add", "sub", "mul", "max_of"})

# How terminals are named in "expected ..." messages.
_FRIENDLY = {
    "NAME": "a name",
    "INT": "an integer",
    "STRING": 'a "string"',
    "DTYPE": "a dtype (float32, bfloat16, int64, ...)",
    "SCALAR_TYPE": "a scalar type (bool, int, float, none)",
    "LIFETIME": "a lifetime (operator, unit, chunk, turn, session, process)",
    "MUTABILITY": "a mutability (immutable, mutable, copy_on_write)",
    "ADDRESS": "an address kind (stable, moves, pinned)",
    "ALLOCATION": "an allocation (demand, stock)",
    "EFFECT": "an effect (none, device_rng, host_rng)",
    "MODE": "a mode (replay, eager)",
    "INSTALL": "an install kind (device_buffer, hoisted, left_eager)",
    "FOLD_KIND": "a fold kind (weight_norm)",
    "COMPARE": "a comparison (<=, <, ==, !=, >=, >)",
    "$END": "end of file",
}


def _describe(terminal: str, parser: Lark) -> str:
    if terminal in _FRIENDLY:
        return _FRIENDLY[terminal]
    for t in parser.terminals:
        if t.name == terminal:
            if t.pattern.type == "str":
                return f"'{t.pattern.value}'"
            return terminal.lower()
    return terminal.lower()


def _token_text(token: Token) -> str:
    if token.type == "$END":
        return "end of file"
    return f"'{token.value}'"


@functools.lru_cache(maxsize=1)
def _mistakes_by_token(parser: Lark) -> dict[str, list[tuple[str, list[str]]]]:
    """The mistake examples grouped by the token type each one fails at, so a
    mistake is only recognised at its state *and* on its kind of token."""
    groups: dict[str, dict[str, list[str]]] = {}
    for code, _, examples in MISTAKES:
        for text in examples:
            try:
                parser.parse(text)
            except UnexpectedToken as exc:
                groups.setdefault(exc.token.type, {}).setdefault(code, []).append(text)
            else:  # pragma: no cover - a test keeps every example malformed
                raise AssertionError(f"mistake example parses: {text!r}")
    return {t: list(by_code.items()) for t, by_code in groups.items()}


def _mistake(exc: UnexpectedToken, parser: Lark) -> Diagnostic | None:
    examples = _mistakes_by_token(parser).get(exc.token.type)
    if not examples:
        return None
    # use_accepts=False: lark 1.3 formats a debug message with '%d' of a ParserState on
    # that path and raises TypeError; the token-type grouping above keeps matches exact
    code = exc.match_examples(parser.parse, examples, use_accepts=False)
    if code is None:
        return None
    message = next(m for c, m, _ in MISTAKES if c == code)
    span = Span(exc.line, exc.column, exc.line, exc.column + max(len(exc.token), 1))
    return error(code, f"unexpected {_token_text(exc.token)}: {message}", span)


def syntax_diagnostic(exc: UnexpectedInput, parser: Lark) -> Diagnostic:
    """The one diagnostic of a syntax error (parsing stops at the first)."""
    span = Span(exc.line if exc.line > 0 else 1, exc.column if exc.column > 0 else 1)
    if isinstance(exc, UnexpectedCharacters):
        char = exc.char if exc.char.isprintable() else ascii(exc.char)
        return error("CLK002", f"unexpected character '{char}'", span)
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        mistake = _mistake(exc, parser)
        if mistake is not None:
            return mistake
    expected = sorted({_describe(t, parser) for t in getattr(exc, "expected", set()) or set()})
    listing = ", ".join(expected[:8]) + (", ..." if len(expected) > 8 else "")
    if isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    ):
        return error("CLK003", f"unexpected end of file; expected {listing}", span)
    assert isinstance(exc, UnexpectedToken)
    return error("CLK001", f"unexpected {_token_text(exc.token)}; expected {listing}", span)


def meta_span(meta) -> Span:
    """The span of a parse-tree node (lark's propagated positions)."""
    if getattr(meta, "empty", True):
        return Span()
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def token_span(tok: Token) -> Span:
    return Span(tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column)


def input_limits(tree: Tree) -> list[Diagnostic]:
    """Integer literals too long and expressions too deep, found without recursion."""
    found: list[Diagnostic] = []
    deep_reported = False
    stack: list[tuple[Tree | Token, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Token):
            if node.type == "INT" and len(node.lstrip("0")) > MAX_INT_DIGITS:
                found.append(
                    error(
                        "CLK007",
                        f"integer literal of {len(node)} digits; at most {MAX_INT_DIGITS} "
                        "are allowed",
                        token_span(node),
                    )
                )
            continue
        if not isinstance(node, Tree):
            continue
        if node.data in ("path", "dotted") and len(node.children) > MAX_PATH_STEPS:
            found.append(
                error(
                    "CLK008",
                    f"path of {len(node.children)} steps; at most {MAX_PATH_STEPS} are allowed",
                    meta_span(node.meta),
                )
            )
            continue
        if node.data in _EXPR_RULES:
            depth += 1
            if depth > MAX_EXPR_DEPTH and not deep_reported:
                deep_reported = True
                found.append(
                    error(
                        "CLK008",
                        f"expression nested more than {MAX_EXPR_DEPTH} levels deep",
                        meta_span(node.meta),
                    )
                )
                continue
        stack.extend((child, depth) for child in node.children)
    return found
