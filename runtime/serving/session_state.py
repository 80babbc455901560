"""A session's state: its own copy of the per-session regions, and turn starts.

Contract of this layer (the state half of sessions.py's ``Session``). A session owns
its copy of every region of lifetime ``session`` or ``turn`` (``storage``), the
carries' host state (live length) beside it, and the turn start it restores. Between
steps its state attributes hold views of that copy; in a step they hold views of the
lane's regions:
  * ``load_into`` (Lane.call): an aliased argument that is the session's stored copy is
    loaded into the lane's region in place, at the same place;
  * ``_take_back`` (after the step): every tensor of the state attributes in lane
    memory moves back, a per-session region into the session's copy, scratch into a
    clone;
With session parameters the session's copy is at its value's shape and the lane's at
the largest value the lane serves: the same elements sit at other offsets, and every
view is moved between the two layouts (layouts.py) — one that cannot be moved makes
the session's copy take the lane's layout (``_places``, counted).
  * ``mark_turn_start``/``reset``/``_restore_turn_start``: the state a turn starts
    from, kept (shared under a key) and written back in place.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ..state.layouts import copy_block
from .params import spec_at
from ..state.regions import LayoutError, Region
from ..state.trees import map_tensors


class SessionError(RuntimeError):
    """A session was used wrongly (closed, or run twice at once)."""


@dataclass
class _TurnStart:
    """The state a turn starts from: cloned state attributes and carry host states.
    Tensor leaves that were a per-session region are tagged with its name, so a
    restore writes them into the restoring session's own copy of that region."""

    trees: dict[str, Any]
    tags: dict[int, tuple[str, tuple[int, ...]]]  # id(cloned leaf) -> region, its layout
    host_state: dict[str, tuple]
    nbytes: int


