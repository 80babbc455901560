"""Lowering: validated IR + analysis -> the typed context the templates render.

All decisions (what is a carry, which classes exist, which leaves of a catalog are
shared by every class, how each argument is materialised for capture) are made here
and handed to the templates as frozen dataclasses of plain values; templates only
loop, branch and render values with their macros. No code is built here: names and
paths reach the templates as strings and integers, which the templates print with
`repr()`, and the grammar restricts identifiers and strings to a safe character set,
so a contract cannot inject code.
"""

from __future__ import annotations

from duplexcadence.dsl import ir
from duplexcadence.compiler.analysis import Analysis, CatalogClass, tensor_layout
from duplexcadence.compiler.counter_advance import Amounts
from duplexcadence.compiler.lowered import (
    Aliased,
    Batch,
    Catalog,
    CatalogRow,
    Constant,
    Control,
    Counter,
    DictNode,
    FieldValue,
    Channel,
    Fold,
    Guard,
    Leaf,
    LoweredCallable,
    LoweredContract,
    Node,
    OneOfLeaf,
    Param,
    RegionLeaf,
    RegionRow,
    Retains,
    Retention,
    StateObject,
    TensorLeaf,
    Tracks,
    ValueLeaf,
)
from duplexcadence.compiler.validate import Checked
from duplexcadence.compiler.silent_loss import used_regions

RETENTION = {
    "head_tail": ("HeadTail", ("head", "tail")),
    "window": ("Window", ("width",)),
    "ring": ("Ring", ("capacity",)),
}
EFFECT = {"none": "NONE", "device_rng": "DEVICE_RNG", "host_rng": "HOST_RNG"}


# ---------------------------------------------------------------- catalogs
def _leaf(arg: ir.Arg, cls: CatalogClass, checked: Checked) -> Leaf:
    t = arg.type
    config = dict(cls.config)
    if isinstance(t, ir.RegionArg):
        extent = dict(cls.extents).get(t.region)
        index = None if t.index is None else config[t.index]
        return RegionLeaf(t.region, extent, index)
    if isinstance(t, ir.TensorArg):
        # dims may name `extent(R)` of a region argument: evaluated at this class's extents
        dims, strides, offset = tensor_layout(t, checked, config, dict(cls.extents))
        return TensorLeaf(
            dims,
            "bool" if t.dtype == "bool8" else t.dtype,
            strides,
            None if t.offset is None else offset,
        )
    return ValueLeaf("None" if t.type == "none" else repr(config[arg.path.root]))


def _class_tree(args: list[ir.Arg], cls: CatalogClass, checked: Checked) -> dict:
    """{root: (path, leaf) | nested dict}: args sharing one root nest by their key steps
    (validation allows key steps only, no overlap)."""
    tree: dict = {}
    for a in args:
        if not a.path.steps:
            tree[a.path.root] = (a.path.dotted(), _leaf(a, cls, checked))
            continue
        node = tree.setdefault(a.path.root, {})
        for s in a.path.steps[:-1]:
            node = node.setdefault(s.value, {})
        node[a.path.steps[-1].value] = (a.path.dotted(), _leaf(a, cls, checked))
    return tree


def _flatten(tree: dict) -> list[tuple[str, Leaf]]:
    """(path, leaf) in the order the runtime meets them (runtime/engine/classes.py)."""
    out = []
    for v in tree.values():
        out += _flatten(v) if isinstance(v, dict) else [v]
    return out


def _typed(tree: dict, leaf_at) -> tuple[tuple[str, Node], ...]:
    """`tree` with each (path, leaf) replaced by `leaf_at(position)`, in flatten order."""
    items = []
    for k, v in tree.items():
        node = DictNode(_typed(v, leaf_at)) if isinstance(v, dict) else leaf_at()
        items.append((k, node))
    return tuple(items)


