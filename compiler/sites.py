"""The static half of the closed site language (CLK047, CLK050, CLK051).

A site names a place in the model object's own attribute tree: attributes of
objects and modules, items of plain containers. `runtime/state/sites.py` enforces the
language on the live object at `bind()` (no functions, modules, classes or
builtins on the way); this module rejects at `clockc check` what the text alone
already shows:

  * an attribute segment that starts with `__` (dunders and name-mangled privates:
    `__globals__`, `__class__`, `__builtins__`) or names an interpreter internal
    (frames, code objects, generators, tracebacks);
  * two declarations bound at one site, or a site inside another bound site (the
    outer one holds a tensor, a callable or a counter, which bind() never
    resolves through); likewise two folds at one site or one inside another (the
    inner one would find its weights folded already);
  * argument paths other than `NAME` or `NAME["key"]...`: a capture class
    describes an argument as nested dicts of leaves, nothing else.
"""

from __future__ import annotations

from duplexcadence.dsl import ir
from duplexcadence.dsl.diagnostics import Diagnostic, error

# Attributes of interpreter objects that lead out of the model (no leading `__`).
INTERPRETER_NAMES = frozenset(
    {
        "func_globals",
        "func_code",
        "func_closure",
        "im_func",
        "im_self",
        "im_class",
        "f_back",
        "f_builtins",
        "f_code",
        "f_globals",
        "f_locals",
        "f_trace",
        "gi_code",
        "gi_frame",
        "gi_yieldfrom",
        "cr_await",
        "cr_code",
        "cr_frame",
        "cr_origin",
        "ag_await",
        "ag_code",
        "ag_frame",
        "tb_frame",
        "tb_next",
        "co_code",
        "co_consts",
        "co_names",
        "mro",
    }
)

Key = tuple[tuple[str, object], ...]


def forbidden_segment(name: str) -> bool:
    return name.startswith("__") or name in INTERPRETER_NAMES


def _attr_names(path: ir.Path, *, root_is_attr: bool) -> list[str]:
    names = [path.root] if root_is_attr else []
    for s in path.steps:
        if s.kind == "attr":
            names.append(str(s.value))
        elif s.kind == "identity":  # the module path inside `[id(...)]` is a site too
            names += _attr_names(s.value, root_is_attr=True)  # type: ignore[arg-type]
    return names


def path_key(path: ir.Path) -> Key:
    """A path as comparable steps (the root an attribute step): equal paths, equal keys;
    a prefix of a path, a prefix of its key."""
    return (("attr", path.root),) + tuple(
        (s.kind, s.value.dotted() if isinstance(s.value, ir.Path) else s.value) for s in path.steps
    )


def _bound_sites(c: ir.Contract) -> list[tuple[str, ir.Path]]:
    """(what, path) of every site bind() resolves on the model."""
    out = [(f"region '{r.name}'", r.site) for r in c.regions if r.site is not None]
    for k in c.callables:
        if k.site is not None:
            out.append((f"callable '{k.name}'", k.site))
        out += [(f"counter of callable '{k.name}'", n.site) for n in k.counters]
        out += [(f"guard of callable '{k.name}'", g.site) for g in k.guards]
    out += [
        (f"constant '{h.name}'", h.site)
        for h in c.constants
        if h.site is not None and h.install == "device_buffer"
    ]
    return out


def _fold_sites(c: ir.Contract) -> list[tuple[str, ir.Path]]:
    """(what, path) of every fold's site: modules whose weights bind() folds; they may
    hold bound sites (a fold changes weights, never an attribute a site names)."""
    return [(f"fold '{f.name}'", f.site) for f in c.folds if f.site is not None]


def _segment_problems(c: ir.Contract) -> list[Diagnostic]:
    paths: list[tuple[ir.Path, bool]] = []
    paths += [(r.site, True) for r in c.regions if r.site is not None]
    paths += [(h.site, True) for h in c.constants if h.site is not None]
    paths += [(path, True) for _, path in _fold_sites(c)]
    for k in c.callables:
        paths += [(k.site, True)] if k.site is not None else []
        paths += [(n.site, True) for n in k.counters]
        paths += [(g.site, True) for g in k.guards]
        paths += [(r.source, False) for r in k.retains]
        paths += [(a.path, True) for a in k.args]
        paths += [(o.site, True) for o in k.objects]
    found = []
    for path, root_is_attr in paths:
        bad = [n for n in _attr_names(path, root_is_attr=root_is_attr) if forbidden_segment(n)]
        if bad:
            found.append(
                error(
                    "CLK050",
                    f"'{path.dotted()}' passes through '{bad[0]}': a site may only name the "
                    "model's own attributes and items (no `__` names, no interpreter internals)",
                    path.span,
                )
            )
    return found


