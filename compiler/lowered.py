"""The typed context lowering hands the templates: frozen dataclasses of plain values.

Contract of this layer: nothing here is code. Names and paths are strings, numbers are
ints, and the templates (templates/_specs.jinja macros) print them with `repr()` or as
the runtime's constructors; `compiler/lower.py` builds these from the analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Union


# ---------------------------------------------------------------- catalog leaves
@dataclass(frozen=True)
class TensorLeaf:
    """A staged input: `TensorSpec(shape, torch.<dtype>, stride=..., offset=...)`."""

    kind: ClassVar[str] = "tensor"
    shape: tuple[int, ...]
    dtype: str  # the torch attribute: float32, bool, ...
    stride: tuple[int, ...] | None = None
    offset: int | None = None


@dataclass(frozen=True)
class RegionLeaf:
    """An aliased input: `RegionView(region, extent, index=...)`."""

    kind: ClassVar[str] = "region"
    region: str
    extent: int | None  # None: a region without a clock extent, passed whole
    index: int | None = None  # `region r[i]`: one slot of the leading axis


@dataclass(frozen=True)
class ValueLeaf:
    """A scalar keyed by value; `code` is its repr (so True and 1 stay apart)."""

    kind: ClassVar[str] = "value"
    code: str


Leaf = Union[TensorLeaf, RegionLeaf, ValueLeaf]


@dataclass(frozen=True)
class OneOfLeaf:
    """A leaf that differs between a catalog's classes: its distinct values, first use first."""

    kind: ClassVar[str] = "one_of"
    choices: tuple[Leaf, ...]
    # in every class, the index the `pick_as`-th varying leaf picks (the row omits it):
    # sixteen KV regions whose extents move together are one column, not sixteen
    pick_as: int | None = None
    # every choice a view of one region at an extent: (region, runs), each run an extent
    # or (start, stop, step) of a range, written `RegionViews(region, range(...), e)`
    views: tuple[str, tuple] | None = None


@dataclass(frozen=True)
class DictNode:
    """Args sharing one root (`cache["a"]`, `cache["b"]`) as a dict, keys in declaration order."""

    kind: ClassVar[str] = "dict"
    items: tuple[tuple[str, "Node"], ...]


Node = Union[TensorLeaf, RegionLeaf, ValueLeaf, OneOfLeaf, DictNode]


@dataclass(frozen=True)
class CatalogRow:
    name: str
    picks: tuple[int, ...]  # the index chosen in each OneOf (but a `pick_as`), in order


@dataclass(frozen=True)
class Catalog:
    """`CatalogDecl(args, kwargs, rows=...)`: what every class shares, once, and one row
    per class (runtime/engine/classes.py expands it)."""

    args: tuple[Node, ...]
    kwargs: tuple[tuple[str, Node], ...]
    varying: tuple[str, ...]  # the contract paths of the OneOf leaves a row picks, in order
    rows: tuple[CatalogRow, ...]


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Aliased:
    region: str
    container: str  # "args" | "kwargs"
    steps: str  # dotted, from the container: `["cache"]["k"]`, `[1]`
    how: str  # carry | prefix | slot


@dataclass(frozen=True)
class Tracks:
    """`tracks R`: R's attended extents, first to last by stride (runtime/state/counters.py
    turns a class's extent into the counter's value there)."""

    region: str
    first: int
    stride: int
    last: int


@dataclass(frozen=True)
class Counter:
    """``advances``: the amount a call, or with ``by`` the amount at each value of that
    configuration variable (``per_value``; compiler/counter_advance.py)."""

    site: str
    advances: int
    start: int
    staged: bool = False
    tracks: Tracks | None = None
    by: str | None = None
    per_value: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Guard:
    """`guard PATH == VALUE` (runtime/state/guards.py)."""

    site: str
    value: bool | int | str


@dataclass(frozen=True)
class Retains:
    region: str
    steps: str  # dotted, from the result


@dataclass(frozen=True)
class Control:
    name: str
    dtype: str
    low: int
    high: int
    steps: str  # dotted, from the result