def lower_catalog(k: ir.Callable, classes: tuple[CatalogClass, ...], checked: Checked) -> Catalog:
    """Factor the leaves every class shares out of the catalog: one row per class."""
    positional = [a for a in k.args if not a.keyword]
    keyword = [a for a in k.args if a.keyword]
    trees, leaves, names = [], [], []
    # canonical order, so reordering independent declarations changes nothing
    for cls in sorted(classes, key=lambda c: (c.extents, sorted(c.config, key=str))):
        tree = (_class_tree(positional, cls, checked), _class_tree(keyword, cls, checked))
        flat = _flatten(tree[0]) + _flatten(tree[1])
        if tuple(flat) in leaves:
            continue  # two configurations that differ only outside the signature
        trees.append(tree)
        leaves.append(tuple(flat))
        names.append(cls.label())
    columns = list(zip(*leaves)) if leaves else []
    choices = [tuple(dict.fromkeys(leaf for _, leaf in column)) for column in columns]
    varying = [i for i, c in enumerate(choices) if len(c) > 1]
    picks = {i: tuple(choices[i].index(leaf) for _, leaf in columns[i]) for i in varying}
    # a varying leaf that picks what an earlier one picks in every class is tied to it
    first_with: dict[tuple, int] = {}
    tied = {}
    for ordinal, i in enumerate(varying):
        j = first_with.setdefault(picks[i], ordinal)
        if j != ordinal:
            tied[i] = j
    own = [i for i in varying if i not in tied]
    position = iter(range(len(columns)))

    def leaf_at() -> Node:
        i = next(position)
        if i not in varying:
            return choices[i][0]
        return OneOfLeaf(choices[i], pick_as=tied.get(i), views=_views(choices[i]))

    args = tuple(node for _, node in _typed(trees[0][0], leaf_at)) if trees else ()
    kwargs = _typed(trees[0][1], leaf_at) if trees else ()
    rows = tuple(CatalogRow(name, tuple(picks[i][r] for i in own)) for r, name in enumerate(names))
    return Catalog(args, kwargs, tuple(columns[i][0][0] for i in own), rows)


def extent_runs(extents: list[int]) -> tuple:
    """Extents as runs: each arithmetic run of three or more as (start, stop, step) of a
    range, the others as themselves (0, 2, ..., 248, 249 -> ((0, 250, 2), 249))."""
    runs: list = []
    i = 0
    while i < len(extents):
        j = i + 1
        step = extents[j] - extents[i] if j < len(extents) else 0
        while step > 0 and j < len(extents) and extents[j] - extents[j - 1] == step:
            j += 1
        if j - i >= 3:
            runs.append((extents[i], extents[j - 1] + step, step))
            i = j
        else:
            runs.append(extents[i])
            i += 1
    return tuple(runs)


def _views(choices: tuple) -> tuple[str, tuple] | None:
    """``(region, runs)`` when every choice views one region at an extent (module
    ``lowered.OneOfLeaf``); arithmetic runs of three or more extents become ranges."""
    if not all(isinstance(c, RegionLeaf) and c.index is None for c in choices):
        return None
    region = {c.region for c in choices}
    extents = [c.extent for c in choices]
    if len(region) != 1 or None in extents:
        return None
    return region.pop(), extent_runs(extents)


# ---------------------------------------------------------------- callables
def _after_root(path: ir.Path) -> str:
    """The dotted spelling of a path's steps after its root: `["k"][1]`, `.x`."""
    return path.dotted()[len(path.root) :]


def _arg_at(a: ir.Arg, positional: list[ir.Arg]) -> tuple[str, str]:
    """Where the call holds an argument: its container and the dotted steps from it
    (`["cache"]["k"]`, `[1]`)."""
    head = f'["{a.path.root}"]' if a.keyword else f"[{positional.index(a)}]"
    return ("kwargs" if a.keyword else "args"), head + _after_root(a.path)


def _aliased(k: ir.Callable, regions: dict[str, ir.Region]) -> tuple[Aliased, ...]:
    positional = [a for a in k.args if not a.keyword]
    out = []
    for a in k.args:
        if not (isinstance(a.type, ir.RegionArg) and a.type.region in k.aliased):
            continue
        # carries adopt with retention; fixed regions keep the stock's leading part;
        # `region r[i]`: a slot is read where the caller put it (no adoption)
        if a.type.index is not None:
            how = "slot"
        else:
            how = "carry" if regions[a.type.region].retention is not None else "prefix"
        out.append(Aliased(a.type.region, *_arg_at(a, positional), how))
    return tuple(out)


def _layout_free(k: ir.Callable) -> tuple[tuple[str, str], ...]:
    """`layout free` tensors: made contiguous before the engine keys the call."""
    positional = [a for a in k.args if not a.keyword]
    return tuple(
        _arg_at(a, positional)
        for a in k.args
        if isinstance(a.type, ir.TensorArg) and a.type.layout == "free"
    )


def _counter(n: ir.HostCounter, got: Amounts, checked: Checked) -> Counter:
    tracks = None
    if n.tracks is not None:
        r = checked.regions[n.tracks]
        tracks = Tracks(n.tracks, r.start, r.stride, r.bound)
    # ``got``: validation's amounts (callable_rules.py), one or one per config value
    return Counter(n.site.dotted(), got.constant, n.start, n.staged, tracks, got.by, got.per_value)


