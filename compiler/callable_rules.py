"""Validation rules of callables: configs, arguments, aliasing, writes, counters.

A mixin of the validator (`validate.py`), like `region_rules.py`. Also home of
`signature_variables`: which config variables reach a callable's signature, the
one definition the analysis uses to count distinct signatures.
"""

from __future__ import annotations

from duplexcadence.compiler.counter_advance import AdvanceError, amounts
from duplexcadence.compiler.evaluate import EvalError, Value
from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Span

# What `ambient autocast in {...}` may list (dsl/codes.py CLK071 says why float32).
AUTOCAST_STATES = ("off", "float32", "float16", "bfloat16")
# No catalog anywhere near this size can be captured; enumerating it would only
# exhaust memory (100**4 configurations is four short lines of text).
MAX_CONFIGURATIONS = 10_000


def names_in(expr: ir.Expr) -> set[str]:
    """Every name an expression refers to (iteratively: expressions are depth-bounded)."""
    found: set[str] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, ir.NameRef):
            found.add(e.name)
        elif isinstance(e, ir.BinOp):
            stack += [e.left, e.right]
        elif isinstance(e, ir.MaxOf):
            stack += list(e.items)
    return found


def signature_variables(k: ir.Callable) -> set[str]:
    """Config variables that change the call's signature: a tensor argument's dims,
    strides or offset, a scalar argument's value, or a region slot index."""
    config = {n for cfg in k.configs for n in cfg.names}
    used: set[str] = set()
    for arg in k.args:
        t = arg.type
        if isinstance(t, ir.TensorArg):
            for e in t.dims + (t.strides or ()) + ((t.offset,) if t.offset is not None else ()):
                used |= names_in(e)
        elif isinstance(t, ir.ScalarArg) and t.type != "none" and not arg.path.steps:
            used.add(arg.path.root)
        elif isinstance(t, ir.RegionArg) and t.index is not None:
            used.add(t.index)
    return used & config


