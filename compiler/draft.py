"""Render a traced stream (`runtime/draft_findings.Trace`) as a `.clock` draft.

Contract of this layer: `render_draft(trace, name)` returns contract text that parses
and checks (the CLI runs `clockc check` on it and says so), built as IR and printed by
`dsl/printer.py`, with `#` comments before each declaration saying what was inferred
from the trace and what could not be. It reads the trace as plain data and imports no
torch: only `clockc draft` runs the model (through the runtime), lazily.

What the draft declares, per finding:
  * a carry: a region on a frame clock (`clock frame = S per chunk`, S the frames
    appended per chunk), its retention (window or head ++ tail in storage order), the
    attended extents from the first call's extent by S until the retained one, its
    site, and on its writer: the argument as `region`, `aliased`, `retains`;
  * a model tensor written in place: a region that is the stock tensor at its site
    (`allocate stock`), written by its callables; `turn` if a later call reads it back,
    else `operator` scratch;
  * a hot callable: its site, arguments in the convention the loop used (`arg` lines in
    positional order, `kwarg` by name), each tensor's dtype, shape, strides and offset,
    with one `config` over every value that varied (the layouts and scalars seen),
    `effects device_rng` when it drew randomness, and the autocast states seen.
"""

from __future__ import annotations

import keyword
import re
import textwrap
from importlib import resources
from typing import Any

from duplexcadence.dsl import ir
from duplexcadence.dsl.printer import print_contract

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def reserved_words() -> tuple[str, ...]:
    """The language's reserved words: the NAME terminal of dsl/clock.lark excludes them."""
    grammar = resources.files("duplexcadence.dsl").joinpath("clock.lark").read_text()
    match = re.search(r"NAME: /\(\?!\(([a-z_|]+)\)", grammar)
    return tuple(match.group(1).split("|")) if match else ()


class _Names:
    """Usable, unique names (identifiers, no reserved word or Python keyword)."""

    def __init__(self) -> None:
        self.taken: set[str] = {"call", "chunk"}
        self.reserved = set(reserved_words())

    def make(self, want: str, suffix: str) -> str:
        base = "_".join(_IDENT.findall(want)) or suffix
        if base[0].isdigit():
            base = f"{suffix}_{base}"
        if base in self.reserved or keyword.iskeyword(base) or base.startswith("_"):
            base = f"{base.strip('_')}_{suffix}"
        name, n = base, 2
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return name


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _q(value: int, unit: str | None = None) -> ir.Quantity:
    return ir.Quantity(value=value, unit=unit)


def _path(steps: tuple, root: str | None = None) -> ir.Path:
    steps = list(steps)
    if root is None:
        root = str(steps.pop(0)[1])
    return ir.Path(root=root, steps=tuple(ir.PathStep(kind=k, value=v) for k, v in steps))


def render_draft(trace: Any, name: str | None = None, source: str = "") -> str:
    """The draft contract's text (see the module docstring)."""
    names = _Names()
    contract = name or _snake(trace.model)
    comments: dict[str, list[str]] = {}
    clocks = [ir.Clock(name="chunk", kind="rate", rate=1, parent="call")]
    per_chunk: dict[str, int] = {k.name: k.calls_per_chunk for k in trace.callables}
    frame_clocks: dict[int, str] = {}
    regions: list[ir.Region] = []
    region_of_carry: dict[tuple, str] = {}
    for c in trace.carries:
        frames = c.stride * per_chunk.get(c.callable, 1)
        if frames not in frame_clocks:
            clock = names.make("frame" if not frame_clocks else f"frame_{frames}", "clock")
            frame_clocks[frames] = clock
            clocks.append(ir.Clock(name=clock, kind="rate", rate=frames, parent="chunk"))
        clock = frame_clocks[frames]
        rname = names.make(c.label, "carry")
        region_of_carry[(c.callable, c.label, c.result)] = rname
        region, comments[f"region {rname}"] = _carry_region(c, rname, clock)
        regions.append(region)
    buffer_regions: dict[tuple, str] = {}
    for b in trace.buffers:
        rname = names.make(str(b.site[-1][1]), "buffer")
        buffer_regions[b.site] = rname
        region, comments[f"region {rname}"] = _buffer_region(b, rname)
        regions.append(region)
    callables = []
    for k in trace.callables:
        cname = names.make(k.name, "call")
        per = "chunk"
        if k.calls_per_chunk > 1:
            per = names.make(f"{cname}_step", "clock")
            clocks.append(ir.Clock(name=per, kind="rate", rate=k.calls_per_chunk, parent="chunk"))
        callables.append(
            _callable(
                k, cname, per, names, region_of_carry, trace.buffers, buffer_regions, comments
            )
        )
    ir_contract = ir.Contract(
        name=contract,
        target=None,
        clocks=tuple(clocks),
        regions=tuple(regions),
        callables=tuple(callables),
    )
    return _with_comments(print_contract(ir_contract), trace, source, comments)


