"""Lowering: validated IR + analysis -> the plain context the templates render.

All decisions (what is a carry, which classes exist, how each argument is
materialised for capture) are made here and handed to the templates as strings
and lists; templates only loop and branch. Code fragments are built from
identifiers that the grammar restricts to a safe character set and from
`repr()` of strings and integers, so a contract cannot inject code.
"""

from __future__ import annotations

from duplexcadence.dsl import ir
from duplexcadence.compiler.analysis import Analysis, CatalogClass, tensor_layout
from duplexcadence.compiler.validate import Checked
from duplexcadence.compiler.silent_loss import used_regions

RETENTION_CLASS = {"head_tail": "HeadTail", "window": "Window", "ring": "Ring"}
EFFECT = {"none": "Effect.NONE", "device_rng": "Effect.DEVICE_RNG", "host_rng": "Effect.HOST_RNG"}


def steps_code(path: ir.Path, *, include_root: bool) -> str:
    steps = [("attr", repr(path.root))] if include_root else []
    steps += [(s.kind, _value_code(s)) for s in path.steps]
    inner = ", ".join(f"({k!r}, {v})" for k, v in steps)
    return f"({inner},)" if len(steps) == 1 else f"({inner})"


def _value_code(step: ir.PathStep) -> str:
    """A step's value as a literal; an identity key's module path is a nested step tuple
    from the model's root (runtime/sites.py resolves it like any site)."""
    if isinstance(step.value, ir.Path):
        return steps_code(step.value, include_root=True)
    return repr(step.value)


def access_code(base: str, path: ir.Path) -> str:
    """`kwargs["cache"]["estimator_att_cache"]`-style access for comments and docs."""
    out = f"{base}[{path.root!r}]"
    for s in path.steps:
        out += f".{s.value}" if s.kind == "attr" else f"[{s.value!r}]"
    return out


def _arg_steps(arg: ir.Arg, position: int) -> str:
    head = ("key", arg.path.root) if arg.keyword else ("index", position)
    steps = [head] + [(s.kind, s.value) for s in arg.path.steps]
    inner = ", ".join(f"({k!r}, {v!r})" for k, v in steps)
    return f"({inner},)" if len(steps) == 1 else f"({inner})"


def _leaf_code(arg: ir.Arg, cls: CatalogClass, checked: Checked) -> str:
    t = arg.type
    config = dict(cls.config)
    if isinstance(t, ir.RegionArg):
        # a region without a clock extent is passed whole (extent None)
        extent = dict(cls.extents).get(t.region)
        if t.index is None:
            return f"RegionView({t.region!r}, {extent})"
        # `region r[i]`: one slot of the leading axis, as the call reads it
        shown = "" if extent is None else f"extent={extent}, "
        return f"RegionView({t.region!r}, {shown}index={config[t.index]!r})"
    if isinstance(t, ir.TensorArg):
        dims, strides, offset = tensor_layout(t, checked, config, dict(cls.extents))
        dtype = f"torch.{t.dtype if t.dtype != 'bool8' else 'bool'}"
        extra = ""
        if t.strides is not None:
            extra += f", stride={strides!r}"
        if t.offset is not None:
            extra += f", offset={offset!r}"
        return f"TensorSpec({dims!r}, {dtype}{extra})"
    if t.type == "none":
        return "None"
    return repr(config[arg.path.root])


def _structure(args: list[ir.Arg], cls: CatalogClass, checked: Checked) -> str:
    """Render args sharing one root as a (nested) dict literal, others as leaves."""
    groups: dict[str, list[ir.Arg]] = {}
    for a in args:
        groups.setdefault(a.path.root, []).append(a)
    parts = []
    for root, members in groups.items():
        if len(members) == 1 and not members[0].path.steps:
            parts.append((root, _leaf_code(members[0], cls, checked)))
        else:
            # `cache["a"]["x"]`: key paths nest (validation allows key steps only, no overlap)
            tree: dict = {}
            for m in members:
                node = tree
                for s in m.path.steps[:-1]:
                    node = node.setdefault(s.value, {})
                node[m.path.steps[-1].value] = _leaf_code(m, cls, checked)
            parts.append((root, _dict_code(tree)))
    return parts


def _autocast_code(state: str) -> str:
    return "Autocast(None)" if state == "off" else f"Autocast(torch.{state})"


def _dict_code(tree: dict) -> str:
    items = (f"{k!r}: {v if isinstance(v, str) else _dict_code(v)}" for k, v in tree.items())
    return "{" + ", ".join(items) + "}"


