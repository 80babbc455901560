"""Validation rules of regions: dims, retention, attended extents, envelopes, sizes.

A mixin of the validator (`validate.py`): it reads the validator's constants and
reports through its `err`/`eval`, and leaves one `RegionNumbers` per region that
validated. A region whose declaration failed is *poisoned*: later rules and
other declarations that refer to it say nothing more about it, so one mistake
gives one diagnostic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from duplexcadence.compiler.evaluate import MAX_VALUE, EvalError, Value
from duplexcadence.compiler.extents import AmountSet
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Span


@dataclass(frozen=True)
class RegionNumbers:
    """A region's declaration reduced to integers (extent axis along `axis`)."""

    dims: tuple[int | None, ...]  # None marks the clock-extent axis
    axis: int | None
    axis_clock: str | None
    retention: tuple[str, tuple[int, ...]] | None
    bound: int | None  # attended limit A (the retention's retained length)
    start: int | None
    stride: int | None
    flush: tuple[int, ...]
    envelope: int | None  # allocated extent along the axis
    stock: tuple[int, ...] | None
    # `attended ... by CLOCK` on a stepped clock: the amounts the extent grows by per
    # call (`stride` is then the smallest)
    steps: AmountSet | None = None
    # `speculative S`: entries a call may write past the committed end (a ring's retained
    # extent is then its capacity less S; every envelope holds the retained extent + S)
    speculative: int = 0


