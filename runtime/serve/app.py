"""The Ray Serve application: one replica per GPU, an ingress with session affinity.

Contract of this layer (imports ray, as client.py; ``runtime.serve`` imports it on
demand): the two deployments; launch.py binds them into the application and runs it.

* ``Replica`` — a deployment per device (``replica_0`` .. ``replica_{n-1}``, one replica
  each, ``gpus_per_replica`` GPUs): a ``ReplicaServer`` (one binding, one SessionPool),
  its calls on a thread pool of one thread per session place so sessions run on lanes
  at once and the event loop stays free for the heartbeat stream.
* ``Ingress`` — opens a session on the up replica with the most headroom and pins every
  later request of it there (router.SessionTable). One deployment per device makes the
  pin an address a stock Serve handle reaches; Serve's routers (pow-2, queue length)
  know no affinity. A heartbeat stream per replica (``watch``) tells the ingress a
  replica died the moment Ray ends the stream: its sessions fail at once — a request in
  flight and every later one get ``SessionLost`` — while Serve starts a replacement,
  which comes up under a new incarnation with empty sessions. A restarted ingress adopts
  every session its replicas report open (router.session_id names a session by its
  replica's incarnation and its id there). Methods (handle API):
  ``open(params) -> session id``, ``chunk(id, payload) -> output``, ``reset(id)``,
  ``close(id)``, ``stats()``; over HTTP, the WebSocket ``/sessions`` (``websocket``).
  For a client that steps sessions on their replica itself (client.SessionClient: one
  hop per chunk instead of two): ``open_pinned(params)`` and ``locate(id)`` say where a
  session lives, the stream ``deaths()`` names every replica incarnation that died.
"""

# No `from __future__ import annotations` here: FastAPI must see the WebSocket
# annotation of a class-based route as a type (Serve rewrites its signature; a string
# left unresolved makes the route refuse every connection with a 403).
import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator

import numpy as np
import torch
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from ray import serve

from .config import ServeConfig
from .errors import Overloaded, ServeError, SessionLost, SessionUnknown
from .journal import Journal, RestoreDiverged
from .liveness import LOG, ReplicaLiveness
from .replica import ReplicaServer
from .router import SessionTable

RESTORE_ATTEMPTS = 2  # a restored session whose new replica dies too is restored again


def replica_name(index: int) -> str:
    """The deployment of replica ``index`` (``serve.get_deployment_handle`` finds it).
    Defined above the deployments: ``serve.ingress`` pickles the Ingress class where it
    is decorated, with the globals defined by then."""
    return f"replica_{index}"


def on_transport(handle: Any, transport: str) -> Any:
    """``handle`` with its calls on ``transport`` (config.TRANSPORTS)."""
    return handle.options(_by_reference=False) if transport == "grpc" else handle


def on_the_wire(output: Any) -> Any:
    """A tensor output as its numpy array: Ray pickles an array out of band (no copy
    into the pickle), a tensor by copying its storage — about 1-3 ms more per 96 KB
    chunk of PCM, per hop, on a CPU. Dtypes numpy lacks (bfloat16) stay tensors."""
    if isinstance(output, torch.Tensor):
        try:
            return output.detach().cpu().numpy()
        except TypeError:
            return output
    return output


@serve.deployment
class Replica:
    def __init__(self, config: ServeConfig) -> None:
        self.server = ReplicaServer(config)
        self.executor = ThreadPoolExecutor(config.max_sessions + 2, thread_name_prefix="session")

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def open(self, params: dict) -> tuple[str, int]:
        return self.server.incarnation, await self._call(self.server.open, params)

    async def step(self, incarnation: str, sid: int, payload: Any) -> Any:
        return on_the_wire(await self._call(self.server.step, incarnation, sid, payload))

    async def reset(self, incarnation: str, sid: int) -> None:
        await self._call(self.server.reset, incarnation, sid)

    async def close(self, incarnation: str, sid: int) -> None:
        await self._call(self.server.close, incarnation, sid)

    async def stats(self) -> dict:
        return self.server.stats()

    async def reset_peak_memory(self) -> None:
        await self._call(self.server.reset_peak_memory)

    async def watch(self, period_s: float) -> AsyncIterator[dict]:
        """The heartbeat stream: the ingress learns the replica's incarnation here,
        its death when Ray ends this stream with an error, and the sessions it closed
        for the idle timeout (``expire_idle`` runs before each beat)."""
        idle_timeout = self.server.config.idle_timeout_s
        while True:
            if idle_timeout is not None:
                await self._call(self.server.expire_idle)
            yield {
                "incarnation": self.server.incarnation,
                "headroom": self.server.headroom(),
                "open": self.server.open_ids(),  # what a restarted ingress adopts
                # repeated for stall_s: a live stream shows the ingress each one
                "expired": self.server.recently_expired(self.server.config.stall_s),
            }
            await asyncio.sleep(period_s)


http = FastAPI(title="duplexcadence sessions")


