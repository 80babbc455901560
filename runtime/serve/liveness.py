"""The ingress's view of its replicas (app.py): which incarnation of each is up, and
the moment one dies.

A heartbeat stream per replica (``Replica.watch``) marks it up at its first beat and
down when the stream ends or stalls (``stall_s``); a replacement comes up under a new
incarnation. A request in flight on a replica that dies fails at once with
``SessionLost`` (``_on``), and every ``deaths()`` stream hears of it.
``ReplicaLiveness`` is a part of ``Ingress``, reading the state ``Ingress.__init__``
creates (``config``, ``replicas``, ``table``, ``gone``, ``dead``, ``death``, ...).
"""

import asyncio
import logging
from typing import Any, AsyncIterator

from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError

from .errors import ServeError, SessionLost, plain

LOG = logging.getLogger("duplexcadence.serve")
DEAD = (RayActorError, ReplicaUnavailableError)  # what Ray raises for a replica that died


class ReplicaLiveness:
    async def _ready(self) -> None:
        if not self.watchers:
            self.first_beat = asyncio.Event()
            self.watchers = [asyncio.create_task(self._watch(i)) for i in range(len(self.replicas))]
        await self.first_beat.wait()

    async def _watch(self, index: int) -> None:
        """Follow replica ``index`` for ever: up at its first beat, down when its
        stream ends or stalls, up again under the replacement's incarnation."""
        handle = self.replicas[index].options(stream=True)
        while True:
            incarnation, why = None, "its heartbeat stream ended"
            try:
                beats = handle.watch.remote(self.config.heartbeat_s).__aiter__()
                while True:
                    beat = await asyncio.wait_for(beats.__anext__(), self.config.stall_s)
                    if beat["incarnation"] != incarnation:
                        if incarnation is not None:
                            self._down(index, incarnation, "it was replaced")
                        incarnation = beat["incarnation"]
                        for sid in self.table.up(index, incarnation, beat.get("open", ())):
                            LOG.warning("%s", self.table.lost.get(sid))
                        self.first_beat.set()
                    if beat.get("expired"):
                        self._expired(index, incarnation, beat["expired"])
            except asyncio.TimeoutError:
                why = f"no heartbeat for {self.config.stall_s:.1f} s"
            except Exception as e:  # noqa: BLE001 - any end of the stream is a death
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if incarnation is not None:
                self._down(index, incarnation, why)
            await asyncio.sleep(self.config.heartbeat_s)

    def _down(self, index: int, incarnation: str, why: str) -> None:
        lost = self.table.down(index, incarnation, why)
        self._gone(index, incarnation).set()
        if incarnation not in self.dead:
            self.dead.append(incarnation)
            self.death.set()  # wakes every ``deaths`` stream
            self.death = asyncio.Event()
        if lost:
            LOG.warning("replica %d (%s) died (%s): %d session(s) lost", index, incarnation[:8], why, len(lost))  # fmt: skip

    def _expired(self, index: int, incarnation: str, local_ids: list[int]) -> None:
        """Replica ``index`` closed these sessions for want of calls: free their places."""
        why = f"no call for {self.config.idle_timeout_s:g} s (the idle timeout)"
        for sid in self.table.expire(index, incarnation, local_ids, why):
            self.journals.pop(sid, None)
            self.turns.pop(sid, None)
            LOG.info("session %s expired: %s", sid, why)

    def _gone(self, index: int, incarnation: str) -> asyncio.Event:
        return self.gone.setdefault((index, incarnation), asyncio.Event())

    async def _on(self, index: int, incarnation: str, call: Any, sid: str) -> Any:
        """Await a replica's answer, or fail as soon as that replica is known dead."""
        task = asyncio.ensure_future(call)
        gone = asyncio.ensure_future(self._gone(index, incarnation).wait())
        try:
            done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if task not in done:
            task.cancel()
        else:
            try:
                return task.result()
            except ServeError as e:  # the replica's refusal, without Ray's traceback around it
                raise plain(e) from None
            except DEAD as e:
                self._down(index, incarnation, f"{type(e).__name__} answering a request")
        raise SessionLost(
            self.table.lost.get(sid)
            or f"session {sid} is lost: replica {index} ({incarnation[:8]}) died"
        )

    async def deaths(self) -> AsyncIterator[list[str]]:
        """Every replica incarnation that died so far: now, then again at each death
        (a SessionClient fails the sessions it pinned there)."""
        await self._ready()
        while True:
            death = self.death
            yield list(self.dead)
            await death.wait()
