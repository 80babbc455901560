"""The contract IR: frozen pydantic models, one per declaration, each with a span.

The parser builds these directly; validation and analysis only read them. Spans
are excluded from dumps and equality-by-dump, so a contract printed from IR and
parsed back compares equal to the original.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from duplexcadence.dsl.diagnostics import Span


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    span: Span = Field(default_factory=Span, exclude=True, repr=False)


# ---------------------------------------------------------------- expressions
class Quantity(Node):
    kind: Literal["quantity"] = "quantity"
    value: int
    unit: str | None = None


class NameRef(Node):
    kind: Literal["name"] = "name"
    name: str


class BinOp(Node):
    kind: Literal["binop"] = "binop"
    op: Literal["+", "-", "*"]
    left: "Expr"
    right: "Expr"


class MaxOf(Node):
    kind: Literal["max"] = "max"
    items: tuple["Expr", ...]


class ExtentOf(Node):
    kind: Literal["extent"] = "extent"
    region: str


Expr = Annotated[Union[Quantity, NameRef, BinOp, MaxOf, ExtentOf], Field(discriminator="kind")]
BinOp.model_rebuild()
MaxOf.model_rebuild()


# ---------------------------------------------------------------- paths
class PathStep(Node):
    # identity: `[id(path)]`, the entry of a dict keyed by the identity of the module at
    # `path` (a path from the model's root of attribute and index steps only)
    kind: Literal["attr", "key", "index", "identity"]
    value: Union[str, int, "Path"]


class Path(Node):
    root: str
    steps: tuple[PathStep, ...] = ()

    def dotted(self) -> str:
        out = self.root
        for s in self.steps:
            if s.kind == "attr":
                out += f".{s.value}"
            elif s.kind == "key":
                out += f'["{s.value}"]'
            elif s.kind == "identity":
                out += f"[id({s.value.dotted()})]"  # type: ignore[union-attr]
            else:
                out += f"[{s.value}]"
        return out


PathStep.model_rebuild()


# ---------------------------------------------------------------- declarations
Literal_ = Union[bool, int, str]


class Determinism(Node):
    setting: str
    value: Literal_


class Clock(Node):
    """`rate`: `rate` ticks per tick of `parent`; `product`: a tuple of rate clocks;
    `stepped`: any amount of `steps` per tick of `parent` (a data-dependent advance, a
    verifier's accepted count: `1..8` is (1, 8) with `listed` empty, `{1, 2, 4}` lists)."""

    name: str
    kind: Literal["rate", "product", "stepped"]
    rate: int | None = None
    parent: str | None = None
    factors: tuple[str, ...] = ()
    steps: tuple[int, int] | None = None
    listed: tuple[int, ...] = ()


class Const(Node):
    name: str
    expr: Expr


class Param(Node):
    """`param f_prompt in 50..600 frame default 302 capture {100, 302} hold 4`: a value
    each session binds (the contract cannot fix it), with its domain [lo, hi]. Constants
    may depend on it; the catalog and the bytes become functions of it (compiler/params.py).
    `default`: the value of a binding given none; `capture`: the values captured at bind;
    `hold`: how many values' graphs a lane keeps (least recently used evicted)."""

    name: str
    lo: int
    hi: int
    unit: str | None = None
    default: int | None = None
    capture: tuple[int, ...] = ()
    hold: int | None = None


class Retention(Node):
    kind: Literal["ring", "window", "head_tail"]
    params: tuple[Expr, ...]


class Attended(Node):
    start: Expr
    stride: Expr
    until: Expr | None = None
    flush: tuple[Expr, ...] = ()


DType = Literal[
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool8"
]
Lifetime = Literal["operator", "unit", "chunk", "turn", "session", "process"]
Mutability = Literal["immutable", "mutable", "copy_on_write"]


class Region(Node):
    name: str
    dtype: DType | None = None
    dims: tuple[Expr, ...] | None = None
    clock: str | None = None
    lifetime: Lifetime = "session"
    mutability: Mutability = "mutable"
    retention: Retention | None = None
    attended: Attended | None = None
    envelope: Expr | None = None
    # `speculative S`: a call may write S entries past the committed end of the extent
    # axis (a verifier's drafted tokens, a wake's masked frames) that the commit then
    # cuts back by moving the end, never by a copy; the envelope holds them too
    speculative: Expr | None = None
    stock: tuple[Expr, ...] | None = None
    # pinned: the stock code rebinds the attribute at `site` on every call; bind()
    # keeps one tensor there and the callables that write it copy each new value in
    address: Literal["stable", "moves", "pinned"] = "stable"
    # demand: bind() allocates the demand-sized region; stock: the region *is* the stock
    # tensor at its site (no state rule), still pointer-checked as write-through
    allocate: Literal["demand", "stock", "none"] = "demand"
    site: Path | None = None
    # zeros: the site may be absent at bind (the stock creates it on its first call,
    # reading zeros where it is absent); bind() creates it as the zeroed region
    initial: Literal["zeros"] | None = None
    # `slot N`: the axis sessions stack on when a batched callable serves several in one
    # call (session i's copy is index i there); its per-session extent is 1
    slot: int | None = None
    note: str | None = None
    prop_spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)


