"""ShadowAudit: a lockstep pool's live ticks checked against batch 1, at run time.

The proof a batched binding admits (lockstep_proof.py) shows at set-up, on seeded
inputs, that each row of the batched call is the batch-1 call bit for bit. The audit
checks the traffic itself: a *shadow*, the same step at batch 1 (eager, on a model of
its own: its own streaming state, weights that may be shared since they are only read),
follows one session at a time from its open. It is fed that session's rows in order,
and each of its outputs is compared, bit for bit, with the session's row of the tick
that served it. A batch-1 call needs a batch-1 state and a vendor keeps a stream's state
in its modules, so the shadow holds its own: nothing is copied out of the batched rows.

* Which sessions: the first one opened, then every ``every``-th, one at a time (a
  session due while another is followed is counted as ``skipped_busy``).
* Off the tick: the shadow runs on a thread of its own, so no tick waits for it; the
  GPU work it adds (one batch-1 step per followed frame) is what the audit costs.
* A divergence is recorded (session, frame, tick, the first output that differs and
  where) and logged as an error. That session is followed no further: its outputs feed
  back into its state, so every later frame would differ too.
* Fails closed: a shadow that raises, a tick that failed, or a shadow ``max_behind``
  frames behind stops following that session, counted by reason. A session's outputs
  never wait for, or come from, the shadow.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..audit import first_tree_difference

log = logging.getLogger("duplexcadence")

MAX_RECORDS = 16  # divergences and shadow errors kept with their details


@dataclass(frozen=True)
class ShadowAudit:
    """What a lockstep pool audits its ticks with: ``step(row)``, one session's row
    (leading extent 1) through the same step at batch 1; ``reset()``, a new session on
    the shadow; ``view(out)``, the part of an output a session receives (all of it when
    None), applied to both sides before they are compared."""

    step: Callable[[torch.Tensor], Any]
    reset: Callable[[], None]
    every: int = 1
    view: Callable[[Any], Any] | None = None
    max_behind: int = 256

    def __post_init__(self) -> None:
        for name in ("step", "reset"):
            if not callable(getattr(self, name)):
                raise TypeError(f"ShadowAudit.{name} must be callable")
        if self.view is not None and not callable(self.view):
            raise TypeError("ShadowAudit.view must be callable or None")
        for name in ("every", "max_behind"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"ShadowAudit.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class AuditDivergence:
    """A followed session's row of a tick that is not its batch-1 output."""

    session: int  # the pool's n-th session opened (from 0)
    slot: int
    frame: int  # the session's frame (from 0)
    tick: int  # the pool's tick (from 0)
    output: str  # the first output that differs
    index: tuple[int, ...] | None  # its first differing element (None: shape, dtype, type)

    def describe(self) -> str:
        where = "" if self.index is None else f" at index {self.index}"
        return (
            f"lockstep audit: session {self.session} (slot {self.slot}) frame {self.frame}, "
            f"tick {self.tick}: {self.output} differs from its batch-1 call{where}"
        )


