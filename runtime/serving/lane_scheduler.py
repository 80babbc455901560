"""Which lane runs a step, and the captures that run between steps.

Contract of this layer. A ``LaneScheduler`` holds a session pool's free lanes and the
captures of parameter values (params.py) the pool still needs. Served with a different
voice per user, a pool meets many values; what the scheduler guarantees:

* ``acquire(key)`` returns a free lane for one step of a session at value ``key``: a
  free lane that holds ``key``'s graphs if there is one (an *affinity hit*). While
  every lane holding ``key`` is busy the step waits for one of them, up to
  ``affinity_patience_s`` (a replay there is shorter than an eager step), letting later
  steps pass; after that, or when no lane holds ``key``, it takes any free lane and
  runs eager (exact; its calls count ``value_not_captured``). ``NoLaneAvailable``
  after the pool's timeout means the pool is overloaded: no step ever captures, grows
  a lane or waits for a capture.
* A value is *wanted* on as many lanes as its share of the open sessions needs
  (``_lanes_wanted``: a voice of one session among many on one lane, the only value on
  all of them): on one lane from the moment its first session opens (its capture runs
  while the session primes), on more whenever a step of it ran eager. The capture thread takes the
  least loaded free lane that does not hold it out of rotation between steps — steps
  first: it takes one only when no step waits, or after ``patience_s``, when the next
  lane released is its — captures the
  value there (``capture(lane, key)``, one class at a time under the eager lock:
  capture_section.CaptureSection; the lane's least recently used value is evicted past its
  hold or graph budget) and puts the lane back.
* Which values a lane holds changes only there (steps never capture, and pools size
  their lanes for the whole declared domain, so they never grow), so the scheduler
  keeps each lane's holdings itself and never reads a lane another thread is using.

Counters (``stats()``): steps, affinity hits and misses, steps run eager for want of
their value's graphs, background captures and their seconds, capture errors, the
longest and the total lane wait.
"""

from __future__ import annotations

import atexit
import itertools
import math
import threading
import time
import weakref
from collections import Counter, OrderedDict
from typing import Any, Callable, Hashable

from ..telemetry import LOGGER


class NoLaneAvailable(TimeoutError):
    """No lane became free within the pool's timeout."""


# what stats() counts, from zero
COUNTERS: dict[str, float] = {
    "steps": 0,
    "affinity_hits": 0,
    "affinity_misses": 0,
    "eager_steps": 0,  # steps on a lane without their value's graphs
    "background_captures": 0,
    "background_capture_s": 0.0,
    "capture_errors": 0,
    "lane_wait_s": 0.0,
    "max_lane_wait_s": 0.0,
}


