"""An engine's capture (replay.py): every catalog class probed, warmed and captured
once, in the order generated code fixed, transparently (capture_state.py).

``CaptureSteps`` is a part of ``ExactShapeReplay``, not a class of its own: it reads and
sets the engine's state (``self.classes``, ``self._entries``, ``self._groups``, ...)
that ``ExactShapeReplay.__init__`` creates.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Container

import torch

from ..progress import capture_progress
from ..state.counters import at_start
from ..telemetry import LOGGER
from . import host_program
from . import signature as R
from .ambient import ambient_state
from .capture_state import CaptureSnapshot
from .classes import materialize
from ..controls import replay_enabled
from .effects import Effect, classify, host_rng_snapshot
from .outputs import OutputPlan
from .replay_entry import Entry, buffer_key
from .signature import CatalogDispatch, is_unkeyable, signature_and_leaves
from .staging import UnstagedUse

if TYPE_CHECKING:
    from .replay import ExactShapeReplay


class CaptureSteps:
    def capture_all(
        self,
        progress: bool = True,
        between_classes: Callable[[], None] | None = None,
        keep_contents: Container[str] | None = None,
    ) -> "ExactShapeReplay":
        """``between_classes``: called before every class after the first (a background
        capture lets waiting eager steps run there: capture_section.CaptureSection.pause).
        ``keep_contents``: the regions whose contents capture saves and puts back (None:
        every one; a lane's capture section saves them itself: capture_state.py)."""
        if self.captured:
            return self  # capture happens once per binding
        if not replay_enabled():
            LOGGER.info("%s: replay disabled, nothing captured", self.name)
            return self
        self.captured = True
        if self.like is not None and self.like.rejected is not None:
            self.rejected = self.like.rejected
        if not self.backend.available(self.device):
            self.rejected = R.NO_CUDA
            for e in self._entries:
                e.status = "rejected"
            LOGGER.info("%s: no CUDA on %s; every call runs eager", self.name, self.device)
            return self
        if self.pool is None:
            self.pool = self.backend.new_pool(self.device)
        self._wt = [(n, buffer_key(g())) for n, g in self.write_through.items()]
        self._wt_keys = [key for _, key in self._wt]
        snap = CaptureSnapshot(
            self.regions,
            self.write_through,
            self.host_values,
            self.backend,
            self.device,
            keep=keep_contents,
        )
        gen = torch.Generator(device=self.device)
        gen.manual_seed(0)  # staging fill only; never the global generators
        n = len(self.ambient)
        try:
            with capture_progress(
                progress, f"capturing {self.name}", len(self._entries)
            ) as advance:
                for i in range(len(self.classes)):
                    if i and between_classes is not None:
                        between_classes()
                    self._capture_class(self._entries[i * n : (i + 1) * n], gen, snap, advance)
        finally:
            # region and write-through contents come back once, after the last class
            # (capture reads addresses, not values); RNG, counters and host state are
            # put back after every eager call, so every class starts from the same
            snap.restore()
        # a signature is admitted while one of its classes is captured; the key is the
        # signature itself, which names its group of entries
        keys = {
            sig: sig
            for sig, group in self._groups.items()
            if any(self._entries[i].status == "captured" for i in group)
        }
        failed = {sig: R.CAPTURE_FAILED for sig in self._groups if sig not in keys}
        self._dispatch = CatalogDispatch(keys, dropped=failed)
        s = self.stats()
        LOGGER.info(
            "%s: captured %d/%d classes in %.3f s (+%.3f s warm-up), effect %s%s",
            self.name,
            sum(e.status == "captured" for e in self._entries),
            len(self._entries),
            s["capture_s"],
            s["warmup_s"],
            s["effect"],
            f", rejected: {self.rejected}" if self.rejected else "",
        )
        return self

    def _capture_class(
        self, variants: list[Entry], gen: torch.Generator, snap: CaptureSnapshot, advance: Callable
    ) -> None:
        """Materialise one class's inputs once; capture it under each ambient state."""
        cls = variants[0].cls
        args, kwargs, aliased_ids = materialize(cls, self.regions, self.device, gen)
        sig, leaves = signature_and_leaves(args, kwargs)
        aliased = [(i, t.data_ptr()) for i, t in enumerate(leaves) if id(t) in aliased_ids]
        staged = [(i, t) for i, t in enumerate(leaves) if id(t) not in aliased_ids]
        for e in variants:
            if self.rejected is not None:
                e.status = "rejected"
            elif is_unkeyable(sig):
                e.status, e.detail = "failed", f"unkeyable argument {sig[1]}"
                LOGGER.warning("%s[%s]: %s", self.name, e.name, e.detail)
            else:
                self._enter_group(e, sig, aliased, staged)
                self._capture_one(e, args, kwargs, snap)
            advance()

    def _enter_group(self, e: Entry, sig: tuple, aliased: list, staged: list) -> None:
        for j in self._groups.get(sig, ()):
            other = self._entries[j]
            if other.aliased == aliased and other.ambient == e.ambient:
                raise ValueError(
                    f"{self.name}: classes {other.cls.name!r} and {e.cls.name!r} have the "
                    "same signature, alias the same pointers and share an ambient state"
                )
        e.sig, e.aliased, e.staged = sig, aliased, staged
        self._groups.setdefault(sig, []).append(e.index)

    def _capture_one(self, e: Entry, args: tuple, kwargs: dict, snap: CaptureSnapshot) -> None:
        dev = self.device
        try:
            # the declared ambient state holds for probe, warm-up and capture; its key
            # is read before the engine's own torch-function mode (hoist.py) is entered
            with torch.no_grad(), e.ambient.context(dev.type):
                e.ambient_key = ambient_state(dev.type)
                e.inputs = (args, kwargs)
                with self.host_constants:
                    captured = self._probe_and_capture(e, args, kwargs, snap)
        except UnstagedUse as exc:  # the contract's mistake: no class of it replays
            self._reject(R.STALE_HOST_VALUE, f"class {e.name}: {exc}")
            e.status = "rejected"
            return
        except Exception as exc:  # fail closed: this class stays eager
            e.status, e.detail = "failed", f"{type(exc).__name__}: {exc}"
            LOGGER.warning(
                "%s[%s]: capture failed (%s); class runs eager", self.name, e.name, e.detail
            )
            return
        finally:
            snap.restore(buffers=False)
        if not captured:
            return
        kept = [r.storage_ptr() for r in self.regions.values()]
        kept += [g().untyped_storage().data_ptr() for g in self.write_through.values()]
        e.plan = OutputPlan(e.captured.outputs, kept)
        e.inputs = (args, kwargs)
        e.status = "captured"

    def _probe_and_capture(
        self, e: Entry, args: tuple, kwargs: dict, snap: CaptureSnapshot
    ) -> bool:
        """Probe (effect classification), warm up, capture. False: rejected.

        For the engine's first class, the one that warms up, the last warm-up call is
        recorded (host_program.py) and the capture is checked against it: a host value
        that changed between them (a position from a host offset, an attribute rebound
        to a new tensor each call, a branch on a Python counter) is what the graph would
        freeze, so the callable is refused (``stale_host_value``), named, on every
        backend. Declared counters, RNG and regions are put back between the calls, so
        they never show here. One class per callable: the Python that turns host state
        into kernel arguments is the callable's, whatever the shapes, and recording
        every class doubled Token2Wav's capture at bind on the H200 (8.2 -> 18.2 s)."""
        dev, b = self.device, self.backend
        t0 = time.perf_counter()
        staging = self.staging
        if staging is not None:
            # every eager call here makes the class's staged buffers (the last one's
            # stay); the capture reads them (staging.py)
            e.stage_uses = staging.new_uses()
            eager_fn = staging.call(self.fn, e.stage_uses, making=True)
            e.capture_fn = staging.call(self.fn, e.stage_uses, making=False)
        else:
            eager_fn = e.capture_fn = self.fn
        if (
            staging is None
            and self.like is not None
            and self.like.effect is not None
            and self.effect is not None
        ):
            # classified on another lane and this stream already warmed: capture only
            at_start(self.host_values, e.cls.extents)
            return self._capture_graph(e, t0, None)
        at_start(self.host_values, e.cls.extents)
        host0, dev0 = host_rng_snapshot(), b.device_rng_state(dev)
        b.run_eager(eager_fn, args, kwargs, dev, 1)  # the probe
        effect = classify(host0, host_rng_snapshot(), dev0, b.device_rng_state(dev))
        snap.restore(buffers=False)
        if effect is Effect.HOST_RNG:
            self._reject(R.HOST_RNG, f"class {e.name} draws host randomness")
            e.status = "rejected"
            return False
        if effect is not self.declared_effect:
            self._reject(
                R.EFFECT_MISMATCH,
                f"class {e.name}: probe saw {effect.value}, "
                f"declared {self.declared_effect.value}",
            )
            e.status = "rejected"
            return False
        self.effect = effect
        program = None
        if self.warmup > 1 and not self._warmed:
            at_start(self.host_values, e.cls.extents)
            if self.warmup > 2:
                b.run_eager(eager_fn, args, kwargs, dev, self.warmup - 2)
            # the last warm-up is the call the capture is checked against: the first
            # call may build lazy state (caches, tables) that later calls only read
            program = self._recorded(eager_fn, args, kwargs)
            snap.restore(buffers=False)
        self._warmed = True
        at_start(self.host_values, e.cls.extents)
        if not self._capture_graph(e, t0, program):
            e.status = "rejected"
            return False
        return True

    def _recorded(self, fn: Callable, args: tuple, kwargs: dict) -> list:
        """One eager call with its host program recorded (host_program.py)."""
        with host_program.HostProgram() as recorder:
            self.backend.run_eager(fn, args, kwargs, self.device, 1)
        return recorder.ops

    def _capture_graph(self, e: Entry, t0: float, expected: list | None) -> bool:
        """Capture ``e``, checked against the host program of the eager call before it
        (``expected``; None: no eager call preceded it here). False: rejected."""
        dev, b = self.device, self.backend
        args, kwargs = e.inputs
        e.warmup_s = time.perf_counter() - t0
        a0, r0 = b.memory(dev)
        t1 = time.perf_counter()
        check, fn = None, e.capture_fn
        if expected is not None:
            fn, check = host_program.checked_once(
                fn, expected, now="at capture", then="in the eager call before it"
            )
        e.captured = b.capture(fn, args, kwargs, dev, self.pool)
        e.capture_s = time.perf_counter() - t1
        if check is not None and check.finish() is None and check.difference is not None:
            self._reject(
                R.STALE_HOST_VALUE,
                f"class {e.name}: a host value changed between the last eager call and the "
                f"capture, so a graph would replay the capture's: {check.difference}",
            )
            e.captured = None
            return False
        a1, r1 = b.memory(dev)
        if a0 is not None and a1 is not None:
            e.allocated_bytes = a1 - a0
        if r0 is not None and r1 is not None:
            e.reserved_bytes = r1 - r0
        return True

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected = reason
        self.rejected_detail = detail  # every call it sends eager says why
        LOGGER.warning(
            "%s: rejected for replay (%s): %s; every call runs eager", self.name, reason, detail
        )