def _conflicts(bound: list[tuple[str, ir.Path]]) -> list[Diagnostic]:
    """Equal or nested sites among `bound`, found through dicts of sites and of their
    prefixes (paths are at most 32 steps: linear in the contract's size)."""
    sites: dict[Key, str] = {}
    prefixes: dict[Key, str] = {}  # a strict prefix of a bound site -> that site's owner
    found = []
    for what, path in bound:
        key = path_key(path)
        inside = next((key[:n] for n in range(1, len(key)) if key[:n] in sites), None)
        host = ("counter", "guard")  # host values: read by several callables, never rebound
        if key in sites and not (what.startswith(host) and sites[key].startswith(host)):
            message = f"{what} is bound at '{path.dotted()}', already the site of {sites[key]}"
        elif inside is not None:
            message = f"{what} at '{path.dotted()}' lies inside the site of {sites[inside]}"
        elif key in prefixes:
            message = f"the site of {prefixes[key]} lies inside {what} at '{path.dotted()}'"
        else:
            sites.setdefault(key, what)
            for n in range(1, len(key)):
                prefixes.setdefault(key[:n], what)
            continue
        found.append(error("CLK051", message, path.span))
    return found


def _folds_in_bound(c: ir.Contract) -> list[Diagnostic]:
    """A fold's site at or inside a bound site: bind() never resolves through what a
    bound site holds (bound sites inside a fold's module are fine)."""
    bound: dict[Key, str] = {}
    for what, path in _bound_sites(c):
        bound.setdefault(path_key(path), what)
    found = []
    for what, path in _fold_sites(c):
        key = path_key(path)
        owner = next((bound[key[:n]] for n in range(1, len(key) + 1) if key[:n] in bound), None)
        if owner is not None:
            message = f"{what} at '{path.dotted()}' lies at or inside the site of {owner}"
            found.append(error("CLK051", message, path.span))
    return found


def _argument_paths(c: ir.Contract) -> list[Diagnostic]:
    found = []
    for k in c.callables:
        leaves: dict[tuple, ir.Arg] = {}
        prefixes: dict[tuple, ir.Arg] = {}
        for arg in k.args:
            if any(s.kind != "key" for s in arg.path.steps):
                found.append(
                    error(
                        "CLK047",
                        f"argument '{arg.path.dotted()}' of callable '{k.name}': an argument "
                        'path is NAME or NAME["key"]..., the nested dicts a capture class '
                        "can describe",
                        arg.path.span,
                    )
                )
                continue
            key = ((arg.keyword, arg.path.root),) + tuple(s.value for s in arg.path.steps)
            other = next((leaves[key[:n]] for n in range(1, len(key)) if key[:n] in leaves), None)
            other = other or prefixes.get(key)
            if other is not None:
                found.append(
                    error(
                        "CLK010",
                        f"argument '{arg.path.dotted()}' of callable '{k.name}' overlaps "
                        f"argument '{other.path.dotted()}': one cannot hold the other",
                        arg.path.span,
                    )
                )
                continue
            leaves.setdefault(key, arg)  # an equal path: CLK010 "declared twice" elsewhere
            for n in range(1, len(key)):
                prefixes.setdefault(key[:n], arg)
    return found


def _all_paths(c: ir.Contract) -> list[tuple[ir.Path, bool]]:
    """(path, is a region's site) of every path in the contract."""
    out = [(r.site, True) for r in c.regions if r.site is not None]
    out += [(h.site, False) for h in c.constants if h.site is not None]
    out += [(path, False) for _, path in _fold_sites(c)]
    for k in c.callables:
        out += [(k.site, False)] if k.site is not None else []
        out += [(n.site, False) for n in k.counters]
        out += [(g.site, False) for g in k.guards]
        out += [(r.source, False) for r in k.retains]
        out += [(a.path, False) for a in k.args]
    return out


def _identity_keys(c: ir.Contract) -> list[Diagnostic]:
    """`[id(path)]`: only in a region's site (a state dict keyed by module), and its
    module path is attribute and index steps from the root (resolved like any site)."""
    found = []
    for path, region_site in _all_paths(c):
        for s in path.steps:
            if s.kind != "identity":
                continue
            inner: ir.Path = s.value  # type: ignore[assignment]
            if not region_site:
                why = "an identity key may appear only in a region's site"
            elif any(t.kind not in ("attr", "index") for t in inner.steps):
                why = "its module path takes attribute and index steps only"
            else:
                continue
            found.append(error("CLK055", f"'{path.dotted()}': {why}", s.span))
    return found


def check_sites(c: ir.Contract) -> list[Diagnostic]:
    conflicts = _conflicts(_bound_sites(c)) + _conflicts(_fold_sites(c)) + _folds_in_bound(c)
    return _segment_problems(c) + conflicts + _argument_paths(c) + _identity_keys(c)