def _objects(k: ir.Callable, regions: dict[str, ir.Region]) -> tuple[StateObject, ...]:
    """Each object argument: where the call holds it, and where in it each member is."""
    return tuple(
        StateObject(
            f'["{o.arg.root}"]',
            o.site.dotted(),
            tuple(
                (m, regions[m].site.dotted()[len(o.site.dotted()) :].removeprefix("."))  # type: ignore[union-attr]
                for m in o.members
            ),
        )
        for o in k.objects
    )


def lower_callable(k: ir.Callable, checked: Checked, analysis) -> LoweredCallable:
    regions = {r.name: r for r in checked.contract.regions}
    return LoweredCallable(
        name=k.name,
        site=k.site.dotted(),
        per=k.per,
        replay=analysis.in_scope,
        reason=analysis.scope_reason,
        width=analysis.width,
        bound=analysis.bound,
        effect=EFFECT[k.effects],
        # the autocast states each class is captured under (runtime/engine/ambient.py)
        ambient=tuple(None if v == "off" else v for a in k.ambient for v in a.values),
        aliased=_aliased(k, regions),
        layout_free=_layout_free(k),
        retains=tuple(
            Retains(r.region, _after_root(r.source).removeprefix(".")) for r in k.retains
        ),
        # (the pinned ones among them the runtime derives: declared.ContractDecl)
        writes=tuple(w for w in k.writes if regions[w].site is not None),
        counters=tuple(
            _counter(n, checked.counter_amounts[(k.name, i)], checked)
            for i, n in enumerate(k.counters)
        ),
        guards=tuple(Guard(g.site.dotted(), g.value) for g in k.guards),
        objects=_objects(k, regions),
        controls=tuple(
            Control(c.name, c.dtype, c.low, c.high, _after_root(c.source).removeprefix("."))
            for c in k.controls
        ),
        catalog=lower_catalog(k, analysis.classes, checked) if analysis.in_scope else None,
        batch=(
            Batch(
                analysis.batch_widths,
                analysis.batch_axis,
                analysis.batch_rows,
                analysis.batch_blocks,
            )
            if analysis.batch_widths
            else None
        ),
    )


# ---------------------------------------------------------------- regions
def region_installs(c: ir.Contract) -> dict[str, str]:
    """How bind() provides each region (runtime/serving/declared.py): carry | allocate | stock
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


def _region_fields(r: ir.Region, a, numbers, install: str, pa) -> dict[str, FieldValue]:
    """RegionTable's fields of one region (runtime/serving/declared.py); None is left out.
    With session parameters (compiler/params.py) `shape` is the domain's largest shape
    (the envelope) and `shape_shift` its per-dim terms: the runtime allocates a value's
    shape from them; attended extents and retention sizes shift per value too."""
    retention = None
    if numbers.retention is not None:
        kind, params = numbers.retention
        name, keys = RETENTION[kind]
        retention = Retention(name, tuple(zip(keys, params)))
    values = {
        "dtype": "bool" if r.dtype == "bool8" else r.dtype,
        "shape": tuple(pa.shapes[r.name] if pa is not None else a.shape),
        "axis": a.axis,
        "lifetime": r.lifetime,
        "mutability": r.mutability,
        "install": install,
        "retention": retention,
        "site": r.site.dotted() if r.site else None,
        "initial": r.initial,
        "slot": r.slot,  # lockstep: the axis sessions stack on (RegionDecl.at_width)
        # (param, coeff) terms; the retention's one term tuple per field, in declared order
        "shift": (pa.extent_shift.get(r.name) or None) if pa is not None else None,
        "retention_shift": (pa.retention_shift.get(r.name) or None) if pa is not None else None,
        # one term tuple per dim of `shape` (empty where the dim is fixed)
        "shape_shift": (pa.shape_shift.get(r.name) or None) if pa is not None else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def lower_regions(
    checked: Checked, analysis: Analysis, pa=None
) -> tuple[tuple, tuple[RegionRow, ...]]:
    """The fields every region shares (with two or more regions), and one row each."""
    c = checked.contract
    by_name = {r.name: r for r in analysis.regions}
    installs = region_installs(c)
    ordered = sorted(c.regions, key=lambda r: r.name)
    own = [
        _region_fields(r, by_name[r.name], checked.regions[r.name], installs[r.name], pa)
        for r in ordered
    ]
    common = {}
    if len(own) > 1:
        common = {k: v for k, v in own[0].items() if all(o.get(k, None) == v for o in own)}
    rows = []
    for r, values in zip(ordered, own):
        a = by_name[r.name]
        demand = pa.bytes_at_bind[r.name] if pa is not None else a.demand_bytes  # a lane at bind
        rows.append(
            RegionRow(
                name=r.name,
                fields=tuple((k, v) for k, v in values.items() if k not in common),
                demand_mib=f"{demand / 2**20:.2f}",
                stock_mib=f"{a.stock_bytes / 2**20:.2f}" if a.stock_bytes else None,
                rho=a.rho,
                attended=tuple(a.attended),
                speculative=a.speculative,
            )
        )
    return tuple(common.items()), tuple(rows)


def lower_params(pa) -> tuple[Param, ...]:
    """The session parameters' domains, as generated code declares them."""
    if pa is None:
        return ()
    return tuple(
        Param(p.name, p.lo, p.hi, pa.reference[p.name], tuple(p.capture), p.hold, p.unit)
        for p in sorted(pa.params, key=lambda p: p.name)
    )


