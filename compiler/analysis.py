"""Analysis: attended extents, catalogs and the memory plan (paper §3.2–3.5).

Everything here is integer arithmetic on a validated contract, in closed form
(`extents.py`): K = ⌈W/s⌉ + 1 per region at any size, joint extents per callable
by lifetime, and the catalog enumerated only when it is within the budget (it is
then exactly what gets captured). A callable's width counts distinct signatures:
configurations that differ only in variables no argument reads are one class.

The analysis also evaluates every admitted configuration's tensor arguments, so a
dim, stride or offset that is negative or too large for one configuration is a
positioned diagnostic here, not a failure at capture.
"""

from __future__ import annotations

import itertools
import math

from pydantic import BaseModel, ConfigDict

from duplexcadence.compiler.batch_rules import stacked_extent_problem
from duplexcadence.compiler.callable_rules import signature_variables
from duplexcadence.compiler.evaluate import MAX_VALUE, EvalError, Value, evaluate
from duplexcadence.compiler.counter_advance import Amounts
from duplexcadence.compiler.extents import (
    AmountSet,
    Progression,
    joint_states,
    joint_width,
    prod_capped,
)
from duplexcadence.compiler.validate import Checked, RegionNumbers
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error

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
# Attended and flush extents are listed (JSON, tables, generated comments) up to this
# many per region; past it only their closed form is given (start, stride, bound, K).
LIST_LIMIT = 1000
# |Q|·ΠK saturates here (it stays a bound; an exact product of hundreds of regions'
# K would be thousands of digits, more than Python prints)
BOUND_CAP = 10**100


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RegionAnalysis(_Frozen):
    name: str
    dtype: str
    shape: tuple[int, ...]  # allocated (demand) shape
    axis: int | None
    retention: str | None
    lifetime: str
    start: int | None  # A^-, the first attended extent
    bound: int | None  # A, the retained extent
    stride: int
    # a stepped clock's amounts (`1..8`, `{1, 2, 4}`) when the extent grows by one;
    # `stride` is then the smallest
    steps: str | None = None
    window: int  # W = A - A^-
    attended: tuple[int, ...]  # every attended extent, when at most LIST_LIMIT; else ()
    flush_extents: tuple[int, ...]  # extra extents one partial flush reaches (same limit)
    flush_count: int
    envelope: int | None
    # `speculative S`: entries past the committed end a call may write (the envelope
    # holds them: retained + S); speculative_bytes is what they add to demand_bytes
    speculative: int = 0
    speculative_bytes: int = 0
    catalog_width: int  # K_r = ceil(W/s) + 1 (1 when pinned; 1 + sums below W if stepped)
    demand_bytes: int
    stock_bytes: int | None
    rho: float | None
    # lockstep (compiler/batch_rules.py): the axis sessions stack on, the bytes of one
    # slot (a session's copy: demand_bytes) and at the contract's largest batch width
    slot: int | None = None
    slot_bytes: int | None = None
    batch_bytes: int | None = None


class CatalogClass(_Frozen):
    extents: tuple[tuple[str, int], ...]  # region -> attended extent
    config: tuple[tuple[str, bool | int | str], ...]  # config variable -> value

    def label(self) -> str:
        parts = [f"{r}={e}" for r, e in self.extents] + [f"{n}={v}" for n, v in self.config]
        return ",".join(parts) or "-"