class RegionArg(Node):
    kind: Literal["region"] = "region"
    region: str
    # `region r[i]`: one slot of the region's leading axis, chosen by config variable i
    index: str | None = None


class TensorArg(Node):
    kind: Literal["tensor"] = "tensor"
    dtype: DType
    dims: tuple[Expr, ...]
    strides: tuple[Expr, ...] | None = None  # None: contiguous
    offset: Expr | None = None  # elements into its storage: the view's alignment class
    # free: the caller passes views of any layout (a window moving over a longer tensor)
    # and the callable's values do not depend on it; each call gets a contiguous copy
    layout: Literal["exact", "free"] = "exact"


class ScalarArg(Node):
    kind: Literal["scalar"] = "scalar"
    type: Literal["bool", "int", "float", "none"]


class ObjectArg(Node):
    """`kwarg past: site stream.cache`: the argument is the object the model holds at
    `site` (a transformers `Cache`, a padding cache), whose tensors are regions at sites
    under it; validation expands it into those regions (compiler/objects.py)."""

    kind: Literal["object"] = "object"
    site: Path


ArgType = Annotated[Union[RegionArg, TensorArg, ScalarArg, ObjectArg], Field(discriminator="kind")]


class Arg(Node):
    path: Path
    keyword: bool
    type: ArgType


class Config(Node):
    names: tuple[str, ...]
    values: tuple[tuple[Literal_, ...], ...]


class Condition(Node):
    left: Expr
    op: Literal["<=", ">=", "==", "!=", "<", ">"]
    right: Expr


class Retains(Node):
    region: str
    source: Path


class HostCounter(Node):
    """A host-side int the stock body advances on every call (e.g. a step counter
    that gates a warm-up branch): calls before `start` run eager; capture sees
    `start`; every replay advances it as the body would have. `advances` is an amount,
    or an expression over one configuration variable (`advances w`: a verify call of
    width w moves a position by w), so each class advances by its own amount."""

    site: Path
    advances: Expr
    start: int
    # `staged`: what the body derives from it reaches the graph through device buffers
    # (runtime/engine/staging.py), so replays read the live value, not the capture's
    staged: bool = False
    # `tracks R`: the counter counts region R's clock, so the class of R's attended
    # extent e is captured with the counter where the stream meets e first
    tracks: str | None = None


class Control(Node):
    """`control accepted: int64 in 0..8 from result[1]`: an integer the call returns (a
    verifier's accepted count, a wake's retained count) that drives the host: how far a
    commit moves (`commits kv by accepted + 1`) and what the next call is configured
    with. Compared bitwise like any output; its range bounds what it can drive."""

    name: str
    dtype: DType
    low: int
    high: int
    source: Path


class Commit(Node):
    """`commits kv by commit`: of the entries a call writes to region `kv`, the committed
    end advances by `amount` (a stepped clock's amount or an expression over one control,
    which only the data decides, or an expression over one configuration variable); the rest are speculative (`speculative`
    on the region) and the next call overwrites them."""

    region: str
    amount: Expr


class HostGuard(Node):
    """`guard cache.is_updated[0] == true`: a host value at a site that picks the stock
    body's path (a flag the first call sets), which no argument shows: every class is
    captured with the site holding `value`, and a call while it holds anything else (or
    nothing) runs eager (runtime/state/guards.py)."""

    site: Path
    op: str  # "==" (validation refuses the other comparisons: CLK059)
    value: Literal_


