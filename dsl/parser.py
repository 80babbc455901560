"""Parse `.clock` text into the contract IR, reporting syntax errors as diagnostics.

One cached LALR parser (positions propagated) and a transformer that builds IR
nodes directly, each carrying its span. Syntax errors and the input limits, checked
on the parse tree before anything recurses over it, are diagnostics made by
`syntax_errors.py`. (The file size is bounded by whoever reads the file:
`compiler/driver.py`.)
"""

from __future__ import annotations

import functools
from importlib import resources

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedInput

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, Span, error
from duplexcadence.dsl.recovery import parse_recovering
from duplexcadence.dsl.syntax_errors import input_limits, meta_span, syntax_diagnostic, token_span


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = resources.files("duplexcadence.dsl").joinpath("clock.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


class _Prop:
    """A block property before it is folded into its owner node."""

    def __init__(self, key: str, value, span: Span):
        self.key, self.value, self.span = key, value, span


@v_args(meta=True)
class _ToIR(Transformer):
    def __init__(self):
        super().__init__()
        self.diagnostics: list[Diagnostic] = []

    # ---- literals and expressions
    def int_lit(self, meta, c):
        return int(c[0])

    def true_lit(self, meta, c):
        return True

    def false_lit(self, meta, c):
        return False

    def string_lit(self, meta, c):
        return c[0][1:-1]

    def quantity(self, meta, c):
        value, unit = c
        return ir.Quantity(value=int(value), unit=str(unit) if unit else None, span=meta_span(meta))

    def name_ref(self, meta, c):
        return ir.NameRef(name=str(c[0]), span=meta_span(meta))

    def add(self, meta, c):
        return ir.BinOp(op="+", left=c[0], right=c[1], span=meta_span(meta))

    def sub(self, meta, c):
        return ir.BinOp(op="-", left=c[0], right=c[1], span=meta_span(meta))

    def mul(self, meta, c):
        return ir.BinOp(op="*", left=c[0], right=c[1], span=meta_span(meta))

    def max_of(self, meta, c):
        return ir.MaxOf(items=tuple(c), span=meta_span(meta))

    def extent_of(self, meta, c):
        return ir.ExtentOf(region=str(c[0]), span=meta_span(meta))

    def dim_list(self, meta, c):
        return tuple(x for x in c if x is not None)

    # ---- paths
    def attr_step(self, meta, c):
        return ir.PathStep(kind="attr", value=str(c[0]), span=meta_span(meta))

    def key_step(self, meta, c):
        return ir.PathStep(kind="key", value=str(c[0])[1:-1], span=meta_span(meta))

    def index_step(self, meta, c):
        return ir.PathStep(kind="index", value=int(c[0]), span=meta_span(meta))

    def identity_step(self, meta, c):
        return ir.PathStep(kind="identity", value=c[0], span=meta_span(meta))

    def path(self, meta, c):
        return ir.Path(root=str(c[0]), steps=tuple(c[1:]), span=meta_span(meta))

    def dotted(self, meta, c):
        return ".".join(str(x) for x in c)

    def name_list(self, meta, c):
        return tuple((str(x), token_span(x)) for x in c)

    # ---- top-level items (returned as tagged tuples, folded in `start`)
    def contract_decl(self, meta, c):
        return ("contract", str(c[0]), meta_span(meta))

    def target_decl(self, meta, c):
        return ("target", str(c[0])[1:-1], meta_span(meta))

    def budget_decl(self, meta, c):
        return ("budget", int(c[0]), meta_span(meta))

    def determinism_decl(self, meta, c):
        return ("determinism", ir.Determinism(setting=c[0], value=c[1], span=meta_span(meta)))

    def rate_clock(self, meta, c):
        name, rate, parent = c
        node = ir.Clock(
            name=str(name), kind="rate", rate=int(rate), parent=str(parent), span=token_span(name)
        )
        return ("clock", node)

    def stepped_clock(self, meta, c):
        name, lo, hi, parent = c
        node = ir.Clock(
            name=str(name),
            kind="stepped",
            steps=(int(lo), int(hi)),
            parent=str(parent),
            span=token_span(name),
        )
        return ("clock", node)

    def listed_clock(self, meta, c):
        name, *amounts, parent = c
        listed = tuple(int(x) for x in amounts)
        node = ir.Clock(
            name=str(name),
            kind="stepped",
            steps=(min(listed), max(listed)),
            listed=listed,
            parent=str(parent),
            span=token_span(name),
        )
        return ("clock", node)

    def product_clock(self, meta, c):
        node = ir.Clock(
            name=str(c[0]),
            kind="product",
            factors=tuple(str(x) for x in c[1:]),
            span=token_span(c[0]),
        )
        return ("clock", node)

    def const_decl(self, meta, c):
        return ("const", ir.Const(name=str(c[0]), expr=c[1], span=token_span(c[0])))

    def param_default(self, meta, c):
        return int(c[0])

    def param_capture(self, meta, c):
        return tuple(int(x) for x in c)

    def param_hold(self, meta, c):
        return int(c[0])

    def param_decl(self, meta, c):
        name, lo, hi, unit, default, capture, hold = c
        node = ir.Param(
            name=str(name),
            lo=int(lo),
            hi=int(hi),
            unit=str(unit) if unit is not None else None,
            default=default,
            capture=capture or (),
            hold=hold,
            span=token_span(name),
        )
        return ("param", node)

    # ---- block properties
    def _prop(key):
        def handler(self, meta, c):
            value = c[0] if len(c) == 1 else tuple(c)
            if isinstance(value, Token):
                value = str(value)
            return _Prop(key, value, meta_span(meta))

        return handler

    prop_dtype = _prop("dtype")
    prop_dims = _prop("dims")
    prop_clock = _prop("clock")
    prop_lifetime = _prop("lifetime")
    prop_mutability = _prop("mutability")
    prop_retention = _prop("retention")
    prop_envelope = _prop("envelope")
    prop_speculative = _prop("speculative")
    prop_stock = _prop("stock")
    prop_address = _prop("address")
    prop_allocate = _prop("allocate")
    prop_site = _prop("site")
    prop_initial = _prop("initial")
    prop_per = _prop("per")
    prop_effects = _prop("effects")
    prop_mode = _prop("mode")
    prop_install = _prop("install")
    prop_by = _prop("by")
    prop_publish = _prop("publish")

    def prop_slot(self, meta, c):
        return _Prop("slot", int(c[0]), meta_span(meta))

    def batch_axis(self, meta, c):
        return int(c[0])

    def row_op(self, meta, c):
        # `aten.mm.default in gating by 8`: the scope is part of the row's name (runtime
        # PerRow reads "op in scope"), the block its own number
        op, scope, block = c
        name = str(op) if scope is None else f"{op} in {scope}"
        return name, 1 if block is None else int(block), token_span(op)

    def batch_rows(self, meta, c):
        return tuple(c)

    def prop_batch(self, meta, c):
        # INT tokens, then the optional axis (an int or None) and rows (a tuple or None)
        *widths, axis, rows = c
        blocks = tuple(n for _, n, _ in rows or ())
        node = ir.Batch(
            widths=tuple(int(w) for w in widths),
            axis=0 if axis is None else axis,
            rows=tuple(op for op, _, _ in rows or ()),
            # every op one session at a time is the default: no blocks recorded
            blocks=blocks if any(n != 1 for n in blocks) else (),
            row_spans=tuple(span for _, _, span in rows or ()),
            span=meta_span(meta),
        )
        return _Prop("batch", node, meta_span(meta))

    def prop_note(self, meta, c):
        return _Prop("note", str(c[0])[1:-1], meta_span(meta))

    def until(self, meta, c):
        return ("until", c[0])

    def flush(self, meta, c):
        return ("flush", tuple(c))

    def prop_attended(self, meta, c):
        start, stride, until, flush = c
        node = ir.Attended(
            start=start,
            stride=stride,
            until=until[1] if until else None,
            flush=flush[1] if flush else (),
            span=meta_span(meta),
        )
        return _Prop("attended", node, meta_span(meta))

    def ring(self, meta, c):
        return ir.Retention(kind="ring", params=(c[0],), span=meta_span(meta))

    def window(self, meta, c):
        return ir.Retention(kind="window", params=(c[0],), span=meta_span(meta))

    def head_tail(self, meta, c):
        return ir.Retention(kind="head_tail", params=(c[0], c[1]), span=meta_span(meta))

    def region_arg(self, meta, c):
        name, index = c
        return ir.RegionArg(
            region=str(name), index=str(index) if index is not None else None, span=meta_span(meta)
        )

    def strides(self, meta, c):
        return c[0]

    def offset(self, meta, c):
        return c[0]

    def tensor_arg(self, meta, c):
        return ir.TensorArg(
            dtype=str(c[0]), dims=c[1], strides=c[2], offset=c[3], span=meta_span(meta)
        )

    def free_tensor_arg(self, meta, c):
        return ir.TensorArg(dtype=str(c[0]), dims=c[1], layout="free", span=meta_span(meta))

    def object_arg(self, meta, c):
        return ir.ObjectArg(site=c[0], span=meta_span(meta))

    def scalar_arg(self, meta, c):
        return ir.ScalarArg(type=str(c[0]), span=meta_span(meta))

    def prop_arg(self, meta, c):
        return _Prop(
            "args",
            ir.Arg(path=c[0], keyword=False, type=c[1], span=meta_span(meta)),
            meta_span(meta),
        )

    def prop_kwarg(self, meta, c):
        return _Prop(
            "args",
            ir.Arg(path=c[0], keyword=True, type=c[1], span=meta_span(meta)),
            meta_span(meta),
        )

    def prop_aliased(self, meta, c):
        return _Prop("aliased", c[0], meta_span(meta))

    def prop_writes(self, meta, c):
        return _Prop("writes", c[0], meta_span(meta))

    def prop_retains(self, meta, c):
        node = ir.Retains(region=str(c[0]), source=c[1], span=meta_span(meta))
        return _Prop("retains", node, meta_span(meta))

    def prop_counter(self, meta, c):
        flags = dict(c[3:])  # counter_flag*: ("staged", True), ("tracks", name)
        node = ir.HostCounter(
            site=c[0],
            advances=c[1],
            start=int(c[2]),
            staged=flags.get("staged", False),
            tracks=flags.get("tracks"),
            span=meta_span(meta),
        )
        return _Prop("counters", node, meta_span(meta))

    def prop_guard(self, meta, c):
        node = ir.HostGuard(site=c[0], op=str(c[1]), value=c[2], span=meta_span(meta))
        return _Prop("guards", node, meta_span(meta))

    def prop_commits(self, meta, c):
        node = ir.Commit(region=str(c[0]), amount=c[1], span=meta_span(meta))
        return _Prop("commits", node, meta_span(meta))

    def prop_control(self, meta, c):
        node = ir.Control(
            name=str(c[0]),
            dtype=str(c[1]),
            low=int(c[2]),
            high=int(c[3]),
            source=c[4],
            span=meta_span(meta),
        )
        return _Prop("controls", node, meta_span(meta))

    def counter_staged(self, meta, c):
        return ("staged", True)

    def counter_tracks(self, meta, c):
        return ("tracks", str(c[0]))

    def ambient_value(self, meta, c):
        return str(c[0]) if c else "off"

    def ambient_values(self, meta, c):
        return tuple(c)

    def prop_ambient(self, meta, c):
        node = ir.Ambient(axis=str(c[0]), values=c[1], span=meta_span(meta))
        return _Prop("ambient", node, meta_span(meta))

    def config_vars(self, meta, c):
        return tuple(str(x) for x in c)

    def config_value(self, meta, c):
        return tuple(c)

    def config_values(self, meta, c):
        return tuple(c)

    def prop_config(self, meta, c):
        names, values = c
        return _Prop(
            "configs", ir.Config(names=names, values=values, span=meta_span(meta)), meta_span(meta)
        )

    def condition(self, meta, c):
        return ir.Condition(left=c[0], op=str(c[1]), right=c[2], span=meta_span(meta))

    def prop_admit(self, meta, c):
        return _Prop("admit", tuple(c), meta_span(meta))

    # ---- blocks
    _REPEATED = {
        "args",
        "retains",
        "configs",
        "counters",
        "guards",
        "commits",
        "controls",
        "ambient",
    }
    _LISTS = {"aliased", "writes"}

    def _fold(self, kind: str, name_tok: Token, props: list[_Prop]) -> dict:
        fields: dict = {"name": str(name_tok), "span": token_span(name_tok)}
        spans: dict[str, Span] = {}
        for p in props:
            if p.key in self._REPEATED:
                fields.setdefault(p.key, [])
                fields[p.key].append(p.value)
            elif p.key in self._LISTS:
                fields.setdefault(p.key, [])
                for item, item_span in p.value:
                    fields[p.key].append(item)
                    spans[f"{p.key}:{item}"] = item_span
            elif p.key in fields:
                self.diagnostics.append(
                    error("CLK026", f"{kind} {name_tok} declares '{p.key}' twice", p.span)
                )
                continue
            else:
                fields[p.key] = p.value
            spans.setdefault(p.key, p.span)
        for key in list(fields):
            if isinstance(fields[key], list):
                fields[key] = tuple(fields[key])
        if kind == "callable" and "admit" in fields:
            fields["admit"] = tuple(fields["admit"])
        fields["prop_spans"] = spans
        return fields

    def region_decl(self, meta, c):
        return ("region", ir.Region(**self._fold("region", c[0], c[1:])))

    def callable_decl(self, meta, c):
        return ("callable", ir.Callable(**self._fold("callable", c[0], c[1:])))

    def constant_decl(self, meta, c):
        return ("constant", ir.HostConstant(**self._fold("constant", c[0], c[1:])))

    def fold_decl(self, meta, c):
        return ("fold", ir.Fold(**self._fold("fold", c[0], c[1:])))

    def channel_decl(self, meta, c):
        return ("channel", ir.Channel(**self._fold("channel", c[0], c[1:])))

    def start(self, meta, items):
        return items


def _fold_contract(items: list, diagnostics: list[Diagnostic]) -> ir.Contract | None:
    fields: dict = {
        "determinism": [],
        "clocks": [],
        "consts": [],
        "params": [],
        "regions": [],
        "callables": [],
        "constants": [],
        "folds": [],
        "channels": [],
    }
    plural = {
        "determinism": "determinism",
        "clock": "clocks",
        "const": "consts",
        "param": "params",
        "region": "regions",
        "callable": "callables",
        "constant": "constants",
        "fold": "folds",
        "channel": "channels",
    }
    for item in items:
        tag = item[0]
        if tag in ("contract", "target", "budget"):
            key = {"contract": "name", "target": "target", "budget": "budget"}[tag]
            if key in fields:
                diagnostics.append(error("CLK026", f"'{tag}' is declared twice", item[2]))
                continue
            fields[key] = item[1]
            if tag == "contract":
                fields["span"] = item[2]
        else:
            fields[plural[tag]].append(item[1])
    if "name" not in fields:
        diagnostics.append(
            error("CLK004", "the contract has no `contract NAME` header", Span(1, 1))
        )
        return None
    for key in plural.values():
        fields[key] = tuple(fields[key])
    return ir.Contract(**fields)


def parse(text: str) -> tuple[ir.Contract | None, list[Diagnostic]]:
    """Parse contract text. Returns (IR or None, diagnostics)."""
    diagnostics: list[Diagnostic] = []

    # every syntax error, each statement resynchronised at the next (recovery.py); then
    # nothing is validated, since a skipped statement would only cause follow-on errors
    tree, syntax = parse_recovering(text, _parser(), lambda e: syntax_diagnostic(e, _parser()))
    if syntax:
        return None, syntax
    limits = input_limits(tree)
    if limits:  # nothing downstream may see an input beyond the limits
        return None, limits
    transformer = _ToIR()
    items = transformer.transform(tree)
    diagnostics.extend(transformer.diagnostics)
    contract = _fold_contract(items, diagnostics)
    return contract, diagnostics