def lower_callable(k: ir.Callable, checked: Checked, analysis) -> dict:
    regions = {r.name: r for r in checked.contract.regions}
    positional = [a for a in k.args if not a.keyword]
    keyword = [a for a in k.args if a.keyword]
    classes = []
    seen: set[str] = set()
    # canonical order, so reordering independent declarations changes nothing
    ordered = sorted(analysis.classes, key=lambda c: (c.extents, sorted(c.config, key=str)))
    for cls in ordered:
        pos = _structure(positional, cls, checked)
        kw = _structure(keyword, cls, checked)
        args_code = "(" + "".join(f"{code}, " for _, code in pos) + ")"
        kwargs_code = "{" + ", ".join(f"{name!r}: {code}" for name, code in kw) + "}"
        if (args_code, kwargs_code) in seen:
            continue  # two configurations that differ only outside the signature
        seen.add((args_code, kwargs_code))
        classes.append({"label": cls.label(), "args": args_code, "kwargs": kwargs_code})
    positions = {id(a): i for i, a in enumerate(positional)}
    aliased = []
    for a in k.args:
        if isinstance(a.type, ir.RegionArg) and a.type.region in k.aliased:
            # carries adopt with retention; fixed regions keep the stock's leading part;
            # `region r[i]`: a slot is read where the caller put it (no adoption)
            how = (
                "slot"
                if a.type.index is not None
                else "carry" if regions[a.type.region].retention is not None else "prefix"
            )
            container = "kwargs" if a.keyword else "args"
            aliased.append(
                f"Aliased({a.type.region!r}, {container!r}, "
                f"{_arg_steps(a, positions.get(id(a), 0))}, {how!r}),"
                f"  # {access_code(container, a.path)}"
            )
    # `layout free` tensors: made contiguous before the engine keys the call
    layout_free = [
        f"({('kwargs' if a.keyword else 'args')!r}, {_arg_steps(a, positions.get(id(a), 0))}),"
        f"  # {access_code('kwargs' if a.keyword else 'args', a.path)}"
        for a in k.args
        if isinstance(a.type, ir.TensorArg) and a.type.layout == "free"
    ]
    return {
        "name": k.name,
        "layout_free": layout_free,
        "site": steps_code(k.site, include_root=True),
        "site_shown": k.site.dotted(),
        "per": k.per,
        "replay": analysis.in_scope,
        "reason": analysis.scope_reason,
        "width": analysis.width,
        "bound": analysis.bound,
        "effect": EFFECT[k.effects],
        # the autocast states each class is captured under (runtime/ambient.py)
        "ambient": [_autocast_code(v) for a in k.ambient for v in a.values],
        "aliased": aliased,
        # write-through regions with a site: pointer-checked on every call
        "writes": [w for w in k.writes if regions[w].site is not None],
        # stock code rebinds these attributes every call: copy the new value in, put
        # the pinned tensor back (inside a capture, the copy is part of the graph)
        "pins": [w for w in k.writes if regions[w].address == "pinned"],
        "counters": [
            f"Counter({steps_code(n.site, include_root=True)}, advances={n.advances}, "
            f"start={n.start}),  # {n.site.dotted()}"
            for n in k.counters
        ],
        "retains": [
            f"Retains({r.region!r}, "
            f"{steps_code(ir.Path(root='_', steps=r.source.steps), include_root=False)}),"
            f"  # {r.source.dotted()}"
            for r in k.retains
        ],
        "classes": classes,
        "note": k.note,
    }


def region_installs(c: ir.Contract) -> dict[str, str]:
    """How bind() provides each region (runtime/declared.py): carry | allocate | stock
    | pinned | declared. A region with no site that no callable reads or writes
    documents the stock state (e.g. a vendor ring that already is demand-sized):
    bind() allocates nothing for it."""
    used = used_regions(c)
    out = {}
    for r in c.regions:
        if r.name not in used:
            out[r.name] = "declared"
        elif r.retention is not None:
            out[r.name] = "carry"
        elif r.address == "pinned":
            out[r.name] = "pinned"
        elif r.allocate == "stock":
            out[r.name] = "stock"
        else:
            out[r.name] = "allocate"
    return out


def _terms_code(terms) -> str:
    inner = ", ".join(f"({p!r}, {c!r})" for p, c in terms)
    return f"({inner},)" if len(terms) == 1 else f"({inner})"


def _param_context(params) -> list[dict]:
    """The session parameters' domains, as generated code declares them."""
    if params is None:
        return []
    return [
        {
            "name": p.name,
            "lo": p.lo,
            "hi": p.hi,
            "default": params.reference[p.name],
            "capture": repr(tuple(p.capture)),
            "hold": p.hold,
            "unit": p.unit,
        }
        for p in sorted(params.params, key=lambda p: p.name)
    ]


