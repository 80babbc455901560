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
  its start.
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

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Mapping, Sequence

import torch

from . import signature as R
from .ambient import AUTOCAST_OFF, Autocast, ambient_state, describe_difference
from .backend import CudaGraphBackend, GraphBackend
from .classes import CaptureClass, materialize, staging_bytes
from .controls import ReplayMiss, replay_enabled, strict_mode
from .counters import HostCounter, at_start, replay_advancing
from .capture_state import CaptureSnapshot
from .effects import Effect, classify, host_rng_snapshot
from .hoist import HostConstants
from .host_program import StaleHostValue
from .outputs import OutputPlan
from .regions import Region
from .signature import (
    CatalogDispatch,
    Miss,
    describe_mismatch,
    is_unkeyable,
    signature_and_leaves,
)
from .telemetry import LOGGER
from .progress import capture_progress


@dataclass
class _Entry:
    index: int
    cls: CaptureClass
    ambient: Autocast = AUTOCAST_OFF  # the declared autocast state it is captured under
    first_variant: bool = True  # variants of one class share its staging buffers
    status: str = "pending"  # pending | captured | failed | invalidated | rejected
    sig: tuple | None = None
    captured: Any = None
    plan: OutputPlan | None = None
    inputs: tuple = ()  # (args, kwargs) kept alive: the graph reads these buffers
    staged: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    aliased: list[tuple[int, int]] = field(default_factory=list)
    ambient_key: tuple | None = None  # ambient.ambient_state() as captured
    hits: int = 0
    warmup_s: float = 0.0
    capture_s: float = 0.0
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    detail: str = ""
    name: str = ""  # the class name, with its autocast state when several are declared


# Misses kept with their detail per engine (binding.report() lists them); later ones
# are counted only. Reasons that are no contract problem are never listed.
MISS_LOG_LIMIT = 100
_EAGER_BY_DESIGN = frozenset({R.NO_CUDA, R.DISABLED})


def _buffer_key(t: torch.Tensor) -> tuple:
    # t.shape is a torch.Size, a tuple: compared as one, never converted on a call
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


