"""Validation rules of lockstep: `batch` on callables, `slot` on regions.

A mixin of the validator (`validate.py`), like `region_rules.py` and `callable_rules.py`.
Sessions in step at a callable's clock may share one call: the contract stays per
session, and a binding of width W stacks W sessions on the callable's batch `axis` of
every staged tensor argument and on the `slot` axis of every per-session region
(runtime/serving/declared.py `ContractDecl.at_width`). What can be decided from the
declaration is checked here; an argument's extent at the axis, which may depend on a
configuration, is checked per configuration by the analysis (`stacked_extent_problem`).
"""

from __future__ import annotations

import re

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error

# A binding stacks at most this many sessions: every width is a graph per class, and
# batches far past the GPU's parallelism gain nothing.
MAX_BATCH_WIDTH = 1024
PER_SESSION = frozenset({"session", "turn"})
# An ATen op as torch names it in a trace: aten.<op> or aten.<op>.<overload>
_OP_NAME = re.compile(r"aten\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")


def batch_span(k: ir.Callable):
    return k.prop_spans.get("batch", k.batch.span if k.batch is not None else k.span)


def stacked_extent_problem(
    arg: ir.Arg, k: ir.Callable, dims: tuple[int, ...], under: str
) -> Diagnostic | None:
    """CLK101 when a staged argument of a batched callable is not of extent 1 at the batch
    axis under one configuration (`under` names it); its rank was validated."""
    axis = k.batch.axis
    if axis >= len(dims) or dims[axis] == 1:  # (the rank is validation's: check_batch)
        return None
    return error(
        "CLK101",
        f"argument '{arg.path.dotted()}' of callable '{k.name}' has extent {dims[axis]} at "
        f"batch axis {axis}{under}: sessions stack there, so one session's extent is 1",
        arg.type.span,
    )