@dataclass(frozen=True)
class Batch:
    """`BatchDecl(widths=, axis=, rows=)`: sessions in lockstep share one call."""

    widths: tuple[int, ...]  # sorted: the runtime compares callables' widths as tuples
    axis: int
    rows: tuple[str, ...]  # ATen op names run one session at a time
    blocks: tuple[int, ...]  # sessions per call of each (1: one at a time)

    def blocks_shown(self) -> tuple[int, ...]:
        """`blocks` as the generated code writes it: empty when every op is per row."""
        return self.blocks if any(n != 1 for n in self.blocks) else ()


@dataclass(frozen=True)
class LoweredCallable:
    name: str
    site: str
    per: str | None
    replay: bool
    reason: str
    width: int
    bound: int
    effect: str  # an Effect member
    ambient: tuple[str | None, ...]  # autocast dtype per captured state; None: off
    aliased: tuple[Aliased, ...]
    # `layout free` tensors, (container, dotted steps from it): copied contiguous first
    layout_free: tuple[tuple[str, str], ...]
    retains: tuple[Retains, ...]
    writes: tuple[str, ...]  # write-through regions with a site (pointer-checked)
    counters: tuple[Counter, ...]
    catalog: Catalog | None  # None when left eager
    guards: tuple[Guard, ...] = ()
    batch: Batch | None = None  # None: one session per call
    objects: tuple["StateObject", ...] = ()  # object arguments (compiler/objects.py)
    controls: tuple[Control, ...] = ()  # integers the call returns that drive the host


@dataclass(frozen=True)
class StateObject:
    """An object argument as generated code declares it: the kwarg's dotted steps, the
    model site of the object, and (member region, dotted steps inside the object)."""

    steps: str
    site: str
    members: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Retention:
    kind: str  # HeadTail | Window | Ring
    params: tuple[tuple[str, int], ...]


FieldValue = Union[str, int, tuple, Retention]


@dataclass(frozen=True)
class RegionRow:
    name: str
    fields: tuple[tuple[str, FieldValue], ...]  # the fields not in RegionTable's common
    demand_mib: str
    stock_mib: str | None
    rho: float
    attended: tuple[int, ...]
    speculative: int = 0  # entries past the committed end the envelope also holds


@dataclass(frozen=True)
class Constant:
    name: str
    install: str
    site: str | None


@dataclass(frozen=True)
class Fold:
    """`FoldDecl(name, by, site=)`: weights folded once at bind (runtime/state/folds.py)."""

    name: str
    by: str
    site: str


@dataclass(frozen=True)
class Channel:
    """`ChannelDecl(name, dtype, capacity=, batch=, clock=)`: a producer's append-only
    buffer (runtime/state/channel.py)."""

    name: str
    dtype: str
    capacity: int
    batch: int
    clock: str


@dataclass(frozen=True)
class Param:
    """A session parameter's domain: `ParamDecl(name, lo=, hi=, default=, capture=, hold=)`."""

    name: str
    lo: int
    hi: int
    default: int
    capture: tuple[int, ...]
    hold: int | None  # None: every value used
    unit: str | None


@dataclass(frozen=True)
class LoweredContract:
    compiler_version: str
    contract: str
    target: str | None
    source_name: str
    source_sha256: str
    imports: tuple[str, ...]  # runtime names contract.py uses, and no other
    uses_torch: bool
    determinism: tuple[tuple[str, bool], ...]
    region_common: tuple[tuple[str, FieldValue], ...]
    regions: tuple[RegionRow, ...]
    callables: tuple[LoweredCallable, ...]
    constants: tuple[Constant, ...]
    params: tuple[Param, ...] = ()  # session parameters, if the contract declares any
    folds: tuple[Fold, ...] = ()  # weights folded at bind, if the contract declares any
    channels: tuple[Channel, ...] = ()  # producers' buffers, if the contract declares any
    # the widths of the contract's lockstep, if a callable is batched: bind() takes `batch`
    batch_widths: tuple[int, ...] = ()

    def context(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
