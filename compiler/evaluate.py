"""Evaluate contract expressions to (integer value, unit), checking units.

Units are clock names (`302 frame`); a plain integer is dimensionless. Addition,
subtraction and `max` need equal units; a product takes the unit of its one
dimensioned factor. `extent(R)` is a region's attended bound, supplied by the
caller. Errors are raised as `EvalError` carrying the offending span; callers
turn them into diagnostics.

Every intermediate value is bounded by `MAX_VALUE` (2**53, exact in a float and in
JSON), so arithmetic on a contract never builds unbounded integers. A name listed
in `poisoned` (a declaration that already failed) raises `EvalError` with code
None: the caller drops it, so one mistake is reported once, not again at every use.
"""

from __future__ import annotations

import difflib

from dataclasses import dataclass
from typing import AbstractSet, Callable, Iterable, Mapping

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Span

MAX_VALUE = 2**53


@dataclass(frozen=True)
class Value:
    value: int
    unit: str | None = None

    def show(self) -> str:
        return f"{self.value} {self.unit}" if self.unit else str(self.value)


class EvalError(Exception):
    def __init__(self, code: str | None, message: str, span: Span):
        super().__init__(message)
        self.code, self.message, self.span = code, message, span


# Names that are not constants resolve through this hook (config values, extents).
Resolver = Callable[[str, Span], Value]


def evaluate(
    expr: ir.Expr,
    consts: Mapping[str, Value],
    *,
    clocks: frozenset[str] = frozenset(),
    names: Mapping[str, Value] | None = None,
    extent: Callable[[str, Span], Value] | None = None,
    poisoned: AbstractSet[str] = frozenset(),
) -> Value:
    """Evaluate `expr`. `names` binds extra names (config variables) and wins over consts."""

    def go(e: ir.Expr) -> Value:
        v = step(e)
        if abs(v.value) > MAX_VALUE:
            raise EvalError("CLK018", f"value {_short(v.value)} exceeds 2**53", e.span)
        return v

    def step(e: ir.Expr) -> Value:
        if isinstance(e, ir.Quantity):
            if e.unit is not None and e.unit not in clocks:
                raise EvalError(
                    "CLK011",
                    f"unknown unit '{e.unit}' (units are clock names)"
                    + did_you_mean(e.unit, clocks),
                    e.span,
                )
            return Value(e.value, e.unit)
        if isinstance(e, ir.NameRef):
            if names is not None and e.name in names:
                return names[e.name]
            if e.name in consts:
                return consts[e.name]
            if e.name in poisoned:
                raise EvalError(None, f"'{e.name}' failed to evaluate", e.span)
            if e.name in clocks:
                raise EvalError(
                    "CLK012",
                    f"clock '{e.name}' names an extent axis; it has no value here",
                    e.span,
                )
            known = [*consts, *clocks, *(names or {})]
            raise EvalError(
                "CLK011", f"unknown name '{e.name}'" + did_you_mean(e.name, known), e.span
            )
        if isinstance(e, ir.ExtentOf):
            if extent is None:
                raise EvalError(
                    "CLK012",
                    "extent(...) is only meaningful in an envelope or a staged argument",
                    e.span,
                )
            return extent(e.region, e.span)
        if isinstance(e, ir.MaxOf):
            values = [go(i) for i in e.items]
            _same_unit(values, e.items, "max")
            return Value(max(v.value for v in values), values[0].unit)
        assert isinstance(e, ir.BinOp)
        left, right = go(e.left), go(e.right)
        if e.op == "*":
            if left.unit and right.unit:
                raise EvalError(
                    "CLK012", f"cannot multiply {left.show()} by {right.show()}", e.span
                )
            return Value(left.value * right.value, left.unit or right.unit)
        _same_unit([left, right], (e.left, e.right), e.op)
        value = left.value + right.value if e.op == "+" else left.value - right.value
        return Value(value, left.unit)

    return go(expr)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """ "; did you mean 'frame'?" for a declared name close to ``word`` (difflib), else ""."""
    close = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _short(value: int) -> str:
    text = str(value) if abs(value) < 10**30 else f"~1e{len(str(abs(value))) - 1}"
    return text


def _same_unit(values: list[Value], exprs, op: str) -> None:
    first = values[0]
    for v, e in zip(values[1:], exprs[1:]):
        if v.unit != first.unit:
            raise EvalError(
                "CLK012",
                f"unit mismatch in '{op}': {first.show()} and {v.show()}",
                e.span,
            )