class BatchRules:
    def check_batch(self, k: ir.Callable) -> None:
        """One callable's `batch`: its widths, its mode, its rows and its arguments."""
        b = k.batch
        if b is None:
            return
        span = batch_span(k)
        bad = [w for w in b.widths if not 1 <= w <= MAX_BATCH_WIDTH]
        twice = sorted({w for w in b.widths if b.widths.count(w) > 1})
        if bad:
            self.err(
                "CLK100",
                f"batch widths {_listed(bad)} of callable '{k.name}' are outside "
                f"1..{MAX_BATCH_WIDTH}",
                span,
            )
        if twice:
            self.err(
                "CLK100",
                f"callable '{k.name}' lists batch widths {_listed(twice)} twice",
                span,
            )
        if k.mode == "eager":
            self.err(
                "CLK102",
                f"callable '{k.name}' is `mode eager` and batched: eager calls run the stock "
                "code once per session, so only a replayed callable can be batched",
                span,
            )
        for i, row in enumerate(b.rows):
            op = row.partition(" in ")[0]  # `aten.mm.default in gating`: the op, scoped
            if not _OP_NAME.fullmatch(op):
                self.err(
                    "CLK106",
                    f"per-row op '{op}' of callable '{k.name}' is not an ATen op name "
                    "(`aten.<op>` or `aten.<op>.<overload>`, e.g. `aten.mean.dim`)",
                    b.row_spans[i] if i < len(b.row_spans) else span,
                )
            if b.rows.index(row) != i:  # the later listing of a row op listed before
                self.err(
                    "CLK106",
                    f"per-row op '{row}' of callable '{k.name}' is listed twice",
                    b.row_spans[i] if i < len(b.row_spans) else span,
                )
        for i, (op, n) in enumerate(zip(b.rows, b.row_blocks())):
            if n < 1 or any(w % n for w in b.widths):
                self.err(
                    "CLK106",
                    f"per-row op '{op}' of callable '{k.name}' runs on blocks of {n} "
                    f"sessions, which does not divide every batch width "
                    f"({_listed(list(b.widths))}): `by N` needs N >= 1 dividing each width",
                    b.row_spans[i] if i < len(b.row_spans) else span,
                )
        if b.rows and b.axis != 0:
            # PerRow (runtime/engine/per_row.py) splits an op's tensors on their leading
            # axis into W blocks: a session's block is leading only when sessions stack
            # batch-major
            self.err(
                "CLK106",
                f"callable '{k.name}' runs ops per row but stacks sessions on batch axis "
                f"{b.axis}: per-row ops split their tensors on the leading axis, so `rows` "
                "needs `axis 0`",
                span,
            )
        for arg in k.args:
            self._check_batched_arg(k, arg)

    def _check_batched_arg(self, k: ir.Callable, arg: ir.Arg) -> None:
        t, axis, shown = arg.type, k.batch.axis, arg.path.dotted()
        if isinstance(t, ir.RegionArg) and t.index is not None:
            self.err(
                "CLK101",
                f"argument '{shown}' of batched callable '{k.name}' is one slot of region "
                f"'{t.region}' (`region {t.region}[{t.index}]`): a slot argument cannot be "
                "stacked across sessions",
                t.span,
            )
        elif isinstance(t, ir.TensorArg):
            if len(t.dims) <= axis:
                self.err(
                    "CLK101",
                    f"argument '{shown}' of callable '{k.name}' has {len(t.dims)} dims: "
                    f"sessions stack on batch axis {axis}, which it does not have",
                    t.span,
                )
            elif t.strides is not None and axis != 0:
                self.err(
                    "CLK101",
                    f"argument '{shown}' of callable '{k.name}' has strides, which are one "
                    f"session's: it can be stacked on axis 0 only, not on batch axis {axis}",
                    t.span,
                )

    def check_slot(self, r: ir.Region) -> None:
        """`slot N`: a fixed axis of extent 1 of a per-session region."""
        if r.slot is None or r.name in self.poisoned or r.name not in self.out.regions:
            return
        span = r.prop_spans.get("slot", r.span)
        dims = self.out.regions[r.name].dims
        why = None
        if r.lifetime not in PER_SESSION:
            why = (
                f"its lifetime is `{r.lifetime}`: only a per-session region (`session` or "
                "`turn`) has one copy per session to stack"
            )
        elif r.slot >= len(dims):
            why = f"it has {len(dims)} dims"
        elif dims[r.slot] is None:
            why = f"axis {r.slot} is its clock-extent axis"
        elif dims[r.slot] != 1:
            why = f"its extent there is {dims[r.slot]}, and one session's must be 1"
        if why is not None:
            self.err(
                "CLK104", f"region '{r.name}' cannot stack sessions on slot {r.slot}: {why}", span
            )

    def check_lockstep(self) -> None:
        """One lockstep per contract: the same widths everywhere, every replayed callable
        batched, every per-session region slotted; a slot with no batch is a warning."""
        batched = [k for k in self.c.callables if k.batch is not None]
        if not batched:
            for r in self.c.regions:
                if r.slot is not None:
                    self.warn(
                        "CLK512",
                        f"region '{r.name}' declares slot {r.slot} but no callable is "
                        "batched: nothing stacks sessions on it",
                        r.prop_spans.get("slot", r.span),
                    )
            return
        first = batched[0]
        widths = sorted(set(first.batch.widths))
        for k in batched[1:]:
            if sorted(set(k.batch.widths)) != widths:
                self.err(
                    "CLK103",
                    f"callable '{k.name}' is batched at widths {_listed(k.batch.widths)} but "
                    f"'{first.name}' at {_listed(first.batch.widths)}: one lockstep per "
                    "contract declares the same widths everywhere",
                    batch_span(k),
                )
        for k in self.c.callables:
            if k.batch is None and k.mode == "replay":
                self.err(
                    "CLK103",
                    f"callable '{k.name}' is replayed but not batched, while '{first.name}' "
                    "is: a batched binding serves every session of the lockstep in every "
                    f"call (add `batch widths {_listed(first.batch.widths)}`, or `mode eager`)",
                    k.span,
                )
        for r in self.c.regions:
            if r.lifetime in PER_SESSION and r.slot is None:
                self.err(
                    "CLK105",
                    f"region '{r.name}' is per session (lifetime {r.lifetime}) but declares "
                    f"no `slot`: where does session i's copy live when '{first.name}' serves "
                    "several sessions in one call?",
                    r.span,
                )


def _listed(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"
