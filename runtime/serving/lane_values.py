"""A lane at a session parameter's value: switching to it, and growing for it.

Contract of this layer. ``use_value`` (``Lane.use``) puts a lane at a value: its
carries' retention at that value and the engines of the callables whose graphs change
with it — kept ones, or new ones, captured here when the lane has captured before,
the least recently used value evicted past ``hold`` (params.ValueGraphs).

A lane's regions are at the largest value it has been asked to serve (lane.py): at
bind the bound value and the declared capture values, so a plain binding at the
default allocates what the contract at its default needs and nothing more. A value
whose regions are larger in some dim makes ``grow`` re-lay the lane at the per-dim
largest of the two:

  1. every engine of the lane is released (its graphs alias the old addresses) and its
     counters kept (``ValueGraphs.retire_all`` / the shared ones here);
  2. every region whose shape changes is allocated anew and keeps its contents (the
     elements at the same multi-index: a carry's live frames, a turn region's state)
     and a carry its host state and counters; regions whose shape does not change stay;
  3. the lane that owns the model's sites (lane 0, one lane) puts the new regions there
     (a carry's view at its site moved to the new carry); with several lanes the eager
     scratch at the sites grows to hold this lane's largest value too (eager code of
     any lane runs there), inside the eager lock, after the last eager section's work;
  4. the bodies and engines are rebuilt at the new value, and captured again if the
     lane had captured (the capture ``use`` does for a new value), counted as a
     ``regrow`` with its time in the lane's parameter stats.
The caller holds the lane (a session's run or a plain binding's ``use``), so no step
of another session sees the lane mid-grow.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Container

import torch

from ..state.layouts import copy_block
from .params import ParamKey, label, shape_at, widest
from ..state.regions import Region
from ..engine.signature import VALUE_NOT_CAPTURED
from ..state.sites import get_at, set_at, update_at

if TYPE_CHECKING:
    from .lane import Lane

_CARRY_COUNTERS = ("retains", "adoptions", "restores", "audit_checks", "audit_divergences")


def use_value(
    lane: "Lane",
    key: ParamKey,
    *,
    capture: bool,
    progress: bool,
    keep_contents: Container[str] | None = None,
) -> None:
    """``Lane.use`` (module docstring). The caller holds the lane (a session's own run,
    or bind), so no other session's run sees this capture.

    Without ``capture`` a value the lane does not hold gets engines that capture nothing
    (its calls run eager, counted ``value_not_captured``) and are not kept: a session
    pool's steps never capture (the pool captures between steps, lane_scheduler.py) and
    never evict a value whose graphs the lane holds."""
    b = lane.binding
    if not b.decl.params:
        return
    if key == lane.key and not (capture and lane.uncaptured):
        return  # at it already (or, asked not to capture, at its uncaptured engines)
    if outgrown(lane, key):  # a larger value: new regions, every engine rebuilt
        grow(lane, key, capture=capture, progress=progress, keep_contents=keep_contents)
        return
    engines = lane.values.get(key)
    if engines is None and not capture and lane.captured:
        _use_uncaptured(lane, key)
        return
    _retire_pending(lane, key)  # captured here from now on: its eager engines' counts kept
    if engines is None:
        engines = {
            n: lane._engine(lane._callables[n], key) for n in lane._per_value if n in lane.engines
        }
        if capture:
            t0 = time.perf_counter()
            with b.capturing(lane, keep_contents) as section:
                lane._set_retention(key)
                for i, engine in enumerate(engines.values()):
                    if i:
                        section.pause()  # between two engines too, as between classes
                    engine.pool = lane.pool
                    engine.capture_all(
                        progress=progress, between_classes=section.pause, keep_contents=()
                    )
            lane.values.captures += 1
            lane.values.capture_s += time.perf_counter() - t0
        lane.values.put(key, engines)
    lane._set_retention(key)
    lane.engines = {**lane._shared, **engines}
    lane.key, lane.uncaptured = key, False


# engines of values a lane runs eager, kept for their counters (and reused) until the
# value is captured on the lane; past this many the oldest are folded into its stats
PENDING_LIMIT = 64


def _use_uncaptured(lane: "Lane", key: ParamKey) -> None:
    """The lane at ``key`` with engines that capture nothing: the step runs eager."""
    engines = lane.pending.pop(key, None)
    if engines is None:
        engines = {
            n: lane._engine(lane._callables[n], key) for n in lane._per_value if n in lane.engines
        }
        for engine in engines.values():
            engine.uncaptured_reason = VALUE_NOT_CAPTURED
    lane.pending[key] = engines
    while len(lane.pending) > PENDING_LIMIT:
        _retire_pending(lane, next(iter(lane.pending)))
    lane._set_retention(key)
    lane.engines = {**lane._shared, **engines}
    lane.key, lane.uncaptured = key, True


def _retire_pending(lane: "Lane", key: ParamKey) -> None:
    engines = lane.pending.pop(key, None)
    if engines:
        lane.values.retired.append((label(key), {n: e.stats() for n, e in engines.items()}))


def outgrown(lane: "Lane", key: ParamKey) -> bool:
    """Whether a region at ``key`` is larger, in any dim, than the lane's."""
    decl = lane.binding.decl
    return any(
        widest(shape_at(decl, r, key), lane.shapes[n]) != lane.shapes[n]
        for n, r in decl.regions.items()
        if r.shape_shift and n in lane.regions
    )


