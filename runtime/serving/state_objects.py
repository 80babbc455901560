"""Object arguments on a lane: a vendor's cache object keyed by its member regions.

A callable declared with ``kwarg past: site cache`` (compiler/objects.py) is passed
the object the model holds at ``cache`` (a transformers ``DynamicCache``, a
``MimiConv1dPaddingCache``). The vendor rebinds the object's tensors on every call
(``self.keys = torch.cat(...)[..., -w:, :]``, ``padding_cache[i] = x[..., -p:]``), so
a graph captured over it would read the capture call's tensors forever. Here:

  * ``Lane.call`` replaces the object by its members ``{"R": tensor}`` (``unpack``)
    before the call is keyed, so the catalog sees the tensors at the regions' own
    addresses; an object that is not the model's own (a second cache the caller
    made) is left as it is: it cannot be keyed, and the call runs eager, counted;
  * the eager body puts the members back on the object and calls the stock code
    with it (``repack``); afterwards (``write_back``) a *pinned* member is copied back
    in place (``pins.pin_at``, as for any pinned region) and a *carry* member is
    written back under its retention (the carry's ``retain``), the object then
    holding the carry's view. Inside a capture both copies are recorded, so every
    replay leaves the new state at the same addresses;
  * the carry views are returned beside the result (a graph's outputs: the same view
    objects on every replay of a class) and ``rebind`` puts them on the object with
    the carry's live length, which a replay does not run Python to set.
"""

from __future__ import annotations

from typing import Any

import torch

from ..state.carry import CarryRegion
from ..state.pins import pin_at
from ..state.regions import Region
from ..state.site_reads import SiteReads
from ..state.sites import format_path, get_at, replace_at, set_at
from .declared import CallableDecl

Members = list[tuple[Region, tuple]]


class BoundObjects:
    """One callable's object arguments on one lane (module docstring)."""

    def __init__(self, decl: CallableDecl, regions: dict[str, Region], model: Any) -> None:
        self.model = model
        self.objects = [(o, [(regions[name], at) for name, at in o.members]) for o in decl.objects]
        self.names = [[name for name, _ in o.members] for o in decl.objects]  # unpack's keys
        # every call reads each object and its members at their model sites: through one
        # SiteReads each (the path rules checked once per chain of objects, not per read)
        self.reads = [
            SiteReads(model, {"": o.site, **{name: o.site + at for name, at in o.members}})
            for o in decl.objects
        ]

    def check_bound(self) -> None:
        """At bind: every carry member is a tensor on the object (a lazily initialized
        cache would replace it on its first call, behind the carry's back)."""
        for o, members in self.objects:
            obj = get_at(self.model, o.site)
            for region, at in members:
                if isinstance(region, CarryRegion) and not isinstance(
                    get_at(obj, at), torch.Tensor
                ):
                    raise ValueError(
                        f"region {region.name}: the object at {format_path(o.site)} holds no tensor "
                        f"at {format_path(at)} at bind; initialize the cache before bind() "
                        "(e.g. each layer's keys and values as empty tensors of the region's dims)"
                    )

    # ---------------------------------------------------------------- Lane.call
    def unpack(self, kwargs: dict) -> list[tuple[Any, Members]]:
        """Replace each model-held object in ``kwargs`` by its member tensors; the
        objects replaced, with their members (for ``rebind``)."""
        replaced = []
        for (o, members), reads, names in zip(self.objects, self.reads, self.names):
            obj = get_at(kwargs, o.steps)
            held, *values = reads.read()
            if obj is not held:
                continue  # a foreign object: unkeyable, so eager (counted by the engine)
            set_at(kwargs, o.steps, dict(zip(names, values)))
            replaced.append((obj, members))
        return replaced

    def rebind(self, replaced: list[tuple[Any, Members]], views: tuple) -> None:
        """Put the carry views a call returned on the objects it was passed."""
        carries = iter(views)
        for obj, members in replaced:
            for region, at in members:
                if isinstance(region, CarryRegion):
                    view = next(carries, None)
                    if view is None:
                        return  # the body ran on a foreign object: nothing was written
                    set_at(obj, at, view)
                    region.length = view.shape[region.spec.axis]  # type: ignore[index]

    # ------------------------------------------------------------ the eager body
    def repack(self, kwargs: dict) -> tuple[dict, list[tuple[Any, Members]]]:
        """The stock call's kwargs: each member dict back into its object, the object's
        members set from it (the regions' views a capture materialised, or what
        ``unpack`` read); the objects repacked."""
        held = []
        for o, members in self.objects:
            given = get_at(kwargs, o.steps)
            if type(given) is not dict:
                continue
            obj = get_at(self.model, o.site)
            for region, at in members:
                set_at(obj, at, given[region.name])
            kwargs = replace_at(kwargs, o.steps, obj)
            held.append((obj, members))
        return kwargs, held

    def write_back(self, held: list[tuple[Any, Members]]) -> tuple:
        """After the stock call: each member the vendor rebound back at its region's
        address — a pinned one copied in place (``pin_at``), a carry written back under
        its retention — and put back on the object; the carry views."""
        views = []
        for obj, members in held:
            for region, at in members:
                if not isinstance(region, CarryRegion):
                    pin_at(obj, at, region)
                    continue
                now = get_at(obj, at)
                if not (isinstance(now, torch.Tensor) and region._is_own_view(now)):
                    now = region.retain(now)
                set_at(obj, at, now)
                views.append(now)
        return tuple(views)
