"""ExactShapeReplay: one graph per exact catalog signature, admitted fail-closed.

Contract of this layer. Given a callable, its catalog (``CaptureClass`` list, in
the order generated code fixed), the regions it aliases and the write-through
buffers it writes, the engine:

* ``capture_all()`` — before traffic, once, in list order: materialises each
  class, probes it with one eager call (effect classification), warms it up on the
  capture stream, and captures one graph at exactly those shapes into ONE pool
  (shared with other replays if ``pool`` is given). Capture is transparent
  (capture_state.py): what the caller observes after ``capture_all`` equals what it
  observed before.
* ``__call__`` — admission, fail closed, from integers and enums only:
  (i) the signature is in the catalog; (ii) every write-through buffer is where it
  was at capture (pointer, shape, stride, dtype — checked on *every* call; drift
  drops the signature's classes and logs an invalidation) and every aliased input is
  at the pointer a captured class recorded for it; (iii) the effect was classified at
  capture (host RNG or a declaration that disagrees with the probe rejects the
  callable for good); (iv) every declared host counter (counters.py) has reached
  its start, and every declared host guard (guards.py) holds its value.
  One signature may name several classes when they alias different region views of
  the same shape (``region r[i]``: slot i of a region, one class per slot): the call
  replays the class whose aliased pointers all equal the live ones, and misses with
  ``aliased_pointer`` when none does. Two classes that agree on the signature *and*
  on every aliased pointer are one class twice: ``capture_all`` raises.
  A hit stages non-aliased inputs into the static buffers with ``copy_``, replays,
  advances the host counters and hands outputs back under the rule in
  ``outputs.py``. Anything else runs
  eager, counted by reason; strict mode raises ``ReplayMiss`` instead.
* Device RNG: the graph reads seed/offset from the default generator at replay
  and advances the offset by the captured increment, exactly as eager calls
  advance it; restoring the generator in place after capture (never swapping the
  state object) makes the first replay draw what eager would have.
* Replays carry no autograd history, so calls with grad mode on run eager
  (``grad_enabled``): wrap serving code in ``torch.inference_mode()`` or
  ``torch.no_grad()``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Sequence

import torch

from ..controls import replay_enabled
from ..state.counters import HostCounter, replay_advancing
from ..state.guards import HostGuard
from ..state.regions import Region
from . import signature as R
from .ambient import AUTOCAST_OFF, Autocast, ambient_state
from .backend import CudaGraphBackend, GraphBackend
from .classes import CaptureClass
from .effects import Effect
from .hoist import HostConstants
from .host_program import StaleHostValue
from .replay_capture import CaptureSteps
from .replay_entry import Entry, buffer_key
from .replay_telemetry import ReplayTelemetry
from .signature import CatalogDispatch, Miss, describe_mismatch, signature_and_leaves
from .staging import Staging
from ..telemetry import LOGGER


class ExactShapeReplay(CaptureSteps, ReplayTelemetry):
    """The engine (module docstring): its state and admission here, its capture in
    replay_capture.py, its miss accounting and ``stats()`` in replay_telemetry.py."""

    def __init__(
        self,
        fn: Callable,
        *,
        name: str,
        classes: list[CaptureClass],
        regions: Mapping[str, Region],
        write_through: Mapping[str, Callable[[], torch.Tensor]] | None = None,
        read_write_through: Callable[[], Sequence[torch.Tensor]] | None = None,
        declared_effect: Effect = Effect.NONE,
        device: torch.device | str,
        warmup: int = 2,
        pool: Any = None,
        backend: GraphBackend | None = None,
        counters: tuple[HostCounter, ...] | list[HostCounter] = (),
        guards: tuple[HostGuard, ...] | list[HostGuard] = (),
        ambient: tuple[Autocast, ...] | list[Autocast] = (AUTOCAST_OFF,),
        like: "ExactShapeReplay | None" = None,
    ) -> None:
        names = [c.name for c in classes]
        if len(set(names)) != len(names):
            raise ValueError(f"{name}: duplicate class names in {names}")
        self.fn = fn
        self.name = name
        self.classes = list(classes)
        self.regions = dict(regions)
        self.write_through = dict(write_through or {})
        # every write-through tensor at once, in ``write_through`` order, for the check
        # on every call (a lane reads its sites through one compiled SiteReads); by
        # default each getter in turn
        getters = tuple(self.write_through.values())
        self._read_write_through = read_write_through or (lambda: [g() for g in getters])
        self.declared_effect = declared_effect
        self.device = torch.device(device)
        self.warmup = max(1, int(warmup))  # the probe is the first warm-up call
        self.pool = pool
        self.counters = tuple(counters)
        self.guards = tuple(guards)
        # what capture sets for every class and puts back after it: counters and guards
        self.host_values = self.counters + self.guards
        # every declared counter is traced while capturing (staging.py): guarded, and
        # a staged one read live by the graphs
        self.staging = Staging(self.counters) if self.counters else None
        self.ambient = tuple(ambient)
        if not self.ambient or len(set(self.ambient)) != len(self.ambient):
            raise ValueError(f"{name}: ambient states must be distinct and non-empty")
        # ``like``: the same callable's engine on another lane, already captured. Its
        # effect classification and host-constant buffers (read-only) are reused, so
        # this engine warms its own stream once and then captures without eager calls
        self.like = like
        self.host_constants = like.host_constants if like is not None else HostConstants(device)
        # the first class warms what needs warming once (allocator, library handles,
        # lazy module state: ``warmup`` eager calls); every later class runs only its
        # probe, which also warms what is particular to its shapes
        self._warmed = False
        # why a call misses while nothing is captured (a pool sets it for an engine of
        # a value that is being captured elsewhere; default: not captured yet)
        self.uncaptured_reason: str | None = None
        self.backend: GraphBackend = backend if backend is not None else CudaGraphBackend()
        self.effect: Effect | None = None
        self.rejected: str | None = None
        self.rejected_detail = ""
        self.captured = False
        self.hits = 0
        self.misses: Counter[str] = Counter()
        self.miss_details: dict[str, str] = {}  # the first miss of each reason, explained
        # every miss, explained (call number, reason, leaf detail), up to MISS_LOG_LIMIT
        # entries: what a contract author reads to see why a call did not replay
        self.miss_log: list[tuple[int, str, str]] = []
        self.calls = 0
        self.invalidations = 0
        self.invalidation_log: list[str] = []
        # one entry per (class, declared ambient state), class-major
        self._entries = [
            Entry(
                i * len(self.ambient) + j,
                c,
                a,
                first_variant=(j == 0),
                name=c.name if len(self.ambient) == 1 else f"{c.name} @autocast={a.label}",
                counter_amounts=tuple(k.amount(c.name) for k in self.counters),
            )
            for i, c in enumerate(self.classes)
            for j, a in enumerate(self.ambient)
        ]
        self._dispatch = CatalogDispatch({})
        # signature -> the entries that share it (they differ by aliased pointers only)
        self._groups: dict[tuple, list[int]] = {}
        self._wt: list[tuple[str, tuple]] = []  # (name, buffer key at capture)
        self._wt_keys: list[tuple] = []  # the keys alone: one list compare per call

    # ================================================================== calls
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if not replay_enabled():
            return self._eager(R.DISABLED, args, kwargs)
        if self.rejected is not None:
            return self._eager(self.rejected, args, kwargs, lambda: self.rejected_detail)
        if not self.captured:
            # without a backend that can capture here (a CPU binding) nothing ever will:
            # eager by design, not a capture that is still pending
            reason = R.NOT_CAPTURED if self.backend.available(self.device) else R.NO_CUDA
            if reason == R.NOT_CAPTURED and self.uncaptured_reason is not None:
                reason = self.uncaptured_reason
            return self._eager(reason, args, kwargs)
        if torch.is_grad_enabled():
            return self._eager(R.GRAD_ENABLED, args, kwargs)
        for counter in self.counters:
            if not counter.ready():
                return self._eager(R.COUNTER_BEFORE_START, args, kwargs)
        for guard in self.guards:
            if not guard.holds():
                return self._eager(R.HOST_GUARD, args, kwargs, guard.mismatch)
        sig, leaves = signature_and_leaves(args, kwargs)
        hit = self._dispatch.lookup(sig)
        if type(hit) is Miss:
            return self._eager(
                hit.reason, args, kwargs, lambda: describe_mismatch(self._dispatch.keys(), sig)
            )
        group = self._groups[hit]  # type: ignore[index]
        live = [buffer_key(t) for t in self._read_write_through()]
        if live != self._wt_keys:
            for (wname, key), now in zip(self._wt, live, strict=True):
                if now != key:
                    self._invalidate(hit, wname, key, now)  # type: ignore[arg-type]
                    return self._eager(R.WRITE_THROUGH_POINTER, args, kwargs)
        ambient = ambient_state(self.device.type)
        same_ambient = [j for j in group if self._entries[j].ambient_key == ambient]
        if not same_ambient:
            return self._eager(
                R.AMBIENT_STATE, args, kwargs, lambda: self._ambient_detail(group, ambient)
            )
        e = self._select(same_ambient, leaves)
        if e is None:
            return self._eager(
                R.ALIASED_POINTER, args, kwargs, lambda: self._pointer_detail(same_ambient, leaves)
            )
        if e.status != "captured":  # a class of this group whose capture failed
            return self._eager(R.CAPTURE_FAILED, args, kwargs, lambda: e.detail)
        if e.stage_uses is not None:
            values = self.staging.values()  # type: ignore[union-attr]
            broken = e.stage_uses.broken_guard(values)
            if broken is not None:
                return self._eager(
                    R.STAGED_GUARD,
                    args,
                    kwargs,
                    lambda: f"class {e.name}: {broken.show(self.staging.names)}",
                )
            e.stage_uses.stage(values)
        for i, buf in e.staged:
            buf.copy_(leaves[i])
        try:
            replay_advancing(self.counters, e.captured.replay, e.counter_amounts)
        except StaleHostValue as exc:
            return self._stale(e, str(exc))
        e.hits += 1
        self.hits += 1
        return e.plan.hand_back()  # type: ignore[union-attr]

    def _stale(self, e: Entry, detail: str) -> Any:
        """A simulated replay met another host value than its capture (host_program.py):
        the callable leaves replay for good; this call's outputs are the re-run body's
        (an eager call's), counted as a miss."""
        text = f"class {e.name}: {detail}"
        self._reject(R.STALE_HOST_VALUE, text)
        self._count_miss(R.STALE_HOST_VALUE, lambda: text)
        return e.plan.hand_back()  # type: ignore[union-attr]

    def _select(self, group: list[int], leaves: list[torch.Tensor]) -> Entry | None:
        """The class of ``group`` whose aliased inputs are at the live pointers."""
        for j in group:
            e = self._entries[j]
            if all(leaves[i].data_ptr() == ptr for i, ptr in e.aliased):
                return e
        return None

    def _eager(
        self, reason: str, args: tuple, kwargs: dict, detail: Callable[[], str] | None = None
    ) -> Any:
        self._count_miss(reason, detail)
        return self.fn(*args, **kwargs)

    def drop_all(self, message: str) -> None:
        """Take every captured class out of replay (a write-through site was rebound
        by stock code: binding.py); later calls run eager with reason ``invalidated``."""
        for sig in list(self._groups):
            self._dispatch.drop(sig, R.INVALIDATED)
        for e in self._entries:
            if e.status == "captured":
                e.status, e.detail = "invalidated", message
                e.captured = e.plan = None
                self.invalidations += 1
        self.invalidation_log.append(message)

    def release(self) -> None:
        """Drop graphs, static buffers and regions (its value was evicted or its lane grew):
        never called again, counters kept, a later engine's ``like`` holds no lane memory."""
        for e in self._entries:
            if e.status == "captured":
                e.status = "released"
            e.captured = e.plan = None
            e.inputs, e.staged = (), []
        self.regions, self.write_through = {}, {}

    def _invalidate(self, sig: tuple, wname: str, was: tuple, now: tuple) -> None:
        """Drop every captured class of ``sig``: they all wrote through the moved buffer."""
        group = [
            self._entries[j] for j in self._groups[sig] if self._entries[j].status == "captured"
        ]
        names = ", ".join(e.name for e in group)
        msg = (
            f"{self.name}[{names}]: write-through buffer {wname} moved "
            f"(ptr 0x{was[0]:x} shape {tuple(was[1])} stride {was[2]} {was[3]} -> "
            f"ptr 0x{now[0]:x} shape {tuple(now[1])} stride {now[2]} {now[3]}); "
            f"{'class' if len(group) == 1 else 'classes'} dropped"
        )
        self._dispatch.drop(sig, R.INVALIDATED)
        for e in group:
            e.status, e.detail = "invalidated", msg
            e.captured = e.plan = None  # release the graph; its pool blocks are reusable
        self.invalidations += len(group)
        self.invalidation_log.append(msg)
        LOGGER.warning("invalidation: %s", msg)
