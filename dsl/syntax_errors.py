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

import difflib
import functools
import re

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from duplexcadence.dsl.diagnostics import Diagnostic, Span, error
from duplexcadence.dsl.mistakes import MISTAKES

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_INT_DIGITS = 15  # 10**15 < 2**53: every literal is exact wherever it goes
MAX_EXPR_DEPTH = 32
MAX_PATH_STEPS = 32
# rules that nest expressions (`(e)` is inlined by the grammar's `?atom`)
_EXPR_RULES = frozenset({"add", "sub", "mul", "max_of"})

# How terminals are named in "expected ..." messages.
_FRIENDLY = {
    "NAME": "a name",
    "ATTR": "an attribute name",
    "INT": "an integer",
    "STRING": 'a "string"',
    "DTYPE": "a dtype (float32, bfloat16, int64, ...)",
    "SCALAR_TYPE": "a scalar type (bool, int, float, none)",
    "LIFETIME": "a lifetime (operator, unit, chunk, turn, session, process)",
    "MUTABILITY": "a mutability (immutable, mutable, copy_on_write)",
    "ADDRESS": "an address kind (stable, moves, pinned)",
    "ALLOCATION": "an allocation (demand, stock, none)",
    "EFFECT": "an effect (none, device_rng, host_rng)",
    "MODE": "a mode (replay, eager)",
    "INSTALL": "an install kind (device_buffer, hoisted, left_eager)",
    "FOLD_KIND": "a fold kind (weight_norm)",
    "COMPARE": "a comparison (<=, <, ==, !=, >=, >)",
    "OP_NAME": "an op name (aten.mean.dim, ...)",
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
def _mistake_states(parser: Lark) -> dict[tuple[int, str], str]:
    """(LR state, token type) each mistake example fails at -> its code. The state is
    the automaton's, not the stack: a mistake is one wherever the block it is in stands
    and whatever came before it in the block (lark's ``match_examples`` also compares the
    stack's depth, so a property after another was never recognised)."""
    states: dict[tuple[int, str], str] = {}
    for code, _, examples in MISTAKES:
        for text in examples:
            try:
                parser.parse(text)
            except UnexpectedToken as exc:
                states.setdefault((exc.state.position, exc.token.type), code)
            else:  # pragma: no cover - a test keeps every example malformed
                raise AssertionError(f"mistake example parses: {text!r}")
    return states


def _mistake(exc: UnexpectedToken, parser: Lark) -> Diagnostic | None:
    state = getattr(exc, "state", None)
    code = _mistake_states(parser).get((getattr(state, "position", None), exc.token.type))
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
    accepted = _accepted(exc)
    expected = sorted({_describe(t, parser) for t in accepted})
    listing = ", ".join(expected[:8]) + (", ..." if len(expected) > 8 else "")
    hint = _did_you_mean(exc, accepted, parser)
    if isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    ):
        return error("CLK003", f"unexpected end of file; expected {listing}", span)
    assert isinstance(exc, UnexpectedToken)
    message = f"unexpected {_token_text(exc.token)}; expected {listing}{hint}"
    return error("CLK001", message, span)


def _did_you_mean(exc: UnexpectedInput, accepted: set[str], parser: Lark) -> str:
    """ "; did you mean 'region'?" for a word close to a keyword or a choice (a dtype, an
    effect, a lifetime) the parser would have accepted there (difflib), else ""."""
    token = getattr(exc, "token", None)
    word = str(getattr(token, "value", ""))
    if not _WORD.fullmatch(word):
        return ""
    choices: list[str] = []
    for t in parser.terminals:
        if t.name not in accepted:
            continue
        if t.pattern.type == "str":
            choices.append(t.pattern.value)
        else:  # an alternation of words: (?:none|device_rng|host_rng)
            body = t.pattern.value.removeprefix("(?:").removesuffix(")")
            alternatives = body.split("|")
            if all(_WORD.fullmatch(a) for a in alternatives):
                choices += alternatives
    close = difflib.get_close_matches(word, [c for c in choices if _WORD.fullmatch(c)], n=1)
    return f"; did you mean '{close[0]}'?" if close and close[0] != word else ""


def _accepted(exc: UnexpectedInput) -> set[str]:
    """The terminals the parser would have accepted where it failed. LALR merges states,
    so lark's own ``expected`` inside a ``region`` block lists ``callable``'s keywords
    too; the interactive parser's ``accepts()`` tries each terminal from the real state."""
    expected = set(getattr(exc, "expected", set()) or set())
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:
        try:
            return set(interactive.accepts()) or expected
        except Exception:  # noqa: BLE001 - a state lark cannot replay: its own set
            return expected
    return expected


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