class CallableAnalysis(_Frozen):
    name: str
    mode: str
    q_size: int  # distinct signatures over the configurations (|Q|)
    region_widths: tuple[tuple[str, int], ...]
    # `region r[i]`: (region, config variable, slots read); the slots count in |Q|
    slots: tuple[tuple[str, str, int], ...] = ()
    bound: int  # |Q| * prod K_r * |A| (saturating at BOUND_CAP)
    # |A|: the declared ambient states (`ambient autocast in {...}`); every class is
    # captured once per state, sharing its staging buffers
    ambient_states: int = 1
    enumerated: bool  # the width is exact (else it is the bound)
    classes: tuple[CatalogClass, ...]  # admitted classes in capture order, when in budget
    rejected_by_admission: int  # configurations `admit` rejects
    width: int
    in_scope: bool
    scope_reason: str
    staging_bytes: int  # eq. (6), first term, summed over classes
    write_through_bytes: int  # eq. (6), second term
    # lockstep: the declared batch widths (sorted), axis and per-row ops; every class is
    # captured once per width, so `graphs` = width x len(batch_widths) counts against
    # the budget (= width when unbatched)
    batch_widths: tuple[int, ...] = ()
    batch_axis: int | None = None
    batch_rows: tuple[str, ...] = ()
    batch_blocks: tuple[int, ...] = ()  # sessions per call of each per-row op
    graphs: int = 0
    # `commits R by AMOUNT`: (region, how far a call moves its committed end: a stepped
    # clock's amounts `1..9`, one amount, or each configuration value's `w=1:1,...`)
    commits: tuple[tuple[str, str], ...] = ()
    # `control NAME: DTYPE in LO..HI from result...`: (name, dtype, `LO..HI`)
    controls: tuple[tuple[str, str, str], ...] = ()

    def rows_shown(self) -> str:
        """The per-row ops as written: `aten.mean.dim, aten.mm.default by 8` (or -)."""
        shown = [
            op + (f" by {n}" if n > 1 else "") for op, n in zip(self.batch_rows, self.batch_blocks)
        ]
        return ", ".join(shown) or "-"


class ChannelAnalysis(_Frozen):
    """A channel (compiler/channel_rules.py): host memory of `capacity` entries that the
    producer's copies land in, published `batch` at a time, read per tick of `clock`."""

    name: str
    dtype: str
    capacity: int
    batch: int
    clock: str
    host_bytes: int


class Analysis(_Frozen):
    contract: str
    budget: int
    regions: tuple[RegionAnalysis, ...]
    callables: tuple[CallableAnalysis, ...]
    demand_bytes: int
    stock_bytes: int
    reserve_bytes: int
    # the contract's one lockstep (every batched callable declares the same widths)
    batch_widths: tuple[int, ...] = ()
    channels: tuple[ChannelAnalysis, ...] = ()

    @property
    def batched(self) -> bool:
        return bool(self.batch_widths)


# ------------------------------------------------------------------ regions
def progression(numbers: RegionNumbers) -> Progression | None:
    """A region's attended extents, or None when it has no retained extent."""
    if numbers.bound is None:
        return None
    start = numbers.start if numbers.start is not None else numbers.bound
    return Progression(start, numbers.stride or 0, numbers.bound, numbers.steps)


def retain(numbers: RegionNumbers, extent: int) -> int:
    """The extent kept after retention of a history of `extent` frames."""
    if numbers.bound is None:
        return extent
    return min(extent, numbers.bound)


def analyse_region(r: ir.Region, n: RegionNumbers, widest: int | None = None) -> RegionAnalysis:
    """One region's numbers; `widest`: the contract's largest batch width, if batched (a
    slotted region then holds that many sessions' copies in a batched binding)."""
    shape = (
        tuple(n.envelope if d is None else d for d in n.dims)
        if n.envelope
        else tuple(1 if d is None else d for d in n.dims)
    )
    if r.allocate == "stock" and n.stock is not None:
        shape = n.stock  # the stock tensor itself is the region
    p = progression(n)
    bytes_per = DTYPE_BYTES[r.dtype]
    demand = math.prod(shape) * bytes_per
    stock = math.prod(n.stock) * bytes_per if n.stock else None
    return RegionAnalysis(
        name=r.name,
        dtype=r.dtype,
        shape=shape,
        axis=n.axis,
        retention=r.retention.kind if r.retention else None,
        lifetime=r.lifetime,
        start=p.start if p else None,
        bound=p.bound if p else None,
        stride=n.stride,
        steps=n.steps.shown() if n.steps else None,
        window=(p.bound - p.start) if p else 0,
        attended=tuple(sorted(p.values(LIST_LIMIT) or ())) if p else (),
        flush_extents=(p.flush_values(n.flush, LIST_LIMIT) or ()) if p else (),
        flush_count=p.flush_count(n.flush) if p else 0,
        envelope=n.envelope,
        speculative=n.speculative,
        # one entry along the extent axis is the other dims' product
        speculative_bytes=n.speculative * math.prod(d for d in n.dims if d is not None) * bytes_per,
        catalog_width=p.count if p else 1,
        demand_bytes=demand,
        stock_bytes=stock,
        rho=round(stock / demand, 3) if stock else None,
        slot=r.slot,
        slot_bytes=demand if widest and r.slot is not None else None,
        batch_bytes=widest * demand if widest and r.slot is not None else None,
    )


