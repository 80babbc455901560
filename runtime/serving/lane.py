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

from ..engine.backend import CudaGraphBackend, FakeGraphBackend, GraphBackend, lane_generator
from ..engine.calls import convention_of
from ..engine.replay import ExactShapeReplay
from ..state.carry import CarryRegion
from ..state.regions import Region, adopt_prefix
from ..state.sites import get_at, has_site, set_at, update_at
from .declared import Aliased
from .lane_engines import LaneEngines, LaneError
from .lane_values import merge_retired, use_value
from .state_objects import BoundObjects
from .params import (
    ParamKey,
    ValueGraphs,
    depends,
    label,
    merge_values,
    retention_at,
    shape_at,
    widest,
)

if TYPE_CHECKING:
    from .binding import Binding


class Lane(LaneEngines):
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
        self.objects: dict[str, BoundObjects] = {}  # callables' object arguments
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
        members = {n for k in b.decl.callables for o in k.objects for n, _ in o.members}
        for r in b.decl.regions.values():
            if r.install == "declared":
                continue
            if r.install == "carry":
                carry = self.new_region(r)
                if (
                    self.owns_sites
                    and r.site is not None
                    and has_site(model, r.site)
                    and get_at(model, r.site) is not None  # an object's member: state_objects
                ):
                    update_at(model, r.site, carry.adopt)
                self.regions[r.name] = carry
            elif r.install == "pinned" and r.initial is not None:
                self.regions[r.name] = _pinned_zeros(self, r)
            elif r.name in members and get_at(model, r.site) is None:  # type: ignore[arg-type]
                # an object's member the vendor makes on its first call (`padding_cache[i]
                # is None`): that call runs eager, and the value is pinned into this region
                self.regions[r.name] = _pinned_zeros(self, r, create_site=False)
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
        objects = self.objects.get(name)
        replaced = objects.unpack(kwargs) if objects is not None else []
        for a in k.aliased:
            container = args_list if a.container == "args" else kwargs
            update_at(container, a.steps, lambda t, a=a: self._adopt(a, t, session))
        for where, steps in k.layout_free:
            container = args_list if where == "args" else kwargs
            update_at(container, steps, _contiguous)
        fn = self.engines.get(name) or self.bodies[name]
        # hot callables are inference-only: a replay carries no autograd history
        with torch.inference_mode():
            out = fn(*args_list, **kwargs)
        if objects is not None:
            out, views = out
            objects.rebind(replaced, views)
        return out

    def _adopt(self, a: Aliased, t: Any, session: Any) -> Any:
        region = self.regions[a.region]
        if a.how == "slot" or not isinstance(t, torch.Tensor):
            return t  # a slot is read where the caller put it: admission pins its pointer
        if session is None and a.how != "carry" and t is region.tensor:
            return t  # the region's own tensor (every replayed call): admission checks it
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


def _pinned_zeros(lane: Lane, r: Any, create_site: bool = True) -> Region:
    """A pinned region that starts as zeros (`initial zeros`): allocated compact at
    its demand shape, holding the stock's state where the site already exists (the
    stock's view may keep a whole activation alive), and put at the site, creating it
    where it is absent (what the stock's first call would read: zeros). With
    ``create_site`` False the site is left as it is (it holds None until the stock's
    first call makes the value, which the callable's pin then copies in)."""
    b = lane.binding
    if not lane.owns_sites:
        raise LaneError(
            f"region {r.name} is pinned at its site: a second lane cannot have its own; "
            "serve sessions on one lane"
        )
    region = Region.allocate(r.spec, b.device)
    if has_site(b.model, r.site) and get_at(b.model, r.site) is not None:
        with torch.no_grad():
            region.tensor.copy_(get_at(b.model, r.site))
    if create_site:
        set_at(b.model, r.site, region.tensor)
    return region


def _contiguous(t: Any) -> Any:
    """A `layout free` argument as the catalog describes it: contiguous, offset 0."""
    if isinstance(t, torch.Tensor) and (not t.is_contiguous() or t.storage_offset()):
        return t.clone(memory_format=torch.contiguous_format)
    return t