def grow(
    lane: "Lane",
    key: ParamKey,
    *,
    capture: bool,
    progress: bool,
    keep_contents: Container[str] | None = None,
) -> None:
    decl = lane.binding.decl
    shapes = {n: widest(s, shape_at(decl, decl.regions[n], key)) for n, s in lane.shapes.items()}
    grow_to(lane, shapes, key, capture=capture, progress=progress, keep_contents=keep_contents)


def grow_to(
    lane: "Lane",
    shapes: dict[str, tuple[int, ...]],
    key: ParamKey | None = None,
    *,
    capture: bool,
    progress: bool,
    keep_contents: Container[str] | None = None,
) -> None:
    """Re-lay ``lane`` at ``shapes`` (module docstring) and put it at ``key`` (default: its
    value now); the values it held are captured again at the new addresses."""
    b = lane.binding
    t0 = time.perf_counter()
    decl = b.decl
    key = lane.key if key is None else key
    again = [k for k in lane.values.values if k != key] if capture else []
    lane.shapes = {n: widest(s, shapes.get(n, s)) for n, s in lane.shapes.items()}
    _retire_engines(lane)
    if capture and lane.pool is not None:
        # every graph of the old pool is gone: capturing into it again trips the
        # caching allocator (a pool whose last graph was freed is released)
        lane.pool = lane.backend.new_pool(b.device)
    lane.key = key
    old = lane.regions
    new = dict(old)
    for name, region in old.items():
        r = decl.regions[name]
        if r.install in ("carry", "allocate") and lane.shapes[name] != region.spec.shape:
            new[name] = lane.new_region(r)
            _carry_over(region, new[name])
    with b.eager_lock:  # the sites and the eager scratch are every lane's eager memory
        if b.device.type == "cuda" and b._eager_done is not None:
            torch.cuda.current_stream(b.device).wait_event(b._eager_done)
        if lane.owns_sites:
            _reinstall(lane, old, new)
        elif b.pool is not None:
            _grow_scratch(b, lane.shapes)
    lane.regions = new
    lane.uncaptured = False
    lane._make_callables()
    lane._set_retention(key)
    engines = list(lane.engines.values())
    if capture:
        with b.capturing(lane, keep_contents) as section:
            for engine in engines:
                engine.pool = lane.pool
                engine.capture_all(
                    progress=progress, between_classes=section.pause, keep_contents=()
                )
    for held in again:  # what the lane held before, at the new addresses
        use_value(lane, held, capture=True, progress=progress, keep_contents=keep_contents)
    use_value(lane, key, capture=capture, progress=progress, keep_contents=keep_contents)
    if b.pool is not None:
        b.pool._storage_of = b.pool._lane_storages()
    lane.values.regrows += 1
    lane.values.regrow_s += time.perf_counter() - t0


