"""Analysis: attended extents, catalogs and the memory plan (paper §3.2–3.5).

Everything here is integer arithmetic on a validated contract. Attended extents
are found by simulating the region's clock (start, +stride per call, truncated
by the retention), so the enumerated catalog is exact and can be checked
against the closed form K = ceil(W / s) + 1 (Criterion 3.5).
"""

from __future__ import annotations

import itertools
import math

from pydantic import BaseModel, ConfigDict

from duplexcadence.compiler import ir
from duplexcadence.compiler.evaluate import Value, evaluate
from duplexcadence.compiler.validate import Checked, RegionNumbers

DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool8": 1,
}
# Above this many joint states a catalog is bounded, not enumerated.
ENUMERATION_LIMIT = 100_000


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RegionAnalysis(_Frozen):
    name: str
    dtype: str
    shape: tuple[int, ...]  # allocated (demand) shape
    axis: int | None
    retention: str | None
    stride: int
    window: int  # W = A - A^-
    attended: tuple[int, ...]  # exact set of attended extents reached
    flush_extents: tuple[int, ...]  # extra extents reached by one partial flush
    envelope: int | None
    catalog_width: int  # K_r = ceil(W/s) + 1 (1 when the extent is pinned)
    demand_bytes: int
    stock_bytes: int | None
    rho: float | None


class CatalogClass(_Frozen):
    extents: tuple[tuple[str, int], ...]  # region -> attended extent
    config: tuple[tuple[str, bool | int | str], ...]  # config variable -> value

    def label(self) -> str:
        parts = [f"{r}={e}" for r, e in self.extents] + [f"{n}={v}" for n, v in self.config]
        return ",".join(parts) or "-"


class CallableAnalysis(_Frozen):
    name: str
    mode: str
    q_size: int
    region_widths: tuple[tuple[str, int], ...]
    # `region r[i]`: (region, config variable, slots read); the slots count in |Q|
    slots: tuple[tuple[str, str, int], ...] = ()
    bound: int  # |Q| * prod K_r * |A|
    # |A|: the declared ambient states (`ambient autocast in {...}`); every class is
    # captured once per state, sharing its staging buffers
    ambient_states: int = 1
    enumerated: bool
    classes: tuple[CatalogClass, ...]  # admitted classes, in enumeration order
    rejected_by_admission: int
    width: int
    in_scope: bool
    scope_reason: str
    staging_bytes: int  # eq. (6), first term, summed over classes
    write_through_bytes: int  # eq. (6), second term


class Analysis(_Frozen):
    contract: str
    budget: int
    regions: tuple[RegionAnalysis, ...]
    callables: tuple[CallableAnalysis, ...]
    demand_bytes: int
    stock_bytes: int
    reserve_bytes: int


# ------------------------------------------------------------------ regions
def retain(numbers: RegionNumbers, extent: int) -> int:
    """The extent kept after retention of a history of `extent` frames."""
    if numbers.bound is None:
        return extent
    return min(extent, numbers.bound)


def attended_sequence(numbers: RegionNumbers, limit: int = ENUMERATION_LIMIT) -> list[int]:
    """Attended extents call by call, from the start until the sequence repeats."""
    if numbers.bound is None:
        return []
    if numbers.retention and numbers.retention[0] == "ring" and numbers.stride == 0:
        return [numbers.bound]  # a ring attended in full: one extent
    seq, seen, a = [], set(), numbers.start
    while a not in seen and len(seq) < limit:
        seen.add(a)
        seq.append(a)
        a = retain(numbers, a + numbers.stride)
    return seq


def catalog_width_formula(start: int, bound: int, stride: int) -> int:
    """Criterion 3.5: K = ceil(W / s) + 1, W = A - A^-; a pinned extent has K = 1."""
    window = bound - start
    if window == 0 or stride == 0:
        return 1
    return math.ceil(window / stride) + 1


def flush_extents(numbers: RegionNumbers, steady: list[int]) -> list[int]:
    """Extents reached when one partial flush of f < s frames interrupts the steady stream."""
    extra: set[int] = set()
    for f in numbers.flush:
        for a in steady:
            b = retain(numbers, a + f)
            for _ in range(ENUMERATION_LIMIT):
                if b in steady or b in extra:
                    break
                extra.add(b)
                b = retain(numbers, b + numbers.stride)
    return sorted(extra)


