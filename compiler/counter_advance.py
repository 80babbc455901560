"""How far a host counter advances per call (`counter PATH advances EXPR from N`), and a
speculative region's committed end (`commits R by EXPR`, commit_rules.py): an amount per
class.

`advances 1` is an amount. `advances w` (or `advances w + 1`, `2 * w`, over consts too)
names one configuration variable of the callable: a verify call of width w moves a
position by w. The graph of a class runs no Python, so the engine advances the counter
itself after each replay, by the amount of the replayed class; that amount must be fixed
by the class, i.e. the variable must be one the call's signature shows (else two
configurations that share a graph would need two amounts). Validation
(callable_rules.py) reports what is wrong; lowering (lower.py) writes each value's amount
into the generated contract (runtime/state/counters.py ``Advance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from duplexcadence.compiler.evaluate import EvalError, Value, evaluate
from duplexcadence.dsl import ir


@dataclass(frozen=True)
class Amounts:
    """A counter's amount per call: ``by`` None (one ``constant``), or the amount at each
    value of configuration variable ``by`` (``per_value``, in declared order)."""

    by: str | None
    constant: int = 0
    per_value: tuple[tuple[int, int], ...] = ()

    def all(self) -> list[int]:
        return [self.constant] if self.by is None else [a for _, a in self.per_value]


class AdvanceError(Exception):
    """Why a counter's `advances` cannot be computed (message for CLK049)."""


def config_values(k: ir.Callable, name: str) -> list:
    """The values configuration variable ``name`` of ``k`` takes, in declared order."""
    for cfg in k.configs:
        if name in cfg.names:
            i = cfg.names.index(name)
            return list(dict.fromkeys(v[i] for v in cfg.values if len(v) == len(cfg.names)))
    return []


def amounts(
    counter: ir.HostCounter,
    k: ir.Callable,
    consts: Mapping[str, Value],
    signature: set[str],
) -> Amounts:
    """The counter's amounts (``signature``: the configuration variables the call's
    signature shows); raises ``AdvanceError`` or ``EvalError``."""
    got = amounts_of(counter.advances, k, consts, signature, verb="advances", code="CLK049")
    if got.by is not None and counter.tracks is not None:
        raise AdvanceError(
            f"advances by '{got.by}' and tracks a region: a tracked counter's amount is one"
        )
    return got


def amounts_of(
    e: ir.Expr,
    k: ir.Callable,
    consts: Mapping[str, Value],
    signature: set[str],
    *,
    verb: str,
    code: str,
    clocks: frozenset[str] = frozenset(),
) -> Amounts:
    """The amounts of ``e``, a plain integer or an expression over one configuration
    variable of ``k`` that the signature shows (messages: "``verb`` by ...", ``code``)."""
    from duplexcadence.compiler.callable_rules import names_in

    variables = sorted(names_in(e) - set(consts) - clocks)
    if not variables:
        return Amounts(None, constant=amount_at(e, consts, {}, verb, code, clocks))
    for name in variables:
        if not config_values(k, name):
            raise AdvanceError(f"{verb} by '{name}', which is no config variable of the callable")
    if len(variables) > 1:
        raise AdvanceError(f"{verb} by {', '.join(variables)}: at most one config variable")
    (by,) = variables
    values = config_values(k, by)
    if by not in signature:
        raise AdvanceError(
            f"{verb} by config variable '{by}', which no argument shows: its configurations "
            "share graphs, and a graph cannot tell their amounts apart"
        )
    if any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        raise AdvanceError(f"{verb} by '{by}', whose values are not all integers")
    return Amounts(
        by, per_value=tuple((v, amount_at(e, consts, {by: v}, verb, code, clocks)) for v in values)
    )


def amount_at(
    e: ir.Expr,
    consts: Mapping[str, Value],
    names: Mapping[str, int],
    verb: str,
    code: str,
    clocks: frozenset[str],
) -> int:
    v = evaluate(e, consts, clocks=clocks, names={n: Value(x, None) for n, x in names.items()})
    if v.unit is not None:
        what = "a plain integer" if verb == "advances" else "a plain integer or a stepped clock"
        raise EvalError(code, f"a callable {verb} by {what}, not {v.show()}", e.span)
    return v.value
