"""Validation of controls: the integers a call returns that drive the host.

`control accepted: int64 in 0..8 from result[1]` names an integer a callable returns (a
verifier's accepted count, a wake's retained count): what the host reads to move a
speculative region's committed end (`commits kv by accepted + 1`, commit_rules.py) and to
configure the next call. A control is an output like any other, compared bitwise by an
audit; what the contract adds is its name, its integer type and the range it is declared
to stay in, which bounds what it can drive: the commit's amounts are the expression's
values over that range, counted by the analysis like a stepped clock's. A mixin of the
validator (validate.py); ``Checked.controls`` holds each callable's ranges.
"""

from __future__ import annotations

from duplexcadence.compiler.evaluate import MAX_VALUE
from duplexcadence.dsl import ir

INTEGER_DTYPES = ("int64", "int32", "int16", "int8", "uint8")
# the values a commit over a control is evaluated at, one by one: a bound on the range
MAX_CONTROL_VALUES = 1 << 16


class ControlRules:
    def check_controls(self, k: ir.Callable) -> None:
        taken = {a.path.root for a in k.args} | {n for cfg in k.configs for n in cfg.names}
        seen: set[str] = set()
        for c in k.controls:
            where = f"callable '{k.name}' control '{c.name}'"
            if c.name in seen:
                self.err("CLK054", f"{where} is declared twice", c.span)
                continue
            seen.add(c.name)
            if c.name in taken:
                self.err(
                    "CLK054",
                    f"{where} has the name of an argument or configuration variable of the "
                    "callable: a commit over it would not say which it means",
                    c.span,
                )
                continue
            if c.dtype not in INTEGER_DTYPES:
                self.err(
                    "CLK054",
                    f"{where} is {c.dtype}: a control is an integer "
                    f"({', '.join(INTEGER_DTYPES)})",
                    c.span,
                )
                continue
            if c.source.root != "result":
                self.err(
                    "CLK054",
                    f"{where} is read from '{c.source.dotted()}': a control is part of what "
                    "the call returns, a path from `result`",
                    c.source.span,
                )
                continue
            if not c.low <= c.high <= MAX_VALUE:
                self.err(
                    "CLK054",
                    f"{where} ranges over {c.low}..{c.high}: an empty range, or past 2**53",
                    c.span,
                )
                continue
            self.out.controls[(k.name, c.name)] = (c.low, c.high)
