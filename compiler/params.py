"""Session parameters: the catalog and the bytes as functions of the bound values.

Contract of this layer. A contract with `param` declarations is validated and
analysed at its reference values (`param_rules.reference_values`: what generated
code is rendered at) and, here, at the two ends of every parameter's domain (the
other parameters at their reference) and at every `capture` value. Every quantity
is linear in each parameter (CLK081), so two ends decide the whole domain:

  * the catalog must be the same classes at every value, each region's attended
    extents shifted by `coeff · (value − reference)` (CLK082 otherwise: a width, a
    stride or a staged argument's shape that moves with a parameter);
  * retention sizes shift the same way (a coefficient per retention parameter);
  * region shapes shift the same way, per dim (``shape_shift``): a session's own
    copy of a region is allocated at its value's shape, a lane's at the largest
    value it serves (at bind: the default and the capture values; it grows when a
    larger value comes, runtime/serving/lane.py). ``shapes`` stays the domain's largest
    shape (the envelope, per dim the larger end): what a lane serving the top
    allocates, reported beside what one value needs;
  * the stock tensor at each region's site holds what bind() puts there at every
    value (stock_rules.py, CLK083).

The result (`ParamAnalysis`) is what lowering writes into generated code (the
shifts, the envelope shapes, the domains) and what `clockc check`/`plan` report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from duplexcadence.compiler.analysis import Analysis, analyse
from duplexcadence.compiler.param_rules import reference_values
from duplexcadence.compiler.stock_rules import param_stock_problems
from duplexcadence.compiler.validate import Checked, validate
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, Severity, error

Terms = tuple[tuple[str, int], ...]  # (param, coefficient) pairs; value shifts by Σ c·Δ


@dataclass
class ParamAnalysis:
    params: tuple[ir.Param, ...]
    reference: dict[str, int]
    # label ("f_prompt=50") -> the analysis at that point
    points: dict[str, Analysis] = field(default_factory=dict)
    point_values: dict[str, dict[str, int]] = field(default_factory=dict)
    extent_shift: dict[str, Terms] = field(default_factory=dict)  # region -> terms
    retention_shift: dict[str, tuple[Terms, ...]] = field(default_factory=dict)
    # region -> per dim, the (param, coeff) terms of its shape (only regions that move)
    shape_shift: dict[str, tuple[Terms, ...]] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the envelope (max)
    bytes_allocated: dict[str, int] = field(default_factory=dict)  # at the envelope
    bind_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # a lane at bind
    bytes_at_bind: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        """Per point: catalog width per callable and contract-owned bytes; JSON-ready."""
        rows = {}
        for label, a in self.points.items():
            rows[label] = {
                "values": self.point_values[label],
                "widths": {k.name: k.width for k in a.callables},
                "demand_bytes": a.demand_bytes,
                "per_session_bytes": _per_session(a),
            }
        allocated = sum(self.bytes_allocated.values())
        per_session = self._per_session_regions()
        return {
            "params": [
                {
                    "name": p.name,
                    "lo": p.lo,
                    "hi": p.hi,
                    "unit": p.unit,
                    "default": self.reference[p.name],
                    "capture": list(p.capture),
                    "hold": p.hold,
                }
                for p in self.params
            ],
            "points": rows,
            # a lane at bind: every region at the largest of the default and capture values
            "lane_at_bind_bytes": sum(self.bytes_at_bind.values()),
            # a lane that served the top of every domain, and a session at the top
            "allocated_bytes": allocated,
            "allocated_per_session_bytes": sum(self.bytes_allocated[r] for r in per_session),
            "extent_shift": {r: [list(t) for t in terms] for r, terms in self.extent_shift.items()},
            "shape_shift": {
                r: {i: [list(t) for t in terms] for i, terms in enumerate(dims) if terms}
                for r, dims in self.shape_shift.items()
            },
        }

    def at_bind(self, analysis: Analysis) -> Analysis:
        """`analysis` with every region at the shape a lane allocates at bind (the
        largest of the default and the capture values), and those bytes."""
        regions = tuple(
            r.model_copy(
                update={
                    "shape": self.bind_shapes[r.name],
                    "demand_bytes": self.bytes_at_bind[r.name],
                }
            )
            for r in analysis.regions
        )
        demand = sum(r.demand_bytes for r in regions)
        return analysis.model_copy(update={"regions": regions, "demand_bytes": demand})

    def _per_session_regions(self) -> list[str]:
        a = next(iter(self.points.values()))
        return [r.name for r in a.regions if r.lifetime in ("turn", "session")]


def _per_session(a: Analysis) -> int:
    return sum(r.demand_bytes for r in a.regions if r.lifetime in ("turn", "session"))


def points_of(contract: ir.Contract) -> dict[str, dict[str, int]]:
    """Where the contract is folded: each parameter at both ends and at each capture
    value (the others at their reference), labelled `name=value`."""
    ref = reference_values(contract)
    out = {}
    for p in contract.params:
        for v in sorted({p.lo, p.hi, ref[p.name], *p.capture}):
            out[f"{p.name}={v}"] = {**ref, p.name: v}
    return out


def analyse_params(
    contract: ir.Contract, checked: Checked, analysis: Analysis
) -> tuple[ParamAnalysis | None, list[Diagnostic]]:
    """Fold the contract over every parameter's domain (module docstring). `checked`
    and `analysis` are the reference fold."""
    if not contract.params:
        return None, []
    ref = reference_values(contract)
    result = ParamAnalysis(params=contract.params, reference=ref)
    problems: list[Diagnostic] = []
    folded: dict[str, tuple[Checked, Analysis]] = {}
    for label, values in points_of(contract).items():
        c, diags = validate(contract, values)
        errors = [d for d in diags if d.severity == Severity.ERROR]
        if not errors:
            a, more = analyse(c)
            errors = [d for d in more if d.severity == Severity.ERROR]
        for d in errors:  # the same mistake at another value: say at which
            problems.append(error(d.code, f"at {label}: {d.message}", d.span))
        if errors:
            return None, _unique(problems)
        folded[label] = (c, a)
        result.points[label] = a
        result.point_values[label] = values
    by_param = {p.name: p for p in contract.params}
    span = {p.name: p.span for p in contract.params}
    for name, p in by_param.items():
        lo, hi = folded[f"{name}={p.lo}"], folded[f"{name}={p.hi}"]
        problems += _same_catalog(name, span[name], (checked, analysis), lo, hi)
        problems += _read_shapes_fixed(contract, name, span[name], lo[1], hi[1])
    if problems:
        return None, problems
    _shifts(result, contract, checked, folded)
    _allocation(result, contract, analysis, folded)
    problems += _shifted_catalogs_agree(result, checked, analysis, folded)
    problems += param_stock_problems(
        contract, result.shapes, folded, result.point_values, result.reference
    )
    return (None if problems else result), problems


def _unique(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen, out = set(), []
    for d in diags:
        key = (d.code, d.span, d.message.split(": ", 1)[-1])
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _same_catalog(name, span, ref, lo, hi) -> list[Diagnostic]:
    """Widths, scopes and strides equal at both ends (so, being linear, everywhere)."""
    out = []
    (_, a_ref), (_, a_lo), (_, a_hi) = ref, lo, hi
    for k0, k1, k2 in zip(a_ref.callables, a_lo.callables, a_hi.callables):
        if not (k0.width == k1.width == k2.width and k0.in_scope == k1.in_scope == k2.in_scope):
            out.append(
                error(
                    "CLK082",
                    f"callable '{k0.name}': its catalog width changes with param '{name}' "
                    f"({k1.width} at the bottom of its domain, {k2.width} at the top)",
                    span,
                )
            )
    for r0, r1, r2 in zip(a_ref.regions, a_lo.regions, a_hi.regions):
        if not (
            r0.stride == r1.stride == r2.stride
            and r0.steps == r1.steps == r2.steps
            and r0.window == r1.window == r2.window
        ):
            out.append(
                error(
                    "CLK082",
                    f"region '{r0.name}': its attended stride or window changes with param "
                    f"'{name}' (only where extents start and stop may move)",
                    span,
                )
            )
    return out


def _read_shapes_fixed(contract, name, span, a_lo: Analysis, a_hi: Analysis) -> list[Diagnostic]:
    """A region a callable reads is passed as a view of its allocation: only its extent
    axis (narrowed to the attended extent) may grow with a parameter, never another dim
    nor a region without one (the call would see the largest value's shape)."""
    read = {
        a.type.region
        for k in contract.callables
        for a in k.args
        if isinstance(a.type, ir.RegionArg)
    }
    out = []
    for r1, r2 in zip(a_lo.regions, a_hi.regions):
        if r1.name not in read:
            continue
        off_axis = [i for i in range(len(r1.shape)) if i != r1.axis or r1.bound is None]
        if any(r1.shape[i] != r2.shape[i] for i in off_axis):
            out.append(
                error(
                    "CLK082",
                    f"region '{r1.name}' is read by a callable and its shape off its attended "
                    f"extent changes with param '{name}' ({r1.shape} to {r2.shape})",
                    span,
                )
            )
    return out


def _coefficient(at_lo: int, at_hi: int, p: ir.Param) -> int:
    if p.hi == p.lo:
        return 0
    return (at_hi - at_lo) // (p.hi - p.lo)  # exact: linear with integer coefficients


def _shifts(result: ParamAnalysis, contract, checked: Checked, folded) -> None:
    for r in contract.regions:
        extent: list[tuple[str, int]] = []
        retention: list[list[tuple[str, int]]] = []
        n0 = checked.regions[r.name]
        for p in contract.params:
            c_lo, a_lo = folded[f"{p.name}={p.lo}"]
            c_hi, a_hi = folded[f"{p.name}={p.hi}"]
            lo = next(x for x in a_lo.regions if x.name == r.name)
            hi = next(x for x in a_hi.regions if x.name == r.name)
            if lo.start is not None and (c := _coefficient(lo.start, hi.start, p)):
                extent.append((p.name, c))
            if n0.retention is not None:
                plo, phi = c_lo.regions[r.name].retention[1], c_hi.regions[r.name].retention[1]
                if not retention:
                    retention = [[] for _ in plo]
                for i, (x, y) in enumerate(zip(plo, phi)):
                    if c := _coefficient(x, y, p):
                        retention[i].append((p.name, c))
        if extent:
            result.extent_shift[r.name] = tuple(extent)
        if any(retention):
            result.retention_shift[r.name] = tuple(tuple(t) for t in retention)


def _allocation(result: ParamAnalysis, contract, analysis: Analysis, folded) -> None:
    """Per region and dim, the shape's terms (linear, so the two ends give them); the
    envelope, each dim at its largest over the domain (reference + the larger growth at
    either end of each parameter: they add, being independent); and a lane's shape at
    bind, each dim at its largest over the default and the capture values."""
    ref = result.reference
    at_bind = [ref] + [{**ref, p.name: v} for p in contract.params for v in p.capture]
    for r in analysis.regions:
        terms: list[list[tuple[str, int]]] = [[] for _ in r.shape]
        for p in contract.params:
            lo = next(x for x in folded[f"{p.name}={p.lo}"][1].regions if x.name == r.name)
            hi = next(x for x in folded[f"{p.name}={p.hi}"][1].regions if x.name == r.name)
            for i, (a, b) in enumerate(zip(lo.shape, hi.shape)):
                if c := _coefficient(a, b, p):
                    terms[i].append((p.name, c))
        if any(terms):
            result.shape_shift[r.name] = tuple(tuple(t) for t in terms)
        grown = [
            d
            + sum(
                max(c * (p.lo - ref[p.name]), c * (p.hi - ref[p.name]))
                for p, c in _params(contract, t)
            )
            for d, t in zip(r.shape, terms)
        ]
        bind = [
            max(d + sum(c * (v[n] - ref[n]) for n, c in t) for v in at_bind)
            for d, t in zip(r.shape, terms)
        ]
        result.shapes[r.name] = tuple(grown)
        result.bind_shapes[r.name] = tuple(bind)
        per = r.demand_bytes // math.prod(r.shape) if math.prod(r.shape) else 0
        result.bytes_allocated[r.name] = per * math.prod(grown)
        result.bytes_at_bind[r.name] = per * math.prod(bind)


def _params(contract, terms) -> list[tuple[ir.Param, int]]:
    by_name = {p.name: p for p in contract.params}
    return [(by_name[n], c) for n, c in terms]


def shifted(extents: tuple[tuple[str, int], ...], result: ParamAnalysis, values: dict) -> tuple:
    """A class's region extents at `values` (from the reference fold's)."""
    return tuple(
        (
            r,
            e
            + sum(c * (values[p] - result.reference[p]) for p, c in result.extent_shift.get(r, ())),
        )
        for r, e in extents
    )


def _shifted_catalogs_agree(result: ParamAnalysis, checked, analysis, folded) -> list[Diagnostic]:
    """The reference catalog, shifted, is each end's catalog: same classes, same
    staged shapes (lowered code compared; a staged argument that moves is CLK082)."""
    from duplexcadence.compiler.lower import lower_catalog

    out = []
    for label, (c, a) in folded.items():
        values = result.point_values[label]
        for k, k0, k1 in zip(checked.contract.callables, analysis.callables, a.callables):
            if not k0.in_scope:
                continue
            moved = tuple(
                cls.model_copy(update={"extents": shifted(cls.extents, result, values)})
                for cls in k0.classes
            )
            want = lower_catalog(k, moved, checked)
            have = lower_catalog(k, k1.classes, c)
            # class names are labels that carry the extents: compare everything else
            strip = lambda g: (g.args, g.kwargs, g.varying, [r.picks for r in g.rows])  # noqa: E731
            if strip(want) != strip(have):
                name = label.split("=")[0]
                out.append(
                    error(
                        "CLK082",
                        f"callable '{k.name}': at {label} its catalog is not the reference "
                        f"catalog with shifted extents (a staged argument's shape depends on "
                        f"param '{name}'?)",
                        next(p.span for p in result.params if p.name == name),
                    )
                )
                break
    return _unique(out)
