"""What bind() requires of the stock tensor at a region's site, decided at check.

Contract of this layer. bind() provides each region by its install
(`lower.region_installs`, runtime/serving/lane.py):

  * `allocate` with a site: a region allocated at its shape, into which bind() copies
    the leading part of the stock tensor at the site (`runtime/binding.install_region`),
    so the stock tensor must hold the region's shape in every dim;
  * `stock` (`allocate stock`) and `pinned`: the stock tensor at the site *is* the
    region (adopted as is; with `initial zeros`, copied into a region of its shape);
  * `carry`: the stock history at the site is adopted along the extent axis, so only
    its other dims must match;
  * `declared`: nothing is read.

A declared `stock` constant that cannot hold the region at the reference values is
CLK031 (`stock_problem`). With session parameters (params.py) a region is allocated
once, at its largest shape over every domain, while the stock tensor at its site is
the model's, bound once. So (CLK083), checked at both ends of every domain and at
every capture value, which decide it (everything is linear in a parameter):

  * a region that is the stock tensor (`stock`, `pinned`) cannot change shape with a
    parameter, nor can a carry's history off its extent axis;
  * an allocated region with a site whose shape changes with a parameter declares its
    `stock` dims, and they hold the largest shape at every value;
  * every declared stock constant passes CLK031 at every value.

Each region gets at most one of these diagnostics: its first problem.
"""

from __future__ import annotations

from duplexcadence.compiler.analysis import Analysis, RegionAnalysis
from duplexcadence.compiler.lower import region_installs
from duplexcadence.compiler.region_rules import RegionNumbers
from duplexcadence.compiler.validate import Checked
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, Span, error

_ADOPTED = {"stock": "`allocate stock`", "pinned": "`address pinned`"}


def stock_problem(region: ir.Region, r: RegionAnalysis, numbers: RegionNumbers) -> str | None:
    """Why the stock constant cannot hold the demand-sized region, or None. The stock
    tensor at the site is what bind() copies from (a carry: off its extent axis)."""
    if r.stock_bytes is None or region.allocate == "stock":
        return None
    if r.demand_bytes > r.stock_bytes:
        return (
            f"region '{r.name}' needs {r.demand_bytes} bytes, more than its stock constant "
            f"({r.stock_bytes} bytes); a demand size cannot exceed the stock envelope"
        )
    for i, (need, have) in enumerate(zip(r.shape, numbers.stock)):
        if numbers.retention is not None and i == r.axis:
            continue
        if need > have:
            return (
                f"region '{r.name}' needs {need} along dim {i}, more than its stock "
                f"constant holds ({have}); the stock tensor could not hold the region"
            )
    return None


def stock_span(region: ir.Region) -> Span:
    """Where a stock problem is reported: the `stock` dims, else the site."""
    spans = region.prop_spans
    return spans.get("stock") or spans.get("site") or region.span


def param_stock_problems(
    contract: ir.Contract,
    allocated: dict[str, tuple[int, ...]],
    folded: dict[str, tuple[Checked, Analysis]],
    point_values: dict[str, dict[str, int]],
    reference: dict[str, int],
) -> list[Diagnostic]:
    """CLK083 (module docstring). `allocated`: each region's shape over the domains;
    `folded`: label ("f_prompt=50") -> the fold at that point, `point_values` its values."""
    installs = region_installs(contract)
    out = []
    for region in contract.regions:
        install = installs[region.name]
        if install == "declared":
            continue
        why = _moving_shape(region, install, contract.params, folded) or _point_problem(
            region, install, allocated[region.name], folded, point_values, reference
        )
        if why is not None:
            out.append(error("CLK083", why, stock_span(region)))
    return out


def _at(folded, label: str, name: str) -> tuple[RegionAnalysis, RegionNumbers]:
    checked, analysis = folded[label]
    return next(r for r in analysis.regions if r.name == name), checked.regions[name]


def _moving_shape(region: ir.Region, install: str, params, folded) -> str | None:
    """Why the region's shape may not change with a parameter it changes with, or None."""
    name = region.name
    for p in params:
        lo, n = _at(folded, f"{p.name}={p.lo}", name)
        hi, _ = _at(folded, f"{p.name}={p.hi}", name)
        moves = [i for i, (a, b) in enumerate(zip(lo.shape, hi.shape)) if a != b]
        if install == "carry":
            moves = [i for i in moves if i != n.axis]
        if not moves:
            continue
        change = f"{lo.shape} at {p.name}={p.lo}, {hi.shape} at {p.name}={p.hi}"
        if install in _ADOPTED:
            return (
                f"region '{name}' is the stock tensor at its site ({_ADOPTED[install]}), "
                f"bound once for every session: its shape cannot change with param "
                f"'{p.name}' ({change})"
            )
        if install == "carry":
            return (
                f"carry '{name}' adopts the stock history at its site, whose dims off its "
                f"extent axis cannot change with param '{p.name}' ({change})"
            )
        if region.site is not None and region.stock is None:
            return (
                f"region '{name}' changes shape with param '{p.name}' ({change}) and bind() "
                f"copies the stock tensor at its site into it: declare its `stock` dims, "
                f"which must hold the largest shape over the domain"
            )
    return None


def _point_problem(region, install, allocated, folded, point_values, reference) -> str | None:
    """Why the declared stock constant cannot hold the region at some fold point, or
    None (also where it cannot at the reference values: CLK031 says so)."""
    if region.stock is None:
        return None
    at = {label: _at(folded, label, region.name) for label in point_values}
    at_reference = next(label for label, v in point_values.items() if v == reference)
    if stock_problem(region, *at[at_reference]) is not None:
        return None
    for label, (r, n) in at.items():
        if (why := stock_problem(region, r, n)) is not None:
            return f"at {label}: {why}"
    if install != "allocate" or region.site is None:
        return None
    stocks = {label: n.stock for label, (_, n) in at.items()}
    for i, need in enumerate(allocated):
        label, have = min(stocks.items(), key=lambda item: item[1][i])
        if need > have[i]:
            where = f" at {label}" if len(set(stocks.values())) > 1 else ""
            return (
                f"region '{region.name}' is allocated at {allocated}, its largest shape over "
                f"the parameters' domains, but its stock constant holds {have[i]} along dim "
                f"{i}{where}; bind() copies the stock tensor at its site into it"
            )
    return None
