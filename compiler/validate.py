"""Validation: resolve names, check units and bounds, and fold constants.

Takes the parsed IR and returns a `Checked` environment (constant values, clock
rates per call, region numbers) plus every diagnostic found, all at once. Only
what can be decided from the declaration alone is checked here; catalog widths
and memory are computed by `analysis` from the `Checked` result. Region and
callable rules live in `region_rules.py` and `callable_rules.py`, name and site
rules in `names.py` and `sites.py`.

A declaration that fails is *poisoned*: whatever refers to it says nothing more,
so one mistake gives one diagnostic, never a cascade of follow-on errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from duplexcadence.compiler.batch_rules import BatchRules
from duplexcadence.compiler.callable_rules import CallableRules
from duplexcadence.compiler.channel_rules import ChannelRules
from duplexcadence.compiler.commit_rules import CommitRules
from duplexcadence.compiler.control_rules import ControlRules
from duplexcadence.compiler.counter_advance import Amounts
from duplexcadence.compiler.evaluate import MAX_VALUE, EvalError, Value, evaluate
from duplexcadence.compiler.extents import APERY_LIMIT, AmountSet
from duplexcadence.compiler.names import check_names
from duplexcadence.compiler.objects import expand_objects
from duplexcadence.compiler.param_rules import check_params, reference_values
from duplexcadence.compiler.region_rules import RegionNumbers, RegionRules
from duplexcadence.compiler.silent_loss import silent_loss_warnings, used_regions
from duplexcadence.compiler.sites import check_sites
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, Severity, Span, error, warning

DEFAULT_BUDGET = 64
MAX_BUDGET = 1000  # a catalog is captured graph by graph before traffic
ROOT_CLOCK = "call"

# Determinism settings the runtime knows how to pin (runtime/serving/binding.py _SETTINGS;
# a test keeps the two lists equal without making the compiler import torch).
KNOWN_SETTINGS = frozenset(
    {
        "cudnn.deterministic",
        "cudnn.benchmark",
        "cudnn.allow_tf32",
        "cuda.matmul.allow_tf32",
        "cuda.cudnn_sdp",
        "cuda.flash_sdp",
        "cuda.mem_efficient_sdp",
    }
)
__all__ = ["Checked", "RegionNumbers", "validate"]


@dataclass
class Checked:
    contract: ir.Contract
    consts: dict[str, Value] = field(default_factory=dict)
    clock_rate: dict[str, int] = field(default_factory=dict)  # ticks per call
    # stepped clocks: the amounts each advances by per tick of its parent
    clock_steps: dict[str, AmountSet] = field(default_factory=dict)
    regions: dict[str, RegionNumbers] = field(default_factory=dict)
    budget: int = DEFAULT_BUDGET
    clock_names: frozenset[str] = frozenset()
    # the session-parameter values this environment was folded at (compiler/params.py)
    params: dict[str, int] = field(default_factory=dict)
    # (callable, counter index) -> what the counter advances by (counter_advance.py)
    counter_amounts: dict[tuple[str, int], Amounts] = field(default_factory=dict)
    # (callable, region) -> how far a call moves the region's committed end: a stepped
    # clock's amounts, or one per class (commit_rules.py)
    commit_amounts: dict[tuple[str, str], Amounts | AmountSet] = field(default_factory=dict)
    # (callable, control) -> the declared range of a control (control_rules.py)
    controls: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # channel -> (capacity, batch): its entries and how many one publish appends
    channels: dict[str, tuple[int, int]] = field(default_factory=dict)


class _Validator(RegionRules, CallableRules, ControlRules, CommitRules, BatchRules, ChannelRules):
    def __init__(self, contract: ir.Contract, params: Mapping[str, int] | None = None):
        self.c = contract
        self.diags: list[Diagnostic] = []
        self.clocks = frozenset(k.name for k in contract.clocks)
        self.out = Checked(
            contract=contract, budget=contract.budget or DEFAULT_BUDGET, clock_names=self.clocks
        )
        self.region_nodes = {r.name: r for r in contract.regions}
        self.poisoned: set[str] = set()  # declarations that failed (see the docstring)
        self.at = dict(params) if params is not None else reference_values(contract)

    def err(self, code: str, message: str, span: Span) -> None:
        self.diags.append(error(code, message, span))

    def warn(self, code: str, message: str, span: Span) -> None:
        self.diags.append(warning(code, message, span))

    def error_count(self) -> int:
        return sum(d.severity == Severity.ERROR for d in self.diags)

    def eval(self, expr: ir.Expr, **kw) -> Value | None:
        try:
            return evaluate(
                expr,
                self.out.consts,
                clocks=self.clocks,
                poisoned=self.poisoned,
                **kw,
            )
        except EvalError as e:
            if e.code is not None:  # None: it refers to a declaration that failed
                self.err(e.code, e.message, e.span)
            return None

    # ------------------------------------------------------------ top level
    def run(self) -> Checked:
        # object arguments become region arguments first: every rule below, and lowering
        # (which reads ``Checked.contract``), sees the regions the runtime keys
        self.c, found = expand_objects(self.c)
        self.out.contract = self.c
        self.diags += found
        self.check_unique_names()
        self.diags += check_names(self.c)
        self.diags += check_sites(self.c)
        self.check_determinism()
        self.check_budget()
        self.check_clocks()
        self.diags += check_params(self.c, self.clocks)
        self.bind_params()
        self.check_consts()
        for region in self.c.regions:
            self.check_region(region)
        for region in self.c.regions:
            self.check_envelope(region)
        for region in self.c.regions:
            self.check_region_size(region)
            self.check_slot(region)
        for callable_ in self.c.callables:
            self.check_callable(callable_)
            self.check_controls(callable_)
            self.check_commits(callable_)
            self.check_batch(callable_)
        self.check_lockstep()
        for constant in self.c.constants:
            self.check_constant(constant)
        for fold in self.c.folds:
            self.check_fold(fold)
        for channel in self.c.channels:
            self.check_channel(channel)
        self.check_pins_written()
        self.check_documented()
        if self.error_count() == 0:
            self.diags += silent_loss_warnings(self.c, self.out.clock_rate, self.out.regions)
        return self.out

    def check_documented(self) -> None:
        """A region declared ``allocate none`` documents stock state: nothing binds it."""
        used = used_regions(self.c)
        for r in self.c.regions:
            if r.allocate == "none" and (r.site is not None or r.name in used):
                how = "has a site" if r.site is not None else "is used by a callable"
                self.err(
                    "CLK057",
                    f"region '{r.name}' is `allocate none` (it documents stock state) but {how}",
                    r.prop_spans.get("allocate", r.span),
                )

    def check_pins_written(self) -> None:
        written = {w for k in self.c.callables for w in k.writes}
        # an object argument's members are copied back by the runtime (state_objects.py)
        written |= {m for k in self.c.callables for o in k.objects for m in o.members}
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
            ("param", self.c.params),
            ("region", self.c.regions),
            ("callable", self.c.callables),
            ("constant", self.c.constants),
            ("fold", self.c.folds),
            ("channel", self.c.channels),
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
        if self.c.budget is not None and not 1 <= self.c.budget <= MAX_BUDGET:
            self.err("CLK030", f"catalog budget must be between 1 and {MAX_BUDGET}", self.c.span)

    def check_clocks(self) -> None:
        by_name = {k.name: k for k in self.c.clocks}
        for k in self.c.clocks:
            if k.kind == "stepped":
                self._check_steps(k)
            if k.kind in ("rate", "stepped"):
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
                    elif by_name[f].kind != "rate" or f == k.name:
                        self.err(
                            "CLK013",
                            f"product clock '{k.name}' may only combine rate clocks",
                            k.span,
                        )
        self._clock_rates(by_name)

    def _check_steps(self, k: ir.Clock) -> None:
        """A stepped clock's amounts: positive, a non-empty range, a listed set whose
        closed-form count stays a small table (CLK019, extents.APERY_LIMIT)."""
        lo, hi = k.steps
        listed = k.listed
        if lo <= 0:
            self.err("CLK014", f"clock '{k.name}' needs positive amounts (it has {lo})", k.span)
        elif hi > MAX_VALUE:
            self.err("CLK018", f"clock '{k.name}' advances more than 2**53 per tick", k.span)
        elif lo > hi:
            self.err("CLK019", f"clock '{k.name}' advances by {lo}..{hi}: an empty range", k.span)
        elif len(set(listed)) != len(listed):
            self.err("CLK019", f"clock '{k.name}' lists an amount twice", k.span)
        else:
            steps = AmountSet.of(listed) if listed else AmountSet(lo, hi)
            if steps.apery_size > APERY_LIMIT:
                self.err(
                    "CLK019",
                    f"clock '{k.name}' advances by {steps.shown()}: its smallest amount over "
                    f"their gcd is {steps.apery_size}, more than {APERY_LIMIT} (the catalog "
                    "is counted over that many residues; a range lo..hi has no such limit)",
                    k.span,
                )
            else:
                self.out.clock_steps[k.name] = steps

    def _clock_rates(self, by_name: dict[str, ir.Clock]) -> None:
        """Ticks per call of every rate clock, each chain walked once (linear time).
        Every clock on a cycle reports it; a clock that only leads into one is quiet."""
        rate: dict[str, int | None] = {}  # None: broken (cycle, unknown parent, too fast)
        for k in self.c.clocks:
            if k.kind != "rate" or k.name in rate:
                continue
            chain: list[ir.Clock] = []
            on_chain: set[str] = set()
            cur, base = k, None
            while True:
                if cur.name in rate:
                    base = rate[cur.name]
                    break
                if cur.name in on_chain:  # (by name: a duplicate clock is another object)
                    cycle = chain[[c.name for c in chain].index(cur.name) :]
                    names = [c.name for c in cycle]
                    for i, c in enumerate(cycle):
                        shown = " -> ".join(names[i:] + names[:i] + [c.name])
                        self.err("CLK013", f"cycle among derived clocks: {shown}", c.span)
                    break
                chain.append(cur)
                on_chain.add(cur.name)
                if cur.parent == ROOT_CLOCK:
                    base = 1
                    break
                nxt = by_name.get(cur.parent)
                if nxt is None or nxt.kind != "rate":
                    break  # unknown or product parent: reported by check_clocks
                cur = nxt
            for c in reversed(chain):
                if base is not None:
                    base *= c.rate or 1
                    if base > MAX_VALUE:
                        self.err(
                            "CLK018",
                            f"clock '{c.name}' ticks more than 2**53 times per call",
                            c.span,
                        )
                        base = None
                rate[c.name] = base
        self.out.clock_rate = {name: r for name, r in rate.items() if r is not None}

    def bind_params(self) -> None:
        """A session parameter is a constant of the value this environment is folded at."""
        for p in self.c.params:
            if p.name in self.at and p.name not in self.out.consts:
                self.out.consts[p.name] = Value(self.at[p.name], p.unit)
                self.out.params[p.name] = self.at[p.name]

    def check_consts(self) -> None:
        for const in self.c.consts:
            if const.name in self.out.consts or const.name in self.poisoned:
                continue  # a duplicate name: reported by check_unique_names
            v = self.eval(const.expr)
            if v is None or v.value < 0:
                if v is not None:
                    self.err(
                        "CLK015", f"constant '{const.name}' is negative ({v.show()})", const.span
                    )
                self.poisoned.add(const.name)
                continue
            self.out.consts[const.name] = v

    def check_constant(self, c: ir.HostConstant) -> None:
        if c.site is None:
            self.err("CLK025", f"constant '{c.name}' has no site", c.span)
        if c.dims is not None:
            for d in c.dims:
                v = self.eval(d)
                if v is not None and v.value < 0:
                    self.err("CLK015", f"dims of constant '{c.name}' must not be negative", d.span)

    def check_fold(self, f: ir.Fold) -> None:
        if f.site is None:
            self.err("CLK025", f"fold '{f.name}' has no site", f.span)
        if f.by is None:
            self.err(
                "CLK025", f"fold '{f.name}' says nothing to fold: add `by weight_norm`", f.span
            )


def validate(
    contract: ir.Contract, params: Mapping[str, int] | None = None
) -> tuple[Checked, list[Diagnostic]]:
    """Validate `contract` with its session parameters at `params` (default: each
    parameter's reference value, compiler/params.py)."""
    v = _Validator(contract, params)
    checked = v.run()
    return checked, v.diags