def _carry_region(c: Any, rname: str, clock: str) -> tuple[ir.Region, list[str]]:
    """A carry the trace found, as a region on its frame clock, and what to say of it."""
    kind, params = c.retention
    retention = ir.Retention(kind=kind, params=tuple(_q(p, clock) for p in params))
    bound = sum(params)
    start = c.extents[0]
    dims = tuple(ir.NameRef(name=clock) if i == c.axis else _q(d) for i, d in enumerate(c.shape))
    region = ir.Region(
        name=rname,
        dtype=c.dtype,
        dims=dims,
        lifetime="turn",
        retention=retention,
        attended=ir.Attended(
            start=_q(start, clock), stride=_q(c.stride, clock), until=_q(bound, clock)
        ),
        site=_path(c.site) if c.site else None,
    )
    shown = (
        f"head({params[0]}) ++ tail({params[1]})" if kind == "head_tail" else f"window({params[0]})"
    )
    order = "new frames last" if c.order == "append" else "new frames first (newest-first)"
    return region, [
        f"carried by {c.callable}: grown by torch.cat along axis {c.axis}, {order},",
        f"{c.stride} frames per call; the loop passed back {shown} of the result",
        f"(storage order). Attended extents seen: {_seen(c.extents)}.",
        "lifetime turn is a guess: the trace saw no turn boundary.",
    ]


def _buffer_region(b: Any, rname: str) -> tuple[ir.Region, list[str]]:
    """A tensor written in place at a site, declared as the stock tensor."""
    region = ir.Region(
        name=rname,
        dtype=b.dtype,
        dims=tuple(_q(d) for d in b.shape),
        lifetime="turn" if b.read_back else "operator",
        allocate="stock",
        stock=tuple(_q(d) for d in b.shape),
        site=_path(b.site),
    )
    return region, [
        f"written in place by {', '.join(sorted(b.writers))}"
        + ("; a later call reads it back (state kept in place)." if b.read_back else "; scratch."),
        "declared as the stock tensor (allocate stock): the demand extent a call really uses is",
        "not inferred; declare dims with a clock axis and an envelope to shrink it.",
    ]


def _seen(values: list) -> str:
    distinct = list(dict.fromkeys(values))
    return "{" + ", ".join(str(v) for v in distinct) + "}"


def _callable(
    k, cname, per, names, region_of_carry, buffers, buffer_regions, comments
) -> ir.Callable:
    args, aliased, retains = [], [], []
    variables: list[tuple[str, list]] = []  # config variable -> value per call
    notes = []
    unkeyed = list(k.unkeyed)  # arguments left out: replay would miss every call
    for a in k.args:
        path = _path(a.steps, root=names_for_root(a.root))
        if a.kind == "carry":
            region = next(
                r
                for (callable_, label, _), r in region_of_carry.items()
                if callable_ == k.name and label == a.carry
            )
            args.append(ir.Arg(path=path, keyword=a.keyword, type=ir.RegionArg(region=region)))
            aliased.append(region)
            result = next(
                res
                for (callable_, label, res) in region_of_carry
                if callable_ == k.name and label == a.carry
            )
            retains.append(ir.Retains(region=region, source=_path(result, root="result")))
        elif a.kind == "tensor":
            args.append(
                ir.Arg(path=path, keyword=a.keyword, type=_tensor(a, path, variables, names))
            )
        elif a.steps:
            notes.append(f"scalar {path.dotted()} inside a container cannot be keyed: left out")
            unkeyed.append(f"scalar {path.dotted()} sits inside a container")
        else:
            kinds = {type(v).__name__ for v in a.values}
            scalar = "none" if kinds == {"NoneType"} else kinds.pop() if len(kinds) == 1 else None
            if scalar not in ("bool", "int", "float", "none"):
                notes.append(f"scalar {a.root} takes values of several types: left out")
                unkeyed.append(f"scalar {a.root} takes values of several types")
                continue
            args.append(ir.Arg(path=path, keyword=a.keyword, type=ir.ScalarArg(type=scalar)))
            if scalar != "none":
                variables.append((path.root, list(a.values)))
    configs = ()
    if variables:
        rows = list(dict.fromkeys(zip(*(values for _, values in variables))))
        configs = (ir.Config(names=tuple(n for n, _ in variables), values=tuple(rows)),)
    writes = tuple(buffer_regions[b.site] for b in buffers if k.name in b.writers)
    ambient = ()
    if k.autocast - {"off"}:
        ambient = (ir.Ambient(axis="autocast", values=tuple(sorted(k.autocast))),)
    comments[f"callable {cname}"] = [
        f"called {k.calls_per_chunk} time(s) per chunk; arguments as the loop passed them",
        "(`arg` lines are positional, in order; `kwarg` by name). Configurations: exactly the",
        "layouts and values the trace saw (a final or short chunk it did not reach runs eager).",
    ] + notes
    counters = _counters(k, comments[f"callable {cname}"])
    if unkeyed:
        why = (
            "mode eager: replay keys every argument the call is passed, and "
            + "; ".join(unkeyed)
            + ", so every call would miss (unkeyable_argument). Declare the argument's tensors "
            "(a container's leaves as regions or staged arguments; an object the model holds "
            "as `kwarg NAME: site PATH`, see the notes), or replay a callable inside this one "
            "whose arguments are tensors and scalars."
        )
        comments[f"callable {cname}"] += textwrap.wrap(why, 86)
    return ir.Callable(
        name=cname,
        site=_path(k.site),
        per=per,
        args=tuple(args),
        aliased=tuple(aliased),
        writes=writes,
        retains=tuple(retains),
        counters=counters,
        configs=configs,
        ambient=ambient,
        effects="device_rng" if k.randomness else "none",
        mode="eager" if unkeyed else "replay",
    )


