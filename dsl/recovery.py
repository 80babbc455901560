"""Syntax errors that recover: every syntax error of a file, each said in its block's terms.

Contract of this layer. ``parse_recovering(text, parser)`` parses; at a syntax error it
keeps the error's diagnostic and resynchronises at the next statement: the statement
the error is in (from its keyword at the start of a line to the next statement keyword
at the start of a line outside any block) is blanked — every character a space, every
newline kept, so the rest keeps its lines and columns — and the text is parsed again,
up to ``MAX_SYNTAX_ERRORS`` errors. Nothing after a syntax error is validated (a
blanked statement would only cause follow-on errors), so a file reports all its syntax
errors and nothing else.

A block left open (its ``}`` missing) is named at its opening line (CLK009) instead of
as an unexpected keyword at the next statement. (What one error says — the expected set
from the parser's real state, "did you mean" — is syntax_errors.py's.)
Braces are counted outside strings and comments; the text stays data throughout.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from lark import Lark
from lark.exceptions import UnexpectedEOF, UnexpectedInput, UnexpectedToken

from duplexcadence.dsl.diagnostics import Diagnostic, Span, error

MAX_SYNTAX_ERRORS = 20
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=1)
def _statement_keywords(parser: Lark) -> frozenset[str]:
    """The keywords statements start with (``contract``, ``region``, ...), read off the
    grammar: the first string of every ``*_decl`` rule's alternatives."""
    strings = {t.name: t.pattern.value for t in parser.terminals if t.pattern.type == "str"}
    return frozenset(
        strings[rule.expansion[0].name]
        for rule in parser.rules
        if (rule.origin.name.endswith("_decl") or rule.origin.name.endswith("_clock"))
        and rule.expansion
        and rule.expansion[0].name in strings
    )


@dataclass(frozen=True)
class _Line:
    depth: int  # brace depth at the start of the line
    word: str | None  # the word the line starts with at column 1, if any


def _scan(text: str) -> tuple[list[_Line], int]:
    """Per line: the brace depth at its start and its first word at column 1; and the
    depth after the last line."""
    out, depth = [], 0
    for line in text.split("\n"):
        m = _WORD.match(line)
        out.append(_Line(depth, m.group(0) if m else None))
        in_string = False
        for ch in line:
            if in_string:
                in_string = ch != '"'
            elif ch == '"':
                in_string = True
            elif ch == "#":
                break
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth = max(0, depth - 1)
    return out, depth


def _opening(lines: list[_Line], before: int, statements: frozenset[str]) -> int | None:
    """The 0-based line of the statement whose block is open at line ``before``."""
    for i in range(min(before, len(lines) - 1), -1, -1):
        if lines[i].depth == 0 and lines[i].word in statements:
            return i
    return None


def parse_recovering(text: str, parser: Lark, diagnose) -> tuple[object, list[Diagnostic]]:
    """(the tree, []) for a file without syntax errors, else (None, every syntax error's
    diagnostic); ``diagnose(exc)`` is the plain diagnostic of one error."""
    statements = _statement_keywords(parser)
    found: list[Diagnostic] = []
    current = text
    for _ in range(MAX_SYNTAX_ERRORS):
        try:
            tree = parser.parse(current)
        except UnexpectedInput as exc:
            lines, end_depth = _scan(current)
            d, start, stop = _explain(exc, lines, end_depth, statements, diagnose)
            found.append(d)
            blanked = _blank(current, start, stop)
            if blanked == current:  # nothing left to skip: stop here
                break
            current = blanked
            continue
        return (tree, []) if not found else (None, found)
    return None, found


def _explain(exc, lines, end_depth, statements, diagnose) -> tuple[Diagnostic, int, int]:
    """The diagnostic of ``exc`` and the 0-based lines [start, stop) to blank after it."""
    eof = isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    )
    at = len(lines) - 1 if eof or exc.line < 1 else min(exc.line - 1, len(lines) - 1)
    word = None if eof or not isinstance(exc, UnexpectedToken) else str(exc.token.value)
    in_block = lines[at].depth > 0
    # the statement the error is in: the last statement keyword at the start of a line
    # outside any block, up to the error (a header missing its `{` ends at the error)
    opened = _opening(lines, at, statements)
    # a statement keyword at the start of a line while a block is open: its '}' is missing
    if in_block and opened is not None and exc.column == 1 and word in statements:
        return _unclosed(lines, opened, at), opened, at
    if eof and opened is not None and end_depth > 0:
        return _unclosed(lines, opened, len(lines)), opened, len(lines)
    d = diagnose(exc)
    start = opened if opened is not None else at
    stop = next(
        (
            i
            for i in range(at + 1, len(lines))
            if lines[i].depth == 0 and lines[i].word in statements
        ),
        len(lines),
    )
    return d, start, stop


def _unclosed(lines, opened: int, at: int) -> Diagnostic:
    where = f"before line {at + 1}" if at < len(lines) else "before the end of the file"
    return error(
        "CLK009",
        f"block '{lines[opened].word}' opened here is not closed: '}}' missing {where}",
        Span(opened + 1, 1, opened + 1, 1 + len(lines[opened].word or "")),
    )


def _blank(text: str, start: int, stop: int) -> str:
    lines = text.split("\n")
    for i in range(max(start, 0), min(stop, len(lines))):
        lines[i] = " " * len(lines[i])
    return "\n".join(lines)
