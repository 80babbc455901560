"""One replica's sessions: one binding of the contract and its SessionPool on one device.

Contract of this layer (ray-free; app.py runs it inside a Ray Serve replica, one per
GPU): ``ReplicaServer(config)`` builds the user's model (model.py) on the device, binds
the contract once, captures it and serves sessions on ``config.lanes`` lanes. It opens
at most ``config.max_sessions`` sessions — one more is refused (``Overloaded``) before
any work, so the open ones keep their cadence. Every call names the replica's
``incarnation`` (a fresh id per process): a call meant for a replica that has died and
been replaced meets a new incarnation and fails with ``SessionLost``, never with
another session's state. Calls run from any thread; a session's steps are sequential
(the pool refuses two at once). With ``config.idle_timeout_s``, ``expire_idle()`` closes
every session that has had no call for that long and is not in one (a client that
vanished without closing would otherwise hold its place for good); a later call of it
is told so (``SessionUnknown``), and ``recently_expired()`` names them for the ingress.
"""

from __future__ import annotations

import importlib
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch

from .config import ServeConfig
from .errors import Overloaded, SessionLost, SessionUnknown
from .model import load_served_model

EXPIRED_KEPT = 4096  # expired sessions remembered, to answer a late call by name


class ReplicaServer:
    def __init__(self, config: ServeConfig, device: Any = None) -> None:
        self.config = config
        self.device = torch.device(device or config.device)
        self.incarnation = uuid.uuid4().hex
        self.spec = load_served_model(config.model)
        adapter = importlib.import_module(config.contract)
        bound: list = []

        def bind(model: Any) -> Any:
            if bound:
                raise RuntimeError(f"{config.model}: build() called bind() twice")
            bound.append(adapter.bind(model, device=self.device, capture=False, progress=False))
            return bound[0]

        self.model = self.spec.build(self.device, bind)
        if not bound:
            bind(self.model)
        self.binding = bound[0]
        self.binding.capture(progress=False)
        self.pool = self.binding.sessions(lanes=config.lanes, progress=False)
        self._lock = threading.Lock()
        self._sessions: dict[int, Any] = {}
        self._opening = 0
        self.refused = 0
        self.clock = time.monotonic  # where call times come from (a test's fake clock)
        self._last_call: dict[int, float] = {}  # session -> self.clock() at its last call
        self._in_call: dict[int, int] = {}  # session -> calls running (never expired then)
        self._expired: OrderedDict[int, tuple[float, str]] = OrderedDict()  # -> (when, why)

    # ---------------------------------------------------------------- sessions
    def open(self, params: Mapping[str, Any]) -> int:
        """A new session for ``params``; its id on this replica."""
        if not isinstance(params, Mapping):
            raise TypeError(
                f"session params must be a mapping of name to value, got {type(params).__name__}"
            )
        with self._lock:
            if len(self._sessions) + self._opening >= self.config.max_sessions:
                self.refused += 1
                raise Overloaded(
                    f"replica {self.incarnation[:8]} is at its capacity of "
                    f"{self.config.max_sessions} sessions"
                )
            self._opening += 1
        try:
            session = self.spec.open(self.model, self.pool, dict(params))
        finally:
            with self._lock:
                self._opening -= 1
        with self._lock:
            self._sessions[session.id] = session
            self._last_call[session.id] = self.clock()
        return session.id

    def step(self, incarnation: str, sid: int, payload: Any) -> Any:
        with self._call(incarnation, sid) as session:
            return self.spec.step(session, payload)

    def reset(self, incarnation: str, sid: int) -> None:
        with self._call(incarnation, sid) as session:
            self.spec.reset(session)

    def close(self, incarnation: str, sid: int) -> None:
        with self._lock:
            session = self._session(incarnation, sid)
            self._forget(sid)
        session.close()

    def expire_idle(self) -> list[int]:
        """Close every session with no call for ``config.idle_timeout_s`` and none
        running; their ids."""
        timeout = self.config.idle_timeout_s
        if timeout is None:
            return []
        now = self.clock()
        why = f"no call for {timeout:g} s (the idle timeout): it was closed"
        with self._lock:
            idle = [
                sid
                for sid, at in self._last_call.items()
                if now - at > timeout and not self._in_call.get(sid)
            ]
            sessions = [self._sessions[sid] for sid in idle]
            for sid in idle:
                self._forget(sid)
                self._expired[sid] = (now, why)
            while len(self._expired) > EXPIRED_KEPT:
                self._expired.popitem(last=False)
        for session in sessions:
            session.close()
        return idle

    def open_ids(self) -> list[int]:
        """The sessions open here (a restarted ingress adopts them from a heartbeat)."""
        with self._lock:
            return sorted(self._sessions)

    def recently_expired(self, within_s: float) -> list[int]:
        """Sessions expired in the last ``within_s`` seconds (every heartbeat repeats
        them, so the ingress sees each one while its stream lives)."""
        now = self.clock()
        with self._lock:
            return [sid for sid, (at, _) in self._expired.items() if now - at <= within_s]

    @contextmanager
    def _call(self, incarnation: str, sid: int) -> Iterator[Any]:
        """The session, marked as in a call (never expired) while the block runs; its
        idle time counts from the call's end."""
        with self._lock:
            session = self._session(incarnation, sid)
            self._in_call[sid] = self._in_call.get(sid, 0) + 1
        try:
            yield session
        finally:
            with self._lock:
                if sid in self._sessions:
                    self._in_call[sid] -= 1
                    self._last_call[sid] = self.clock()

    def _forget(self, sid: int) -> None:  # under self._lock
        self._sessions.pop(sid, None)
        self._last_call.pop(sid, None)
        self._in_call.pop(sid, None)

    def _session(self, incarnation: str, sid: int) -> Any:  # under self._lock
        if incarnation != self.incarnation:
            raise SessionLost(
                f"session {sid} was held by replica {incarnation[:8]}, which died "
                f"(replaced by {self.incarnation[:8]}): its state is gone"
            )
        session = self._sessions.get(sid)
        if session is None:
            if sid in self._expired:
                raise SessionUnknown(
                    f"session {sid} on replica {self.incarnation[:8]} had "
                    f"{self._expired[sid][1]}"
                )
            raise SessionUnknown(f"no open session {sid} on replica {self.incarnation[:8]}")
        return session

    # --------------------------------------------------------------- telemetry
    def headroom(self) -> int:
        with self._lock:
            return self.config.max_sessions - len(self._sessions) - self._opening

    def stats(self) -> dict:
        with self._lock:
            open_ = len(self._sessions)
        return {
            "incarnation": self.incarnation,
            "device": str(self.device),
            "open": open_,
            "capacity": self.config.max_sessions,
            "refused": self.refused,
            "pool": self.pool.stats(),
            "device_memory": self.device_memory(),
        }

    def device_memory(self) -> dict | None:
        """This replica's device memory in MiB (None on a CPU): allocated now, the most
        allocated since ``reset_peak_memory()`` (or since start), and what the caching
        allocator reserves. Only the replica's process sees it: a client's own
        ``torch.cuda`` counters read 0 for memory that lives here."""
        if self.device.type != "cuda":
            return None
        mib = 2**20
        return {
            "allocated_mib": torch.cuda.memory_allocated(self.device) / mib,
            "peak_mib": torch.cuda.max_memory_allocated(self.device) / mib,
            "reserved_mib": torch.cuda.memory_reserved(self.device) / mib,
        }

    def reset_peak_memory(self) -> None:
        """Start ``device_memory()["peak_mib"]`` over from what is allocated now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