class Ambient(Node):
    """`ambient autocast in {off, float16}`: the states of one ambient axis the callable
    is called under; every class is captured once per state (runtime/engine/ambient.py)."""

    axis: str
    values: tuple[str, ...]


class Batch(Node):
    """`batch widths {8, 16} axis 0 rows {aten.mean.dim}`: sessions in step at the
    callable's clock may share one call (lockstep). `widths`: the numbers of sessions a
    batched binding may serve, each its own graphs; `axis`: the axis of every staged
    tensor argument the sessions stack on (extent 1 per session); `rows`: the ops that
    run one session at a time inside the batched call (kernels not batch-invariant);
    `blocks`: per row op, the sessions it runs on at once (`rows {aten.mm.default by 8}`:
    blocks of 8, a width where that kernel was found invariant; 1 without `by`)."""

    widths: tuple[int, ...]
    axis: int = 0
    rows: tuple[str, ...] = ()
    blocks: tuple[int, ...] = ()  # one per row op (empty: every op one session at a time)
    row_spans: tuple[Span, ...] = Field(default=(), exclude=True, repr=False)  # one per row

    def row_blocks(self) -> tuple[int, ...]:
        """The sessions each row op runs on at once, one per op in `rows`."""
        return self.blocks or (1,) * len(self.rows)


class StateObject(Node):
    """An object argument after expansion (compiler/objects.py): the call passes at
    `arg` the object the model holds at `site`; `members` are the regions at sites under
    it, each now a region argument `arg["member"]`."""

    arg: Path  # a keyword argument (CLK058)
    site: Path
    members: tuple[str, ...]


class Callable(Node):
    name: str
    site: Path | None = None
    per: str | None = None
    args: tuple[Arg, ...] = ()
    aliased: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    retains: tuple[Retains, ...] = ()
    configs: tuple[Config, ...] = ()
    admit: tuple[Condition, ...] = ()
    counters: tuple[HostCounter, ...] = ()
    guards: tuple[HostGuard, ...] = ()
    commits: tuple[Commit, ...] = ()
    controls: tuple[Control, ...] = ()
    ambient: tuple[Ambient, ...] = ()
    effects: Literal["none", "device_rng", "host_rng"] = "none"
    mode: Literal["replay", "eager"] = "replay"
    batch: Batch | None = None
    note: str | None = None
    # object arguments, expanded (compiler/objects.py); the parser leaves this empty
    objects: tuple[StateObject, ...] = ()
    prop_spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)


class HostConstant(Node):
    name: str
    site: Path | None = None
    dtype: DType | None = None
    dims: tuple[Expr, ...] | None = None
    install: Literal["device_buffer", "hoisted", "left_eager"] = "device_buffer"
    note: str | None = None
    prop_spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)


class Fold(Node):
    """`fold NAME { site PATH  by KIND }`: every submodule at `site` whose forward
    recomputes a weight from fixed parameters (`by weight_norm`) gets that weight
    computed once at bind instead."""

    name: str
    site: Path | None = None
    by: Literal["weight_norm"] | None = None
    note: str | None = None
    prop_spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)


class Channel(Node):
    """`channel NAME { dtype D  dims [N]  batch B  clock C }`: an append-only buffer of N
    entries that a producer fills B at a time and another call reads (AS2D's drafter and
    verifier, one session, two streams); each batch is readable once its copy's event
    completed, and the entries ready are recorded per tick of `clock` so a replayed run
    reads the same ones (runtime/state/channel.py)."""

    name: str
    dtype: DType | None = None
    dims: tuple[Expr, ...] | None = None
    publish: Expr | None = None  # `batch B`: entries per published batch
    clock: str | None = None
    note: str | None = None
    prop_spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)


class Contract(Node):
    name: str
    target: str | None = None
    budget: int | None = None
    determinism: tuple[Determinism, ...] = ()
    clocks: tuple[Clock, ...] = ()
    consts: tuple[Const, ...] = ()
    params: tuple[Param, ...] = ()
    regions: tuple[Region, ...] = ()
    callables: tuple[Callable, ...] = ()
    constants: tuple[HostConstant, ...] = ()
    folds: tuple[Fold, ...] = ()
    channels: tuple[Channel, ...] = ()