# ---------------------------------------------------------------- the contract
def lower(
    checked: Checked,
    analysis: Analysis,
    *,
    param_analysis=None,
    compiler_version: str,
    source_name: str,
    source_sha256: str,
) -> LoweredContract:
    c = checked.contract
    common, regions = lower_regions(checked, analysis, param_analysis)
    callables = tuple(
        lower_callable(k, checked, ka)
        for k, ka in sorted(zip(c.callables, analysis.callables), key=lambda p: p[0].name)
    )
    constants = tuple(
        Constant(h.name, h.install, h.site.dotted() if h.site else None)
        for h in sorted(c.constants, key=lambda h: h.name)
    )
    params = lower_params(param_analysis)
    folds = tuple(
        Fold(f.name, f.by, f.site.dotted())
        for f in sorted(c.folds, key=lambda f: f.name)
        if f.site is not None and f.by is not None  # (validation refuses the others)
    )
    channels = tuple(
        Channel(ch.name, ch.dtype, ch.capacity, ch.batch, ch.clock)
        for ch in sorted(analysis.channels, key=lambda ch: ch.name)
    )
    imports, uses_torch = _imports(common, regions, callables, constants, params, folds, channels)
    return LoweredContract(
        compiler_version=compiler_version,
        contract=c.name,
        target=c.target,
        source_name=source_name,
        source_sha256=source_sha256,
        imports=imports,
        uses_torch=uses_torch,
        determinism=tuple(
            (d.setting, d.value) for d in sorted(c.determinism, key=lambda d: d.setting)
        ),
        region_common=common,
        regions=regions,
        callables=callables,
        constants=constants,
        params=params,
        folds=folds,
        channels=channels,
        batch_widths=analysis.batch_widths,
    )


def _nodes(catalog: Catalog):
    """Every leaf node of a catalog (OneOf choices included)."""
    stack = list(catalog.args) + [n for _, n in catalog.kwargs]
    while stack:
        n = stack.pop()
        if isinstance(n, DictNode):
            stack += [v for _, v in n.items]
        elif isinstance(n, OneOfLeaf):
            yield n
            stack += [] if n.views else list(n.choices)
        else:
            yield n


def _imports(
    common, regions, callables, constants, params, folds, channels
) -> tuple[tuple[str, ...], bool]:
    """The runtime names contract.py uses, and whether it uses torch (generated code
    imports only what it uses)."""
    used = {"CallableDecl", "ContractDecl", "Effect", "RegionTable"}
    values = [v for _, v in common] + [v for r in regions for _, v in r.fields]
    used |= {v.kind for v in values if isinstance(v, Retention)}
    uses_torch = bool(regions)  # dtypes
    if constants:
        used.add("ConstantDecl")
    if params:
        used.add("ParamDecl")
    if folds:
        used.add("FoldDecl")
    if channels:
        used.add("ChannelDecl")
    if any(k.batch is not None for k in callables):
        used.add("BatchDecl")
    for k in callables:
        if k.catalog is not None:
            used.add("CatalogDecl")
            nodes = list(_nodes(k.catalog))
            views = [n for n in nodes if isinstance(n, OneOfLeaf) and n.views]
            kinds = {type(n) for n in nodes if not (isinstance(n, OneOfLeaf) and n.views)}
            used |= {name for t, name in _LEAF_IMPORTS if t in kinds}
            used |= {"RegionViews"} if views else set()
            uses_torch |= TensorLeaf in kinds
        uses_torch |= any(v is not None for v in k.ambient)
        for name, present in (
            ("Autocast", k.ambient),
            ("Aliased", k.aliased),
            ("Retains", k.retains),
            ("StateObject", k.objects),
            ("Counter", k.counters),
            ("Guard", k.guards),
            ("Control", k.controls),
            ("Tracks", [n for n in k.counters if n.tracks is not None]),
            ("Advance", [n for n in k.counters if n.by is not None]),
        ):
            if present:
                used.add(name)
    return tuple(sorted(used)), uses_torch


_LEAF_IMPORTS = ((TensorLeaf, "TensorSpec"), (RegionLeaf, "RegionView"), (OneOfLeaf, "OneOf"))
