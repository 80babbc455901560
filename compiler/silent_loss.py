"""Warnings for a valid contract that would silently lose replay or state.

Contract of this layer: given a contract that validated without errors (its
`Checked` numbers), return warnings, each positioned at the declaration to fix,
for mistakes that `bind()` and replay would otherwise accept without a word:

  CLK506  a carry's attended stride differs from what its writer appends per call
          (the rate of the region's clock per the callable's `per` clock), so the
          catalog holds extents the stream never reaches and misses those it does (a
          writer: a callable that retains it, or is passed the object it is a member of);
  CLK507  a carry retained by writeback grows but declares no `attended`: only its
          full extent is captured, so every call while it grows misses;
  CLK508  regions bound to nothing (no site, no callable) and not declared `allocate
          none` (documentation on purpose), listed in one warning at the first:
          bind() provides nothing for them (often a forgotten `site` or argument);
  CLK509  a contract with no callable: its adapter binds and does nothing.

These judge a contract that is otherwise valid, so they run only when validation
found no error (a broken declaration is reported once, by its error).
"""

from __future__ import annotations

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, Span, warning


def silent_loss_warnings(
    c: ir.Contract, clock_rate: dict[str, int], regions: dict
) -> list[Diagnostic]:
    """Every warning above for contract `c` (`clock_rate`: ticks per call of each rate
    clock; `regions`: the validator's `RegionNumbers` by name)."""
    out: list[Diagnostic] = []
    if not c.callables:
        out.append(
            warning(
                "CLK509",
                f"contract '{c.name}' declares no callable: its adapter binds and replays "
                "nothing (declare the hot calls with `callable NAME { site ... }`)",
                c.span,
            )
        )
    # `allocate none` documents stock state on purpose (Moshi's rings: what a session
    # owns, which `clockc plan` counts); anything else unbound is likely a forgotten site
    unused = [r for r in c.regions if r.name not in used_regions(c) and r.allocate != "none"]
    if unused:
        listed = ", ".join(f"{r.name} (line {r.span.line})" for r in unused)
        out.append(
            warning(
                "CLK508",
                f"{len(unused)} region(s) declared only, bound to nothing (no site, no "
                f"callable reads, writes or retains them; bind() provides nothing): {listed}",
                unused[0].span,
            )
        )
    writers = {}
    for k in c.callables:
        for ret in k.retains:
            writers.setdefault(ret.region, []).append(k)
        # an object argument's members: the vendor appends to them and rebinds them
        for o in k.objects:
            for m in o.members:
                writers.setdefault(m, []).append(k)
    for r in c.regions:
        numbers = regions.get(r.name)
        if numbers is None or r.name not in writers or r.retention is None:
            continue
        if r.attended is None:
            out.append(
                warning(
                    "CLK507",
                    f"region '{r.name}' is retained by writeback "
                    f"({', '.join(k.name for k in writers[r.name])}) but declares no "
                    f"`attended`: only its full extent {numbers.bound} is captured, so every "
                    "call while it grows misses (declare `attended from START by STRIDE`)",
                    r.prop_spans.get("retention", r.span),
                )
            )
            continue
        for k in writers[r.name]:
            advance = _advance_per_call(numbers.axis_clock, k.per, clock_rate)
            if advance is not None and numbers.stride and advance != numbers.stride:
                out.append(
                    warning(
                        "CLK506",
                        f"attended stride {numbers.stride} of region '{r.name}' differs from "
                        f"what callable '{k.name}' appends per call: {advance} "
                        f"{numbers.axis_clock} per {k.per} (by the clocks); replay misses "
                        "every extent the stream reaches off the declared stride",
                        _stride_span(r),
                    )
                )
    return out


def used_regions(c: ir.Contract) -> set[str]:
    """Regions bind() provides: at a site, or read, written or retained by a callable
    (`lower.region_installs` calls the rest `declared`)."""
    used = {r.name for r in c.regions if r.site is not None}
    for k in c.callables:
        used.update(a.type.region for a in k.args if isinstance(a.type, ir.RegionArg))
        used.update(k.writes)
        used.update(k.aliased)
        used.update(ret.region for ret in k.retains)
    return used


def _advance_per_call(axis_clock: str | None, per: str | None, rate: dict[str, int]):
    """Ticks of `axis_clock` per tick of `per`, when both are rate clocks and the
    ratio is whole; else None (nothing to compare against)."""
    if axis_clock is None or per is None:
        return None
    a, p = rate.get(axis_clock), rate.get(per)
    if a is None or p is None or a % p:
        return None
    return a // p


def _stride_span(r: ir.Region) -> Span:
    return r.attended.stride.span if r.attended is not None else r.span
