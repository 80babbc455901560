"""One replica's sessions: one binding of the contract and its SessionPool on one device.

Contract of this layer (ray-free; app.py runs it inside a Ray Serve replica, one per
GPU): ``ReplicaServer(config)`` builds the user's model (model.py) on the device, binds
the contract once, captures it and serves sessions on ``config.lanes`` lanes. It opens
at most ``config.max_sessions`` sessions — one more is refused (``Overloaded``) before
any work, so the open ones keep their cadence. Every call names the replica's
``incarnation`` (a fresh id per process): a call meant for a replica that has died and
been replaced meets a new incarnation and fails with ``SessionLost``, never with
another session's state. Calls run from any thread; a session's steps are sequential
(the pool refuses two at once).
"""

from __future__ import annotations

import importlib
import threading
import uuid
from typing import Any, Mapping

import torch

from .config import ServeConfig
from .errors import Overloaded, SessionLost, SessionUnknown
from .model import load_served_model


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
        return session.id

    def step(self, incarnation: str, sid: int, payload: Any) -> Any:
        return self.spec.step(self._session(incarnation, sid), payload)

    def reset(self, incarnation: str, sid: int) -> None:
        self.spec.reset(self._session(incarnation, sid))

    def close(self, incarnation: str, sid: int) -> None:
        session = self._session(incarnation, sid)
        with self._lock:
            self._sessions.pop(sid, None)
        session.close()

    def _session(self, incarnation: str, sid: int) -> Any:
        if incarnation != self.incarnation:
            raise SessionLost(
                f"session {sid} was held by replica {incarnation[:8]}, which died "
                f"(replaced by {self.incarnation[:8]}): its state is gone"
            )
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
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