def _counters(k, comments: list[str]) -> tuple[ir.HostCounter, ...]:
    """The host ints every call advanced, drafted as staged counters (said in comments)."""
    counters = tuple(
        ir.HostCounter(
            site=_path(c.site), advances=ir.Quantity(value=c.advances), start=c.start, staged=True
        )
        for c in k.counters
    )
    for c in counters:
        comments += textwrap.wrap(
            f"counter {c.site.dotted()}: a host int every call advanced by "
            f"{c.advances.value}. "
            "Drafted `staged`: what the call derives from it reaches the graphs through "
            "device buffers, and what it decides is checked on every replay. `from` is its "
            "value at the first recorded call; raise it past a first call that takes another "
            "branch. If it counts a region's clock (a cache's length), add `tracks REGION`.",
            86,
        )
    return counters


def names_for_root(root: str) -> str:
    """A positional label or keyword as a path root (any identifier: paths are not names)."""
    base = "_".join(_IDENT.findall(root)) or "arg"
    return base if base not in reserved_words() and not base[0].isdigit() else f"{base}_arg"


def _tensor(a, path, variables, names) -> ir.TensorArg:
    """dims/strides/offset: constant components inline, varying ones as config variables."""
    layouts = a.layouts
    label = path.root + "".join(f"_{s.value}" for s in path.steps)

    def component(values: list[int], what: str) -> ir.Expr:
        if len(set(values)) == 1:
            return _q(values[0])
        var = names.make(f"{label}_{what}", "cfg")
        variables.append((var, values))
        return ir.NameRef(name=var)

    rank = len(layouts[0].shape)
    dims = tuple(component([l.shape[i] for l in layouts], f"d{i}") for i in range(rank))
    strides = offset = None
    if not all(l.contiguous for l in layouts):
        strides = tuple(component([l.stride[i] for l in layouts], f"s{i}") for i in range(rank))
    if any(l.offset for l in layouts):
        offset = component([l.offset for l in layouts], "off")
    return ir.TensorArg(dtype=_dtype(a.dtype), dims=dims, strides=strides, offset=offset)


def _dtype(dtype: str) -> str:
    return "bool8" if dtype == "bool" else dtype


def _with_comments(text: str, trace: Any, source: str, comments: dict[str, list[str]]) -> str:
    head = [
        f"# Draft contract traced by `clockc draft` from {source or trace.model} over {trace.chunks} chunks.",
        "# Everything below was inferred from that trace; review it, then `clockc check` and",
        "# `clockc verify` it against the model. What a trace cannot tell:",
        "#  - turn boundaries (lifetime turn vs session), configurations the loop did not reach",
        "#    (a final or short chunk), retention a longer stream would exercise;",
        "#  - demand extents of scratch buffers (declared at their stock size here);",
        "#  - host syncs inside a callable (constants to hoist: see `constant`), which only a",
        "#    CUDA run shows, and determinism settings exactness depends on.",
    ]
    head += [f"#  - {n}" for n in trace.notes]
    out = head + [""]
    for line in text.splitlines():
        key = " ".join(line.split()[:2])
        if line.startswith(("region ", "callable ")) and key in comments:
            out += [""] + [f"# {c}" for c in comments[key]]
        out.append(line)
    return "\n".join(out) + "\n"
