"""Validation of commits: how far a call moves a speculative region's committed end.

`commits R by AMOUNT` on a callable says that of the entries the call writes to region R
(a verifier's drafted tokens and its own next one, a wake's committed and masked frames)
the committed end advances by AMOUNT; the rest lie past it, within R's declared
`speculative` slack, and the next call overwrites them: the cut-back is a move of the
end (a position, a counter), never a copy. AMOUNT is either a stepped clock (`commits kv
by commit`: any one of its amounts, which only the data decides, e.g. the accepted count
+ 1), counted in the ticks R's extent axis counts, or an expression over one
configuration variable the signature shows (`commits ring by c`: each class its own
amount, compiler/counter_advance.py), at least 1. A mixin of the validator (validate.py);
the amounts go to ``Checked.commit_amounts`` for the analysis.
"""

from __future__ import annotations

from duplexcadence.compiler.counter_advance import AdvanceError, amounts_of
from duplexcadence.compiler.evaluate import EvalError
from duplexcadence.dsl import ir


class CommitRules:
    def check_commits(self, k: ir.Callable) -> None:
        from duplexcadence.compiler.callable_rules import signature_variables

        committed: set[str] = set()
        for c in k.commits:
            where = f"callable '{k.name}' commits region '{c.region}'"
            if c.region in self.poisoned:
                continue  # its declaration failed, and said so
            numbers = self.out.regions.get(c.region)
            if c.region not in self.region_nodes or numbers is None:
                self.err(
                    "CLK053", f"callable '{k.name}' commits unknown region '{c.region}'", c.span
                )
                continue
            if not numbers.speculative:
                self.err(
                    "CLK053",
                    f"{where}, which declares no `speculative` entries (what a commit cuts back)",
                    c.span,
                )
                continue
            if c.region in committed:
                self.err("CLK053", f"{where} twice", c.span)
                continue
            committed.add(c.region)
            if self._stepped(c.amount):
                clock = c.amount.name
                if numbers.axis_clock != clock:
                    self.err(
                        "CLK053",
                        f"{where} by stepped clock '{clock}', but its extent axis counts "
                        f"'{numbers.axis_clock}'",
                        c.amount.span,
                    )
                elif clock in self.out.clock_steps:
                    self.out.commit_amounts[(k.name, c.region)] = self.out.clock_steps[clock]
                continue
            try:
                got = amounts_of(
                    c.amount,
                    k,
                    self.out.consts,
                    signature_variables(k),
                    verb="commits",
                    code="CLK053",
                    clocks=self.clocks,
                )
            except AdvanceError as e:
                self.err("CLK053", f"{where}: {e}", c.amount.span)
                continue
            except EvalError as e:
                if e.code is not None:
                    self.err(e.code, e.message, e.span)
                continue
            if min(got.all(), default=1) < 1:
                self.err("CLK053", f"{where} by less than 1 entry a call", c.amount.span)
                continue
            self.out.commit_amounts[(k.name, c.region)] = got
