"""Validation of commits: how far a call moves a speculative region's committed end.

`commits R by AMOUNT` on a callable says that of the entries the call writes to region R
(a verifier's drafted tokens and its own next one, a wake's committed and masked frames)
the committed end advances by AMOUNT; the rest lie past it, within R's declared
`speculative` slack, and the next call overwrites them: the cut-back is a move of the
end (a position, a counter), never a copy. AMOUNT is either a stepped clock (`commits kv
by commit`: any one of its amounts, which only the data decides, e.g. the accepted count
+ 1), counted in the ticks R's extent axis counts, an expression over one control of the
callable (`commits kv by accepted + 1`: the data decides too, its values over the
control's declared range, control_rules.py), or an expression over one configuration
variable the signature shows (`commits ring by c`: each class its own amount,
compiler/counter_advance.py), at least 1. A mixin of the validator (validate.py);
the amounts go to ``Checked.commit_amounts`` for the analysis.
"""

from __future__ import annotations

from duplexcadence.compiler.control_rules import MAX_CONTROL_VALUES
from duplexcadence.compiler.counter_advance import AdvanceError, amount_at, amounts_of
from duplexcadence.compiler.evaluate import EvalError
from duplexcadence.compiler.extents import AmountSet
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
            if self._over_control(k, c.amount):
                self._commit_by_control(k, c, where)
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

    def _over_control(self, k: ir.Callable, e: ir.Expr) -> bool:
        from duplexcadence.compiler.callable_rules import names_in

        return bool(names_in(e) & {c.name for c in k.controls})

    def _commit_by_control(self, k: ir.Callable, c: ir.Commit, where: str) -> None:
        """The amounts of an expression over one control: its values at every value of
        the control's declared range, each at least 1."""
        from duplexcadence.compiler.callable_rules import names_in

        controls = {x.name for x in k.controls}
        names = sorted(names_in(c.amount) - set(self.out.consts) - self.clocks)
        if len(names) > 1 or names[0] not in controls:
            self.err(
                "CLK053",
                f"{where} by {', '.join(names)}: an expression over one control and constants",
                c.amount.span,
            )
            return
        (name,) = names
        if (k.name, name) not in self.out.controls:
            return  # its declaration failed, and said so
        low, high = self.out.controls[(k.name, name)]
        if high - low + 1 > MAX_CONTROL_VALUES:
            self.err(
                "CLK053",
                f"{where} by control '{name}' of {high - low + 1} values (at most "
                f"{MAX_CONTROL_VALUES}: each is evaluated)",
                c.amount.span,
            )
            return
        amounts = set()
        for v in range(low, high + 1):
            try:
                got = amount_at(
                    c.amount, self.out.consts, {name: v}, "commits", "CLK053", self.clocks
                )
            except EvalError as e:
                if e.code is not None:
                    self.err(e.code, e.message, e.span)
                return
            if got < 1:
                self.err(
                    "CLK053",
                    f"{where} by {got} at {name} = {v}: at least 1 entry, a plain integer",
                    c.amount.span,
                )
                return
            amounts.add(got)
        self.out.commit_amounts[(k.name, c.region)] = AmountSet.of(amounts)