def _elements(dims) -> int:
    return math.prod(dims)


def analyse_region(r: ir.Region, n: RegionNumbers) -> RegionAnalysis:
    shape = (
        tuple(n.envelope if d is None else d for d in n.dims)
        if n.envelope
        else tuple(1 if d is None else d for d in n.dims)
    )
    if r.allocate == "stock" and n.stock is not None:
        shape = n.stock  # the stock tensor itself is the region
    steady = attended_sequence(n)
    bytes_per = DTYPE_BYTES[r.dtype]
    demand = _elements(shape) * bytes_per
    stock = _elements(n.stock) * bytes_per if n.stock else None
    start = n.start if n.start is not None else (n.bound or 0)
    return RegionAnalysis(
        name=r.name,
        dtype=r.dtype,
        shape=shape,
        axis=n.axis,
        retention=r.retention.kind if r.retention else None,
        stride=n.stride,
        window=(n.bound - start) if n.bound is not None else 0,
        attended=tuple(sorted(steady)),
        flush_extents=tuple(flush_extents(n, steady)),
        envelope=n.envelope,
        catalog_width=len(set(steady)) if steady else 1,
        demand_bytes=demand,
        stock_bytes=stock,
        rho=round(stock / demand, 3) if stock else None,
    )


# ------------------------------------------------------------------ callables
def config_space(k: ir.Callable) -> tuple[tuple[str, ...], list[tuple]]:
    """Q: the product of the callable's declared non-extent configurations."""
    names: list[str] = []
    axes: list[tuple] = []
    for cfg in k.configs:
        names.extend(cfg.names)
        axes.append(cfg.values)
    combos = [sum(choice, ()) for choice in itertools.product(*axes)] if axes else [()]
    return tuple(names), combos


def _eval(expr: ir.Expr, checked: Checked, env: dict[str, Value]) -> int:
    clocks = frozenset(k.name for k in checked.contract.clocks)
    return evaluate(expr, checked.consts, clocks=clocks, names=env).value


def _value(v) -> Value:
    return Value(int(v)) if not isinstance(v, str) else Value(0)


def admitted(k: ir.Callable, checked: Checked, config: dict) -> bool:
    env = {n: _value(v) for n, v in config.items()}
    for cond in k.admit:
        left = _eval(cond.left, checked, env)
        right = _eval(cond.right, checked, env)
        ok = {
            "<=": left <= right,
            "<": left < right,
            "==": left == right,
            "!=": left != right,
            ">=": left >= right,
            ">": left > right,
        }[cond.op]
        if not ok:
            return False
    return True


def joint_extents(
    regions: list[str], numbers: dict[str, RegionNumbers]
) -> tuple[list[tuple], bool]:
    """Joint attended extents of a callable's regions, simulated call by call."""
    if not regions:
        return [()], True
    seqs = {r: attended_sequence(numbers[r]) for r in regions}
    bound = math.prod(len(set(s)) or 1 for s in seqs.values())
    if bound > ENUMERATION_LIMIT:
        return [], False
    states: list[tuple] = []
    seen: set[tuple] = set()
    state = tuple(numbers[r].start for r in regions)
    while state not in seen:
        seen.add(state)
        states.append(state)
        state = tuple(retain(numbers[r], a + numbers[r].stride) for r, a in zip(regions, state))
        if all(
            numbers[r].retention and numbers[r].retention[0] == "ring" and numbers[r].stride == 0
            for r in regions
        ):
            break
    return states, True


def tensor_bytes(arg: ir.TensorArg, checked: Checked, config: dict) -> int:
    """Bytes of the static buffer a staged argument needs: the storage span its
    strides reach (a strided view stages its whole row stride), plus its offset."""
    env = {n: _value(v) for n, v in config.items()}
    dims = [_eval(d, checked, env) for d in arg.dims]
    offset = _eval(arg.offset, checked, env) if arg.offset is not None else 0
    if arg.strides is None:
        span = _elements(dims)
    elif 0 in dims:
        span = 0
    else:
        strides = [_eval(d, checked, env) for d in arg.strides]
        span = 1 + sum((d - 1) * st for d, st in zip(dims, strides))
    return (offset + span) * DTYPE_BYTES[arg.dtype]