class ExactShapeReplay:
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
            _Entry(
                i * len(self.ambient) + j,
                c,
                a,
                first_variant=(j == 0),
                name=c.name if len(self.ambient) == 1 else f"{c.name} @autocast={a.label}",
            )
            for i, c in enumerate(self.classes)
            for j, a in enumerate(self.ambient)
        ]
        self._dispatch = CatalogDispatch({})
        # signature -> the entries that share it (they differ by aliased pointers only)
        self._groups: dict[tuple, list[int]] = {}
        self._wt: list[tuple[str, tuple]] = []  # (name, buffer key at capture)
        self._wt_keys: list[tuple] = []  # the keys alone: one list compare per call

    # ================================================================ capture
    def capture_all(
        self,
        progress: bool = True,
        between_classes: Callable[[], None] | None = None,
        keep_contents: Container[str] | None = None,
    ) -> "ExactShapeReplay":
        """``between_classes``: called before every class after the first (a background
        capture lets waiting eager steps run there: binding.CaptureSection.pause).
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
        self._wt = [(n, _buffer_key(g())) for n, g in self.write_through.items()]
        self._wt_keys = [key for _, key in self._wt]
        snap = CaptureSnapshot(
            self.regions,
            self.write_through,
            self.counters,
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
        self, variants: list[_Entry], gen: torch.Generator, snap: CaptureSnapshot, advance: Callable
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

    def _enter_group(self, e: _Entry, sig: tuple, aliased: list, staged: list) -> None:
        for j in self._groups.get(sig, ()):
            other = self._entries[j]
            if other.aliased == aliased and other.ambient == e.ambient:
                raise ValueError(
                    f"{self.name}: classes {other.cls.name!r} and {e.cls.name!r} have the "
                    "same signature, alias the same pointers and share an ambient state"
                )
        e.sig, e.aliased, e.staged = sig, aliased, staged
        self._groups.setdefault(sig, []).append(e.index)

    def _capture_one(self, e: _Entry, args: tuple, kwargs: dict, snap: CaptureSnapshot) -> None:
        dev = self.device
        try:
            # the declared ambient state holds for probe, warm-up and capture; its key
            # is read before the engine's own torch-function mode (hoist.py) is entered
            with torch.no_grad(), e.ambient.context(dev.type):
                e.ambient_key = ambient_state(dev.type)
                e.inputs = (args, kwargs)
                with self.host_constants:
                    captured = self._probe_and_capture(e, args, kwargs, snap)
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
        self, e: _Entry, args: tuple, kwargs: dict, snap: CaptureSnapshot
    ) -> bool:
        """Probe (effect classification), warm up, capture. False: rejected."""
        dev, b = self.device, self.backend
        t0 = time.perf_counter()
        if self.like is not None and self.like.effect is not None and self.effect is not None:
            # classified on another lane and this stream already warmed: capture only
            at_start(self.counters)
            return self._capture_graph(e, t0)
        at_start(self.counters)
        host0, dev0 = host_rng_snapshot(), b.device_rng_state(dev)
        b.run_eager(self.fn, args, kwargs, dev, 1)  # the probe
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
        if self.warmup > 1 and not self._warmed:
            at_start(self.counters)
            b.run_eager(self.fn, args, kwargs, dev, self.warmup - 1)
            snap.restore(buffers=False)
        self._warmed = True
        at_start(self.counters)
        return self._capture_graph(e, t0)

    def _capture_graph(self, e: _Entry, t0: float) -> bool:
        dev, b = self.device, self.backend
        args, kwargs = e.inputs
        e.warmup_s = time.perf_counter() - t0
        a0, r0 = b.memory(dev)
        t1 = time.perf_counter()
        e.captured = b.capture(self.fn, args, kwargs, dev, self.pool)
        e.capture_s = time.perf_counter() - t1
        a1, r1 = b.memory(dev)
        if a0 is not None and a1 is not None:
            e.allocated_bytes = a1 - a0
        if r0 is not None and r1 is not None:
            e.reserved_bytes = r1 - r0
        return True

    def _reject(self, reason: str, detail: str) -> None:
        self.rejected = reason
        LOGGER.warning(
            "%s: rejected for replay (%s): %s; every call runs eager", self.name, reason, detail
        )

    # ================================================================== calls
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if not replay_enabled():
            return self._eager(R.DISABLED, args, kwargs)
        if self.rejected is not None:
            return self._eager(self.rejected, args, kwargs)
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
        sig, leaves = signature_and_leaves(args, kwargs)
        hit = self._dispatch.lookup(sig)
        if type(hit) is Miss:
            return self._eager(
                hit.reason, args, kwargs, lambda: describe_mismatch(self._dispatch.keys(), sig)
            )
        group = self._groups[hit]  # type: ignore[index]
        live = [_buffer_key(t) for t in self._read_write_through()]
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
        for i, buf in e.staged:
            buf.copy_(leaves[i])
        try:
            replay_advancing(self.counters, e.captured.replay)
        except StaleHostValue as exc:
            return self._stale(e, str(exc))
        e.hits += 1
        self.hits += 1
        return e.plan.hand_back()  # type: ignore[union-attr]

    def _stale(self, e: _Entry, detail: str) -> Any:
        """A simulated replay met another host value than its capture (host_program.py):
        the callable leaves replay for good; this call's outputs are the re-run body's
        (an eager call's), counted as a miss."""
        text = f"class {e.name}: {detail}"
        self._reject(R.STALE_HOST_VALUE, text)
        self._count_miss(R.STALE_HOST_VALUE, lambda: text)
        return e.plan.hand_back()  # type: ignore[union-attr]

    def _select(self, group: list[int], leaves: list[torch.Tensor]) -> _Entry | None:
        """The class of ``group`` whose aliased inputs are at the live pointers."""
        for j in group:
            e = self._entries[j]
            if all(leaves[i].data_ptr() == ptr for i, ptr in e.aliased):
                return e
        return None

    def _ambient_detail(self, group: list[int], live: tuple) -> str:
        keys = [self._entries[j].ambient_key for j in group]
        captured = [k for k in keys if k is not None]
        if not captured:
            return "no class of this signature recorded an ambient state"
        return describe_difference(self.device.type, captured[0], live)

    def _pointer_detail(self, group: list[int], leaves: list[torch.Tensor]) -> str:
        e = self._entries[group[0]]
        for i, ptr in e.aliased:
            if leaves[i].data_ptr() != ptr:
                return (
                    f"aliased argument leaf {i} is at 0x{leaves[i].data_ptr():x}; "
                    f"{len(group)} captured class(es) alias e.g. 0x{ptr:x} ({e.name})"
                )
        return "no captured class aliases these pointers"

    def _eager(
        self, reason: str, args: tuple, kwargs: dict, detail: Callable[[], str] | None = None
    ) -> Any:
        self._count_miss(reason, detail)
        return self.fn(*args, **kwargs)

    def _count_miss(self, reason: str, detail: Callable[[], str] | None) -> None:
        """Count, explain and log one miss; strict mode raises ``ReplayMiss`` for it."""
        self.misses[reason] += 1
        strict = reason != R.DISABLED and strict_mode()
        logged = len(self.miss_log) < MISS_LOG_LIMIT and reason not in _EAGER_BY_DESIGN
        if self.misses[reason] == 1 or strict or logged:
            text = detail() if detail is not None else ""
            if logged:
                self.miss_log.append((self.calls, reason, text))
            if self.misses[reason] == 1:
                self.miss_details[reason] = text
                LOGGER.info(
                    "%s: first eager fallback for reason %s%s",
                    self.name,
                    reason,
                    f": {text}" if text else "",
                )
            if strict:
                raise ReplayMiss(self.name, reason, text)

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

    # ============================================================== telemetry
    def stats(self) -> dict:
        cls = [
            {
                "name": e.name,
                "ambient": e.ambient.label,
                "status": e.status,
                "hits": e.hits,
                "warmup_s": e.warmup_s,
                "capture_s": e.capture_s,
                "allocated_bytes": e.allocated_bytes,
                "reserved_bytes": e.reserved_bytes,
                # variants of one class share its staging buffers
                "staging_bytes": staging_bytes(e.cls) if e.first_variant else 0,
                "detail": e.detail,
            }
            for e in self._entries
        ]

        def total(k: str) -> int | None:
            vals = [c[k] for c in cls if c[k] is not None]
            return sum(vals) if vals else None

        return {
            "kind": "replay",
            "name": self.name,
            "device": str(self.device),
            "backend": self.backend.name,
            "captured": self.captured,
            "effect": "unclassified" if self.effect is None else self.effect.value,
            "declared_effect": self.declared_effect.value,
            "rejected": self.rejected,
            "counters": {c.name: {"start": c.start, "advances": c.advances} for c in self.counters},
            "hits": self.hits,
            "misses": dict(self.misses),
            "miss_details": dict(self.miss_details),
            "miss_log": [
                {"call": call, "reason": reason, "detail": detail}
                for call, reason, detail in self.miss_log
            ],
            "calls": self.calls,
            "ambient": [a.label for a in self.ambient],
            "host_constants": {
                "device_buffers": len(self.host_constants.cache),
                "served": self.host_constants.served,
                "istft_without_host_check": self.host_constants.istft_calls,
            },
            "eager_calls": sum(self.misses.values()),
            "invalidations": self.invalidations,
            "warmup_s": sum(c["warmup_s"] for c in cls),
            "capture_s": sum(c["capture_s"] for c in cls),
            "capture_allocated_bytes": total("allocated_bytes"),
            "capture_reserved_bytes": total("reserved_bytes"),
            # Reserve of replay (DESIGN eq. 6): staging of non-aliased inputs over
            # all classes + the frozen envelopes of write-through buffers.
            "staging_bytes": sum(c["staging_bytes"] for c in cls),
            "write_through_bytes": sum(
                g().untyped_storage().nbytes() for g in self.write_through.values()
            ),
            "classes": cls,
        }
