"""Validation: resolve names, check units and bounds, and fold constants.

Takes the parsed IR and returns a `Checked` environment (constant values, clock
rates per call, region numbers) plus every diagnostic found, all at once. Only
what can be decided from the declaration alone is checked here; catalog widths
and memory are computed by `analysis` from the `Checked` result.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field

from duplexcadence.compiler import ir
from duplexcadence.compiler.evaluate import EvalError, Value, evaluate
from duplexcadence.dsl.diagnostics import Diagnostic, Span, error, warning

DEFAULT_BUDGET = 64
ROOT_CLOCK = "call"

# Determinism settings the runtime knows how to pin (runtime/binding.py _SETTINGS;
# a test keeps the two lists equal without making the compiler import torch).
KNOWN_SETTINGS = frozenset(
    {"cudnn.deterministic", "cudnn.benchmark", "cudnn.allow_tf32", "cuda.matmul.allow_tf32"}
)
# What `ambient autocast in {...}` may list: off, or an autocast dtype (float32 is what
# `torch.autocast("cuda", dtype=torch.float32)` enables on CUDA; it casts nothing, but
# it is a distinct ambient state, so a callable called under it must declare it).
AUTOCAST_STATES = ("off", "float32", "float16", "bfloat16")
# Region, callable and constant names become Python identifiers in the generated
# adapter; these would be syntax errors or would shadow what bind() itself uses.
RESERVED_NAMES = frozenset(
    {"model", "device", "audit", "capture", "progress", "binding", "torch", "args", "kwargs"}
)


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


@dataclass
class Checked:
    contract: ir.Contract
    consts: dict[str, Value] = field(default_factory=dict)
    clock_rate: dict[str, int] = field(default_factory=dict)  # ticks per call
    regions: dict[str, RegionNumbers] = field(default_factory=dict)
    budget: int = DEFAULT_BUDGET


class _Validator:
    def __init__(self, contract: ir.Contract):
        self.c = contract
        self.diags: list[Diagnostic] = []
        self.out = Checked(contract=contract, budget=contract.budget or DEFAULT_BUDGET)
        self.clocks = frozenset(k.name for k in contract.clocks)

    def err(self, code: str, message: str, span: Span) -> None:
        self.diags.append(error(code, message, span))

    def warn(self, code: str, message: str, span: Span) -> None:
        self.diags.append(warning(code, message, span))

    def eval(self, expr: ir.Expr, **kw) -> Value | None:
        try:
            return evaluate(expr, self.out.consts, clocks=self.clocks, **kw)
        except EvalError as e:
            self.err(e.code, e.message, e.span)
            return None

    # ------------------------------------------------------------ top level
    def run(self) -> Checked:
        self.check_unique_names()
        self.check_generated_names()
        self.check_determinism()
        self.check_budget()
        self.check_clocks()
        self.check_consts()
        for region in self.c.regions:
            self.check_region(region)
        for region in self.c.regions:
            self.check_envelope(region)
        for callable_ in self.c.callables:
            self.check_callable(callable_)
        for constant in self.c.constants:
            self.check_constant(constant)
        self.check_pins_written()
        return self.out

    def check_pins_written(self) -> None:
        written = {w for k in self.c.callables for w in k.writes}
        for r in self.c.regions:
            if r.address == "pinned" and r.site is not None and r.name not in written:
                self.warn(
                    "CLK505",
                    f"pinned region '{r.name}' is written by no callable: nothing copies the "
                    "stock code's new values into it",
                    r.prop_spans.get("address", r.span),
                )

    def check_unique_names(self) -> None:
        seen: dict[str, str] = {ROOT_CLOCK: "the built-in clock"}
        groups = [
            ("clock", self.c.clocks),
            ("const", self.c.consts),
            ("region", self.c.regions),
            ("callable", self.c.callables),
            ("constant", self.c.constants),
        ]
        for kind, nodes in groups:
            for node in nodes:
                if node.name in seen:
                    self.err(
                        "CLK010",
                        f"duplicate name '{node.name}' (already {seen[node.name]})",
                        node.span,
                    )
                else:
                    seen[node.name] = f"a {kind}"

    def check_generated_names(self) -> None:
        for nodes in (self.c.regions, self.c.callables, self.c.constants):
            for node in nodes:
                if keyword.iskeyword(node.name) or keyword.issoftkeyword(node.name):
                    self.err(
                        "CLK017",
                        f"'{node.name}' is a Python keyword; choose another name",
                        node.span,
                    )
                elif node.name in RESERVED_NAMES or node.name.startswith(("stock_", "_")):
                    self.err(
                        "CLK017",
                        f"'{node.name}' is reserved in the generated adapter; choose another name",
                        node.span,
                    )
        if keyword.iskeyword(self.c.name) or keyword.issoftkeyword(self.c.name):
            self.err("CLK017", f"contract name '{self.c.name}' is a Python keyword", self.c.span)

    def check_determinism(self) -> None:
        for d in self.c.determinism:
            if d.setting not in KNOWN_SETTINGS:
                known = ", ".join(sorted(KNOWN_SETTINGS))
                self.err(
                    "CLK016", f"unknown determinism setting '{d.setting}' (known: {known})", d.span
                )
            elif not isinstance(d.value, bool):
                self.err("CLK016", f"determinism setting '{d.setting}' takes true or false", d.span)

    def check_budget(self) -> None:
        if self.c.budget is not None and self.c.budget < 1:
            self.err("CLK030", "catalog budget must be at least 1", self.c.span)

    def check_clocks(self) -> None:
        by_name = {k.name: k for k in self.c.clocks}
        for k in self.c.clocks:
            if k.kind == "rate":
                if k.rate is not None and k.rate <= 0:
                    self.err("CLK014", f"clock '{k.name}' needs a positive rate", k.span)
                if k.parent != ROOT_CLOCK and k.parent not in by_name:
                    self.err(
                        "CLK011",
                        f"clock '{k.name}' is derived from unknown clock '{k.parent}'",
                        k.span,
                    )
            else:
                for f in k.factors:
                    if f not in by_name:
                        self.err(
                            "CLK011", f"product clock '{k.name}' names unknown clock '{f}'", k.span
                        )
                    elif by_name[f].kind == "product" or f == k.name:
                        self.err(
                            "CLK013",
                            f"product clock '{k.name}' may only combine rate clocks",
                            k.span,
                        )
        # rates per call, detecting cycles among derived clocks
        for k in self.c.clocks:
            if k.kind != "rate":
                continue
            rate, cur, chain = 1, k, [k.name]
            while cur is not None:
                rate *= cur.rate or 1
                if cur.parent == ROOT_CLOCK:
                    self.out.clock_rate[k.name] = rate
                    break
                nxt = by_name.get(cur.parent)
                if nxt is None or nxt.kind != "rate":
                    break
                if nxt.name in chain:
                    cycle = " -> ".join(chain + [nxt.name])
                    self.err("CLK013", f"cycle among derived clocks: {cycle}", k.span)
                    break
                chain.append(nxt.name)
                cur = nxt

    def check_consts(self) -> None:
        for const in self.c.consts:
            if const.name in self.out.consts:
                continue
            v = self.eval(const.expr)
            if v is not None:
                if v.value < 0:
                    self.err(
                        "CLK015", f"constant '{const.name}' is negative ({v.show()})", const.span
                    )
                self.out.consts[const.name] = v

    # ------------------------------------------------------------ regions
    def check_region(self, r: ir.Region) -> None:
        spans = r.prop_spans
        if r.dtype is None:
            self.err("CLK025", f"region '{r.name}' has no dtype", r.span)
        if r.dims is None:
            self.err("CLK025", f"region '{r.name}' has no dims", r.span)
            return
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
            dims.append(v.value if v else 1)
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
            params = [in_axis_unit(p, "retention") for p in r.retention.params]
            if all(p is not None for p in params):
                if any(p <= 0 for p in params) and r.retention.kind != "head_tail":
                    self.err(
                        "CLK020",
                        f"retention of region '{r.name}' must be positive",
                        r.retention.span,
                    )
                retention = (r.retention.kind, tuple(params))
                bound = sum(params)
        elif axis is not None and r.envelope is None:
            self.err(
                "CLK020",
                f"retention of region '{r.name}' is unbounded: its '{axis_clock}' axis grows "
                "with no retention policy or envelope",
                spans.get("dims", r.span),
            )

        start = stride = None
        flush: tuple[int, ...] = ()
        if r.attended is not None:
            a = r.attended
            if retention is None:
                self.err(
                    "CLK020",
                    f"region '{r.name}' declares an attended extent but no retention",
                    a.span,
                )
            start = in_axis_unit(a.start, "attended start")
            stride = in_axis_unit(a.stride, "attended stride")
            flush = tuple(x for x in (in_axis_unit(f, "flush") for f in a.flush) if x is not None)
            if stride is not None and stride <= 0:
                self.err(
                    "CLK021",
                    f"attended stride of region '{r.name}' must be positive",
                    a.stride.span,
                )
                stride = None
            if retention and retention[0] == "window" and stride and stride > bound:
                self.err(
                    "CLK021",
                    f"attended stride {stride} exceeds the window {bound} of region '{r.name}'",
                    a.stride.span,
                )
            if a.until is not None and bound is not None:
                until = in_axis_unit(a.until, "attended limit")
                if until is not None and until != bound:
                    self.err(
                        "CLK022",
                        f"attended limit {until} of region '{r.name}' disagrees with its "
                        f"retention, which keeps {bound}",
                        a.until.span,
                    )
            if start is not None and bound is not None and start > bound:
                self.err(
                    "CLK023",
                    f"attended start {start} of region '{r.name}' exceeds its retained extent {bound}",
                    a.start.span,
                )
        if r.clock is not None and r.clock not in self.clocks:
            self.err(
                "CLK011",
                f"region '{r.name}' names unknown clock '{r.clock}'",
                spans.get("clock", r.span),
            )

        stock = None
        if r.stock is not None:
            values = [self.eval(d) for d in r.stock]
            if len(values) != len(r.dims):
                self.err(
                    "CLK028",
                    f"stock of region '{r.name}' has {len(values)} dims but the region has {len(r.dims)}",
                    spans.get("stock", r.span),
                )
            elif all(v is not None for v in values):
                stock = tuple(v.value for v in values)
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
        if r.allocate == "stock":
            if r.site is None or stock is None:
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
        self.out.regions[r.name] = RegionNumbers(
            dims=tuple(dims),
            axis=axis,
            axis_clock=axis_clock,
            retention=retention,
            bound=bound,
            start=start if start is not None else bound,
            stride=stride or 0,
            flush=flush,
            envelope=bound,
            stock=stock,
        )

    def check_envelope(self, r: ir.Region) -> None:
        """Envelopes may name other regions' extents, so they are folded second."""
        numbers = self.out.regions.get(r.name)
        if numbers is None or r.envelope is None:
            return

        def extent(name: str, span: Span) -> Value:
            other = self.out.regions.get(name)
            if other is None or other.bound is None:
                raise EvalError("CLK011", f"extent({name}) names no region with a retention", span)
            return Value(other.bound, other.axis_clock)

        v = self.eval(r.envelope, extent=extent)
        if v is None:
            return
        if numbers.axis is None:
            self.err(
                "CLK012",
                f"region '{r.name}' has an envelope but no clock-extent axis",
                r.envelope.span,
            )
            return
        if v.unit != numbers.axis_clock:
            self.err(
                "CLK012",
                f"envelope of region '{r.name}' is {v.show()} but its axis counts {numbers.axis_clock}",
                r.envelope.span,
            )
            return
        if numbers.bound is not None and v.value < numbers.bound:
            self.err(
                "CLK023",
                f"envelope {v.value} of region '{r.name}' is smaller than its retained extent {numbers.bound}",
                r.envelope.span,
            )
        self.out.regions[r.name] = RegionNumbers(**{**numbers.__dict__, "envelope": v.value})

    # ------------------------------------------------------------ callables
    def check_callable(self, k: ir.Callable) -> None:
        spans = k.prop_spans
        regions = {r.name: r for r in self.c.regions}
        if k.site is None:
            self.err("CLK025", f"callable '{k.name}' has no site", k.span)
        if k.per is not None and k.per not in self.clocks:
            self.err(
                "CLK011",
                f"callable '{k.name}' runs per unknown clock '{k.per}'",
                spans.get("per", k.span),
            )
        config_names: set[str] = set()
        for cfg in k.configs:
            for n in cfg.names:
                if n in config_names:
                    self.err(
                        "CLK010",
                        f"config variable '{n}' of callable '{k.name}' is declared twice",
                        cfg.span,
                    )
                config_names.add(n)
            for values in cfg.values:
                if len(values) != len(cfg.names):
                    self.err(
                        "CLK029",
                        f"config value {values} has {len(values)} fields, expected {len(cfg.names)}",
                        cfg.span,
                    )
        sample = {n: Value(0) for n in config_names}
        arg_regions: set[str] = set()
        seen_paths: set[str] = set()
        for arg in k.args:
            dotted = arg.path.dotted()
            if dotted in seen_paths:
                self.err(
                    "CLK010",
                    f"argument '{dotted}' of callable '{k.name}' is declared twice",
                    arg.span,
                )
            seen_paths.add(dotted)
            t = arg.type
            if isinstance(t, ir.RegionArg):
                if t.region not in regions:
                    self.err(
                        "CLK011", f"argument '{dotted}' names unknown region '{t.region}'", t.span
                    )
                arg_regions.add(t.region)
                if t.index is not None:
                    self.check_index(k, dotted, t, config_names)
            elif isinstance(t, ir.TensorArg):
                for d in t.dims + (t.strides or ()):
                    self.eval(d, names=sample)
                if t.offset is not None:
                    v = self.eval(t.offset, names=sample)
                    if v is not None and v.value < 0:
                        self.err("CLK015", f"offset of argument '{dotted}' is negative", t.span)
                if t.strides is not None and len(t.strides) != len(t.dims):
                    self.err(
                        "CLK028",
                        f"argument '{dotted}' has {len(t.dims)} dims but {len(t.strides)} strides",
                        t.span,
                    )
            elif t.type == "none":
                pass  # always None: keyed by value, nothing to configure
            else:
                if arg.path.steps or arg.path.root not in config_names:
                    self.err(
                        "CLK044",
                        f"scalar argument '{dotted}' of callable '{k.name}' needs "
                        f"`config {dotted} in {{...}}` to fix its values",
                        arg.span,
                    )
        for name in k.aliased:
            span = spans.get(f"aliased:{name}", k.span)
            if name not in regions:
                self.err("CLK011", f"callable '{k.name}' aliases unknown region '{name}'", span)
            elif name not in arg_regions:
                self.err(
                    "CLK040",
                    f"aliased region '{name}' is not an argument of callable '{k.name}'",
                    span,
                )
        for name in k.writes:
            span = spans.get(f"writes:{name}", k.span)
            if name not in regions:
                self.err("CLK011", f"callable '{k.name}' writes unknown region '{name}'", span)
            elif regions[name].mutability == "immutable":
                self.err("CLK042", f"callable '{k.name}' writes immutable region '{name}'", span)
        for ret in k.retains:
            if ret.region not in regions:
                self.err(
                    "CLK011", f"callable '{k.name}' retains unknown region '{ret.region}'", ret.span
                )
            elif regions[ret.region].retention is None:
                self.err(
                    "CLK041", f"region '{ret.region}' has no retention policy to apply", ret.span
                )
            elif regions[ret.region].mutability == "immutable":
                self.err(
                    "CLK042",
                    f"callable '{k.name}' retains into immutable region '{ret.region}'",
                    ret.span,
                )
            if ret.source.root != "result":
                self.err(
                    "CLK043",
                    "a retained history is read from `result[...]`, the callable's output",
                    ret.source.span,
                )
        for counter in k.counters:
            if counter.site.root == "result" or counter.advances < 1:
                self.err(
                    "CLK049",
                    f"counter '{counter.site.dotted()}' of callable '{k.name}' must be a model "
                    "attribute that advances by at least 1 per call",
                    counter.span,
                )
        self.check_ambient(k)
        for cond in k.admit:
            for side in (cond.left, cond.right):
                self.eval(side, names={n: Value(0, None) for n in config_names} | {})
        if k.effects == "host_rng" and k.mode == "replay":
            self.warn(
                "CLK502",
                f"callable '{k.name}' draws host randomness; replay rejects it at capture, "
                "so declare `mode eager`",
                spans.get("effects", k.span),
            )

    def check_ambient(self, k: ir.Callable) -> None:
        axes: set[str] = set()
        for amb in k.ambient:
            if amb.axis != "autocast":
                self.err(
                    "CLK060",
                    f"unknown ambient axis '{amb.axis}' of callable '{k.name}' (known: autocast)",
                    amb.span,
                )
                continue
            if amb.axis in axes:
                self.err("CLK026", f"callable {k.name} declares 'ambient {amb.axis}' twice", amb.span)
            axes.add(amb.axis)
            for v in amb.values:
                if v not in AUTOCAST_STATES:
                    self.err(
                        "CLK061",
                        f"autocast state '{v}' of callable '{k.name}' is not one of "
                        f"{', '.join(AUTOCAST_STATES)}",
                        amb.span,
                    )
            if len(set(amb.values)) != len(amb.values):
                self.err(
                    "CLK061",
                    f"callable '{k.name}' lists an autocast state twice in {{{', '.join(amb.values)}}}",
                    amb.span,
                )

    def check_index(
        self, k: ir.Callable, dotted: str, t: ir.RegionArg, config_names: set[str]
    ) -> None:
        """`region r[i]`: i is a config variable whose every value names a slot of r's
        fixed leading axis (the slot is what the call reads, so the catalog keys it)."""
        if t.index not in config_names:
            self.err(
                "CLK045",
                f"argument '{dotted}' of callable '{k.name}' indexes region '{t.region}' by "
                f"'{t.index}', which is not a config variable of the callable "
                f"(declare `config {t.index} in {{...}}`)",
                t.span,
            )
            return
        numbers = self.out.regions.get(t.region)
        if numbers is None or not numbers.dims:
            return  # unknown or dimensionless region: reported already
        if numbers.axis == 0:
            self.err(
                "CLK046",
                f"argument '{dotted}' of callable '{k.name}' indexes the leading axis of region "
                f"'{t.region}', which is its clock-extent axis; an index selects a slot of a "
                "fixed leading axis",
                t.span,
            )
            return
        slots = numbers.dims[0]
        values = [
            v[cfg.names.index(t.index)]
            for cfg in k.configs
            if t.index in cfg.names
            for v in cfg.values
            if len(v) == len(cfg.names)
        ]
        bad = [v for v in values if type(v) is not int or not 0 <= v < slots]
        if bad:
            shown = ", ".join(
                str(v).lower() if type(v) is bool else f'"{v}"' if type(v) is str else str(v)
                for v in bad
            )
            self.err(
                "CLK046",
                f"argument '{dotted}' of callable '{k.name}' indexes region '{t.region}' by "
                f"'{t.index}', whose values {{{shown}}} fall outside its leading axis "
                f"(slots 0..{slots - 1})",
                t.span,
            )

    def check_constant(self, c: ir.HostConstant) -> None:
        if c.site is None:
            self.err("CLK025", f"constant '{c.name}' has no site", c.span)
        if c.dims is not None:
            for d in c.dims:
                self.eval(d)


def validate(contract: ir.Contract) -> tuple[Checked, list[Diagnostic]]:
    v = _Validator(contract)
    checked = v.run()
    return checked, v.diags
