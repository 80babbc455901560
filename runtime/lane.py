"""A replay lane: one complete set of a contract's device state and captured graphs.

Contract of this layer. A lane owns its regions (carries, write-through scratch),
one ``ExactShapeReplay`` per replayed callable with its own captured catalog, one
graph pool, one stream (so its graphs use that stream's cuBLAS workspace) and one
device generator state. Two lanes share nothing a graph touches, so their replays
may run at the same time on their own streams; DESIGN §6c measured what happens
otherwise (graphs sharing a pool, a cuBLAS workspace or a generator state crashed
and hung when replayed concurrently).

Lane 0 is what ``bind()`` builds: it *owns the model's sites* (its allocated regions
are installed there, its carries adopt the live stock state), so a binding without
sessions behaves exactly as one stream always did. Every other lane is private:
its regions are at no model site. Eager code reads scratch through the model's
sites, so an eager call (a miss, a callable left eager, a capture) runs inside the
binding's eager section (``Binding.eager_section``: one lock, the lane's generator),
and a lane captures with its own regions put at the sites for the duration.

With session parameters (params.py) a lane's regions are at the largest value it has
been asked to serve: at bind the bound value and the declared capture values; a
larger value grows the lane (lane_values.py: new regions, every engine rebuilt).

``Lane.call`` is what the generated wrapper used to do per call: bring every
aliased argument to the lane's own address (a session's stored state is loaded in
place, sessions.py; a tensor from outside is adopted), then run the engine — or the
eager body — under inference mode.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Container

import torch

from .backend import CudaGraphBackend, FakeGraphBackend, GraphBackend, lane_generator
from .calls import convention_of
from .carry import CarryRegion
from .counters import HostCounter
from .declared import Aliased, CallableDecl
from .params import (
    ParamKey,
    ValueGraphs,
    classes_at,
    depends,
    label,
    merge_values,
    retention_at,
    shape_at,
    widest,
)
from .pins import pin_at
from .regions import LayoutError, Region
from .replay import ExactShapeReplay
from .binding import adopt_prefix
from .lane_values import merge_retired, use_value
from .site_reads import SiteReads
from .sites import format_path, get_at, has_site, replace_at, set_at, update_at
from .trees import map_tensors

if TYPE_CHECKING:
    from .binding import Binding


class LaneError(RuntimeError):
    """A contract's state cannot be given to a second lane (stock or pinned regions,
    host counters at a shared site): such a binding serves sessions on one lane."""


class Lane:
    def __init__(self, binding: "Binding", index: int, *, owns_sites: bool) -> None:
        self.binding = binding
        self.index = index
        self.owns_sites = owns_sites
        device = binding.device
        self.backend: GraphBackend
        if isinstance(binding.backend, FakeGraphBackend):
            self.backend = binding.backend
            self.stream = None
        elif device.type == "cuda" and torch.cuda.is_available():
            # lane 0 keeps the process's shared capture stream (one cuBLAS workspace
            # for a plain binding, as before); every other lane gets its own
            self.stream = None if index == 0 else torch.cuda.Stream(device=device)
            self.backend = CudaGraphBackend(stream=self.stream)
        else:
            self.backend = CudaGraphBackend()
            self.stream = None
        self.rng = lane_generator(device, first=(index == 0))
        self.pool: Any = None  # one graph pool per lane, made at its first capture
        self.regions: dict[str, Region] = {}
        self.engines: dict[str, ExactShapeReplay] = {}
        self.bodies: dict[str, Callable] = {}
        self._callables = {k.name: k for k in binding.decl.callables}
        # each callable's declared argument form (calls.py): a caller may pass an `arg`
        # by keyword or a `kwarg` by position; the catalog and the aliasing see one form
        self._conventions = {
            k.name: convention_of(binding.stock_callables[k.name], k.classes, k.aliased)
            for k in binding.decl.callables
        }
        # session parameters (params.py): the value this lane's engines are at, the
        # engines of callables whose graphs change with it, per value (bounded)
        self.key: ParamKey = binding.params_key
        holds = [p.hold for p in binding.decl.params if p.hold is not None]
        self.values = ValueGraphs(min(holds) if holds else None)
        self._shared: dict[str, ExactShapeReplay] = {}
        self._per_value = {k.name for k in binding.decl.callables if depends(binding.decl, k)}
        self.captured = False  # capture() ran: a new value's graphs are captured on use
        # at ``key`` with engines that capture nothing (a pool's step at a value the lane
        # does not hold runs eager: lane_values.use_value)
        self.uncaptured = False
        self.pending: dict[ParamKey, dict[str, ExactShapeReplay]] = {}  # lane_values.py
        # each region's shape here: the largest over the values this lane serves (at bind,
        # the bound value and the capture set; lane_values.py grows it)
        served = [self.key, *binding.capture_keys]
        self.shapes = {
            n: widest(*(shape_at(binding.decl, r, k) for k in served))
            for n, r in binding.decl.regions.items()
        }
        self._retired_shared: dict[str, list[dict]] = {}  # shared engines dropped by a grow
        self._make_regions()
        self._make_callables()

    def _make_callables(self) -> None:
        """Every callable's eager body and engine at this lane's value (bind, and again
        after the lane grew: the bodies hold the regions they write back into)."""
        self.bodies, self._shared = {}, {}
        for k in self.binding.decl.callables:
            self._make_callable(k)
        if self.binding.decl.params:
            self.values.put(
                self.key, {n: self.engines[n] for n in self._per_value if n in self.engines}
            )

    # ------------------------------------------------------------------ build
    def _make_regions(self) -> None:
        b, model = self.binding, self.binding.model
        for r in b.decl.regions.values():
            if r.install == "declared":
                continue
            if r.install == "carry":
                carry = self.new_region(r)
                if self.owns_sites and r.site is not None and has_site(model, r.site):
                    update_at(model, r.site, carry.adopt)
                self.regions[r.name] = carry
            elif r.install == "pinned" and r.initial is not None:
                self.regions[r.name] = self._pinned_zeros(r)
            elif r.install in ("stock", "pinned"):
                if not self.owns_sites:
                    raise LaneError(
                        f"region {r.name} is the stock tensor at its site ({r.install}): "
                        "a second lane cannot have its own; serve sessions on one lane"
                    )
                self.regions[r.name] = Region(r.spec, get_at(model, r.site))  # type: ignore[arg-type]
            else:
                region = self.new_region(r)
                if self.owns_sites and r.site is not None:
                    b.install_region(r.site, region)
                self.regions[r.name] = region

    def new_region(self, r: Any) -> Region:
        """A carry or an allocated region at this lane's shape for it (zeros)."""
        b = self.binding
        spec = dataclasses.replace(r.spec, shape=self.shapes[r.name])
        if r.install == "carry":
            retention = retention_at(b.decl, r, self.key)
            return CarryRegion(spec, retention, b.device, audit=b.audit)  # type: ignore[arg-type]
        return Region.allocate(spec, b.device)

    def _pinned_zeros(self, r: Any) -> Region:
        """A pinned region that starts as zeros (`initial zeros`): allocated compact at
        its demand shape, holding the stock's state where the site already exists (the
        stock's view may keep a whole activation alive), and put at the site, creating it
        where it is absent (what the stock's first call would read: zeros)."""
        b = self.binding
        if not self.owns_sites:
            raise LaneError(
                f"region {r.name} is pinned at its site: a second lane cannot have its own; "
                "serve sessions on one lane"
            )
        region = Region.allocate(r.spec, b.device)
        if has_site(b.model, r.site):
            with torch.no_grad():
                region.tensor.copy_(get_at(b.model, r.site))
        set_at(b.model, r.site, region.tensor)
        return region

    def _make_callable(self, k: CallableDecl) -> None:
        if k.counters and not self.owns_sites:
            raise LaneError(
                f"callable {k.name} keeps host counters at model sites: a second lane "
                "would share them; serve sessions on one lane"
            )
        body = self._eager_body(k)
        self.bodies[k.name] = body
        if not k.replay:
            return
        self.engines[k.name] = self._engine(k, self.key)
        if k.name not in self._per_value:
            self._shared[k.name] = self.engines[k.name]

    def _like(self, name: str) -> ExactShapeReplay | None:
        """The same callable's engine whose classification a new engine reuses: lane 0's
        for a new lane; this lane's own, once it classified, for a new parameter value."""
        own = self.engines.get(name)
        if own is not None:
            return own if own.effect is not None or own.rejected is not None else None
        return self.binding.lanes[0].engines.get(name) if self.binding.lanes else None

    def _engine(self, k: CallableDecl, key: ParamKey) -> ExactShapeReplay:
        b = self.binding
        like = self._like(k.name)
        wt = self._write_through_names(k)
        return ExactShapeReplay(
            self.bodies[k.name],
            name=k.name,
            classes=classes_at(b.decl, k, key),
            regions=self.regions,
            write_through=self._write_through_getters(wt),
            read_write_through=self._write_through_reader(wt),
            declared_effect=k.effect,
            device=b.device,
            backend=self.backend,
            counters=[
                HostCounter(
                    format_path(c.site),
                    read=lambda site=c.site: get_at(b.model, site),
                    write=lambda value, site=c.site: set_at(b.model, site, value),
                    advances=c.advances,
                    start=c.start,
                )
                for c in k.counters
            ],
            ambient=b.ambient_of(k),
            # lane 0 classifies effects and warms kernels, allocator and libraries; a later
            # lane (or a new parameter value) warms each class once and then only captures
            warmup=2 if like is None else 1,
            like=like,
        )

    def _eager_body(self, k: CallableDecl) -> Callable:
        """The stock callable plus what the contract adds around it (writeback of
        retained carries, pinned copies), inside the binding's eager section."""
        b = self.binding
        stock = b.stock_callables[k.name]
        retains = [(self.regions[r.region], r.steps) for r in k.retains]
        pins = [(b.decl.regions[w].site, self.regions[w]) for w in k.pins]

        def body(*args: Any, **kwargs: Any) -> Any:
            with b.eager_section(self):
                result = stock(*args, **kwargs)
                for carry, steps in retains:
                    result = replace_at(result, steps, carry.retain(get_at(result, steps)))
                for site, region in pins:
                    pin_at(b.model, site, region)
                return self._off_eager_scratch(result)

        return body

    def _off_eager_scratch(self, result: Any) -> Any:
        """With several lanes the model's sites hold the eager scratch, which the next
        eager call of any lane overwrites: a result that views it (a stock call
        returning its new cache as a view of a site buffer) is moved into this lane's
        region of the same name and layout before the eager section ends."""
        pool = self.binding.pool
        if pool is None or not pool.eager_scratch:
            return result
        scratch = {r.storage_ptr(): name for name, r in pool.eager_scratch.items()}

        def move(t: torch.Tensor) -> torch.Tensor:
            name = scratch.get(t.untyped_storage().data_ptr()) if t.numel() else None
            if name is None:
                return t
            dst = self.regions[name].moved_view(t, pool.eager_scratch[name].spec.shape)
            if dst is None:
                raise LayoutError(
                    f"region {name}: a stock result views the eager scratch in a way that does "
                    "not keep the region's strides; lanes of other shapes cannot hold it"
                )
            dst.copy_(t)
            return dst

        return map_tensors(result, move)

    def _write_through_names(self, k: CallableDecl) -> list[str]:
        """The regions ``k`` writes that sit at a model site (admission checks them)."""
        return [w for w in k.writes if self.binding.decl.regions[w].site is not None]

    def write_through_getters(self) -> dict[str, Callable[[], torch.Tensor]]:
        """Every replayed callable's write-through tensors (what a capture section saves
        beside the regions)."""
        names = {
            w: None
            for k in self._callables.values()
            if k.replay
            for w in self._write_through_names(k)
        }
        return self._write_through_getters(list(names))

    def _write_through_getters(self, names: list[str]) -> dict[str, Callable[[], torch.Tensor]]:
        return {w: (lambda w=w: self.write_through_tensor(w)) for w in names}

    def write_through_tensor(self, name: str) -> torch.Tensor:
        """What admission pointer-checks for a write-through region: the tensor at the
        model's site while this lane owns the sites (stock code could rebind it),
        otherwise the lane's own region (nothing else can reach it)."""
        if self.owns_sites:
            return get_at(self.binding.model, self.binding.decl.regions[name].site)  # type: ignore[arg-type]
        return self.regions[name].tensor

    def _write_through_reader(self, names: list[str]) -> Callable[[], list[torch.Tensor]]:
        """``write_through_tensor`` of every name at once, for admission's check on every
        call: the sites are read through one ``SiteReads`` (their rules checked once per
        chain of objects, shared prefixes walked once), not ``get_at`` each."""
        reads = SiteReads(self.binding.model, {n: self.binding.decl.regions[n].site for n in names})

        def read() -> list[torch.Tensor]:
            if self.owns_sites:
                return reads.read()
            return [self.regions[n].tensor for n in names]

        return read

    # ---------------------------------------------------------------- capture
    def capture(self, progress: bool = True) -> None:
        if self.pool is None and self.engines:
            self.pool = self.backend.new_pool(self.binding.device) if self._can_capture() else None
        with self.binding.capturing(self) as section:  # saves every region's contents
            for engine in self.engines.values():
                engine.pool = self.pool
                engine.capture_all(
                    progress=progress, between_classes=section.pause, keep_contents=()
                )
        self.captured = True
        # the declared capture set, then back to this lane's value
        key = self.key
        for value in self.binding.capture_keys:
            self.use(value, progress=progress)
        self.use(key)

    def _can_capture(self) -> bool:
        return self.backend.available(self.binding.device)

    # ------------------------------------------------------ session parameters
    def use(
        self,
        key: ParamKey,
        *,
        capture: bool | None = None,
        progress: bool = False,
        keep_contents: Container[str] | None = None,
    ) -> None:
        """Put this lane at parameter value ``key``, growing it for a larger one
        (lane_values.py); new graphs captured if the lane has captured (``capture``
        overrides). The caller holds the lane (a session's run, or bind).
        ``keep_contents``: the regions whose contents a capture here keeps (None: all;
        capture_state.py)."""
        use_value(
            self,
            key,
            capture=self.captured if capture is None else capture,
            progress=progress,
            keep_contents=keep_contents,
        )

    def held_values(self) -> frozenset | None:
        """The values whose graphs this lane holds, captured (None: every value, when no
        callable's graphs depend on the parameters)."""
        if not self._per_value:
            return None
        return frozenset(
            key
            for key, engines in self.values.values.items()
            if engines and all(e.captured for e in engines.values())
        )

    def size_for(self, keys: list[ParamKey], progress: bool = False) -> None:
        """Re-lay this lane's regions at the largest shape over ``keys`` (a session pool's
        lanes, at the values it serves: no value ever grows one in a step); its held
        values are captured again at the new addresses if they were captured."""
        from .lane_values import grow_to

        decl = self.binding.decl
        top = {n: widest(*(shape_at(decl, decl.regions[n], k) for k in keys)) for n in self.shapes}
        if any(widest(self.shapes[n], s) != self.shapes[n] for n, s in top.items()):
            grow_to(self, top, capture=self.captured, progress=progress)

    def _set_retention(self, key: ParamKey) -> None:
        for name, r in self.binding.decl.regions.items():
            if r.retention_shift and name in self.regions:
                self.regions[name].retention = retention_at(self.binding.decl, r, key)  # type: ignore[attr-defined]

    def engine_stats(self) -> dict[str, dict]:
        """Callable -> stats, over every parameter value captured here (params.py) and
        every value it ran eager while the pool captured it."""
        if not self.binding.decl.params:
            return {n: e.stats() for n, e in self.engines.items()}
        per_value = self.values.engine_stats()
        for key, engines in self.pending.items():
            for n, e in engines.items():
                per_value.setdefault(n, []).append((label(key), e.stats()))
        return {
            n: (
                merge_values(per_value[n])
                if n in self._per_value
                else merge_retired(self._retired_shared.get(n, []), e.stats())
            )
            for n, e in {
                **self._shared,
                **{n: self.engines[n] for n in self._per_value if n in self.engines},
            }.items()
        }

    # ------------------------------------------------------------------ calls
    def call(self, name: str, args: tuple, kwargs: dict, session: Any) -> Any:
        k = self._callables[name]
        convention = self._conventions[name]
        if convention is not None:
            args, kwargs = convention.normalise(args, kwargs)
        args_list = list(args)
        for a in k.aliased:
            container = args_list if a.container == "args" else kwargs
            update_at(container, a.steps, lambda t, a=a: self._adopt(a, t, session))
        for where, steps in k.layout_free:
            container = args_list if where == "args" else kwargs
            update_at(container, steps, _contiguous)
        fn = self.engines.get(name) or self.bodies[name]
        # hot callables are inference-only: a replay carries no autograd history
        with torch.inference_mode():
            return fn(*args_list, **kwargs)

    def _adopt(self, a: Aliased, t: Any, session: Any) -> Any:
        region = self.regions[a.region]
        if a.how == "slot" or not isinstance(t, torch.Tensor):
            return t  # a slot is read where the caller put it: admission pins its pointer
        if session is not None:
            loaded = session.load_into(a.region, region, t)
            if loaded is not None:
                return loaded
        if a.how == "carry":
            return region.adopt(t)  # type: ignore[attr-defined]
        return adopt_prefix(region, t)

    # -------------------------------------------------------------- telemetry
    def storages(self) -> dict[int, tuple["Lane", str]]:
        return {r.storage_ptr(): (self, n) for n, r in self.regions.items() if r.nbytes > 0}

    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.regions.values())


def _contiguous(t: Any) -> Any:
    """A `layout free` argument as the catalog describes it: contiguous, offset 0."""
    if isinstance(t, torch.Tensor) and (not t.is_contiguous() or t.storage_offset()):
        return t.clone(memory_format=torch.contiguous_format)
    return t
