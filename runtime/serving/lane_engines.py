"""How a lane builds its engines (lane.py): per callable, the eager body (the stock
callable with the contract's writeback and pins around it, inside the binding's eager
section) and an ``ExactShapeReplay`` at a parameter value, with the write-through
tensors admission checks on every call.

``LaneEngines`` is a part of ``Lane``, reading the state ``Lane.__init__`` creates
(``binding``, ``regions``, ``bodies``, ``engines``, ``owns_sites``, ...).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..engine.replay import ExactShapeReplay
from ..state.counters import HostCounter
from ..state.guards import guard_at
from ..state.pins import pin_at
from ..state.regions import LayoutError
from ..state.site_reads import SiteReads
from ..state.sites import format_path, get_at, replace_at, set_at
from ..state.trees import map_tensors
from .declared import CallableDecl
from .state_objects import BoundObjects
from .params import ParamKey, classes_at


class LaneError(RuntimeError):
    """A contract's state cannot be given to a second lane (stock or pinned regions,
    host counters at a shared site): such a binding serves sessions on one lane."""


class LaneEngines:
    def _make_callable(self, k: CallableDecl) -> None:
        if k.counters and not self.owns_sites:
            raise LaneError(
                f"callable {k.name} keeps host counters at model sites: a second lane "
                "would share them; serve sessions on one lane"
            )
        if k.objects:
            if not self.owns_sites:
                raise LaneError(
                    f"callable {k.name} is passed objects the model holds (a cache): a second "
                    "lane would share them; serve sessions on one lane"
                )
            self.objects[k.name] = BoundObjects(k, self.regions, self.binding.model)
            self.objects[k.name].check_bound()
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
                    staged=c.staged,
                    tracks=c.tracks,
                )
                for c in k.counters
            ],
            guards=[guard_at(b.model, g.site, g.value) for g in k.guards],
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
        rows = k.batch.row_ops() if b.batch > 1 and k.batch is not None else {}
        objects = self.objects.get(k.name)

        def body(*args: Any, **kwargs: Any) -> Any:
            with b.eager_section(self):
                held: list = []
                if objects is not None:
                    kwargs, held = objects.repack(kwargs)
                if rows:
                    # the ops no proof found batch-invariant, one session at a time; a
                    # capture records the per-row kernels, so replay runs them so too
                    with b.rows.mode(rows, b.batch):
                        result = stock(*args, **kwargs)
                else:
                    result = stock(*args, **kwargs)
                for carry, steps in retains:
                    result = replace_at(result, steps, carry.retain(get_at(result, steps)))
                for site, region in pins:
                    pin_at(b.model, site, region)
                result = self._off_eager_scratch(result)
                if objects is not None:
                    return result, objects.write_back(held)
                return result

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