@serve.deployment(max_ongoing_requests=100_000)
@serve.ingress(http)
class Ingress(ReplicaLiveness):
    def __init__(self, config: ServeConfig, *replicas: Any) -> None:
        self.config = config
        self.replicas = [on_transport(r, config.transport) for r in replicas]
        self.table = SessionTable(len(replicas), config.max_sessions)
        self.gone: dict[tuple[int, str], asyncio.Event] = {}  # (replica, incarnation) died
        self.dead: list[str] = []  # incarnations that died, in order (the ``deaths`` stream)
        self.death = asyncio.Event()  # set (and replaced) at every death
        self.watchers: list[asyncio.Task] = []
        self.first_beat: asyncio.Event | None = None
        self.journals: dict[str, Journal] = {}  # sessions opened here (restore_calls > 0)
        self.turns: dict[str, asyncio.Lock] = {}  # a journaled session's calls take turns
        self.restoring: dict[str, asyncio.Lock] = {}
        self.restores = {"restored": 0, "not_restored": 0, "calls_replayed": 0, "replay_s": 0.0}

    # ------------------------------------------------------------ handle API
    async def open(self, params: dict | None = None) -> str:
        sid = (await self.open_pinned(params))["session"]
        if self.config.restore_calls:  # its calls come through here: keep them
            self.journals[sid] = Journal(dict(params or {}), self.config.restore_calls)
            self.turns[sid] = asyncio.Lock()
        return sid

    async def open_pinned(self, params: dict | None = None) -> dict:
        """``open``, with where the session lives: ``{"session", "replica" (index),
        "deployment", "incarnation", "local"}`` (a SessionClient steps it there)."""
        await self._ready()
        index, incarnation = self.table.choose()  # Overloaded: refused before any work
        local = None
        try:
            local = await self._open_on(index, incarnation, params or {})
        except SessionLost as e:
            raise SessionLost(f"no session opened: replica {index} died meanwhile ({e})") from None
        finally:
            sid = self.table.opened(index, incarnation, local)
        if sid is None:  # the replica went down after it answered
            raise SessionLost(f"no session opened: replica {index} died meanwhile")
        return self._where(sid, self.table.lookup(sid))

    async def _open_on(self, index: int, incarnation: str, params: dict) -> int:
        """A new session on replica ``index`` (a place reserved there); its local id."""
        call = self.replicas[index].open.remote(params)
        got, local = await self._on(index, incarnation, call, "(opening)")
        if got != incarnation:  # the replica was replaced between beat and call
            raise SessionLost(f"replica {index} was replaced while the session opened")
        return local

    async def restore(self, sid: str, journal: Journal) -> dict:
        """Rebuild lost session ``sid`` from its calls (journal.py) on the up replica
        with the most headroom, under the same id; where it lives now (as ``locate``).
        ``SessionLost`` saying why not: a history past the journal's limit, other bytes
        on replay, no place left, or the new replica dying too."""
        if not isinstance(journal, Journal):
            raise TypeError(f"restore needs a journal.Journal, got {type(journal).__name__}")
        async with self.restoring.setdefault(sid, asyncio.Lock()):  # one restore at a time
            if sid in self.table.pins:  # restored meanwhile (by a concurrent call)
                return self._where(sid, self.table.lookup(sid))
            lost = self.table.lost.get(sid)
            if lost is None:
                self.table.lookup(sid)  # SessionUnknown: never opened here, or closed
            why, began = journal.why_not(), time.perf_counter()
            if why is None:
                why = await self._replay(sid, journal)
            if why is not None:
                self.restores["not_restored"] += 1
                raise SessionLost(f"{lost} (not restored: {why})")
            self.restores["restored"] += 1
            self.restores["calls_replayed"] += len(journal.calls)
            self.restores["replay_s"] += time.perf_counter() - began
            LOG.warning("session %s restored on replica %d", sid, self.table.lookup(sid).replica)
            return self._where(sid, self.table.lookup(sid))

    async def _replay(self, sid: str, journal: Journal) -> str | None:
        """Open a session for ``journal`` and make its calls again: None once ``sid`` is
        pinned to it, else why not (the new session closed, its place released)."""
        await self._ready()
        try:
            index, incarnation = self.table.choose()
        except Overloaded as e:
            return str(e)
        local, why = None, None
        try:
            local = await self._open_on(index, incarnation, journal.params)
            for method, args, check in journal.replaying():
                call = getattr(self.replicas[index], method).remote(incarnation, local, *args)
                check(await self._on(index, incarnation, call, sid))
        except Exception as e:  # noqa: BLE001 - whatever it was, the restore fails closed
            why = str(e) if isinstance(e, (ServeError, RestoreDiverged)) else repr(e)
            if local is not None and self.table.is_up(index, incarnation):
                try:
                    await self.replicas[index].close.remote(incarnation, local)
                except Exception:  # noqa: BLE001 - best effort: it died meanwhile
                    pass
            local = None
        finally:
            pinned = self.table.opened(index, incarnation, local, sid=sid)
        if pinned is None:
            return why or f"replica {index} died as the replay ended"
        return None

    async def locate(self, sid: str) -> dict:
        """Where an open session lives (as ``open_pinned``); SessionUnknown / SessionLost.
        A client that asks steps the session itself from now on, so a journal kept here
        would miss its calls: it is dropped (the client keeps its own)."""
        where = self._where(sid, self.table.lookup(sid))
        self.journals.pop(sid, None)
        return where

    def _where(self, sid: str, pin: Any) -> dict:
        return {
            "session": sid,
            "replica": pin.replica,
            "deployment": replica_name(pin.replica),
            "incarnation": pin.incarnation,
            "local": pin.local,
        }

    async def chunk(self, sid: str, payload: Any) -> Any:
        return await self._call(sid, "step", payload)

    async def reset(self, sid: str) -> None:
        await self._call(sid, "reset")

    async def _call(self, sid: str, method: str, *args: Any) -> Any:
        """A call of a session on its replica; a journaled session lost meanwhile is
        restored (``restore``) and the call made there."""
        journal = self.journals.get(sid)
        if journal is None:
            return await self._hop(sid, method, *args)
        async with self.turns[sid]:  # the journal's order is the order of the calls
            frozen = Journal.freeze(args[0]) if method == "step" else None
            for attempt in range(RESTORE_ATTEMPTS + 1):
                try:
                    out = await self._hop(sid, method, *args)
                    break
                except SessionLost:
                    if attempt == RESTORE_ATTEMPTS or self.journals.get(sid) is not journal:
                        raise
                    try:
                        await self.restore(sid, journal)
                    except SessionLost:
                        self.journals.pop(sid, None)  # lost for good
                        raise
            journal.record(method, frozen, out)
            return out

    async def _hop(self, sid: str, method: str, *args: Any) -> Any:
        pin = self.table.lookup(sid)  # SessionUnknown / SessionLost
        call = getattr(self.replicas[pin.replica], method).remote(pin.incarnation, pin.local, *args)
        return await self._on(pin.replica, pin.incarnation, call, sid)

    async def close(self, sid: str) -> None:
        self.journals.pop(sid, None)
        self.turns.pop(sid, None)
        self.restoring.pop(sid, None)
        pin = self.table.close(sid)
        if pin is not None and self.table.is_up(pin.replica, pin.incarnation):
            call = self.replicas[pin.replica].close.remote(pin.incarnation, pin.local)
            try:
                await self._on(pin.replica, pin.incarnation, call, sid)
            except SessionLost:
                pass  # its replica died meanwhile: nothing is left to release
            except SessionUnknown:
                pass  # its replica expired it (idle) before this table heard: closed

    async def stats(self) -> dict:
        await self._ready()
        out = self.table.stats()
        for r in out["replicas"]:
            if r["up"]:
                try:
                    r["server"] = await asyncio.wait_for(
                        self.replicas[r["index"]].stats.remote(), self.config.stall_s
                    )
                except Exception as e:  # noqa: BLE001 - a dying replica has no stats
                    r["server"] = {"error": f"{type(e).__name__}"}
        out["restores"] = {
            **self.restores,
            "journals": len(self.journals),  # sessions stepped here whose calls are kept
            "journal_bytes": sum(j.nbytes for j in self.journals.values()),
        }
        return out

    async def reset_peak_memory(self) -> None:
        """Every live replica's device-memory peak starts over (a measured window's
        start: ``stats()`` then reports each replica's peak within the window)."""
        await self._ready()
        up = [r["index"] for r in self.table.stats()["replicas"] if r["up"]]
        await asyncio.gather(*(self.replicas[i].reset_peak_memory.remote() for i in up))

    # ---------------------------------------------------------------- HTTP
    @http.websocket("/sessions")
    async def websocket(self, ws: WebSocket) -> None:
        """One session per connection. The client sends JSON text messages: first
        ``{"open": params}`` (answer ``{"session": id}``), then ``{"chunk": payload}``
        (answer: the output as a binary float32 frame) or ``{"reset": true}`` (answer
        ``{"ok": true}``); an error is answered ``{"error": type, "message": ...}``. The
        session closes with the connection."""
        await ws.accept()
        sid = None
        try:
            while True:
                msg = json.loads(await ws.receive_text())
                try:
                    if sid is None:
                        sid = await self.open(msg.get("open") or {})
                        await ws.send_json({"session": sid})
                    elif "chunk" in msg:
                        out = await self.chunk(sid, msg["chunk"])
                        await ws.send_bytes(np.asarray(out, dtype=np.float32).tobytes())
                    elif msg.get("reset"):
                        await self.reset(sid)
                        await ws.send_json({"ok": True})
                    else:
                        raise ValueError(f"unknown message {sorted(msg)}")
                except (ServeError, ValueError) as e:
                    await ws.send_json({"error": type(e).__name__, "message": str(e)})
        except WebSocketDisconnect:
            pass
        finally:
            if sid is not None:
                try:
                    await self.close(sid)
                except ServeError:
                    pass