def _retire_engines(lane: "Lane") -> None:
    """Release every engine, keeping its counters: the per-value ones as evicted values
    (params.ValueGraphs), the shared ones here (``merge_retired``)."""
    lane.values.retire_all()
    for name, engine in lane._shared.items():
        lane._retired_shared.setdefault(name, []).append(engine.stats())
        engine.release()


def _carry_over(old: Region, new: Region) -> None:
    """``new`` (larger) takes ``old``'s contents at the same multi-indices, and a carry
    its live length, ring position, counters and the turn snapshot it kept."""
    copy_block(old.tensor, new.tensor)
    new._set_host_state(old._host_state())
    if hasattr(old, "retention"):
        for counter in _CARRY_COUNTERS:
            setattr(new, counter, getattr(old, counter))
        new.audit_records = list(old.audit_records)  # type: ignore[attr-defined]
        saved = old._saved  # type: ignore[attr-defined]
        if saved is not None:
            spec = dataclasses.replace(saved.spec, shape=new.spec.shape)
            new._saved = Region.allocate(spec, new.device)  # type: ignore[attr-defined]
            copy_block(saved.tensor, new._saved.tensor)  # type: ignore[attr-defined]
            new._saved_state = old._saved_state  # type: ignore[attr-defined]


def _reinstall(lane: "Lane", old: dict[str, Region], new: dict[str, Region]) -> None:
    """Lane 0 owns the model's sites: the grown regions go there (the stock reads its
    scratch and carries through them), a carry's view at its site moved along."""
    b = lane.binding
    for name, region in new.items():
        r = b.decl.regions[name]
        if region is old[name] or r.site is None:
            continue
        if r.install == "allocate":
            set_at(b.model, r.site, region.tensor)
            if name in b._site_tensors:
                b._site_tensors[name] = region.tensor
        else:  # a carry: its site holds a view of the old carry (or the stock's tensor)
            before = old[name]

            def move(t: Any, before=before, region=region) -> Any:
                if not isinstance(t, torch.Tensor) or t.numel() == 0:
                    return t
                if t.untyped_storage().data_ptr() != before.storage_ptr():
                    return t
                moved = region.moved_view(t, before.spec.shape)
                return moved if moved is not None else t

            try:
                update_at(b.model, r.site, move)
            except (KeyError, AttributeError, IndexError, TypeError):
                pass  # the site is not there (yet): nothing views the old carry


def _grow_scratch(b: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    """The eager scratch at the model's sites holds every lane's largest value."""
    pool = b.pool
    for name, scratch in list(pool.eager_scratch.items()):
        want = widest(scratch.spec.shape, shapes[name])
        if want == scratch.spec.shape:
            continue
        grown = Region.allocate(dataclasses.replace(scratch.spec, shape=want), b.device)
        copy_block(scratch.tensor, grown.tensor)
        site = b.decl.regions[name].site
        if get_at(b.model, site) is scratch.tensor:
            set_at(b.model, site, grown.tensor)
        if name in b._site_tensors:
            b._site_tensors[name] = grown.tensor
        pool.eager_scratch[name] = grown


def merge_retired(retired: list[dict], now: dict) -> dict:
    """A shared engine's stats with those of the engines a grow dropped before it."""
    if not retired:
        return now
    from ..telemetry import merge_lane_stats

    out = dict(merge_lane_stats([*retired, now]))
    out.pop("lanes", None)
    return out