# ------------------------------------------------------------------ callables
def config_space(k: ir.Callable) -> tuple[tuple[str, ...], list[tuple]]:
    """Q: the product of the callable's declared non-extent configurations
    (bounded by validation: CLK032)."""
    names: list[str] = []
    axes: list[tuple] = []
    for cfg in k.configs:
        names.extend(cfg.names)
        axes.append(cfg.values)
    combos = [tuple(itertools.chain.from_iterable(choice)) for choice in itertools.product(*axes)]
    return tuple(names), combos


def _eval(
    expr: ir.Expr, checked: Checked, env: dict[str, Value], extents: dict | None = None
) -> int:
    def extent(name: str, span) -> Value:
        # a staged argument as long as a region argument's attended extent (validated):
        # the class's extent, or the region's bound where no class is at hand yet
        numbers = checked.regions[name]
        return Value((extents or {}).get(name, numbers.bound), numbers.axis_clock)

    return evaluate(
        expr, checked.consts, clocks=checked.clock_names, names=env, extent=extent
    ).value


def _value(v) -> Value:
    return Value(int(v)) if not isinstance(v, str) else Value(0)


_COMPARE = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}


def admitted(k: ir.Callable, checked: Checked, config: dict) -> bool:
    env = {n: _value(v) for n, v in config.items()}
    return all(
        _COMPARE[c.op](_eval(c.left, checked, env), _eval(c.right, checked, env)) for c in k.admit
    )


def tensor_layout(arg: ir.TensorArg, checked: Checked, config: dict, extents: dict | None = None):
    """(dims, strides or None, offset) of a staged argument under one configuration
    (and, where it names `extent(R)`, one class's extents; the bounds without them)."""
    env = {n: _value(v) for n, v in config.items()}
    dims = tuple(_eval(d, checked, env, extents) for d in arg.dims)
    strides = (
        tuple(_eval(d, checked, env, extents) for d in arg.strides)
        if arg.strides is not None
        else None
    )
    offset = _eval(arg.offset, checked, env, extents) if arg.offset is not None else 0
    return dims, strides, offset


def tensor_bytes(
    arg: ir.TensorArg, checked: Checked, config: dict, extents: dict | None = None
) -> int:
    """Bytes of the static buffer a staged argument needs: the storage span its
    strides reach (a strided view stages its whole row stride), plus its offset.
    The runtime's `TensorSpec.nbytes` is the same formula (a property test ties them)."""
    dims, strides, offset = tensor_layout(arg, checked, config, extents)
    if strides is None:
        span = math.prod(dims)
    elif 0 in dims:
        span = 0
    else:
        span = 1 + sum((d - 1) * st for d, st in zip(dims, strides))
    return (offset + span) * DTYPE_BYTES[arg.dtype]


