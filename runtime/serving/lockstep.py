"""LockstepPool: the sessions of a batched binding, one slot each, served in ticks.

A batched binding (``bind(batch=W)``) calls the model with W sessions stacked on the
batch axis, session i's state at index i of every slotted region (the vendor's own
batched state, for a model built for W sessions). A ``LockstepPool`` gives each open
session a slot and turns the sessions' calls, each from its own thread, into ticks:

* ``session.step(x)`` hands in the session's row (leading extent 1) and blocks until
  the tick that served it has run; it returns the session's row of the tick's outputs
  (every tensor whose leading extent is W, sliced and cloned: the next tick reuses the
  batched buffers). ``session.submit(x)`` hands it in without waiting and returns a
  ``LockstepFrame`` (``result()`` waits; ``done_at`` says when its tick ended): a
  session's frames queue in order, one served per tick, so a stream that fell behind
  (a stall, the ramp of sessions opening) has its next frame in as soon as a tick ends
  and catches up while ticks are shorter than its period (a blocking caller submits
  only after its thread woke: 10-20 ms a tick with 32 threads on the H200);
* a tick runs the user's ``step`` once on the W rows stacked (``torch.cat`` on axis 0):
  the rows of the sessions that are in, and a parked row (zeros) in every other slot;
* a tick starts when every open session is in, or ``gather_s`` after the first one
  came in *if* the model can hold a row still (``hold(mask)``: Moshi's
  ``set_exec_mask``, rows off keep their state); the late ones wait for the next tick.
  With ``period_s`` (the model's frame: sessions' frames arrive at their own phases)
  ticks keep a fixed clock instead: a tick starts at the next beat, or earlier once
  every open session is in or one has a second frame queued (it is behind: ticks run
  back to back until it caught up: on the H100 a backlog from the ramp otherwise kept
  its 2-5 frames for good). While a tick takes less than a period, a frame submitted
  before a beat is served at it, so every frame waits at most one period and is done
  within a period plus a tick (bench/results/sessions_moshi_h200_gather.md: ticks that
  moved with the arrivals left a session that missed one a frame behind for good).
  Without ``hold`` a parked row would advance its slot's state on the park input, so a
  tick waits for every open session (a slot nobody holds is still parked: its state
  is reset when a session opens on it);
* ``open()`` takes a free slot; one ``reset(mask)`` call resets every slot opened since
  the last (the vendor's ``reset_streaming(reset_mask)``): on a clock, between ticks,
  just before the beat (the ticker is idle then; Moshi's reset took 13 ms of each ramp
  tick on the H100, bench/results/sessions_moshi_h100.md), else first thing in the next
  tick; ``close()`` frees it.

Exactness is the binding's: each tick is the batched graph (or its eager call) of the
contract's lockstep, whose per-row ops give each row its batch-1 bits; a session's
outputs are its solo run's whatever the other slots hold, when they joined or how many
ticks it sat out (``tests/test_runtime_lockstep.py``; the Moshi arms of
``bench/sessions_moshi.py`` against solo stock runs). ``audit=ShadowAudit(...)`` checks
live ticks against a batch-1 shadow that follows sampled sessions (lockstep_audit.py).
A failing tick raises in every session it served. ``stats()`` counts ticks, rows
served and parked, and tick seconds.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable

import torch

from .lockstep_audit import ShadowAudit, ShadowAuditor
from .lockstep_session import LockstepFrame, LockstepSession, PoolFull
from .tick_log import TickLog

__all__ = ["LockstepFrame", "LockstepPool", "LockstepSession", "PoolFull"]


class LockstepPool:
    def __init__(
        self,
        width: int,
        step: Callable[[torch.Tensor], Any],
        *,
        reset: Callable[[torch.Tensor], None] | None = None,
        hold: Callable[[torch.Tensor], None] | None = None,
        gather_s: float = 0.005,
        period_s: float | None = None,
        timeout_s: float = 60.0,
        max_ahead: int = 8,
        audit: ShadowAudit | None = None,
    ) -> None:
        _check_arguments(width, step, reset, hold, gather_s, period_s, timeout_s, max_ahead)
        self.width, self._step, self._reset, self._hold = width, step, reset, hold
        self.gather_s, self.timeout_s = float(gather_s), float(timeout_s)
        self.max_ahead = max_ahead
        if audit is not None and not isinstance(audit, ShadowAudit):
            raise TypeError(f"lockstep audit must be a ShadowAudit or None, got {audit!r}")
        self.auditor = None if audit is None else ShadowAuditor(audit)
        self.period_s = None if period_s is None else float(period_s)
        self._beat: float | None = None  # the clock's next tick (period_s)
        self._cond = threading.Condition()
        self._sessions: dict[int, LockstepSession] = {}
        self._queues: dict[int, deque[LockstepFrame]] = {}  # slot: frames not yet served
        self._resets: set[int] = set()  # slots opened since the last reset
        self._reset_s = 0.0  # the last reset's seconds: a clock resets that long before a beat
        self._retry_in_tick = False  # a reset between ticks failed: the tick tries it again
        self._template: torch.Tensor | None = None  # a row's shape, dtype and device
        self._held: torch.Tensor | None = None  # the rows the model runs (hold's mask)
        self._closed = False
        self.log = TickLog(width)  # where the ticks' time goes (tick_log.py)
        self._thread = threading.Thread(target=self._run, name="lockstep-ticks", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ sessions
    def open(self) -> LockstepSession:
        """A session on a free slot, its state reset (``reset``) before its first tick."""
        with self._cond:
            if self._closed:
                raise RuntimeError("lockstep pool is shut down")
            free = [i for i in range(self.width) if i not in self._sessions]
            if not free:
                raise PoolFull(f"all {self.width} slots of the lockstep pool hold a session")
            session = LockstepSession(self, free[0])
            self._sessions[session.slot] = session
            if self.auditor is not None:
                self.auditor.opened(session.slot)
            if self._reset is not None:
                # reset before its first tick, with every slot opened since: one reset
                # call for the sessions of a ramp, not one each (Moshi's walks every module)
                self._resets.add(session.slot)
                self._cond.notify_all()  # the ticker may reset it before the beat
        self.log.opened()
        return session

    def _release(self, session: LockstepSession) -> None:
        with self._cond:
            self._sessions.pop(session.slot, None)
            if self.auditor is not None:
                self.auditor.closed(session.slot)
            for frame in self._queues.pop(session.slot, ()):  # never served: said so
                frame.finish(error=RuntimeError(f"session on slot {session.slot} closed"))
            self._cond.notify_all()  # a tick waiting for it need not

    def shut_down(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=self.timeout_s)
        if self.auditor is not None:
            self.auditor.shut_down(self.timeout_s)

    def _mask(self, slots: list[int]) -> torch.Tensor:
        device = self._template.device if self._template is not None else "cpu"
        mask = torch.zeros(self.width, dtype=torch.bool)
        mask[slots] = True
        return mask.to(device)

    # --------------------------------------------------------------------- ticks
    def _submit(self, session: LockstepSession, x: torch.Tensor) -> LockstepFrame:
        with self._cond:
            _check_row(x, self._template)
            deadline = time.perf_counter() + self.timeout_s
            while len(self._queues.get(session.slot, ())) >= self.max_ahead:
                if self._closed or not self._cond.wait(deadline - time.perf_counter()):
                    break
            if self._closed:
                raise RuntimeError("lockstep pool is shut down")
            if len(self._queues.get(session.slot, ())) >= self.max_ahead:
                raise TimeoutError(
                    f"lockstep slot {session.slot}: {self.max_ahead} frames unserved "
                    f"for {self.timeout_s:.0f} s"
                )
            if self._template is None:
                self._template = torch.zeros_like(x)
            frame = LockstepFrame(x, session.slot, self.timeout_s)
            self._queues.setdefault(session.slot, deque()).append(frame)
            self._cond.notify_all()
        return frame

    def _ready(self) -> bool:
        """Whether the tick may start: every open session is in, or the gather window
        has passed and the model can hold the rows that are not."""
        if not self._queues:
            return False
        if set(self._sessions) <= set(self._queues):
            return True
        if self._hold is None:
            return False  # a parked row would advance: wait for every open session
        if any(len(q) > 1 for q in self._queues.values()):
            # a session is behind (its next frame is in already): a tick now, not at the
            # beat, so it catches up while ticks are shorter than the period
            return True
        now = time.perf_counter()
        first_in = min(q[0].submitted_at for q in self._queues.values())
        if self.period_s is not None:
            if self._beat is None:  # the clock starts with the first frame
                self._beat = first_in + self.period_s
            return now >= self._beat
        return now - first_in >= self.gather_s

    def _reset_at(self) -> float:
        """When to reset opened slots between ticks (in one call): on a clock, a reset's
        time before the beat, or at once with no beat yet; never (inf): nothing to reset,
        no clock, or the next tick retries a failed reset."""
        if not self._resets or self.period_s is None or self._retry_in_tick:
            return math.inf
        return -math.inf if self._beat is None else self._beat - self._reset_s

    def _wait_s(self) -> float | None:
        """How long the ticker sleeps before it looks again (None: until a submission
        or an open wakes it; nothing is due at a beat with no frame and no reset)."""
        if self.period_s is not None and self._beat is not None:
            due = min(self._beat if self._queues else math.inf, self._reset_at())
            return None if due == math.inf else max(0.0, due - time.perf_counter())
        return None if not self._queues else self.gather_s

    def _next_beat(self, started: float) -> None:
        """After a tick that started at ``started``: the beat of the next one. A tick
        serves the beat it started at or after (the latest passed), or, started early
        with every session in, the beat ahead; the next tick is one period on."""
        if self.period_s is not None and self._beat is not None:
            passed = max(0, int((started - self._beat) // self.period_s))
            self._beat += (passed + 1) * self.period_s

    def _run(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._closed
                    and not (ready := self._ready())
                    and time.perf_counter() < self._reset_at()
                ):
                    self._cond.wait(self._wait_s())
                if self._closed:
                    for queue in self._queues.values():
                        for frame in queue:
                            frame.finish(error=RuntimeError("lockstep pool shut down"))
                    return
                if ready:
                    partial = not set(self._sessions) <= set(self._queues)
                    batch = {slot: q.popleft() for slot, q in self._queues.items()}
                    self._queues = {slot: q for slot, q in self._queues.items() if q}
                    self._cond.notify_all()  # a session at max_ahead may hand in one more
                    self._next_beat(time.perf_counter())
            if ready:
                self._tick(batch, partial)
            else:  # the beat is near and slots were opened: reset them while idle
                try:
                    self._reset_opened()
                except Exception:  # noqa: BLE001 - the next tick tries again, failing loudly
                    self._retry_in_tick = True

    def _tick(self, batch: dict[int, LockstepFrame], partial: bool) -> None:
        t = time.perf_counter()
        try:
            rows = [batch[i].row if i in batch else self._template for i in range(self.width)]
            # the model is touched on this thread only: resets, holds and the step
            self._retry_in_tick = False
            self._reset_opened()
            if self._hold is not None:
                mask = self._mask(sorted(batch))
                if self._held is None or not torch.equal(mask, self._held):
                    held = time.perf_counter()
                    self._hold(mask)  # rows off keep their state this tick
                    self._held = mask
                    self.log.held(time.perf_counter() - held)
            out = self._step(torch.cat(rows))
            results = {i: _row(out, i, self.width) for i in batch}
        except Exception as e:  # noqa: BLE001 - raised in every session it served
            if self.auditor is not None:
                self.auditor.failed(batch)
            for frame in batch.values():
                frame.finish(error=e)
        else:
            if self.auditor is not None:  # before the sessions may hand in their next
                self.auditor.served(self.log.counters["ticks"], batch, results)
            for i, frame in batch.items():
                frame.finish(results[i])
        self.log.tick(t, time.perf_counter(), len(batch), partial)

    def _reset_opened(self) -> None:
        """Reset the slots opened since the last reset, in one call (before their first
        frame: a slot's session hands in only after open() returned)."""
        with self._cond:
            slots, self._resets = sorted(self._resets), set()
        if slots:
            t = time.perf_counter()
            try:
                self._reset(self._mask(slots))
            except BaseException:
                # not reset: those slots are tried again before the next tick (whose
                # sessions then fail too), never served on a state left as it was
                with self._cond:
                    self._resets.update(slots)
                raise
            self._held = None  # a reset may turn its rows back on (Moshi's does)
            self._reset_s = time.perf_counter() - t
            self.log.reset(self._reset_s)

    @property
    def timeline(self) -> list[tuple[float, float, float, int, bool]]:
        return self.log.timeline

    def stats(self) -> dict:
        audit = {} if self.auditor is None else {"audit": self.auditor.stats()}
        return {"width": self.width, "open": len(self._sessions), **self.log.stats(), **audit}

    def report(self) -> str:
        s = self.stats()
        return (
            f"lockstep pool: {s['width']} slots, {s['open']} open; {s['ticks']} ticks, "
            f"{s['rows_per_tick']:.1f} rows per tick ({s['parked']} parked), "
            f"{s['tick_ms_mean']:.1f} ms per tick"
        ) + ("" if self.auditor is None else "\n" + self.auditor.report())


def _check_arguments(width, step, reset, hold, gather_s, period_s, timeout_s, max_ahead) -> None:
    """A pool's arguments, each refused with what it must be."""
    if type(width) is not int or width < 1:
        raise ValueError(f"lockstep width must be a positive int, got {width!r}")
    if not callable(step):
        raise TypeError(f"lockstep step must be callable, got {step!r}")
    for name, f in (("reset", reset), ("hold", hold)):
        if f is not None and not callable(f):
            raise TypeError(f"lockstep {name} must be callable or None, got {f!r}")
    if not (isinstance(gather_s, (int, float)) and 0 <= gather_s <= timeout_s):
        raise ValueError(f"gather_s must be in [0, timeout_s], got {gather_s!r}")
    if period_s is not None and not (
        isinstance(period_s, (int, float)) and 0 < period_s <= timeout_s
    ):
        raise ValueError(f"period_s must be in (0, timeout_s] or None, got {period_s!r}")
    if type(max_ahead) is not int or max_ahead < 1:
        raise ValueError(f"max_ahead must be a positive int, got {max_ahead!r}")


def _check_row(x: Any, t: torch.Tensor | None) -> None:
    """One session's row: leading extent 1, and the shape, dtype and device of the
    pool's rows (``t``, the first row handed in) once there is one."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] != 1:
        shown = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"a lockstep step takes one session's row (leading extent 1), got {shown}")
    if t is not None and (x.shape, x.dtype, x.device) != (t.shape, t.dtype, t.device):
        raise ValueError(
            f"lockstep row {tuple(x.shape)} {x.dtype} on {x.device} differs from the "
            f"pool's rows {tuple(t.shape)} {t.dtype} on {t.device}"
        )


def _row(out: Any, i: int, width: int) -> Any:
    """Row ``i`` of a tick's outputs: every tensor whose leading extent is ``width``,
    sliced and cloned (the next tick reuses the batched buffers); anything else as is."""
    if isinstance(out, torch.Tensor):
        return out[i : i + 1].clone() if out.dim() > 0 and out.shape[0] == width else out
    if isinstance(out, (list, tuple)):
        rows = [_row(v, i, width) for v in out]
        return type(out)(rows) if isinstance(out, list) else tuple(rows)
    if isinstance(out, dict):
        return {k: _row(v, i, width) for k, v in out.items()}
    return out
