"""A capture section: a lane's hold on the shared model while its graphs are captured.

``Binding.capturing`` (binding.py) opens one: the eager lock (a background capture
holds it one class at a time, ``pause()`` between two), the lane's generator as the
device default and the lane's regions at the model's sites, the lane's region
contents saved once for every engine captured inside (capture_state.py) and the
model's host scalars (state/object_tree.py: an offset the body advances, a flag it
sets, which the probe, warm-up and capture calls would leave moved by three calls) and
the tensors on the objects passed as object arguments (serving/state_objects.py); all
of it put back on exit, and the scalars at every pause too, so the eager steps that run
between two classes see the model as their own calls left it.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Container

import torch

from ..engine.backend import drawing_from
from ..engine.capture_state import RegionContents
from ..state.object_tree import HostScalars
from ..state.sites import get_at, set_at

if TYPE_CHECKING:
    from .binding import Binding


class CaptureSection:
    """``Binding.capturing``'s hold on the model: the eager lock, the lane's generator
    as the device default, the lane's regions at the sites."""

    def __init__(
        self, binding: Binding, lane: Any, keep_contents: Container[str] | None = None
    ) -> None:
        self.binding, self.lane = binding, lane
        self.keep_contents = keep_contents
        self._contents: RegionContents | None = None
        self._scalars: HostScalars | None = None
        self.scalars_put_back = 0
        self.pauses = 0
        self._stack: ExitStack | None = None
        self._swapped: list[tuple[Any, Any]] = []
        self._kept: dict[str, Any] = {}
        # only the outermost hold can let go: a capture inside a caller's eager
        # section (a plain binding's first use of a value) keeps the lock it came with
        self._outermost = not binding.eager_lock.held_here()

    def enter(self) -> None:
        self.binding.eager_lock.acquire()
        try:
            self._take_model()
            lane = self.lane
            self._contents = RegionContents(
                lane.regions, lane.write_through_getters(), self.keep_contents
            )
        except BaseException:
            self._give_model()
            self.binding.eager_lock.release()
            raise

    def exit(self) -> None:
        try:
            self._restore_scalars()
            if self._contents is not None:
                self._contents.restore()
        finally:
            try:
                self._give_model()
            finally:
                self.binding.eager_lock.release()  # last: the generator and the sites are back

    def pause(self) -> None:
        """Hand the eager lock to the next waiting eager section and take it back right
        after it (eager_lock.py), the sites and the generator put back meanwhile; a no-op
        unless this is the thread's outermost hold and somebody waits."""
        lock = self.binding.eager_lock
        if not self._outermost or not lock.waiting():
            return
        self._restore_scalars()
        self._give_model()
        try:
            lock.hand_over()
        finally:
            self._take_model()
        self.pauses += 1

    def _restore_scalars(self) -> None:
        if self._scalars is not None:
            self.scalars_put_back += self._scalars.restore()

    def _take_model(self) -> None:
        """The lane's generator as the device default, its regions at the sites."""
        b, lane = self.binding, self.lane
        self._stack = ExitStack()
        self._stack.enter_context(drawing_from(b.device, lane.rng))
        if b.device.type == "cuda":
            torch.cuda.synchronize(b.device)
        self._swapped = []
        self._kept = dict(b._site_tensors)
        self._scalars = HostScalars(b.model)
        if lane.owns_sites:
            # an object argument's members are rebound by every call the capture makes
            # (state_objects.py): the sites are put back as they were found
            for k in b.decl.callables:
                for o in k.objects:
                    obj = get_at(b.model, o.site)
                    self._swapped += [(o.site + at, get_at(obj, at)) for _, at in o.members]
        else:
            for r in b.decl.regions.values():
                if r.site is not None and r.install == "allocate":
                    self._swapped.append((r.site, get_at(b.model, r.site)))
                    set_at(b.model, r.site, lane.regions[r.name].tensor)
                    if r.name in b._site_tensors:  # a capture once sessions are served
                        b._site_tensors[r.name] = lane.regions[r.name].tensor

    def _give_model(self) -> None:
        b = self.binding
        for site, tensor in reversed(self._swapped):
            set_at(b.model, site, tensor)
        b._site_tensors = self._kept
        self._swapped = []
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