def analyse_callable(
    k: ir.Callable, checked: Checked, regions: dict[str, RegionAnalysis]
) -> CallableAnalysis:
    # only regions with a clock extent vary the signature; fixed regions are one shape
    # (a slot index `region r[i]` varies the aliased pointer: it counts in Q, as config i)
    region_args = [
        a.type.region
        for a in k.args
        if isinstance(a.type, ir.RegionArg) and checked.regions[a.type.region].bound is not None
    ]
    region_args = list(dict.fromkeys(region_args))
    names, q = config_space(k)
    widths = tuple((r, regions[r].catalog_width) for r in region_args)
    slots = tuple(
        (a.type.region, a.type.index, len({v[names.index(a.type.index)] for v in q}))
        for a in k.args
        if isinstance(a.type, ir.RegionArg) and a.type.index is not None
    )
    n_ambient = math.prod(len(set(a.values)) for a in k.ambient)
    bound = len(q) * math.prod(w for _, w in widths) * n_ambient
    states, enumerated = joint_extents(region_args, checked.regions)
    classes: list[CatalogClass] = []
    rejected = 0
    staging = 0
    for state in states:
        for values in q:
            config = dict(zip(names, values))
            if not admitted(k, checked, config):
                rejected += 1
                continue
            classes.append(
                CatalogClass(extents=tuple(zip(region_args, state)), config=tuple(config.items()))
            )
            for a in k.args:
                if isinstance(a.type, ir.TensorArg):
                    staging += tensor_bytes(a.type, checked, config)
                elif isinstance(a.type, ir.RegionArg) and a.type.region not in k.aliased:
                    ra = regions[a.type.region]
                    extent = dict(zip(region_args, state)).get(a.type.region, 1)
                    per_frame = ra.demand_bytes // (ra.shape[ra.axis] if ra.axis is not None else 1)
                    nbytes = per_frame * (extent if ra.axis is not None else 1)
                    # `region r[i]` stages one slot of the leading axis
                    staging += nbytes // ra.shape[0] if a.type.index is not None else nbytes
    width = len(classes) * n_ambient if enumerated else bound
    write_through = sum(regions[r].demand_bytes for r in k.writes if r in regions)
    if width > checked.budget:
        in_scope = False
        slim = ", ".join(f"K({r})={w}" for r, w in widths if w > 1)
        reason = f"catalog width {width} exceeds budget {checked.budget}" + (
            f" ({slim})" if slim else ""
        )
    elif k.mode == "eager":
        in_scope, reason = False, "declared `mode eager`"
    else:
        in_scope, reason = True, "exact catalog within budget"
    return CallableAnalysis(
        name=k.name,
        mode=k.mode,
        q_size=len(q),
        region_widths=widths,
        slots=slots,
        bound=bound,
        ambient_states=n_ambient,
        enumerated=enumerated,
        classes=tuple(classes),
        rejected_by_admission=rejected,
        width=width,
        in_scope=in_scope,
        scope_reason=reason,
        staging_bytes=staging if in_scope else 0,
        write_through_bytes=write_through if in_scope else 0,
    )


def analyse(checked: Checked) -> Analysis:
    c = checked.contract
    regions = {r.name: analyse_region(r, checked.regions[r.name]) for r in c.regions}
    callables = tuple(analyse_callable(k, checked, regions) for k in c.callables)
    demand = sum(r.demand_bytes for r in regions.values())
    stock = sum((r.stock_bytes or r.demand_bytes) for r in regions.values())
    reserve = sum(k.staging_bytes + k.write_through_bytes for k in callables)
    return Analysis(
        contract=c.name,
        budget=checked.budget,
        regions=tuple(regions.values()),
        callables=callables,
        demand_bytes=demand,
        stock_bytes=stock,
        reserve_bytes=reserve,
    )