def _layout_problem(arg: ir.Arg, k: ir.Callable, checked: Checked, config: dict):
    """A diagnostic if this configuration gives the argument an impossible layout."""
    t = arg.type
    shown = arg.path.dotted()
    try:
        dims, strides, offset = tensor_layout(t, checked, config)
    except EvalError as e:
        return error(e.code or "CLK018", f"argument '{shown}': {e.message}", e.span)
    label = ", ".join(f"{n}={v}" for n, v in config.items())
    under = f" (config {label})" if label else ""
    if k.batch is not None:  # sessions stack on the batch axis: one session's extent is 1
        stacked = stacked_extent_problem(arg, k, dims, under)
        if stacked is not None:
            return stacked
    if any(d < 0 for d in dims) or any(s < 0 for s in strides or ()) or offset < 0:
        return error(
            "CLK015",
            f"argument '{shown}' of callable '{k.name}' has a negative dim, stride or "
            f"offset{under}",
            t.span,
        )
    if math.prod(dims) > MAX_VALUE or tensor_bytes(t, checked, config) > MAX_VALUE:
        return error(
            "CLK018",
            f"argument '{shown}' of callable '{k.name}' spans more than 2**53 elements{under}",
            t.span,
        )
    return None


def analyse_callable(
    k: ir.Callable,
    checked: Checked,
    regions: dict[str, RegionAnalysis],
    problems: list[Diagnostic],
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
    position = {n: i for i, n in enumerate(names)}
    signatures, reps, rejected, failed = _configurations(k, checked, names, q, problems)

    widths = tuple((r, regions[r].catalog_width) for r in region_args)
    slots = tuple(
        (a.type.region, a.type.index, len({v[position[a.type.index]] for v in q}))
        for a in k.args
        if isinstance(a.type, ir.RegionArg) and a.type.index is not None
    )
    n_ambient = math.prod(len(set(a.values)) for a in k.ambient)
    bound = prod_capped([len(signatures), n_ambient] + [w for _, w in widths], BOUND_CAP - 1)
    lifetimes = [regions[r].lifetime for r in region_args]
    progressions = [progression(checked.regions[r]) for r in region_args]
    count = joint_width(progressions, lifetimes)
    enumerated = count is not None
    width = count * len(reps) * n_ambient if enumerated else bound
    classes: list[CatalogClass] = []
    staging = 0
    if not failed and width <= checked.budget:
        states = joint_states(progressions, lifetimes, checked.budget) or []
        for state in states:
            extents = tuple(zip(region_args, state))
            for config in reps.values():
                classes.append(CatalogClass(extents=extents, config=tuple(config.items())))
                staging += _staging(k, checked, dict(extents), config)
    write_through = sum(regions[r].demand_bytes for r in k.writes if r in regions)
    batch_widths = tuple(sorted(set(k.batch.widths))) if k.batch is not None else ()
    graphs = prod_capped([width, len(batch_widths) or 1], BOUND_CAP - 1)
    in_scope, reason = _scope(k, width, graphs, enumerated, widths, checked.budget)
    return CallableAnalysis(
        name=k.name,
        mode=k.mode,
        q_size=len(signatures),
        region_widths=widths,
        slots=slots,
        bound=bound,
        ambient_states=n_ambient,
        enumerated=enumerated,
        classes=tuple(classes),
        rejected_by_admission=rejected,
        width=width,
        in_scope=in_scope and not failed,
        scope_reason=reason,
        staging_bytes=staging if in_scope else 0,
        write_through_bytes=write_through if in_scope else 0,
        batch_widths=batch_widths,
        batch_axis=k.batch.axis if k.batch is not None else None,
        batch_rows=k.batch.rows if k.batch is not None else (),
        batch_blocks=k.batch.row_blocks() if k.batch is not None else (),
        graphs=graphs,
        commits=tuple(
            (c.region, _commit_shown(checked.commit_amounts[(k.name, c.region)]))
            for c in k.commits
            if (k.name, c.region) in checked.commit_amounts
        ),
        controls=tuple(
            (c.name, c.dtype, f"{c.low}..{c.high}")
            for c in k.controls
            if (k.name, c.name) in checked.controls
        ),
    )


def _commit_shown(amounts: Amounts | AmountSet) -> str:
    """A commit's amounts as `clockc check` shows them (``Checked.commit_amounts``)."""
    if isinstance(amounts, AmountSet):
        return amounts.shown()
    if amounts.by is None:
        return str(amounts.constant)
    return ",".join(f"{amounts.by}={v}:{a}" for v, a in amounts.per_value)


def _configurations(k: ir.Callable, checked: Checked, names, q, problems: list[Diagnostic]):
    """(distinct signatures over Q, the first admitted configuration of each admitted
    signature, configurations rejected by `admit`, whether an evaluation failed).
    Every admitted signature's tensor layouts are evaluated and checked here."""
    position = {n: i for i, n in enumerate(names)}
    keyed = sorted(signature_variables(k), key=position.__getitem__)
    signatures: dict[tuple, dict] = {}
    reps: dict[tuple, dict] = {}
    rejected = 0
    for values in q:
        config = dict(zip(names, values))
        key = tuple(config[n] for n in keyed)
        signatures.setdefault(key, config)
        try:
            ok = admitted(k, checked, config)
        except EvalError as e:
            problems.append(error(e.code or "CLK018", e.message, e.span))
            return signatures, reps, rejected, True
        if not ok:
            rejected += 1
            continue
        reps.setdefault(key, config)
    tensors = [a for a in k.args if isinstance(a.type, ir.TensorArg)]
    for config in reps.values():
        found = [p for p in (_layout_problem(a, k, checked, config) for a in tensors) if p]
        if found:
            problems.extend(found)
            return signatures, reps, rejected, True
    return signatures, reps, rejected, False


def _scope(k: ir.Callable, width: int, graphs: int, enumerated: bool, widths, budget: int):
    """(in scope, why) of one callable. The budget counts graphs: one per class, and per
    batch width where the callable is batched (one graph per (class, width))."""
    if graphs > budget:
        slim = ", ".join(f"K({r})={w}" for r, w in widths if w > 1)
        shown = str(width) if enumerated else f"up to {width}"
        if k.batch is not None:
            n = len(set(k.batch.widths))
            shown += f" x {n} batch width{'s' if n != 1 else ''} = {graphs} graphs"
        return False, f"catalog width {shown} exceeds budget {budget}" + (
            f" ({slim})" if slim else ""
        )
    if k.mode == "eager":
        return False, "declared `mode eager`"
    return True, "exact catalog within budget"


def _staging(k: ir.Callable, checked: Checked, extents: dict, config: dict) -> int:
    """Eq. (6), first term, for one class: its tensor arguments. A region argument is
    never staged, `aliased` or not: the graph reads the region where it lies (the
    runtime's RegionView), and a call whose argument is elsewhere runs eager."""
    return sum(
        tensor_bytes(a.type, checked, config, extents)
        for a in k.args
        if isinstance(a.type, ir.TensorArg)
    )


def analyse(checked: Checked) -> tuple[Analysis, list[Diagnostic]]:
    """The analysis, and the diagnostics only per-configuration evaluation finds."""
    c = checked.contract
    problems: list[Diagnostic] = []
    batch_widths = tuple(sorted({w for k in c.callables if k.batch for w in k.batch.widths}))
    regions = {
        r.name: analyse_region(r, checked.regions[r.name], max(batch_widths, default=None))
        for r in c.regions
    }
    callables = tuple(analyse_callable(k, checked, regions, problems) for k in c.callables)
    demand = sum(r.demand_bytes for r in regions.values())
    stock = sum((r.stock_bytes or r.demand_bytes) for r in regions.values())
    reserve = sum(k.staging_bytes + k.write_through_bytes for k in callables)
    analysis = Analysis(
        contract=c.name,
        budget=checked.budget,
        regions=tuple(regions.values()),
        callables=callables,
        demand_bytes=demand,
        stock_bytes=stock,
        reserve_bytes=reserve,
        batch_widths=batch_widths,
        channels=tuple(
            ChannelAnalysis(
                name=ch.name,
                dtype=ch.dtype,
                capacity=capacity,
                batch=batch,
                clock=ch.clock,
                host_bytes=capacity * DTYPE_BYTES[ch.dtype],
            )
            for ch in c.channels
            for capacity, batch in [checked.channels[ch.name]]
        ),
    )
    return analysis, problems
