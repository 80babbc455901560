"""What a generated contract module declares: plain data that ``bind_contract`` reads.

Contract of this layer: these frozen dataclasses are the whole interface between
generated code and the runtime. clockc writes one ``ContractDecl`` per contract
(``generated/<contract>/contract.py``) as literals — names only as string keys,
sites as step tuples (``runtime/sites.py``) — and the hand-written, tested binder
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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .ambient import AUTOCAST_OFF, Autocast
from .classes import CaptureClass
from .effects import Effect
from .params import ParamDecl
from .regions import RegionSpec
from .retention import Retention
from .sites import Step

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

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def per_session(self) -> bool:
        return self.spec.lifetime in PER_SESSION


@dataclass(frozen=True)
class Aliased:
    """An argument the call must read at a region's own address.

    ``container`` is ``"args"`` (first step an index) or ``"kwargs"`` (first step a
    key). ``how``: ``carry`` adopts with retention, ``prefix`` copies the stock
    tensor's leading part in, ``slot`` (``region r[i]``) is read where the caller put
    it (admission pins its pointer)."""

    region: str
    container: Literal["args", "kwargs"]
    steps: tuple[Step, ...]
    how: Literal["carry", "prefix", "slot"]


@dataclass(frozen=True)
class Retains:
    """``retains region from result...``: the history at ``steps`` of the result is
    written back into the carry, and the result then holds the carry's view."""

    region: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Counter:
    site: tuple[Step, ...]
    advances: int
    start: int


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
    pins: tuple[str, ...] = ()  # pinned regions this callable's stock code rebinds
    counters: tuple[Counter, ...] = ()
    # `layout free` arguments, ("args" | "kwargs", steps): a view of any layout is
    # replaced by a contiguous copy before the call is keyed (the contract states the
    # callable's values do not depend on its layout), so the catalog names shapes only
    layout_free: tuple[tuple[Literal["args", "kwargs"], tuple[Step, ...]], ...] = ()


@dataclass(frozen=True)
class ConstantDecl:
    name: str
    install: Literal["device_buffer", "hoisted", "left_eager"]
    site: tuple[Step, ...] | None = None


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
        for c in self.constants:
            if c.site is not None and c.install == "device_buffer":
                out[c.name] = c.site
        return out
