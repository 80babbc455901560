"""A session of a pool (sessions.py): one exact stream, its steps run on the pool's lanes.

``Session.run(fn, ...)`` is one step (the pool's module docstring says what a step
does, in order); the run's context (``current_run()``: the binding, the session, the
lane) is what a bound callable called inside the step reads to find its lane
(binder.Dispatcher). A session's state, turn starts and reset are ``SessionState``'s
(session_state.py).
"""

from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from ..engine.backend import drawing_from, generator_state
from ..state.regions import Region
from ..state.trees import SharedState
from .session_state import SessionError, SessionState, _TurnStart

if TYPE_CHECKING:
    from .sessions import SessionPool


class SessionRequired(RuntimeError):
    """A bound callable was called outside every session of a pooled binding."""


class SessionBusy(SessionError):
    pass


@dataclass(frozen=True)
class _Run:
    binding: Any
    session: "Session"
    lane: Any


_CURRENT: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "duplexcadence_run", default=None
)


def current_run() -> _Run | None:
    return _CURRENT.get()


class Session(SessionState):
    def __init__(
        self,
        pool: SessionPool,
        sid: int,
        obj: Any,
        seed: int | None,
        state: tuple[str, ...],
        name: str | None,
    ) -> None:
        self.pool = pool
        self.id = sid
        self.name = name or f"session-{sid}"
        self.obj = obj
        self.state = state if obj is not None else ()
        self.storage: dict[str, Region] = {}
        self.host_state: dict[str, tuple] = {}
        self.rng_state = generator_state(pool.device, seed)
        self.turn_key: Any = None
        self.runs = 0
        self.closed = False
        self._busy = threading.Lock()  # held by the step in flight, and by close()
        self._stepping: int | None = None  # the thread running this session's step
        self._pending_reset = False
        self._turn_start: _TurnStart | None = None
        self.shared: SharedState | None = None
        self._shared_snapshot: list | None = None
        self.params_key: tuple = pool.binding.params_key  # session-parameter values
        self._relaid: dict[int, tuple] = {}

    # ------------------------------------------------------------------- run
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` as this session's next step (module docstring)."""
        if not callable(fn):
            raise TypeError(f"run() needs a callable, got {type(fn).__name__}")
        if self.closed:
            raise SessionError(f"{self.name} is closed")
        if not self._busy.acquire(blocking=False):
            raise SessionBusy(
                f"{self.name} is already running a step: a session's steps are sequential"
            )
        try:
            if self.closed:  # closed by another thread since the check above
                raise SessionError(f"{self.name} is closed")
            self._stepping = threading.get_ident()
            lane, _ = self.pool.scheduler.acquire(self.params_key)
            try:
                return self._run_on(lane, fn, args, kwargs)
            finally:
                self.pool.scheduler.release(lane)
        finally:
            self._stepping = None
            self._busy.release()

    def prime(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like ``run``, for a step that runs model code outside the bound callables
        which reads the model's shared scratch through its sites — priming a prompt
        with the stock set-up, say: it runs in the eager section, with the model's
        sites to itself, and its state is taken back before the section ends."""
        return self.run(_Exclusive(fn), *args, **kwargs)

    def _run_on(self, lane: Any, fn: Callable, args: tuple, kwargs: dict) -> Any:
        pool = self.pool
        # this session's parameter values: the lane's graphs for them, or, where it holds
        # none, engines that run eager (the pool captures the value between steps) and
        # its carries' retention; never a capture inside a step
        lane.use(self.params_key, capture=False)
        token = _CURRENT.set(_Run(pool.binding, self, lane))
        exclusive = isinstance(fn, _Exclusive)
        try:
            with (
                _on_stream(lane),
                self._rng_on(lane),
                pool.binding.eager_section(lane) if exclusive else nullcontext(),
            ):
                if self._pending_reset:
                    self._restore_turn_start()
                if self.shared is not None and self._shared_snapshot is not None:
                    self.shared.load(self._shared_snapshot)
                self._record_streams(lane)
                result = (fn.fn if exclusive else fn)(*args, **kwargs)
                copied = self._take_back()
                if self.shared is not None:
                    self._shared_snapshot = self.shared.save(self._shared_snapshot)
            if lane.stream is not None:
                lane.stream.synchronize()
        finally:
            _CURRENT.reset(token)
        self.runs += 1
        with pool._lock:
            pool.counters["runs"] += 1
            pool.counters["copied_out_bytes"] += copied
        return result

    @contextmanager
    def _rng_on(self, lane: Any) -> Iterator[None]:
        lane.rng.set_state(self.rng_state)
        # one lane: the whole step draws from the session's state (no other step runs);
        # several: only the bound callables do (graphs by registration, eager calls in
        # the eager section)
        whole = (
            drawing_from(self.pool.device, lane.rng) if len(self.pool.lanes) == 1 else nullcontext()
        )
        try:
            with whole:
                yield
        finally:
            self.rng_state = lane.rng.get_state()

    # ----------------------------------------------------------------- close
    def close(self) -> None:
        """Release the session's state (idempotent, from any thread). A step running on
        another thread finishes first, with its answer (a client that hangs up mid-chunk
        loses nothing it was owed); the step's own code may not close its session."""
        if self._stepping == threading.get_ident():
            raise SessionError(
                f"{self.name}: close() called inside its own step; close it after run() returns"
            )
        with self._busy:
            if self.closed:
                return
            self.closed = True
            self.storage.clear()
            self._shared_snapshot = None
        self.pool._forget(self)

    def nbytes(self) -> int:
        shared = self.shared.nbytes(self._shared_snapshot) if self.shared is not None else 0
        return sum(r.nbytes for r in self.storage.values()) + shared

    def __repr__(self) -> str:
        return f"<Session {self.name}: {self.runs} runs, {self.nbytes() / 2**20:.1f} MiB>"


@dataclass(frozen=True)
class _Exclusive:
    """A step that must run in the eager section (``Session.prime``)."""

    fn: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@contextmanager
def _on_stream(lane: Any) -> Iterator[None]:
    if lane.stream is None:
        yield
        return
    with torch.cuda.stream(lane.stream):
        yield