def lower(
    checked: Checked,
    analysis: Analysis,
    *,
    param_analysis=None,
    compiler_version: str,
    source_name: str,
    source_sha256: str,
) -> dict:
    c = checked.contract
    by_name = {r.name: r for r in analysis.regions}
    installs = region_installs(c)
    regions = []
    for r in sorted(c.regions, key=lambda r: r.name):
        a = by_name[r.name]
        numbers = checked.regions[r.name]
        retention = None
        if numbers.retention is not None:
            kind, params = numbers.retention
            if kind == "head_tail":
                retention = f"HeadTail(head={params[0]}, tail={params[1]})"
            elif kind == "window":
                retention = f"Window(width={params[0]})"
            else:
                retention = f"Ring(capacity={params[0]})"
        install = installs[r.name]
        # session parameters: allocated at the domain's largest shape, attended extents
        # and retention sizes shifted per value (compiler/params.py)
        pa = param_analysis
        shape = pa.shapes[r.name] if pa is not None else a.shape
        demand = pa.bytes_allocated[r.name] if pa is not None else a.demand_bytes
        shift = pa.extent_shift.get(r.name) if pa is not None else None
        rshift = pa.retention_shift.get(r.name) if pa is not None else None
        regions.append(
            {
                "install": install,
                "name": r.name,
                "dtype": "bool" if r.dtype == "bool8" else r.dtype,
                "shape": repr(shape),
                "shift": _terms_code(shift) if shift else None,
                "retention_shift": (
                    "(" + "".join(f"{_terms_code(t)}, " for t in rshift) + ")" if rshift else None
                ),
                "axis": repr(a.axis),
                "lifetime": r.lifetime,
                "mutability": r.mutability,
                "retention": retention,
                "site": steps_code(r.site, include_root=True) if r.site else None,
                "site_shown": r.site.dotted() if r.site else None,
                "demand_mib": f"{demand / 2**20:.2f}",
                "stock_mib": f"{a.stock_bytes / 2**20:.2f}" if a.stock_bytes else None,
                "rho": a.rho,
                "attended": list(a.attended),
                "address": r.address,
                "allocated": install != "declared",
                "adopt_stock": r.allocate == "stock" or r.address == "pinned",
                "initial": r.initial,
                "note": r.note,
            }
        )
    callables = [
        lower_callable(k, checked, ka)
        for k, ka in sorted(zip(c.callables, analysis.callables), key=lambda p: p[0].name)
    ]
    constants = [
        {
            "name": h.name,
            "site": steps_code(h.site, include_root=True) if h.site else None,
            "site_shown": h.site.dotted() if h.site else None,
            "install": h.install,
            "note": h.note,
        }
        for h in sorted(c.constants, key=lambda h: h.name)
    ]
    determinism = [
        {"setting": d.setting, "value": repr(d.value)}
        for d in sorted(c.determinism, key=lambda d: d.setting)
    ]
    return {
        "imports": _imports(regions, callables, constants, bool(param_analysis)),
        "params": _param_context(param_analysis),
        "compiler_version": compiler_version,
        "contract": c.name,
        "target": c.target,
        "source_name": source_name,
        "source_sha256": source_sha256,
        "determinism": determinism,
        "regions": regions,
        "callables": callables,
        "constants": constants,
    }


def _imports(
    regions: list[dict], callables: list[dict], constants: list[dict], params: bool = False
) -> list[str]:
    """The runtime names contract.py uses, and no other (generated code imports only
    what it uses)."""
    used = {"CallableDecl", "ContractDecl", "Effect", "RegionDecl", "RegionSpec"}
    text = " ".join(r["retention"] or "" for r in regions)
    used |= {n for n in ("HeadTail", "Window", "Ring") if n + "(" in text}
    if constants:
        used.add("ConstantDecl")
    if params:
        used.add("ParamDecl")
    for k in callables:
        if k["replay"] and k["classes"]:
            used.add("CaptureClass")
        code = " ".join(f"{c['args']} {c['kwargs']}" for c in k["classes"])
        used |= {n for n in ("TensorSpec", "RegionView") if n + "(" in code}
        if k["ambient"]:
            used.add("Autocast")
        if k["aliased"]:
            used.add("Aliased")
        if k["retains"]:
            used.add("Retains")
        if k["counters"]:
            used.add("Counter")
    return sorted(used)