class SessionState:
    """The state half of ``Session`` (sessions.py): it sets ``pool``, ``obj``, ``state``,
    ``storage``, ``host_state``, ``params_key``, ``turn_key``, ``_pending_reset``,
    ``_turn_start`` and ``_relaid`` (old storage pointer -> (its shape, the copy now),
    for one take-back or restore)."""

    # -------------------------------------------------------- state movement
    def load_into(self, region_name: str, lane_region: Region, t: torch.Tensor) -> Any:
        """Lane.call: if ``t`` is this session's stored copy of ``region_name``, load it
        into the lane's region in place (the same elements, in the lane's layout) and
        return the lane's view; else None."""
        mine = self.storage.get(region_name)
        if mine is None or t.untyped_storage().data_ptr() != mine.storage_ptr():
            return None
        return lane_region.load(t, self.host_state.get(region_name), mine.spec.shape)

    def _storage(self, region_name: str, shape: tuple[int, ...] | None = None) -> Region:
        """The session's copy of ``region_name``, allocated at the session's value's shape
        (params.shape_at); or, given ``shape`` that it does not have, re-allocated at it
        with the contents kept (the fallback for a view that does not move between layouts:
        ``_places``)."""
        r = self.storage.get(region_name)
        if r is not None and (shape is None or r.spec.shape == shape):
            return r
        decl = self.pool.binding.decl
        spec = spec_at(decl, decl.regions[region_name], self.params_key)
        if shape is not None:
            spec = dataclasses.replace(spec, shape=shape)
        device = self.pool.state_device
        pinned = device.type == "cpu" and self.pool.device.type == "cuda"
        tensor = torch.zeros(spec.shape, dtype=spec.dtype, device=device, pin_memory=pinned)
        new = self.storage[region_name] = Region(spec, tensor)
        if r is not None:
            copy_block(r.tensor, new.tensor)
            self._relaid[r.storage_ptr()] = (r.spec.shape, new)
        return new

    def _places(self, name: str, views: list[tuple[torch.Tensor, tuple[int, ...]]]) -> list:
        """Where each view (of an allocation of region ``name`` at its layout) goes in the
        session's copy: the same elements (layouts.py). A view with no image there (one
        that does not keep the region's strides) re-allocates the copy at that view's
        layout, counted in the pool's ``layout_fallbacks``: correct, if larger."""
        mine = self._storage(name)
        dsts = [mine.moved_view(t, layout) for t, layout in views]
        if all(d is not None for d in dsts):
            return dsts
        layout = next(lay for (_, lay), d in zip(views, dsts) if d is None)
        mine = self._storage(name, shape=layout)
        with self.pool._lock:
            self.pool.counters["layout_fallbacks"] += 1
        dsts = [mine.moved_view(t, lay) for t, lay in views]
        if any(d is None for d in dsts):
            raise LayoutError(
                f"{self.name}: views of region {name} from allocations of different shapes, "
                "one of them not keeping the region's strides: serve it on lanes of one shape"
            )
        return dsts

    def _take_back(self) -> int:
        """Every tensor of the state attributes that lives in lane memory moves to the
        session: a per-session region into the session's copy (the same elements, in the
        session's layout), scratch into a clone. Returns the bytes copied."""
        if self.obj is None:
            return 0
        pool = self.pool
        where = pool._storage_of
        regions = pool.binding.decl.regions
        found: dict[str, dict[int, tuple[torch.Tensor, tuple[int, ...]]]] = {}

        def find(t: torch.Tensor) -> torch.Tensor:
            hit = where.get(t.untyped_storage().data_ptr()) if t.numel() else None
            if hit is not None and regions[hit[1]].per_session:
                lane, name = hit
                source = lane.regions[name] if lane is not None else pool.eager_scratch[name]
                found.setdefault(name, {})[id(t)] = (t, source.spec.shape)
            return t

        attrs = [a for a in self.state if hasattr(self.obj, a)]
        for attr in attrs:
            map_tensors(getattr(self.obj, attr), find)
        # first decide every region's layout (a fallback re-allocates), then copy
        placed = {}
        for name, views in found.items():
            placed.update(zip(views, self._places(name, list(views.values()))))
        copied = 0

        def take(t: torch.Tensor) -> torch.Tensor:
            nonlocal copied
            if not t.numel():
                return t
            ptr = t.untyped_storage().data_ptr()
            if ptr in self._relaid:  # a view of this session's copy before a fallback
                layout, now = self._relaid[ptr]
                moved = now.moved_view(t, layout)
                return moved if moved is not None else t
            hit = where.get(ptr)
            if hit is None:
                return t
            lane, name = hit
            copied += t.numel() * t.element_size()
            dst = placed.get(id(t))
            if dst is None:
                return t.clone()
            dst.copy_(t, non_blocking=True)  # complete when the step's stream syncs
            if lane is not None and name in lane.regions:
                self.host_state[name] = lane.regions[name]._host_state()
            return dst

        for attr in attrs:
            setattr(self.obj, attr, map_tensors(getattr(self.obj, attr), take))
        self._relaid.clear()
        return copied

    def _record_streams(self, lane: Any) -> None:
        """Tensors the session keeps were made on other lanes' streams: tell the
        allocator this lane uses them too, so a free during this step is not reused
        by another stream before this lane's work on it is done."""
        if lane.stream is None or self.obj is None:
            return

        def mark(t: torch.Tensor) -> torch.Tensor:
            if t.is_cuda:
                t.record_stream(lane.stream)
            return t

        for attr in self.state:
            if hasattr(self.obj, attr):
                map_tensors(getattr(self.obj, attr), mark)

    # ----------------------------------------------------------------- turns
    def mark_turn_start(self, key: Any = None) -> None:
        """Keep the session's current state as the state its turns start from (under
        ``key``: shared by every session opened with that key; first one wins)."""
        if self.obj is None:
            raise SessionError(f"{self.name} has no state attributes to keep")
        key = key if key is not None else self.turn_key
        if key is not None and key in self.pool._turn_starts:
            self._turn_start = self.pool._turn_starts[key]
            self.turn_key = key
            return
        tags: dict[int, tuple[str, tuple[int, ...]]] = {}
        nbytes = 0

        def keep(t: torch.Tensor) -> torch.Tensor:
            nonlocal nbytes
            for name, r in self.storage.items():
                if t.numel() and t.untyped_storage().data_ptr() == r.storage_ptr():
                    # keep the copy's layout: a restore writes the same elements
                    c = r.tensor.clone().as_strided(t.shape, t.stride(), t.storage_offset())
                    tags[id(c)] = (name, r.spec.shape)
                    nbytes += r.nbytes
                    return c
            nbytes += t.numel() * t.element_size()
            return t.clone()

        trees = {
            a: map_tensors(getattr(self.obj, a), keep, copy=True)
            for a in self.state
            if hasattr(self.obj, a)
        }
        snap = _TurnStart(trees, tags, dict(self.host_state), nbytes)
        self._turn_start = snap
        if key is not None:
            self.turn_key = key
            with self.pool._lock:
                self.pool._turn_starts.setdefault(key, snap)

    def reset(self) -> None:
        """Start a new turn: the turn-start state is restored at the next ``run``."""
        if self.closed:
            raise SessionError(f"{self.name} is closed")
        if self._turn_start is None and not self.pool.has_turn_start(self.turn_key):
            raise SessionError(f"{self.name} has no turn start: call mark_turn_start() first")
        self._pending_reset = True

    def _restore_turn_start(self) -> None:
        snap = self._turn_start or self.pool._turn_starts[self.turn_key]
        self._turn_start = snap

        kept: dict[str, list[torch.Tensor]] = {}

        def find(c: torch.Tensor) -> torch.Tensor:
            if id(c) in snap.tags:
                kept.setdefault(snap.tags[id(c)][0], []).append(c)
            return c

        for tree in snap.trees.values():
            map_tensors(tree, find, copy=True)
        placed = {}  # the session's copy may be at another value's shape than the snapshot's
        for name, cs in kept.items():
            views = [(c, snap.tags[id(c)][1]) for c in cs]
            placed.update(zip(map(id, cs), self._places(name, views)))
        self._relaid.clear()

        def put(c: torch.Tensor) -> torch.Tensor:
            dst = placed.get(id(c))
            if dst is None:
                return c.clone()
            dst.copy_(c)
            return dst

        for attr, tree in snap.trees.items():
            setattr(self.obj, attr, map_tensors(tree, put, copy=True))
        self.host_state = dict(snap.host_state)
        self._pending_reset = False