class RegionRules:
    def check_region(self, r: ir.Region) -> None:
        spans = r.prop_spans
        errors_before = self.error_count()
        if r.dtype is None:
            self.err("CLK025", f"region '{r.name}' has no dtype", r.span)
        if r.dims is None:
            self.err("CLK025", f"region '{r.name}' has no dims", r.span)
            self.poisoned.add(r.name)
            return
        dims, axis, axis_clock = self._dims(r)
        if any(d is None for i, d in enumerate(dims) if i != axis):
            # a dim that did not evaluate was reported (an unknown name, say); what is
            # checked against the dims (retention, attended, stock) would only echo it
            self.poisoned.add(r.name)
            return
        unit = axis_clock

        def in_axis_unit(expr: ir.Expr, what: str) -> int | None:
            v = self.eval(expr)
            if v is None:
                return None
            if v.unit != unit:
                self.err(
                    "CLK012",
                    f"{what} of region '{r.name}' is {v.show()} but its extent axis counts "
                    f"{unit or 'nothing (no clock axis)'}",
                    expr.span,
                )
                return None
            return v.value

        retention = bound = None
        if r.retention is not None:
            retention = self._retention(r, in_axis_unit)
            bound = sum(retention[1]) if retention else None
        elif axis is not None and r.envelope is None:
            self.err(
                "CLK020",
                f"retention of region '{r.name}' is unbounded: its '{axis_clock}' axis grows "
                "with no retention policy or envelope",
                spans.get("dims", r.span),
            )
        speculative, bound = self._speculative(r, axis, retention, bound, in_axis_unit)
        start = stride = steps = None
        flush: tuple[int, ...] = ()
        # a retention or speculative extent that failed was reported: nothing more here
        failed = retention is None and r.retention is not None or speculative is None
        if r.attended is not None and not failed:
            start, stride, flush, steps = self._attended(
                r, r.attended, retention, bound, in_axis_unit, axis_clock, speculative
            )
        speculative = speculative or 0
        if r.clock is not None and r.clock not in self.clocks:
            self.err(
                "CLK011",
                f"region '{r.name}' names unknown clock '{r.clock}'",
                spans.get("clock", r.span),
            )

        stock = self._stock(r)
        self._address_and_allocation(r, stock)
        if self.error_count() > errors_before:
            self.poisoned.add(r.name)
        self.out.regions[r.name] = RegionNumbers(
            dims=tuple(dims),
            axis=axis,
            axis_clock=axis_clock,
            retention=retention,
            bound=bound,
            start=start if start is not None else bound,
            stride=stride or 0,
            flush=flush,
            envelope=None if bound is None else bound + speculative,
            stock=stock,
            steps=steps,
            speculative=speculative,
        )

    def _speculative(self, r: ir.Region, axis, retention, bound, in_axis_unit):
        """(`speculative S`: S, 0 when none is declared, None when it was reported (CLK052,
        CLK012: what depends on it says nothing more); the retained extent, which for a
        `ring(N)` is the N - S committed entries it keeps)."""
        value = self._speculative_extent(r, axis, retention, in_axis_unit)
        if value and retention is not None and retention[0] == "ring":
            bound = retention[1][0] - value
        return value, bound

    def _speculative_extent(self, r: ir.Region, axis, retention, in_axis_unit) -> int | None:
        if r.speculative is None:
            return 0
        span = r.speculative.span
        if axis is None:
            self.err(
                "CLK052",
                f"region '{r.name}' declares speculative entries but has no clock-extent axis "
                "(they lie past the committed end of it)",
                span,
            )
            return None
        value = in_axis_unit(r.speculative, "speculative extent")
        if value is None:
            return None
        if value < 1:
            self.err("CLK052", f"speculative extent of region '{r.name}' must be positive", span)
            return None
        if retention is not None and retention[0] == "ring" and value >= retention[1][0]:
            self.err(
                "CLK052",
                f"ring({retention[1][0]}) of region '{r.name}' cannot hold {value} speculative "
                "entries and a committed one",
                span,
            )
            return None
        return value

    def _dims(self, r: ir.Region) -> tuple[list[int | None], int | None, str | None]:
        """(dims with None on the clock-extent axis, that axis, its clock)."""
        dims: list[int | None] = []
        axis = axis_clock = None
        for i, d in enumerate(r.dims):
            if isinstance(d, ir.NameRef) and d.name in self.clocks:
                if axis is not None:
                    self.err(
                        "CLK024", f"region '{r.name}' has more than one clock-extent axis", d.span
                    )
                axis, axis_clock = i, d.name
                dims.append(None)
                continue
            v = self.eval(d)
            if v is not None and v.value <= 0:
                self.err("CLK015", f"dimension {i} of region '{r.name}' must be positive", d.span)
            dims.append(v.value if v else None)  # None off the axis: did not evaluate
        return dims, axis, axis_clock

    def _stock(self, r: ir.Region) -> tuple[int, ...] | None:
        if r.stock is None:
            return None
        span = r.prop_spans.get("stock", r.span)
        values = [self.eval(d) for d in r.stock]
        if len(values) != len(r.dims):
            self.err(
                "CLK028",
                f"stock of region '{r.name}' has {len(values)} dims but the region has "
                f"{len(r.dims)}",
                span,
            )
            return None
        if any(v is None for v in values):
            return None
        stock = tuple(v.value for v in values)
        if any(v <= 0 for v in stock):
            self.err("CLK015", f"stock dims of region '{r.name}' must be positive", span)
            return None
        if math.prod(stock) > MAX_VALUE:
            self.err("CLK018", f"stock of region '{r.name}' has more than 2**53 elements", span)
            return None
        return stock

    def _retention(self, r: ir.Region, in_axis_unit) -> tuple[str, tuple[int, ...]] | None:
        kind = r.retention.kind
        params = [in_axis_unit(p, "retention") for p in r.retention.params]
        if any(p is None for p in params):
            return None
        span = r.retention.span
        if r.dims is not None and not any(
            isinstance(d, ir.NameRef) and d.name in self.clocks for d in r.dims
        ):
            self.err(
                "CLK020",
                f"region '{r.name}' has a retention but no clock-extent axis to retain along",
                span,
            )
            return None
        if kind == "head_tail":
            if any(p < 0 for p in params):
                self.err(
                    "CLK020",
                    f"head and tail of region '{r.name}' must not be negative "
                    f"(head {params[0]}, tail {params[1]})",
                    span,
                )
                return None
            if sum(params) == 0:
                self.err(
                    "CLK020", f"retention of region '{r.name}' keeps nothing (head 0, tail 0)", span
                )
                return None
        elif any(p <= 0 for p in params):
            self.err("CLK020", f"retention of region '{r.name}' must be positive", span)
            return None
        return (kind, tuple(params))

    def _attended(
        self, r: ir.Region, a: ir.Attended, retention, bound, in_axis_unit, axis_clock, spec
    ):
        if retention is None:
            self.err(
                "CLK020",
                f"region '{r.name}' declares an attended extent but no retention",
                a.span,
            )
            return None, None, (), None
        start = in_axis_unit(a.start, "attended start")
        steps = None
        if self._stepped(a.stride):
            stride, steps = self._stepped_stride(r, a, axis_clock)
        else:
            stride = in_axis_unit(a.stride, "attended stride")
        flush = tuple(x for x in (in_axis_unit(f, "flush") for f in a.flush) if x is not None)
        if start is not None and start < 0:
            self.err("CLK015", f"attended start of region '{r.name}' is negative", a.start.span)
            start = None
        if any(f <= 0 for f in flush):
            self.err("CLK015", f"flush extents of region '{r.name}' must be positive", a.span)
            flush = tuple(f for f in flush if f > 0)
        if stride is not None and stride <= 0:
            self.err(
                "CLK021",
                f"attended stride of region '{r.name}' must be positive",
                a.stride.span,
            )
            stride = None
        if retention[0] == "window" and stride and stride > bound:
            self.err(
                "CLK021",
                f"attended stride {stride} exceeds the window {bound} of region '{r.name}'",
                a.stride.span,
            )
        if a.until is not None:
            until = in_axis_unit(a.until, "attended limit")
            if until is not None and until > bound and spec and retention[0] == "ring":
                capacity = retention[1][0]
                self.err(
                    "CLK052",
                    f"region '{r.name}' attends {until} entries of a ring({capacity}) that a "
                    f"call writes up to {spec} entries past its first into: they overwrite the "
                    f"oldest entries its first queries still read; lossless only with a "
                    f"ring of at least {until + spec} (or attending {bound})",
                    a.until.span,
                )
            elif until is not None and until != bound:
                self.err(
                    "CLK022",
                    f"attended limit {until} of region '{r.name}' disagrees with its "
                    f"retention, which keeps {bound}",
                    a.until.span,
                )
        if start is not None and start > bound:
            self.err(
                "CLK023",
                f"attended start {start} of region '{r.name}' exceeds its retained extent {bound}",
                a.start.span,
            )
            start = None
        return start, stride, flush, steps

    def _stepped(self, stride: ir.Expr) -> bool:
        """`attended ... by CLOCK`: the extent grows by what a stepped clock advances."""
        return isinstance(stride, ir.NameRef) and any(
            k.kind == "stepped" and k.name == stride.name for k in self.c.clocks
        )

    def _stepped_stride(self, r: ir.Region, a: ir.Attended, axis_clock):
        """(smallest amount, the amounts) of `by CLOCK` on a stepped clock: its extent
        axis must count that clock (the amounts are in its ticks), and no partial flush
        (its extents are every sum of amounts already). (None, None) once reported, or
        when the clock failed (reported there)."""
        name = a.stride.name
        if axis_clock != name:
            counts = f"'{axis_clock}'" if axis_clock else "nothing (no clock axis)"
            self.err(
                "CLK012",
                f"attended stride of region '{r.name}' is stepped clock '{name}' but its "
                f"extent axis counts {counts}",
                a.stride.span,
            )
            return None, None
        if a.flush:
            self.err(
                "CLK021",
                f"region '{r.name}' grows by stepped clock '{name}': it declares no flush "
                "(its extents are every sum of the clock's amounts)",
                a.span,
            )
            return None, None
        steps = self.out.clock_steps.get(name)
        return (steps.lo, steps) if steps else (None, None)

    def _address_and_allocation(self, r: ir.Region, stock) -> None:
        spans = r.prop_spans
        if r.address == "pinned":
            if r.site is None:
                self.err(
                    "CLK048",
                    f"region '{r.name}' is pinned: it needs the site the stock code rebinds",
                    spans.get("address", r.span),
                )
            elif r.retention is not None or r.allocate == "stock":
                self.err(
                    "CLK048",
                    f"region '{r.name}' is pinned: bind() adopts the stock tensor and keeps it "
                    "at its site, so it takes no retention and no `allocate`",
                    spans.get("address", r.span),
                )
        if r.initial is not None:
            last = r.site.steps[-1].kind if r.site is not None and r.site.steps else None
            if r.address != "pinned" or last not in ("key", "identity"):
                self.err(
                    "CLK056",
                    f"region '{r.name}' starts as zeros where its site is absent: it needs "
                    "`address pinned` and a site whose last step is a dict key",
                    spans.get("initial", r.span),
                )
        if r.allocate == "stock":
            if r.site is None or (stock is None and r.stock is None):
                self.err(
                    "CLK025",
                    f"region '{r.name}' allocates stock: it needs a site and its stock dims",
                    spans.get("allocate", r.span),
                )
            elif r.retention is not None:
                self.err(
                    "CLK041",
                    f"region '{r.name}' allocates stock, so it cannot retain by writeback",
                    spans.get("allocate", r.span),
                )

    def check_envelope(self, r: ir.Region) -> None:
        """Envelopes may name other regions' extents, so they are folded second."""
        numbers = self.out.regions.get(r.name)
        if numbers is None or r.envelope is None or r.name in self.poisoned:
            return

        def extent(name: str, span: Span) -> Value:
            other = self.out.regions.get(name)
            if name in self.poisoned:
                raise EvalError(None, f"extent({name}) of a failed region", span)
            if other is None or other.bound is None:
                raise EvalError("CLK011", f"extent({name}) names no region with a retention", span)
            return Value(other.bound, other.axis_clock)

        v = self.eval(r.envelope, extent=extent)
        if v is None:
            self.poisoned.add(r.name)
            return
        message = None
        if numbers.axis is None:
            code, message = "CLK012", f"region '{r.name}' has an envelope but no clock-extent axis"
        elif v.unit != numbers.axis_clock:
            code, message = (
                "CLK012",
                f"envelope of region '{r.name}' is {v.show()} but its axis counts "
                f"{numbers.axis_clock}",
            )
        elif v.value <= 0:
            code, message = "CLK015", f"envelope of region '{r.name}' must be positive"
        elif numbers.bound is not None and v.value < numbers.bound + numbers.speculative:
            code, message = (
                "CLK023",
                f"envelope {v.value} of region '{r.name}' is smaller than its retained extent "
                f"{numbers.bound}"
                + (f" and {numbers.speculative} speculative" if numbers.speculative else ""),
            )
        if message is not None:
            self.err(code, message, r.envelope.span)
            self.poisoned.add(r.name)
            return
        self.out.regions[r.name] = RegionNumbers(**{**numbers.__dict__, "envelope": v.value})

    def check_region_size(self, r: ir.Region) -> None:
        """The demand shape (extent axis at its envelope) must count at most 2**53 elements."""
        n = self.out.regions.get(r.name)
        if n is None or r.name in self.poisoned:
            return
        extent = n.envelope or 1
        shape = (
            n.stock
            if r.allocate == "stock" and n.stock
            else [extent if d is None else d for d in n.dims]
        )
        if math.prod(shape) > MAX_VALUE:
            self.err(
                "CLK018",
                f"region '{r.name}' has more than 2**53 elements",
                r.prop_spans.get("dims", r.span),
            )
            self.poisoned.add(r.name)