class LaneScheduler:
    def __init__(
        self,
        lanes: list[Any],
        *,
        timeout_s: float,
        held: Callable[[Any], frozenset | None],
        capture: Callable[[Any, Hashable], None] | None,
        patience_s: float = 0.2,
        affinity_patience_s: float = 0.3,
    ) -> None:
        """``held(lane)``: the values whose graphs ``lane`` holds (None: every value, a
        contract whose graphs do not depend on the parameters); ``capture(lane, key)``:
        put ``lane`` at ``key`` with its graphs captured (None: never, e.g. no CUDA)."""
        self.lanes = list(lanes)
        self.timeout_s = timeout_s
        self.patience_s = patience_s
        self.affinity_patience_s = affinity_patience_s
        self._held_of = held
        self._capture = capture
        self._cond = threading.Condition()
        self._free: list[Any] = list(lanes)  # least recently released first
        self._holding: dict[int, frozenset | None] = {id(lane): held(lane) for lane in lanes}
        # waiting steps' tickets, in arrival order: (value, when it asked)
        self._waiting: OrderedDict[int, tuple[Hashable, float]] = OrderedDict()
        self._granted: dict[int, tuple[Any, bool]] = {}  # ticket -> (lane, holds value)
        self._tickets = itertools.count()
        self._open: Counter = Counter()  # open sessions per value
        self._wanted: dict[Hashable, None] = {}  # values wanted on one more lane, in order
        self._capturing: set[Hashable] = set()
        self._due: Hashable | None = None  # a capture past its patience: lanes go to it
        self._failed: set[Hashable] = set()  # a value whose capture raised runs eager
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.counters = dict(COUNTERS)

    # ---------------------------------------------------------------- sessions
    def opened(self, key: Hashable) -> None:
        """A session of ``key`` opened: its value is wanted on a lane now, so its
        capture runs while the session primes, before its first step is due."""
        with self._cond:
            self._open[key] += 1
            if not self._lanes_holding(key):
                # one lane to start with; more only if its steps find it busy (a share
                # taken at open is too large early in a ramp: the H200 voices run put
                # the first voice on two lanes while later voices waited)
                self._want(key)

    def closed(self, key: Hashable) -> None:
        with self._cond:
            self._open[key] -= 1
            if self._open[key] <= 0:
                del self._open[key]

    # ------------------------------------------------------------------- steps
    def holds(self, lane: Any, key: Hashable) -> bool:
        held = self._holding[id(lane)]
        return held is None or key in held

    def acquire(self, key: Hashable) -> tuple[Any, bool]:
        """A free lane for a step at ``key``, and whether it holds ``key``'s graphs."""
        t0 = time.perf_counter()
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = (key, t0)
            deadline = t0 + self.timeout_s
            while True:
                self._grant()
                if ticket in self._granted:
                    break
                now = time.perf_counter()
                if now >= deadline:
                    del self._waiting[ticket]
                    self._cond.notify_all()
                    raise NoLaneAvailable(
                        f"no lane of {len(self.lanes)} became free within {self.timeout_s:.1f} s"
                    )
                # woken by a release, or when this step's affinity patience runs out
                patience_left = t0 + self.affinity_patience_s - now
                self._cond.wait(min(deadline - now, patience_left if patience_left > 0 else 1.0))
            lane, hit = self._granted.pop(ticket)
            c = self.counters
            waited = time.perf_counter() - t0
            c["steps"] += 1
            c["lane_wait_s"] += waited
            c["max_lane_wait_s"] = max(c["max_lane_wait_s"], waited)
            c["affinity_hits" if hit else "affinity_misses"] += 1
            if not hit:
                c["eager_steps"] += 1
                self._want(key)
            self._cond.notify_all()
            return lane, hit

    def _grant(self) -> None:
        """Give free lanes to waiting steps, in arrival order (the caller holds the
        lock): a step takes a free lane holding its value; while every lane holding
        its value is busy it waits for one up to ``affinity_patience_s`` (a replay there
        is shorter than an eager step) and lets later steps pass; after that, or when
        no lane holds its value, it takes any free lane and runs eager."""
        now = time.perf_counter()
        due = self._due
        for ticket, (key, t0) in list(self._waiting.items()):
            # a due capture's lanes (those not holding its value) are not for steps
            free = [lane for lane in self._free if due is None or self.holds(lane, due)]
            if not free:
                return
            holding = [lane for lane in free if self.holds(lane, key)]
            if holding:
                lane, hit = holding[0], True
            elif self._lanes_holding(key) and now - t0 < self.affinity_patience_s:
                continue
            else:
                lane, hit = free[0], False
            self._free.remove(lane)
            del self._waiting[ticket]
            self._granted[ticket] = (lane, hit)

    def release(self, lane: Any) -> None:
        with self._cond:
            self._free.append(lane)
            self._cond.notify_all()

    # ---------------------------------------------------------------- captures
    def _lanes_wanted(self, key: Hashable) -> int:
        """How many lanes a value's load needs: its share of the open sessions, in
        lanes (a voice of one session among many: one lane; the only value: all)."""
        total = sum(self._open.values())
        if not total:
            return 0
        return max(1, math.ceil(self._open.get(key, 0) * len(self.lanes) / total))

    def _want(self, key: Hashable) -> None:
        """Queue ``key`` for one more lane (the caller holds the lock)."""
        if self._capture is None or key in self._wanted or key in self._capturing:
            return
        if key in self._failed:  # its capture raised: its steps keep running eager
            return
        if self._lanes_holding(key) >= self._lanes_wanted(key):
            return
        self._wanted[key] = None
        self._start()
        self._cond.notify_all()

    def _lanes_holding(self, key: Hashable) -> int:
        return sum(1 for lane in self.lanes if self.holds(lane, key))

    def _load(self, lane: Any) -> int:
        """Open sessions whose values ``lane`` holds: where a new value's graphs go."""
        held = self._holding[id(lane)]
        return sum(self._open.values()) if held is None else sum(self._open[k] for k in held)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._capture_loop, name="duplexcadence-capture", daemon=True
            )
            self._thread.start()
            # a daemon thread still inside a CUDA capture when the interpreter exits
            # aborts the process ("terminate called without an active exception", seen
            # on the H200): at exit the capture under way finishes and the thread stops
            atexit.register(_stop_at_exit, weakref.ref(self))

    def _capture_loop(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    return
                lane, key = job
            t0 = time.perf_counter()
            try:
                self._capture(lane, key)  # type: ignore[misc]
            except Exception as exc:  # fail closed: the value's steps keep running eager
                self.counters["capture_errors"] += 1
                with self._cond:
                    self._failed.add(key)
                LOGGER.warning("background capture of %s on lane %s failed: %s", key, lane, exc)
            finally:
                held = self._held_of(lane)
                with self._cond:
                    self._holding[id(lane)] = held
                    self._capturing.discard(key)
                    self._free.append(lane)
                    self.counters["background_captures"] += 1
                    self.counters["background_capture_s"] += time.perf_counter() - t0
                    self._cond.notify_all()

    def _next_job(self) -> tuple[Any, Hashable] | None:
        """The next (lane, value) to capture, the lane taken out of rotation; None once
        stopped. Waits (lock held, released while waiting)."""
        since: dict[Hashable, float] = {}
        while not self._stopped:
            self._due = None
            for key in list(self._wanted):
                if self._lanes_holding(key) >= self._lanes_wanted(key):
                    del self._wanted[key]  # its sessions closed, or enough lanes hold it
                    continue
                free = [lane for lane in self._free if not self.holds(lane, key)]
                waited = time.perf_counter() - since.setdefault(key, time.perf_counter())
                if free and (not self._waiting or waited >= self.patience_s):
                    lane = min(free, key=self._load)  # the least loaded free lane
                    self._free.remove(lane)
                    del self._wanted[key]
                    self._capturing.add(key)
                    self._due = None
                    return lane, key
                if waited >= self.patience_s and self._due is None:
                    # past its patience the capture is due: no step is granted a lane it
                    # could take (under load every released lane would go to a step)
                    self._due = key
            self._cond.wait(0.05 if self._wanted else None)
        return None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._due = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=600)

    def idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no capture is wanted or running (tests, benchmarks); True if so."""
        deadline = time.perf_counter() + timeout_s
        with self._cond:
            while self._wanted or self._capturing:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    # --------------------------------------------------------------- telemetry
    def stats(self) -> dict:
        with self._cond:
            return {
                **self.counters,
                "captures_wanted": len(self._wanted),
                "capturing": len(self._capturing),
                "values_open": len(self._open),
            }


def _stop_at_exit(ref: "weakref.ref[LaneScheduler]") -> None:
    scheduler = ref()
    if scheduler is not None:
        scheduler.stop()