class ShadowAuditor:
    """Runs a ``ShadowAudit`` beside a pool. The pool calls ``opened``/``closed`` under
    its lock and ``served``/``failed`` from its ticker; the shadow's thread does the
    work, in the order the calls came."""

    def __init__(self, audit: ShadowAudit) -> None:
        self.audit = audit
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._slot: int | None = None  # the slot of the session followed now
        self._follow = 0  # which following this is (the shadow's thread drops stale work)
        self._frames = 0  # frames of the followed session handed to the shadow
        self._behind = 0  # of those, not yet checked
        self._opened = 0
        self.counters = {
            "followed": 0, "checks": 0, "divergences": 0, "skipped_busy": 0,
            "stopped_behind": 0, "stopped_tick_failed": 0, "shadow_errors": 0,
        }  # fmt: skip
        self.divergences: list[AuditDivergence] = []
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name="lockstep-audit", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the pool's side
    def opened(self, slot: int) -> None:
        with self._lock:
            number, self._opened = self._opened, self._opened + 1
            if number % self.audit.every:
                return
            if self._slot is not None:
                self.counters["skipped_busy"] += 1
                return
            self._slot, self._frames, self._behind = slot, 0, 0
            self._follow += 1
            self.counters["followed"] += 1
            self._queue.put(("reset", self._follow, number, slot))

    def served(self, tick: int, frames: dict[int, Any], outs: dict[int, Any]) -> None:
        """A tick served ``frames`` (slot: the ``LockstepFrame`` handed in) with ``outs``
        (slot: its row of the outputs, as the session got it)."""
        with self._lock:
            slot = self._slot
            if slot is None or slot not in frames:
                return
            if self._behind >= self.audit.max_behind:
                self._stop("stopped_behind")
                return
            self._behind += 1
            check = (self._follow, self._frames, tick, frames[slot].row, outs[slot])
            self._queue.put(("check", *check))
            self._frames += 1

    def failed(self, slots) -> None:
        """A tick that served ``slots`` raised: a followed session's state is unknown."""
        with self._lock:
            if self._slot is not None and self._slot in slots:
                self._stop("stopped_tick_failed")

    def closed(self, slot: int) -> None:
        with self._lock:
            if self._slot == slot:
                self._slot = None

    def _stop(self, reason: str | None) -> None:
        """Follow that session no further (``reason``: the counter it is counted by)."""
        if reason is not None:
            self.counters[reason] += 1
        self._slot = None
        self._follow += 1  # the shadow's queued work for that session is dropped

    def drain(self, timeout_s: float = 120.0) -> bool:
        """Wait until the shadow has checked every frame handed to it (the counters are
        then final for the ticks so far); False if it was still busy at ``timeout_s``."""
        done = threading.Event()
        self._queue.put(("mark", done))
        return done.wait(timeout_s)

    def shut_down(self, timeout_s: float = 60.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    # ---------------------------------------------------------- the shadow's side
    def _run(self) -> None:
        session = slot = -1
        while (item := self._queue.get()) is not None:
            kind, *args = item
            if kind == "mark":
                args[0].set()
            elif kind == "reset":
                follow, session, slot = args
                self._shadow(follow, lambda: self.audit.reset())
            else:
                follow, frame, tick, row, out = args
                self._check(follow, session, slot, frame, tick, row, out)

    def _shadow(self, follow: int, call: Callable[[], Any]) -> tuple[bool, Any]:
        """Run ``call`` for following ``follow`` unless it was stopped; a raise stops it."""
        with self._lock:
            if follow != self._follow:
                return False, None
        try:
            return True, call()
        except Exception as e:  # noqa: BLE001 - counted, logged, the session goes on
            with self._lock:
                if follow == self._follow:
                    self._stop("shadow_errors")
                if len(self.errors) < MAX_RECORDS:
                    self.errors.append(f"{type(e).__name__}: {e}")
            log.error("lockstep audit: the batch-1 shadow raised %s: %s", type(e).__name__, e)
            return False, None

    def _check(self, follow, session, slot, frame, tick, row, out) -> None:
        view = self.audit.view or (lambda x: x)
        # the shadow's step and the comparison (outside the lock: it may read the device;
        # a view that raises is a shadow error), counted only if that session is still
        # followed (a stop in between dropped its work)
        ran, difference = self._shadow(
            follow, lambda: first_tree_difference(view(self.audit.step(row)), view(out), "output")
        )
        with self._lock:
            if follow != self._follow:
                return
            self._behind = max(0, self._behind - 1)
            if not ran:
                return
            self.counters["checks"] += 1
            if difference is None:
                return
            record = AuditDivergence(session, slot, frame, tick, *difference)
            self.counters["divergences"] += 1
            if len(self.divergences) < MAX_RECORDS:
                self.divergences.append(record)
            self._stop(None)  # counted as a divergence
        log.error(record.describe())

    def stats(self) -> dict:
        with self._lock:
            return {
                **self.counters,
                "every": self.audit.every,
                "behind": self._behind if self._slot is not None else 0,  # not yet checked
                "divergence_records": [d.describe() for d in self.divergences],
                "shadow_error_records": list(self.errors),
            }

    def report(self) -> str:
        s = self.stats()
        stopped = s["stopped_behind"] + s["stopped_tick_failed"] + s["shadow_errors"]
        return (
            f"lockstep audit: {s['followed']} sessions followed by a batch-1 shadow, "
            f"{s['checks']} frames checked, {s['divergences']} diverged, {stopped} stopped "
            f"({s['stopped_behind']} behind, {s['stopped_tick_failed']} failed ticks, "
            f"{s['shadow_errors']} shadow errors)"
        )
