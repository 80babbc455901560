"""Rules for session parameters that the declaration alone decides (CLK080, CLK081).

A `param` is a value each session binds, with a finite integer domain. Validation
folds the contract at one value of every parameter (`Checked.params`); `params.py`
folds it at the ends of each domain and derives the catalog and bytes as functions
of the value. That is sound only if every quantity is linear in each parameter: a
linear function is decided by its two ends (its extremes are there, and two values
fix it). So a parameter may be added, subtracted and multiplied by a number, never
multiplied by another parameter nor taken inside `max(...)` (CLK081).

`extent(R)` counts as depending on a parameter whenever the contract has one (an
attended extent may move with it): conservative, and `extent` only appears in
envelopes, where a sum is what contracts write.
"""

from __future__ import annotations

from pydantic import BaseModel

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error, warning

_EXPR = (ir.Quantity, ir.NameRef, ir.BinOp, ir.MaxOf, ir.ExtentOf)


def reference_values(contract: ir.Contract) -> dict[str, int]:
    """The value each parameter takes where none is bound: its default, else the
    bottom of its domain. Generated code is rendered at these values."""
    return {p.name: p.default if p.default is not None else p.lo for p in contract.params}


def check_params(contract: ir.Contract, clocks: frozenset[str]) -> list[Diagnostic]:
    found: list[Diagnostic] = []
    for p in contract.params:
        found += _domain_problems(p, clocks)
    if contract.params:
        found += _nonlinear_uses(contract)
        found += _unused(contract)
    return found


def _domain_problems(p: ir.Param, clocks: frozenset[str]) -> list[Diagnostic]:
    out = []
    if p.lo > p.hi:
        out.append(error("CLK080", f"param '{p.name}': empty domain {p.lo}..{p.hi}", p.span))
    if p.unit is not None and p.unit not in clocks:
        out.append(
            error(
                "CLK080",
                f"param '{p.name}': unknown unit '{p.unit}' (units are clock names)",
                p.span,
            )
        )
    if p.default is not None and not p.lo <= p.default <= p.hi:
        out.append(
            error(
                "CLK080",
                f"param '{p.name}': default {p.default} is outside its domain {p.lo}..{p.hi}",
                p.span,
            )
        )
    outside = [v for v in p.capture if not p.lo <= v <= p.hi]
    if outside:
        out.append(
            error(
                "CLK080",
                f"param '{p.name}': capture values {outside} are outside its domain "
                f"{p.lo}..{p.hi}",
                p.span,
            )
        )
    if len(set(p.capture)) != len(p.capture):
        out.append(error("CLK080", f"param '{p.name}': a capture value is listed twice", p.span))
    if p.hold is not None and p.hold < 1:
        out.append(error("CLK080", f"param '{p.name}': hold must be at least 1", p.span))
    elif p.hold is not None and len(set(p.capture)) > p.hold:
        out.append(
            warning(
                "CLK510",
                f"param '{p.name}': capture lists {len(set(p.capture))} values but hold keeps "
                f"{p.hold}; bind evicts the first ones again",
                p.span,
            )
        )
    return out


def _dependent_names(contract: ir.Contract) -> set[str]:
    """The parameters and every constant whose value depends on one."""
    names = {p.name for p in contract.params}
    for const in contract.consts:  # in order: a constant may only use earlier ones
        if _references(const.expr, names):
            names.add(const.name)
    return names


def _references(e: ir.Expr, names: set[str]) -> bool:
    if isinstance(e, ir.NameRef):
        return e.name in names
    if isinstance(e, ir.ExtentOf):
        return True
    if isinstance(e, ir.BinOp):
        return _references(e.left, names) or _references(e.right, names)
    if isinstance(e, ir.MaxOf):
        return any(_references(i, names) for i in e.items)
    return False


def _nonlinear(e: ir.Expr, names: set[str]) -> ir.Expr | None:
    """The first sub-expression that is not linear in the parameters, or None."""
    if isinstance(e, ir.BinOp):
        bad = _nonlinear(e.left, names) or _nonlinear(e.right, names)
        if bad is None and e.op == "*":
            if _references(e.left, names) and _references(e.right, names):
                return e
        return bad
    if isinstance(e, ir.MaxOf):
        if any(_references(i, names) for i in e.items):
            return e
    return None


def _expressions(node) -> list[ir.Expr]:
    """Every outermost expression in a node (contract, region, callable ...)."""
    if isinstance(node, _EXPR):
        return [node]
    if isinstance(node, (tuple, list)):
        return [e for item in node for e in _expressions(item)]
    if isinstance(node, BaseModel):
        return [e for name in type(node).model_fields for e in _expressions(getattr(node, name))]
    return []


def _nonlinear_uses(contract: ir.Contract) -> list[Diagnostic]:
    names = _dependent_names(contract)
    out = []
    for e in _expressions(contract):
        bad = _nonlinear(e, names)
        if bad is not None:
            out.append(
                error(
                    "CLK081",
                    "a session parameter may only be added, subtracted or multiplied by a "
                    "number here (not multiplied by another parameter, nor inside max)",
                    bad.span,
                )
            )
    return out


def _unused(contract: ir.Contract) -> list[Diagnostic]:
    used = {
        e.name for root in _expressions(contract) for e in _names(root) if isinstance(e, ir.NameRef)
    }
    return [
        warning("CLK511", f"param '{p.name}' is used by nothing", p.span)
        for p in contract.params
        if p.name not in used
    ]


def _names(e: ir.Expr) -> list[ir.Expr]:
    if isinstance(e, ir.BinOp):
        return _names(e.left) + _names(e.right)
    if isinstance(e, ir.MaxOf):
        return [x for i in e.items for x in _names(i)]
    return [e]
