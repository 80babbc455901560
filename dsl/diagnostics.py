"""Diagnostics: user errors and warnings as values.

Every layer (parser, validation, analysis) reports problems by returning
`Diagnostic` values instead of raising, so one run can show all of them, sorted
by position, as `path:line:col: error[CLKnnn]: message` with the source line and
a caret. Nothing here ever shows a Python traceback or a parser-internal name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from duplexcadence.dsl.codes import CODES


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, order=True)
class Span:
    """A 1-based source position (line, column) with an end, as lark reports it."""

    line: int = 0
    column: int = 0
    end_line: int = 0
    end_column: int = 0


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    code: str
    message: str
    span: Span = field(default_factory=Span)

    def sort_key(self) -> tuple:
        return (self.span.line, self.span.column, self.severity != Severity.ERROR, self.code)

    def to_json(self, path: str) -> dict:
        return {
            "path": path,
            "line": self.span.line,
            "column": self.span.column,
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
        }


def _make(severity: Severity, code: str, message: str, span: Span | None) -> Diagnostic:
    registered = CODES.get(code)
    if registered is None or registered.severity != severity.value:
        raise ValueError(f"{code} is not a registered {severity.value} code (dsl/codes.py)")
    return Diagnostic(severity, code, message, span or Span())


def error(code: str, message: str, span: Span | None = None) -> Diagnostic:
    return _make(Severity.ERROR, code, message, span)


def warning(code: str, message: str, span: Span | None = None) -> Diagnostic:
    return _make(Severity.WARNING, code, message, span)


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.severity == Severity.ERROR for d in diagnostics)


def shown_path(path: str) -> str:
    """A path as diagnostics print it: unchanged, unless it holds characters that are
    not printable (a newline, an escape sequence), which are shown escaped so a file
    name can never rewrite the terminal or forge a second diagnostic line."""
    return path if path.isprintable() else ascii(path)[1:-1]


def render(diagnostics: list[Diagnostic], path: str, source: str) -> str:
    """Render sorted diagnostics with the offending source line and a caret.

    A diagnostic about the file itself (no position) is `path: error[CODE]: ...`."""
    lines = source.splitlines()
    path = shown_path(path)
    out: list[str] = []
    for d in sorted(diagnostics, key=Diagnostic.sort_key):
        where = f"{path}:{d.span.line}:{d.span.column}" if d.span.line else path
        out.append(f"{where}: {d.severity.value}[{d.code}]: {d.message}")
        if 1 <= d.span.line <= len(lines):
            text = lines[d.span.line - 1].rstrip()
            out.append(f"    {text}")
            width = 1
            if d.span.end_line == d.span.line and d.span.end_column > d.span.column:
                width = d.span.end_column - d.span.column
            out.append("    " + " " * max(d.span.column - 1, 0) + "^" * width)
    return "\n".join(out)
