"""The int a counter's site holds inside a staged call (staging.py): it remembers that it
is ``a * c + b`` of counter ``c``, keeps that form through arithmetic with plain ints
(so ``past + n - past`` is a plain ``n`` again), and turns whatever else it decides — a
comparison, an index, a float, a product of two counters — into a ``Guard`` the call
records: what a replay must find true of the live counters to run the graph.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch

_COMPARE = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Affine:
    """``a * counters[c] + b``."""

    c: int
    a: int
    b: int

    def at(self, values: Sequence[int]) -> int:
        return self.a * values[self.c] + self.b

    def show(self, names: Sequence[str]) -> str:
        term = names[self.c] if self.a == 1 else f"{self.a} * {names[self.c]}"
        return term if self.b == 0 else f"{term} {'+' if self.b > 0 else '-'} {abs(self.b)}"


@dataclass(frozen=True)
class Guard:
    """What a staged value decided while the buffers were made: ``left op right`` was
    ``outcome`` (``right`` a plain int or another staged value)."""

    left: Affine
    op: str
    right: Affine | int
    outcome: bool
    where: str

    def holds(self, values: Sequence[int]) -> bool:
        right = self.right.at(values) if isinstance(self.right, Affine) else self.right
        return _COMPARE[self.op](self.left.at(values), right) == self.outcome

    def show(self, names: Sequence[str]) -> str:
        right = self.right.show(names) if isinstance(self.right, Affine) else self.right
        return f"{self.left.show(names)} {self.op} {right} was {self.outcome} ({self.where})"


class StagedInt(int):
    """A counter's value inside a staged call (module docstring). ``call`` is the staged
    call (staging._StagedCall): it holds the counters' values and records the guards."""

    def __new__(cls, value: int, form: Affine, call: Any) -> "StagedInt":
        obj = super().__new__(cls, value)
        obj.form, obj.call = form, call
        return obj

    def _make(self, a: int, b: int) -> int:
        if a == 0:
            return b  # the counter cancelled out: a plain int (a length, say)
        return StagedInt(
            a * self.call.values[self.form.c] + b, Affine(self.form.c, a, b), self.call
        )

    def _affine(self, other: Any) -> Affine | None:
        if type(other) is int or type(other) is bool:
            return Affine(self.form.c, 0, other)
        if isinstance(other, StagedInt) and other.form.c == self.form.c:
            return other.form
        return None

    def _plain(self, what: str) -> int:
        self.call.guard(self, "==", int(self), what)
        return int(self)

    def __add__(self, other: Any) -> Any:
        if isinstance(other, torch.Tensor):
            return NotImplemented  # the tensor's own operator: the mode rewrites it
        o = self._affine(other)
        if o is None:
            return self._plain("+") + other
        return self._make(self.form.a + o.a, self.form.b + o.b)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        if isinstance(other, torch.Tensor):
            return NotImplemented
        o = self._affine(other)
        if o is None:
            return self._plain("-") - other
        return self._make(self.form.a - o.a, self.form.b - o.b)

    def __rsub__(self, other: Any) -> Any:
        if isinstance(other, torch.Tensor):
            return NotImplemented
        o = self._affine(other)
        if o is None:
            return other - self._plain("-")
        return self._make(o.a - self.form.a, o.b - self.form.b)

    def __mul__(self, other: Any) -> Any:
        if isinstance(other, torch.Tensor):
            return NotImplemented
        if type(other) is int:
            return self._make(self.form.a * other, self.form.b * other)
        return self._plain("*") * other

    __rmul__ = __mul__

    def __neg__(self) -> Any:
        return self._make(-self.form.a, -self.form.b)

    def _compare(self, op: str, other: Any) -> Any:
        if not isinstance(other, (int, float)):
            return NotImplemented  # a tensor's own comparison: the mode guards it
        outcome = _COMPARE[op](int(self), int(other) if isinstance(other, int) else other)
        self.call.guard(self, op, other, f"a comparison ({op})", outcome)
        return outcome

    def __lt__(self, other: Any) -> bool:
        return self._compare("<", other)

    def __le__(self, other: Any) -> bool:
        return self._compare("<=", other)

    def __gt__(self, other: Any) -> bool:
        return self._compare(">", other)

    def __ge__(self, other: Any) -> bool:
        return self._compare(">=", other)

    def __eq__(self, other: Any) -> bool:
        return self._compare("==", other)

    def __ne__(self, other: Any) -> bool:
        return self._compare("!=", other)

    __hash__ = int.__hash__

    def __bool__(self) -> bool:
        return self._compare("!=", 0)

    def __index__(self) -> int:  # a slice bound, a range, a size: baked
        return self._plain("an index")

    def __int__(self) -> int:
        return int.__int__(self)

    def __float__(self) -> float:
        return float(self._plain("a float"))

    def __floordiv__(self, other: Any) -> Any:
        return self._plain("//") // other

    def __mod__(self, other: Any) -> Any:
        return self._plain("%") % other

    def __truediv__(self, other: Any) -> Any:
        return self._plain("/") / other

    def __pow__(self, other: Any) -> Any:
        return self._plain("**") ** other
