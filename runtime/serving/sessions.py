"""Sessions: many exact streams on one binding, served by K replay lanes.

Contract of this layer. One process holds the weights and one binding; a
``SessionPool`` (``binding.sessions(lanes=K)``) serves any number of sessions on K
lanes (lane.py). A ``Session`` owns only what the contract says lives per session or
per turn (region ``lifetime`` ``session`` or ``turn``): its copy of those regions,
the carries' host state (live length), its device generator state, and — given by
the workload — its own view of the model (``obj``: e.g. a shallow copy of the vendor
object whose per-session attributes the vendor's own per-session call reads and
writes). Scratch (``operator``/``chunk``/``unit`` regions, the captured graphs, their
pools and streams) belongs to lanes; weights and constants to the process.

``session.run(fn, *args)`` runs one step of the session — typically the vendor's own
per-chunk call on ``obj`` — on a free lane, from the calling thread:
  1. wait for a lane (FIFO; ``NoLaneAvailable`` after ``timeout_s``);
  2. on the lane's stream, with the session's generator state in the lane's
     generator (graphs registered that state object at capture, so a replay draws
     the session's numbers; eager calls draw from it inside the eager section);
  3. every bound callable called by ``fn`` finds this run (a context variable) and
     uses the lane: an aliased argument that is the session's stored state is
     loaded into the lane's region in place (``Region.load``), anything else is
     adopted as a plain binding would;
  4. afterwards every tensor the session's state attributes hold in lane memory is
     taken back: per-session regions are copied into the session's own copy (same
     layout, so the next run loads it wherever it runs), scratch is cloned; the
     lane's stream is synchronised and the lane released.
So a session's bytes do not depend on which lane ran it or on who ran before: each
session's output equals the same session run alone on stock code (tests and
``bench/``). A session's steps are sequential (a second concurrent ``run`` of one
session is refused: ``SessionBusy``); different sessions run concurrently on
different lanes, any number of caller threads.

Turns. ``mark_turn_start(key)`` keeps the session's state (its state attributes,
per-session regions included) as the state a turn starts from — under ``key`` it is
shared, read-only, by every session opened with that key (the same voice prompt
primes to the same bytes), so opening such a session costs a copy, not a priming.
``reset()`` starts a new turn: the state is restored in place at the next ``run``.

Device randomness outside the bound callables is per session only with one lane
(the whole run draws from the session's state); with several lanes such draws come
from the process's generator, so a contract whose stock step draws outside its
bound callables should be served on one lane.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from contextlib import nullcontext
from typing import Any, Callable

import torch

from ..engine.backend import capture_stream
from ..state.regions import Region
from ..state.trees import SharedState
from .lane_scheduler import LaneScheduler, NoLaneAvailable
from .params import ParamError, ParamKey, resolve
from .session import Session, SessionBusy, SessionRequired, current_run
from .session_state import SessionError, _TurnStart
from .undeclared import watching_undeclared_writes


class SessionPool:
    def __init__(
        self,
        binding: Any,
        lanes: int = 1,
        *,
        timeout_s: float = 60.0,
        capture: bool = True,
        progress: bool = True,
        state_on: str | None = None,
        params_up_to: dict | None = None,
        graph_budget_mib: float | None = None,
    ) -> None:
        self.check_args(lanes, timeout_s)
        if graph_budget_mib is not None and not graph_budget_mib > 0:
            raise ValueError(f"graph_budget_mib must be positive, got {graph_budget_mib!r}")
        # where sessions keep their regions between steps: the binding's device (default)
        # or "cpu" (pinned host memory: device memory then holds only the lanes; every
        # step moves the session's state in and out over the host link)
        self.state_device = torch.device(state_on) if state_on is not None else binding.device
        self.binding = binding
        self.timeout_s = float(timeout_s)
        self.device = binding.device
        # what a lane holds between two steps that is not a session's: every step loads
        # its session's per-session regions and takes them back, and scratch is scratch,
        # so a capture between steps (the scheduler's) keeps only shared (process) state
        self.state_between_steps = frozenset(
            n for n, r in binding.decl.regions.items() if r.spec.lifetime == "process"
        )
        self.eager_scratch: dict[str, Region] = {}
        self.lane_capture: list[dict] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.sessions: dict[int, Session] = {}
        self._turn_starts: dict[Any, _TurnStart] = {}
        self.counters = {
            "runs": 0,
            "copied_out_bytes": 0,
            "opened": 0,
            "layout_fallbacks": 0,  # session copies re-laid at a lane's shape (session_state)
        }
        self.closed_sessions = 0
        self._shut = False
        # the values this pool serves: the declared domain, or up to ``params_up_to``
        # (``{"f_prompt": 400}``: smaller lanes; a session above it is refused at open)
        self.served = _served_range(binding.decl.params, params_up_to)
        if binding.decl.params:
            # every lane at the served values' largest shapes: a session of any of them
            # runs on any lane, and no step ever grows one (the plan says what it costs)
            binding.lanes[0].size_for(list(self.served), progress=progress)
        if capture and self.device.type == "cuda":
            t0 = time.perf_counter()
            binding.lanes[0].capture(progress=progress)
            self.lane_capture.append(
                {
                    "lane": 0,
                    "seconds": time.perf_counter() - t0,
                    "regions_mib": binding.lanes[0].nbytes() / 2**20,
                    "allocated_mib": None,
                }
            )
        if lanes > 1:
            _add_lanes(self, lanes, capture=capture, progress=progress)
        binding.pool = self
        binding.keep_sites()
        self.lanes = list(binding.lanes[:lanes])
        for lane in self.lanes:  # `clockc plan --values` says what a value's graphs take
            if graph_budget_mib is not None:
                # the budget replaces the contract's `hold` count: a lane keeps as many
                # values as their measured graph bytes fit (LRU past it)
                lane.values.budget_bytes = int(graph_budget_mib * 2**20)
                lane.values.hold = None
        for lane in self.lanes:
            if lane.stream is None and self.device.type == "cuda" and torch.cuda.is_available():
                lane.stream = capture_stream(self.device)  # lane 0 replays where it captured
        lane0 = self.lanes[0]
        background = lane0.captured and lane0._per_value and lane0.backend.available(self.device)
        self.scheduler = LaneScheduler(
            self.lanes,
            timeout_s=self.timeout_s,
            held=lambda lane: lane.held_values(),
            capture=self._capture_value if background else None,
        )
        self._storage_of = self._lane_storages()

    @staticmethod
    def check_args(lanes: Any, timeout_s: Any = 60.0) -> None:
        if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
            raise ValueError(f"lanes must be a positive int, got {lanes!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")

    # ------------------------------------------------------------------ lanes
    def _lane_storages(self) -> dict[int, tuple[Any, str]]:
        out: dict[int, tuple[Any, str]] = {}
        for lane in self.binding.lanes:
            out.update(lane.storages())
        for name, r in self.eager_scratch.items():
            out[r.storage_ptr()] = (None, name)
        return out

    def _capture_value(self, lane: Any, key: tuple) -> None:
        """The scheduler's background capture: ``lane`` (out of rotation) at ``key``,
        its graphs captured (lane_scheduler.py)."""
        cuda = self.device.type == "cuda" and torch.cuda.is_available()
        with torch.cuda.device(self.device) if cuda else nullcontext():
            lane.use(key, capture=True, keep_contents=self.state_between_steps)

    def wait_for_captures(self, timeout_s: float = 60.0) -> bool:
        """Block until the background captures wanted so far are done (tests, benchmarks
        that warm a pool before timing); True if they are."""
        return self.scheduler.idle(timeout_s)

    # --------------------------------------------------------------- sessions
    def open(
        self,
        obj: Any = None,
        *,
        seed: int | None = None,
        state: tuple[str, ...] = (),
        turn_key: Any = None,
        shared: Callable[[], list] | None = None,
        name: str | None = None,
        params: dict | None = None,
    ) -> "Session":
        """A new session. ``obj``: the session's own view of the model (the vendor's
        per-session call runs on it); ``state``: its attributes that hold per-session
        state besides the contract's region sites; ``seed``: its device generator seed
        (default: the process generator's state now); ``turn_key``: start from the
        turn-start state kept under this key, if any (``mark_turn_start``); ``shared``:
        for a model that keeps a stream's state in its shared modules, a callable
        returning the objects that hold it — swapped in place around every step
        (trees.SharedState; one lane only, the modules being one set); ``params``: the
        session's values of the contract's session parameters (``{"f_prompt": 200}``;
        defaults otherwise; ``ParamError`` outside the declared domain). A value no lane
        holds is captured in the background from now on (lane_scheduler.py): never
        inside a step; until it is, the session's steps run eager."""
        key = resolve(self.binding.decl.params, params)
        above = [(n, v, top) for (n, v), (_, top) in zip(key, self.served[1]) if v > top]
        if above:
            n, v, top = above[0]
            raise ParamError(
                f"session parameter {n}={v}: this pool serves {n} up to {top} (params_up_to)"
            )
        if shared is not None and len(self.lanes) > 1:
            raise SessionError(
                "state kept in the model's shared objects is one set: serve it on one lane"
            )
        if self._shut:
            raise SessionError("the session pool was shut down")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        for attr in state:
            if not isinstance(attr, str) or not attr.isidentifier() or attr.startswith("_"):
                raise ValueError(f"state attribute {attr!r} is not a public attribute name")
        with self._lock:
            sid = next(self._ids)
            self.counters["opened"] += 1
        s = Session(self, sid, obj, seed, tuple(dict.fromkeys(self._site_roots() + state)), name)
        s.params_key = key
        s.shared = SharedState(shared) if shared is not None else None
        if turn_key is not None:
            s.turn_key = turn_key
            if turn_key in self._turn_starts:
                s._pending_reset = True
        with self._lock:
            self.sessions[sid] = s
        self.scheduler.opened(key)
        return s

    def has_turn_start(self, key: Any) -> bool:
        return key in self._turn_starts

    def _site_roots(self) -> tuple[str, ...]:
        """Attributes of a session's object where the contract's per-session regions
        live (the first step of their sites)."""
        roots = []
        for r in self.binding.decl.regions.values():
            if r.per_session and r.site is not None and r.site[0][0] == "attr":
                roots.append(r.site[0][1])
        return tuple(dict.fromkeys(roots))

    def _forget(self, s: "Session") -> None:
        with self._lock:
            forgotten = self.sessions.pop(s.id, None) is not None
            if forgotten:
                self.closed_sessions += 1
        if forgotten:
            self.scheduler.closed(s.params_key)

    def shut_down(self) -> None:
        self._shut = True
        for s in list(self.sessions.values()):
            s.close()
        self.scheduler.stop()

    # -------------------------------------------------------------- telemetry
    def stats(self) -> dict:
        with self._lock:
            open_ = list(self.sessions.values())
            return {
                "lanes": len(self.lanes),
                "open": len(open_),
                "closed": self.closed_sessions,
                **self.counters,
                **self.scheduler.stats(),
                "eager_sections": self.binding.eager_waits["sections"],
                "eager_lock_wait_s": self.binding.eager_waits["wait_s"],
                "max_eager_lock_wait_s": self.binding.eager_waits["max_wait_s"],
                "session_bytes": sum(s.nbytes() for s in open_),
                "lane_region_bytes": [lane.nbytes() for lane in self.lanes],
                "turn_starts": len(self._turn_starts),
                "turn_start_bytes": sum(t.nbytes for t in self._turn_starts.values()),
                "eager_scratch_bytes": sum(r.nbytes for r in self.eager_scratch.values()),
                "state_on": str(self.state_device),
                "lane_capture": list(self.lane_capture),
            }

    def report(self) -> str:
        return describe_pool(self.stats(), bool(self.binding.decl.params))


# --------------------------------------------------------------------- helpers
def _add_lanes(pool: SessionPool, k: int, *, capture: bool, progress: bool) -> None:
    """``pool``'s lanes 1..k-1, and a separate eager scratch set at the model's sites so that
    no lane's graphs share memory with an eager call."""
    from .lane import Lane

    b = pool.binding
    with b.eager_lock:
        for r in b.decl.regions.values():
            if r.site is not None and r.install == "allocate":
                # at lane 0's shape: the largest value served yet (lane_values.py grows it)
                spec = dataclasses.replace(r.spec, shape=b.lanes[0].shapes[r.name])
                scratch = Region.allocate(spec, pool.device)
                b.install_region(r.site, scratch)
                pool.eager_scratch[r.name] = scratch
        b.lanes[0].owns_sites = False
        for i in range(1, k):
            a0 = _allocated(pool.device)
            t0 = time.perf_counter()
            lane = Lane(b, i, owns_sites=False)
            if b.decl.params:
                lane.size_for(list(pool.served))  # before its capture: nothing twice
            b.lanes.append(lane)
            if capture and i == 1:
                with watching_undeclared_writes(b.model, pool._lane_storages()):
                    lane.capture(progress=progress)
            elif capture:
                lane.capture(progress=progress)
            pool.lane_capture.append(
                {
                    "lane": i,
                    "seconds": time.perf_counter() - t0,
                    "regions_mib": lane.nbytes() / 2**20,
                    "allocated_mib": (
                        None if a0 is None else (_allocated(pool.device) - a0) / 2**20
                    ),
                }
            )


def _served_range(params: tuple, up_to: dict | None) -> tuple[ParamKey, ParamKey]:
    """(lowest, highest) values a pool serves: the declared domain, the top lowered to
    ``up_to`` where given (checked: a value in the domain, no unknown name)."""
    lo = resolve(params, {p.name: p.lo for p in params})
    hi = {p.name: p.hi for p in params}
    hi.update(up_to or {})
    return lo, resolve(params, hi)


def describe_pool(s: dict, has_params: bool) -> str:
    """``SessionPool.report()``: its ``stats()`` as the lines ``binding.report()`` prints."""
    lines = [
        f"  sessions: {s['open']} open, {s['closed']} closed on {s['lanes']} lane(s); "
        f"{s['runs']} runs, lane wait {s['lane_wait_s']:.3f} s "
        f"(longest {1e3 * s['max_lane_wait_s']:.1f} ms), "
        f"{s['session_bytes'] / 2**20:.1f} MiB of session state, "
        f"{s['turn_starts']} turn start(s) kept ({s['turn_start_bytes'] / 2**20:.1f} MiB)"
    ]
    if has_params:
        lines.append(
            f"  lanes by value: {s['affinity_hits']} steps on a lane holding their value, "
            f"{s['affinity_misses']} not ({s['eager_steps']} of them run eager); "
            f"{s['background_captures']} value(s) captured between steps in "
            f"{s['background_capture_s']:.2f} s"
            + (f", {s['capture_errors']} capture error(s)" if s["capture_errors"] else "")
            + f"; eager sections waited {s['eager_lock_wait_s']:.3f} s for the eager lock "
            f"(longest {1e3 * s['max_eager_lock_wait_s']:.1f} ms)"
        )
    for c in s["lane_capture"]:
        alloc = "-" if c["allocated_mib"] is None else f"{c['allocated_mib']:.1f}"
        lines.append(
            f"  lane {c['lane']}: built and captured in {c['seconds']:.2f} s, "
            f"regions {c['regions_mib']:.1f} MiB, allocated {alloc} MiB"
        )
    return "\n".join(lines)


def _allocated(device: torch.device) -> int | None:
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.memory_allocated(device)
    return None


__all__ = [
    "NoLaneAvailable",
    "Session",
    "SessionBusy",
    "SessionError",
    "SessionPool",
    "SessionRequired",
    "current_run",
]
