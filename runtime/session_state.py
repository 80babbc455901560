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
  * ``mark_turn_start``/``reset``/``_restore_turn_start``: the state a turn starts
    from, kept (shared under a key) and written back in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .regions import Region
from .trees import map_tensors


class SessionError(RuntimeError):
    """A session was used wrongly (closed, or run twice at once)."""


@dataclass
class _TurnStart:
    """The state a turn starts from: cloned state attributes and carry host states.
    Tensor leaves that were a per-session region are tagged with its name, so a
    restore writes them into the restoring session's own copy of that region."""

    trees: dict[str, Any]
    tags: dict[int, str]  # id(cloned leaf) -> region name
    host_state: dict[str, tuple]
    nbytes: int


class SessionState:
    """The state half of ``Session`` (sessions.py): it sets ``pool``, ``obj``, ``state``,
    ``storage``, ``host_state``, ``turn_key``, ``_pending_reset`` and ``_turn_start``."""

    # -------------------------------------------------------- state movement
    def load_into(self, region_name: str, lane_region: Region, t: torch.Tensor) -> Any:
        """Lane.call: if ``t`` is this session's stored copy of ``region_name``, load it
        into the lane's region in place and return the lane's view; else None."""
        mine = self.storage.get(region_name)
        if mine is None or t.untyped_storage().data_ptr() != mine.storage_ptr():
            return None
        return lane_region.load(t, self.host_state.get(region_name))

    def _storage(self, region_name: str) -> Region:
        r = self.storage.get(region_name)
        if r is None:
            spec = self.pool.binding.decl.regions[region_name].spec
            device = self.pool.state_device
            pinned = device.type == "cpu" and self.pool.device.type == "cuda"
            tensor = torch.zeros(spec.shape, dtype=spec.dtype, device=device, pin_memory=pinned)
            r = self.storage[region_name] = Region(spec, tensor)
        return r

    def _take_back(self) -> int:
        """Every tensor of the state attributes that lives in lane memory moves to the
        session: a per-session region into the session's copy (same layout), scratch
        into a clone. Returns the bytes copied."""
        if self.obj is None:
            return 0
        where = self.pool._storage_of
        regions = self.pool.binding.decl.regions
        copied = 0

        def take(t: torch.Tensor) -> torch.Tensor:
            nonlocal copied
            hit = where.get(t.untyped_storage().data_ptr()) if t.numel() else None
            if hit is None:
                return t
            lane, name = hit
            copied += t.numel() * t.element_size()
            if regions[name].per_session:
                dst = self._storage(name).same_view(t)
                dst.copy_(t, non_blocking=True)  # complete when the step's stream syncs
                if lane is not None and name in lane.regions:
                    self.host_state[name] = lane.regions[name]._host_state()
                return dst
            return t.clone()

        for attr in self.state:
            if hasattr(self.obj, attr):
                setattr(self.obj, attr, map_tensors(getattr(self.obj, attr), take))
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
        tags: dict[int, str] = {}
        nbytes = 0

        def keep(t: torch.Tensor) -> torch.Tensor:
            nonlocal nbytes
            c = t.clone()
            nbytes += c.numel() * c.element_size()
            for name, r in self.storage.items():
                if t.numel() and t.untyped_storage().data_ptr() == r.storage_ptr():
                    # keep the region's layout: a restore writes the same view
                    c = r.tensor.clone().as_strided(t.shape, t.stride(), t.storage_offset())
                    tags[id(c)] = name
            return c

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

        def put(c: torch.Tensor) -> torch.Tensor:
            name = snap.tags.get(id(c))
            if name is None:
                return c.clone()
            dst = self._storage(name).same_view(c)
            dst.copy_(c)
            return dst

        for attr, tree in snap.trees.items():
            setattr(self.obj, attr, map_tensors(tree, put, copy=True))
        self.host_state = dict(snap.host_state)
        self._pending_reset = False
