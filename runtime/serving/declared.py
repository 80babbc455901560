"""What a generated contract module declares: plain data that ``bind_contract`` reads.

Contract of this layer: these frozen dataclasses are the whole interface between
generated code and the runtime. clockc writes one ``ContractDecl`` per contract
(``generated/<contract>/contract.py``) as literals — names only as string keys,
sites as dotted paths that ``__post_init__`` parses into step tuples
(``runtime/state/sites.py``: ``"flow.decoder.x"``, ``'cache["k"]'``, ``"[1]"``), regions as a
``RegionTable`` and catalogs as ``CatalogDecl`` rows (``classes.py``), both expanded to
exactly the objects they stand for — and the hand-written, tested binder
(``binder.py``, ``lane.py``) does everything else. Nothing in a declaration is code:
a contract's text can reach the runtime only as these values.

How bind provides a region (``RegionDecl.install``):
  * ``carry``    — a ``CarryRegion`` (retention by in-place writeback); adopts the
                   live stock state at its site, if the model has one;
  * ``allocate`` — demand-sized, installed at its site (keeps the stock's leading part);
  * ``stock``    — the region *is* the stock tensor at its site (no state rule);
  * ``pinned``   — the stock tensor, kept at its site by the callables that write it;
  * ``declared`` — documentation only: no site and no callable uses it.
Region lifetimes decide what sessions own (``sessions.py``): ``turn`` and ``session``
regions are per session; ``operator``, ``chunk`` and ``unit`` are per lane (scratch);
``process`` is shared.

Lockstep (``batch`` on a callable, ``slot`` on a region): sessions in step at the
callable's clock may share one call. The declaration is per session; ``at_width(W)``
is the same contract with ``W`` sessions stacked: every batched callable's staged
arguments ``W`` times longer on its ``axis`` and every slotted region ``W`` times
longer on its ``slot`` axis (session ``i`` owns index ``i`` there: slot-major storage
at one stable address). ``bind(batch=W)`` binds that declaration and runs each
callable's ``rows`` ops one session at a time inside the batched call
(``engine/per_row.py``): the kernels a proof found not batch-invariant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Literal, Mapping

from ..engine.ambient import AUTOCAST_OFF, Autocast
from ..engine.classes import CaptureClass, RegionView, TensorSpec
from ..engine.effects import Effect
from .params import ParamDecl
from ..state.channel import ChannelDecl
from ..state.regions import RegionSpec
from ..state.retention import Retention
from ..state.sites import Step
from .declared_args import (
    Aliased,
    Control,
    Counter,
    Guard,
    Retains,
    StateObject,
    _normalise,
    _steps,
)

Install = Literal["carry", "allocate", "stock", "pinned", "declared"]
PER_SESSION = frozenset({"turn", "session"})


@dataclass(frozen=True)
class RegionDecl:
    spec: RegionSpec
    install: Install
    retention: Retention | None = None
    site: tuple[Step, ...] | None = None
    # "zeros": the site may be absent at bind (the stock creates it on its first call and
    # reads zeros until then); bind() allocates the region zeroed and creates the site
    initial: Literal["zeros"] | None = None
    # session parameters (params.py): attended extents move by Σ coeff·(value − default);
    # retention fields likewise, one term tuple per field in declared order
    shift: tuple[tuple[str, int], ...] = ()
    retention_shift: tuple[tuple[tuple[str, int], ...], ...] = ()
    # the shape likewise, one term tuple per dim; ``spec.shape`` is the domain's largest
    # (the envelope): a lane or a session allocates its value's (params.shape_at)
    shape_shift: tuple[tuple[tuple[str, int], ...], ...] = ()
    # the axis sessions stack on in a batched binding (its per-session extent is 1)
    slot: int | None = None

    def __post_init__(self) -> None:
        _normalise(self, site=_steps(self.site))
        if self.slot is not None and not 0 <= self.slot < len(self.spec.shape):
            raise ValueError(f"region {self.name}: slot axis {self.slot} outside {self.spec.shape}")

    def at_width(self, width: int) -> "RegionDecl":
        """This region with ``width`` sessions stacked on its slot axis (a session's
        extent there is 1)."""
        if self.slot is None:
            return self
        shape = list(self.spec.shape)
        if shape[self.slot] != 1:
            raise ValueError(
                f"region {self.name}: slot axis {self.slot} of {self.spec.shape} is not of extent 1"
            )
        shape[self.slot] = width
        return replace(self, spec=replace(self.spec, shape=tuple(shape)))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def per_session(self) -> bool:
        return self.spec.lifetime in PER_SESSION


@dataclass(frozen=True)
class BatchDecl:
    """``batch widths {8} axis 0 rows {aten.mean.dim}``: the slot widths a batched
    binding may have, the axis of the staged arguments sessions stack on, and the ops
    that run one session at a time inside the batched call (``blocks``: per op, the
    sessions it runs on at once, ``rows {aten.mm.default by 8}``; empty: all one)."""

    widths: tuple[int, ...]
    axis: int = 0
    rows: tuple[str, ...] = ()
    blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _normalise(
            self, widths=tuple(self.widths), rows=tuple(self.rows), blocks=tuple(self.blocks)
        )
        if self.blocks and (
            len(self.blocks) != len(self.rows)
            or any(type(n) is not int or n < 1 for n in self.blocks)
        ):
            raise ValueError(
                f"batch blocks must be one positive int per row op, got {self.blocks!r}"
            )
        if not self.widths or any(type(w) is not int or w < 1 for w in self.widths):
            raise ValueError(f"batch widths must be positive ints, got {self.widths!r}")
        if self.axis < 0:
            raise ValueError(f"batch axis must be >= 0, got {self.axis}")
        if self.rows and self.axis != 0:
            # PerRow splits on the leading axis (clockc's CLK106 says the same)
            raise ValueError(f"per-row ops need batch axis 0, got axis {self.axis}")

    def row_ops(self) -> dict[str, int]:
        """Each per-row op with the sessions it runs on at once (PerRow's ``ops``)."""
        return dict(zip(self.rows, self.blocks or (1,) * len(self.rows)))

    def rows_shown(self) -> list[str]:
        """The per-row ops as the contract writes them (``aten.mm.default by 8``)."""
        return [op + (f" by {n}" if n > 1 else "") for op, n in self.row_ops().items()]


def _stacked(x: Any, axis: int, width: int, where: str) -> Any:
    """A catalog argument structure with every staged tensor ``width`` times longer on
    ``axis`` (its per-session extent there is 1)."""
    if isinstance(x, TensorSpec):
        if not (axis < len(x.shape) and x.shape[axis] == 1):
            raise ValueError(f"{where}: batch axis {axis} of {x.shape} is not of extent 1")
        if x.stride is not None and axis != 0:
            raise ValueError(f"{where}: an argument with strides stacks on axis 0 only")
        shape = x.shape[:axis] + (width,) + x.shape[axis + 1 :]
        return replace(x, shape=shape)
    if isinstance(x, RegionView):
        raise ValueError(f"{where}: a region-slot argument cannot be batched")
    if type(x) in (tuple, list):
        return type(x)(_stacked(i, axis, width, where) for i in x)
    if type(x) is dict:
        return {k: _stacked(v, axis, width, where) for k, v in x.items()}
    return x


@dataclass(frozen=True)
class CallableDecl:
    name: str
    site: tuple[Step, ...]
    classes: tuple[CaptureClass, ...] = ()
    replay: bool = True
    eager_reason: str = ""
    effect: Effect = Effect.NONE
    ambient: tuple[Autocast, ...] = (AUTOCAST_OFF,)
    aliased: tuple[Aliased, ...] = ()
    retains: tuple[Retains, ...] = ()
    writes: tuple[str, ...] = ()  # write-through regions (pointer-checked per call)
    # pinned regions this callable's stock code rebinds: besides any named here, every
    # region in `writes` installed "pinned" (ContractDecl derives them)
    pins: tuple[str, ...] = ()
    counters: tuple[Counter, ...] = ()
    guards: tuple[Guard, ...] = ()  # host values the body branches on (state/guards.py)
    # `layout free` arguments, ("args" | "kwargs", steps): a view of any layout is
    # replaced by a contiguous copy before the call is keyed (the contract states the
    # callable's values do not depend on its layout), so the catalog names shapes only
    layout_free: tuple[tuple[Literal["args", "kwargs"], tuple[Step, ...]], ...] = ()
    batch: BatchDecl | None = None  # sessions in step may share one call (lockstep)
    objects: tuple[StateObject, ...] = ()  # object arguments (transformers caches)
    controls: tuple[Control, ...] = ()  # integers the call returns that drive the host

    def __post_init__(self) -> None:
        # a CatalogDecl (or any sequence) of classes is kept as the tuple it expands to
        _normalise(
            self,
            site=_steps(self.site),
            classes=tuple(self.classes),
            layout_free=tuple((where, _steps(steps)) for where, steps in self.layout_free),
        )

    def at_width(self, width: int) -> "CallableDecl":
        """This callable with ``width`` sessions stacked in each staged argument."""
        if self.batch is None:
            return self
        where = f"callable {self.name}"
        axis = self.batch.axis
        classes = tuple(
            replace(
                c,
                args=_stacked(c.args, axis, width, where),
                kwargs=_stacked(dict(c.kwargs), axis, width, where),
            )
            for c in self.classes
        )
        return replace(self, classes=classes)


@dataclass(frozen=True)
class ConstantDecl:
    name: str
    install: Literal["device_buffer", "hoisted", "left_eager"]
    site: tuple[Step, ...] | None = None

    def __post_init__(self) -> None:
        _normalise(self, site=_steps(self.site))


@dataclass(frozen=True)
class FoldDecl:
    """Fold the weights of every module under ``site`` once at bind (folds.py)."""

    name: str
    by: Literal["weight_norm"]
    site: tuple[Step, ...]

    def __post_init__(self) -> None:
        _normalise(self, site=_steps(self.site))


@dataclass(frozen=True)
class ContractDecl:
    name: str
    target: str | None
    source_sha256: str
    determinism: dict[str, bool]
    regions: dict[str, RegionDecl]
    callables: tuple[CallableDecl, ...]
    constants: tuple[ConstantDecl, ...] = ()
    params: tuple[ParamDecl, ...] = ()  # values each session binds (params.py)
    folds: tuple[FoldDecl, ...] = ()  # weights folded once at bind (folds.py)
    channels: tuple[ChannelDecl, ...] = ()  # producers' append-only buffers (channel.py)

    def __post_init__(self) -> None:
        regions = dict(self.regions)  # a RegionTable as the dict it stands for
        _normalise(
            self, regions=regions, callables=tuple(_with_pins(k, regions) for k in self.callables)
        )

    def channel(self, name: str) -> ChannelDecl:
        """The declared channel ``name`` (``Channel(decl, device)`` opens one)."""
        for ch in self.channels:
            if ch.name == name:
                return ch
        known = ", ".join(ch.name for ch in self.channels) or "none"
        raise KeyError(f"contract {self.name} declares no channel {name!r} (it has: {known})")

    def sites_to_check(self, *, carries: bool = True) -> dict[str, tuple[Step, ...]]:
        """Every site bind() must find before it changes anything. ``carries=False``
        leaves out the carries' sites, for a bind before the stock state exists
        (``capture=False``, before priming); ``Binding.capture()`` checks them then."""
        out: dict[str, tuple[Step, ...]] = {}
        for r in self.regions.values():
            if r.site is not None and r.install in ("allocate", "stock", "pinned"):
                out[r.name] = r.site
                if r.initial is not None:  # the site may be absent: its container must not
                    out[r.name] = r.site[:-1]
                    kind, module = r.site[-1]
                    if kind == "identity":
                        out[f"{r.name} (its key's module)"] = module
            elif r.site is not None and r.install == "carry" and carries:
                out[r.name] = r.site
        for k in self.callables:
            out[k.name] = k.site
            for g in k.guards:  # the value may be absent (set by the first call)
                if len(g.site) > 1:
                    out[f"{k.name} (its guard's container)"] = g.site[:-1]
        for c in self.constants:
            if c.site is not None and c.install == "device_buffer":
                out[c.name] = c.site
        for f in self.folds:
            out[f.name] = f.site
        return out

    @property
    def batch_widths(self) -> tuple[int, ...]:
        """The slot widths every batched callable declares (one lockstep per contract);
        () when none is batched."""
        widths = {k.batch.widths for k in self.callables if k.batch is not None}
        if len(widths) > 1:
            raise ValueError(f"contract {self.name}: batched callables disagree on widths {widths}")
        return next(iter(widths), ())

    def at_width(self, width: int) -> "ContractDecl":
        """The declaration of ``width`` sessions in lockstep (module docstring); width 1
        is this one. Only a declared width may be bound."""
        if width == 1:
            return self
        if width not in self.batch_widths:
            declared = ", ".join(map(str, self.batch_widths)) or "none: no callable is batched"
            raise ValueError(
                f"contract {self.name}: batch width {width} is not declared ({declared})"
            )
        unbatched = [k.name for k in self.callables if k.replay and k.batch is None]
        if unbatched:
            raise ValueError(f"contract {self.name}: callables {unbatched} declare no batch")
        return replace(
            self,
            regions={n: r.at_width(width) for n, r in self.regions.items()},
            callables=tuple(k.at_width(width) for k in self.callables),
        )


def _with_pins(k: CallableDecl, regions: dict[str, RegionDecl]) -> CallableDecl:
    """``k`` with every pinned region it writes among its pins: the stock code rebinds
    those attributes every call, so the lane copies the new value in and puts the
    pinned tensor back (inside a capture, the copy is part of the graph)."""
    written = tuple(w for w in k.writes if w in regions and regions[w].install == "pinned")
    pins = tuple(dict.fromkeys(k.pins + written))
    return k if pins == k.pins else replace(k, pins=pins)


# RegionSpec's fields and RegionDecl's, as a RegionTable names them; those absent are None
_SPEC_FIELDS = ("dtype", "shape", "axis", "lifetime", "mutability")
_DECL_FIELDS = (
    "install",
    "retention",
    "site",
    "initial",
    "shift",
    "retention_shift",
    "shape_shift",
    "slot",
)
_OPTIONAL = frozenset(
    {"axis", "retention", "site", "initial", "shift", "retention_shift", "shape_shift", "slot"}
)


class RegionTable(Mapping[str, RegionDecl]):
    """REGIONS as generated code writes them, and the ``{name: RegionDecl}`` they stand for.

    ``common`` holds the fields every region shares, ``rows`` each region's own fields
    (name -> fields); a field is one of RegionSpec's (``dtype``, ``shape``, ``axis``,
    ``lifetime``, ``mutability``) or RegionDecl's (``install``, ``retention``, ``site``,
    ``initial``, ``shift``, ``retention_shift``, ``shape_shift``, ``slot``). ``axis``,
    ``retention``, ``site``, ``initial``, ``slot`` and the three shifts may be absent (RegionDecl's default); a field given in
    both ``common`` and a row is an error, not an override."""

    def __init__(self, common: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]]) -> None:
        self._regions = {name: _region(name, common, own) for name, own in rows.items()}

    def __getitem__(self, name: str) -> RegionDecl:
        return self._regions[name]

    def __len__(self) -> int:
        return len(self._regions)

    def __iter__(self) -> Iterator[str]:
        return iter(self._regions)

    def __repr__(self) -> str:
        return f"RegionTable({list(self._regions)})"


def _region(name: str, common: Mapping[str, Any], own: Mapping[str, Any]) -> RegionDecl:
    both = sorted(set(common) & set(own))
    fields = {**common, **own}
    unknown = sorted(set(fields) - set(_SPEC_FIELDS) - set(_DECL_FIELDS))
    missing = sorted(set(_SPEC_FIELDS + _DECL_FIELDS) - set(fields) - _OPTIONAL)
    if both or unknown or missing:
        raise ValueError(
            f"region {name}: fields given twice {both}, unknown {unknown}, missing {missing}"
        )
    spec = RegionSpec(name, *(fields.get(f) for f in _SPEC_FIELDS))
    return RegionDecl(spec, **{f: fields[f] for f in _DECL_FIELDS if f in fields})
