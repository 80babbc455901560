"""A client whose chunks go straight to their session's replica: one Ray hop, not two.

Contract of this layer (imports ray, as app.py; for a synchronous caller in a process
on the application's Ray cluster — the driver that started it, a worker of it):
``SessionClient(app_name)`` opens a session through the ingress (``open_pinned``: the
replica with the most headroom, ``Overloaded`` refused there) and keeps its pin — the
replica's deployment, incarnation and local id; ``chunk`` and ``reset`` call that
replica's deployment handle directly, so a chunk crosses one hop (a Ray actor call, or
Serve's gRPC transport) instead of client -> ingress -> replica -> ingress -> client.
``close`` and ``stats`` go through the ingress, which owns the session table. A session
opened elsewhere (the ingress handle, another client) is located through the ingress on
first use.

Failures are the ingress's, with its 2 s bound: a session whose replica died gets
``SessionLost`` — a call in flight as soon as Ray reports the actor's death or the
ingress's ``deaths`` stream (which this client follows on a thread) names its
incarnation, whichever comes first (in-flight calls look every ``POLL_S``), and every
later call at once; a replacement replica answers a stale pin with ``SessionLost`` too
(its incarnation differs). A closed or unknown session gets ``SessionUnknown``. Other
sessions are untouched.

With ``restore_calls=N`` (off by default) a session this client opened survives its
replica's death while it has made at most N calls: the client keeps its calls
(journal.py), and when the session is lost the ingress rebuilds it from them on the
replica with the most headroom, under the same id (``Ingress.restore``: every replayed
output checked against the bytes this client already returned); then the call that met
the death is made there. The caller sees only the delay. A session with a longer
history, a replay whose bytes differ, or no place left gets ``SessionLost`` saying
which; ``stats()["restores"]`` counts both outcomes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping

import ray
from ray import serve

from .app import on_transport
from .liveness import DEAD
from .config import TRANSPORTS
from .errors import ServeError, SessionLost, plain
from .journal import Journal
from .router import lost_message

POLL_S = 0.1  # how often a call in flight looks whether its replica was reported dead
RESTORE_ATTEMPTS = 2  # a restored session whose new replica dies too is restored again


class SessionClient:
    """``transport``: how chunks and resets reach the replica. ``"actor"``: Serve's
    default, a Ray actor call; ``"grpc"``: Serve's direct gRPC transport to the replica
    (``handle.options(_by_reference=False)``, an underscored option in Ray 2.60), which
    skips the object store and is faster per hop (``python -m bench.serve_hop``).
    Errors, death detection and bytes are the same either way (tested).

    ``restore_calls``: restore a lost session whose history is at most this many calls
    (chunks and resets) by replaying it on another replica; 0, the default, never
    restores. While it is on, one session's calls from several threads take turns."""

    def __init__(
        self,
        app_name: str = "duplexcadence",
        *,
        transport: str = "actor",
        restore_calls: int = 0,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        if not isinstance(restore_calls, int) or isinstance(restore_calls, bool):
            raise TypeError(f"restore_calls must be an int, got {type(restore_calls).__name__}")
        if restore_calls < 0:
            raise ValueError(f"restore_calls must be 0 (off) or more, got {restore_calls}")
        self.app_name = app_name
        self.transport = transport
        self.restore_calls = restore_calls
        self._journals: dict[str, Journal] = {}  # session -> its calls (restore_calls > 0)
        self._turns: dict[str, threading.Lock] = {}  # session -> its calls take turns
        self.ingress = serve.get_app_handle(app_name)
        self._lock = threading.Lock()
        self._pins: dict[str, dict] = {}  # session -> the ingress's open_pinned/locate
        self._lost: dict[str, str] = {}  # session -> why (until closed)
        self._dead: set[str] = set()  # incarnations the ingress reported dead
        self._replicas: dict[str, Any] = {}  # deployment name -> its handle
        self._stop = threading.Event()
        self._stream: Any = None
        self._watcher = threading.Thread(
            target=self._follow_deaths, name=f"{app_name}-deaths", daemon=True
        )
        self._watcher.start()

    # ------------------------------------------------------------ sessions
    def open(self, params: Mapping[str, Any] | None = None) -> str:
        if params is not None and not isinstance(params, Mapping):  # before any Ray hop
            raise TypeError(
                f"session params must be a mapping of name to value, got {type(params).__name__}"
            )
        try:
            where = self.ingress.open_pinned.remote(dict(params or {})).result()
        except ServeError as e:
            raise plain(e) from None
        self._replica(where["deployment"])  # its router starts now, not at the first chunk
        sid = where["session"]
        with self._lock:
            self._pins[sid] = where
            if self.restore_calls:
                self._journals[sid] = Journal(dict(params or {}), self.restore_calls)
                self._turns[sid] = threading.Lock()
        return sid

    def chunk(self, sid: str, payload: Any) -> Any:
        return self._call(sid, "step", payload)

    def reset(self, sid: str) -> None:
        self._call(sid, "reset")

    def close(self, sid: str) -> None:
        with self._lock:
            self._pins.pop(sid, None)
            self._lost.pop(sid, None)
            self._journals.pop(sid, None)
            self._turns.pop(sid, None)
        try:
            self.ingress.close.remote(sid).result()
        except ServeError as e:
            raise plain(e) from None

    @property
    def journal_bytes(self) -> int:
        """What this client keeps to restore its sessions: their pickled payloads."""
        with self._lock:
            return sum(j.nbytes for j in self._journals.values())

    def stats(self) -> dict:
        return self.ingress.stats.remote().result()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop following the ingress, and wait (up to ``timeout_s``) until the thread
        that follows it has ended. Call it before ``ray.shutdown()``: Ray ends a process
        at once (exit status 1, no output) when one of its threads calls into Ray after
        the shutdown (ray-project/ray#19115)."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            _cancel(stream)
        self._watcher.join(timeout_s)

    @property
    def following(self) -> bool:
        """Whether the thread that follows the ingress's ``deaths`` stream still runs."""
        return self._watcher.is_alive()

    def __enter__(self) -> "SessionClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------- the hop
    def _call(self, sid: str, method: str, *args: Any) -> Any:
        with self._lock:
            journal, turn = self._journals.get(sid), self._turns.get(sid)
        if journal is None:
            return self._hop(sid, self._pin(sid), method, *args)
        with turn:  # the journal's order is the order the session got its calls
            frozen = Journal.freeze(args[0]) if method == "step" else None
            for attempt in range(RESTORE_ATTEMPTS + 1):
                try:
                    out = self._hop(sid, self._pin(sid), method, *args)
                    break
                except SessionLost:
                    if attempt == RESTORE_ATTEMPTS or self._journals.get(sid) is not journal:
                        raise
                    self._restore(sid, journal)
            journal.record(method, frozen, out)
            return out

    def _restore(self, sid: str, journal: Journal) -> None:
        """Have the ingress rebuild lost session ``sid`` from this client's journal of
        it (``Ingress.restore``: same id, another replica), or raise ``SessionLost``."""
        try:
            where = self.ingress.restore.remote(sid, journal).result()
        except ServeError as e:
            with self._lock:
                self._journals.pop(sid, None)  # lost for good: later calls fail at once
                self._lost[sid] = str(plain(e))
            raise plain(e) from None
        self._replica(where["deployment"])
        with self._lock:
            self._lost.pop(sid, None)
            self._pins[sid] = where

    def _hop(self, sid: str, where: dict, method: str, *args: Any) -> Any:
        if where["incarnation"] in self._dead:
            raise self._lose(sid, where, "reported by the ingress")
        handle = getattr(self._replica(where["deployment"]), method)
        response = handle.remote(where["incarnation"], where["local"], *args)
        try:
            while True:
                try:
                    return response.result(timeout_s=POLL_S)
                except TimeoutError:
                    pass
                if where["incarnation"] in self._dead:
                    _cancel(response)  # else it waits for (and meets) the replacement
                    raise self._lose(sid, where, "reported by the ingress")
        except ServeError as e:  # the replica's refusal, without Ray's traceback around it
            raise plain(e) from None
        except DEAD as e:
            with self._lock:
                self._dead.add(where["incarnation"])
            raise self._lose(sid, where, f"{type(e).__name__} answering a request") from None

    def _pin(self, sid: str) -> dict:
        with self._lock:
            where = self._pins.get(sid)
            if where is None and sid in self._lost:
                raise SessionLost(self._lost[sid])
        if where is None:  # opened through another client: ask the ingress once
            try:
                where = self.ingress.locate.remote(sid).result()
            except ServeError as e:  # SessionUnknown, SessionLost
                raise plain(e) from None
            with self._lock:
                self._pins[sid] = where
        return where

    def _lose(self, sid: str, where: dict, why: str) -> SessionLost:
        message = lost_message(sid, where["replica"], where["incarnation"], why)
        with self._lock:
            if self._pins.pop(sid, None) is not None:
                self._lost[sid] = message
            message = self._lost.get(sid, message)
        return SessionLost(message)

    def _replica(self, deployment: str) -> Any:
        handle = self._replicas.get(deployment)
        if handle is None:
            handle = serve.get_deployment_handle(deployment, self.app_name)
            handle = on_transport(handle, self.transport)
            self._replicas[deployment] = handle
        return handle

    def _follow_deaths(self) -> None:
        """The ingress's ``deaths`` stream, for as long as the client and Ray live (a
        broken stream — the ingress restarting — is followed again)."""
        while not self._stop.is_set() and ray.is_initialized():
            try:
                stream = self.ingress.options(stream=True).deaths.remote()
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():  # shutdown() ran before the stream was kept
                    _cancel(stream)
                    return
                for dead in stream:
                    with self._lock:
                        self._dead.update(dead)
            except BaseException:  # noqa: BLE001 - any end of the stream: follow it again
                if self._stop.is_set():  # (Ray shutting down raises SystemExit here)
                    return
            time.sleep(POLL_S)


def _cancel(response: Any) -> None:
    try:
        response.cancel()
    except Exception:  # noqa: BLE001 - best effort: a replacement refuses it anyway
        pass


__all__ = ["POLL_S", "TRANSPORTS", "SessionClient"]