class CallableRules:
    def check_callable(self, k: ir.Callable) -> None:
        spans = k.prop_spans
        regions = self.region_nodes
        if k.site is None:
            self.err("CLK025", f"callable '{k.name}' has no site", k.span)
        if k.per is not None and k.per not in self.clocks:
            self.err(
                "CLK011",
                f"callable '{k.name}' runs per unknown clock '{k.per}'",
                spans.get("per", k.span),
            )
        config_names = self._check_configs(k)
        arg_regions = self._check_args(k, regions, config_names)
        self._check_region_uses(k, regions, arg_regions)
        self._check_one_stepped_clock(k, arg_regions)
        for i, counter in enumerate(k.counters):
            self._check_counter(k, i, counter)
            if counter.tracks is not None:
                self._check_tracks(k, counter)
        for guard in k.guards:
            where = f"guard '{guard.site.dotted()}' of callable '{k.name}'"
            if guard.site.root == "result":
                self.err(
                    "CLK059",
                    f"{where} must name a model attribute or item, not the call's result",
                    guard.span,
                )
            elif guard.op != "==":
                self.err(
                    "CLK059",
                    f"{where} names the one value its graphs are for "
                    f"(`== VALUE`), not a comparison `{guard.op}`",
                    guard.span,
                )
        self._check_ambient(k)
        admit_names: set[str] = set()
        for cond in k.admit:
            for side in (cond.left, cond.right):
                self.eval(side, names={n: Value(0, None) for n in config_names})
                admit_names |= names_in(side)
        unused = config_names - signature_variables(k) - admit_names
        for cfg in k.configs:
            for n in cfg.names:
                if n in unused:
                    self.warn(
                        "CLK503",
                        f"config variable '{n}' of callable '{k.name}' reaches no argument and "
                        "no `admit`: it does not change any signature",
                        cfg.span,
                    )
        if k.effects == "host_rng" and k.mode == "replay":
            self.warn(
                "CLK502",
                f"callable '{k.name}' draws host randomness; replay rejects it at capture, "
                "so declare `mode eager`",
                spans.get("effects", k.span),
            )

    def _check_tracks(self, k: ir.Callable, counter: ir.HostCounter) -> None:
        """`tracks R`: R is a region argument of the callable with an attended extent
        (its classes are keyed by R's extent, and the extent says where the stream is)."""
        name, shown = counter.tracks, counter.site.dotted()
        numbers = self.out.regions.get(name)
        argued = any(isinstance(a.type, ir.RegionArg) and a.type.region == name for a in k.args)
        why = None
        if name not in {r.name for r in self.c.regions}:
            why = "there is no such region"
        elif not argued:
            why = f"it is no region argument of '{k.name}' (its classes are not keyed by it)"
        elif numbers is not None and not numbers.stride:
            why = "it declares no `attended from ... by ...` (no extent says where the stream is)"
        elif numbers is not None and numbers.steps is not None:
            why = "it grows by a stepped clock (a counter advancing by one amount does not)"
        if why is not None:
            self.err(
                "CLK049",
                f"counter '{shown}' of callable '{k.name}' cannot track '{name}': {why}",
                counter.span,
            )

    def _check_ambient(self, k: ir.Callable) -> None:
        axes: set[str] = set()
        for amb in k.ambient:
            if amb.axis != "autocast":
                self.err(
                    "CLK070",
                    f"unknown ambient axis '{amb.axis}' of callable '{k.name}' (known: autocast)",
                    amb.span,
                )
                continue
            if amb.axis in axes:
                self.err(
                    "CLK026", f"callable {k.name} declares 'ambient {amb.axis}' twice", amb.span
                )
            axes.add(amb.axis)
            for v in amb.values:
                if v not in AUTOCAST_STATES:
                    self.err(
                        "CLK071",
                        f"autocast state '{v}' of callable '{k.name}' is not one of "
                        f"{', '.join(AUTOCAST_STATES)}",
                        amb.span,
                    )
            if len(set(amb.values)) != len(amb.values):
                self.err(
                    "CLK071",
                    f"callable '{k.name}' lists an autocast state twice in {{{', '.join(amb.values)}}}",
                    amb.span,
                )

    def _check_args(self, k: ir.Callable, regions: dict, config_names: set[str]) -> set[str]:
        """Check each argument; returns the regions passed as arguments."""
        sample = {n: Value(0) for n in config_names}
        extent = self._argument_extent(k)
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
                # units and names here; values per configuration in the analysis
                for d in t.dims + (t.strides or ()):
                    self.eval(d, names=sample, extent=extent)
                if t.offset is not None:
                    self.eval(t.offset, names=sample, extent=extent)
                if t.strides is not None and len(t.strides) != len(t.dims):
                    self.err(
                        "CLK028",
                        f"argument '{dotted}' has {len(t.dims)} dims but {len(t.strides)} strides",
                        t.span,
                    )
            elif t.type != "none" and (arg.path.steps or arg.path.root not in config_names):
                # (`none` is always None: keyed by value, nothing to configure)
                self.err(
                    "CLK044",
                    f"scalar argument '{dotted}' of callable '{k.name}' needs "
                    f"`config {dotted} in {{...}}` to fix its values",
                    arg.span,
                )
        return arg_regions

    def _argument_extent(self, k: ir.Callable):
        """`extent(R)` in a staged argument: as long as region argument R's attended
        extent, so the argument follows R's states class by class (no config of its own).
        Only a region that is an argument of this callable and has a retention names one."""
        region_args = {a.type.region for a in k.args if isinstance(a.type, ir.RegionArg)}

        def extent(name: str, span: Span) -> Value:
            numbers = self.out.regions.get(name)
            if name in self.poisoned:
                raise EvalError(None, f"extent({name}) of a failed region", span)
            if name not in region_args or numbers is None or numbers.bound is None:
                raise EvalError(
                    "CLK011",
                    f"extent({name}) in an argument of callable '{k.name}' names no region "
                    "argument of it with a retention",
                    span,
                )
            return Value(numbers.bound, numbers.axis_clock)

        return extent

    def _check_counter(self, k: ir.Callable, i: int, counter: ir.HostCounter) -> None:
        """CLK049: a model attribute, advancing by at least 1 a call, by an amount or by
        one configuration variable the signature shows (compiler/counter_advance.py);
        the amounts of a valid one go to lowering (``Checked.counter_amounts``)."""
        where = f"counter '{counter.site.dotted()}' of callable '{k.name}'"
        if counter.site.root == "result":
            self.err(
                "CLK049", f"{where} must be a model attribute, not the call's result", counter.span
            )
            return
        try:
            got = amounts(counter, k, self.out.consts, signature_variables(k))
        except AdvanceError as e:
            self.err("CLK049", f"{where} {e}", counter.span)
            return
        except EvalError as e:
            if e.code is not None:
                self.err(e.code, e.message, e.span)
            return
        if min(got.all(), default=1) < 1:
            self.err("CLK049", f"{where} must advance by at least 1 per call", counter.span)
            return
        self.out.counter_amounts[(k.name, i)] = got

    def _check_configs(self, k: ir.Callable) -> set[str]:
        config_names: set[str] = set()
        size = 1
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
            size *= len(cfg.values)
            if size > MAX_CONFIGURATIONS:
                self.err(
                    "CLK032",
                    f"callable '{k.name}' declares more than {MAX_CONFIGURATIONS:,} "
                    "configurations (the product of its config value counts); no catalog that "
                    "size can be captured",
                    cfg.span,
                )
                break
        return config_names

    def _check_region_uses(self, k: ir.Callable, regions: dict, arg_regions: set[str]) -> None:
        spans = k.prop_spans
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
            elif ret.region in self.poisoned:
                pass  # its own error was reported
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

    def _check_one_stepped_clock(self, k: ir.Callable, arg_regions: set[str]) -> None:
        """The regions a callable reads advance together by one amount per call, so its
        joint extents are counted by rank (compiler/extents.py): a region growing by a
        stepped clock may share the callable only with regions growing by the same
        amounts (or not growing)."""
        growing = {}
        for name in sorted(arg_regions):
            n = self.out.regions.get(name)
            if n is not None and n.stride and n.bound is not None and n.start != n.bound:
                growing[name] = n.steps.shown() if n.steps else f"{n.stride} per call"
        if len(set(growing.values())) > 1 and any(self.out.regions[r].steps for r in growing):
            shown = ", ".join(f"'{r}' by {s}" for r, s in growing.items())
            self.err(
                "CLK019",
                f"callable '{k.name}' reads regions that grow by different amounts per "
                f"call ({shown}): a stepped clock's regions advance together, by one "
                "clock (declare them all `by` that clock)",
                k.span,
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
        if numbers is None or t.region in self.poisoned:
            return  # unknown or failed region: reported already
        if not numbers.dims:
            self.err(
                "CLK046",
                f"argument '{dotted}' of callable '{k.name}' indexes region '{t.region}', "
                "which has no dims: there is no leading axis to select a slot of",
                t.span,
            )
            return
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
