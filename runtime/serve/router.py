"""Session affinity: which replica holds which session, and what is left of each.

Contract of this layer (pure, ray-free; the ingress in app.py owns one table and calls
it from its event loop): a replica is *up* under an incarnation once its heartbeat is
seen, *down* once it ends. ``choose`` picks, for a new session, the up replica with the
most headroom (capacity minus its open and opening sessions: the capacity plan's
numbers, ``ServeConfig.max_sessions``) and reserves a place there; every later request
of that session is routed by ``lookup`` to the same replica and incarnation. ``down``
fails every session of that incarnation at once: their next (or in-flight) request gets
``SessionLost``; sessions elsewhere are untouched. No replica with headroom: ``Overloaded``
at open, never a missed deadline later. ``expire`` forgets sessions their replica closed
for want of calls (the idle timeout): their places are free, and a later request of one
gets ``SessionUnknown`` saying why.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

from .errors import Overloaded, SessionLost, SessionUnknown

CLOSED_KEPT = 10_000  # expired sessions remembered, to answer a late request by name


def lost_message(sid: str, index: int, incarnation: str, why: str) -> str:
    return (
        f"session {sid} is lost: replica {index} ({incarnation[:8]}) died ({why}); "
        f"its state is gone, open a new session"
    )


def session_id(incarnation: str, local: int) -> str:
    """A session's id: its replica's incarnation and its id there. Nothing else goes in,
    so an ingress that Serve restarts names every open session as its predecessor did
    (``up`` adopts what a replica reports open) and its clients' ids stay valid."""
    return f"s-{incarnation[:8]}-{local}"


@dataclass(frozen=True)
class Pin:
    replica: int
    incarnation: str
    local: int  # the session's id on its replica


@dataclass
class _Replica:
    index: int
    capacity: int
    incarnation: str | None = None  # None: down (starting, or being replaced)
    sessions: set[str] = field(default_factory=set)
    opening: int = 0

    @property
    def headroom(self) -> int:
        return self.capacity - len(self.sessions) - self.opening


class SessionTable:
    def __init__(self, replicas: int, capacity: int) -> None:
        self.replicas = [_Replica(i, capacity) for i in range(replicas)]
        self.pins: dict[str, Pin] = {}
        self.lost: dict[str, str] = {}  # session -> why (until the client closes it)
        self.expired: OrderedDict[str, str] = OrderedDict()  # session -> why (the latest)
        self.expired_count = 0
        self.refused = 0

    # ---------------------------------------------------------------- replicas
    def up(self, index: int, incarnation: str, open_ids: Iterable[int] = ()) -> list[str]:
        """Replica ``index`` answers as ``incarnation``, holding sessions ``open_ids``
        (its ids); a different incarnation than before means the old one died: its
        sessions are returned as lost. Open sessions this table does not know (it is a
        restarted ingress's) are adopted under their ids; one already declared lost to
        its client stays lost."""
        r = self.replicas[index]
        lost = []
        if r.incarnation is not None and r.incarnation != incarnation:
            lost = self.down(index, r.incarnation, "it was replaced")
        r.incarnation = incarnation
        for local in open_ids:
            sid = session_id(incarnation, local)
            if sid not in self.pins and sid not in self.lost:
                self.pins[sid] = Pin(index, incarnation, local)
                r.sessions.add(sid)
        return lost

    def down(self, index: int, incarnation: str, why: str) -> list[str]:
        """Replica ``index`` under ``incarnation`` is gone: fail its sessions."""
        r = self.replicas[index]
        if r.incarnation != incarnation:
            return []  # already handled (or never seen)
        r.incarnation = None
        lost = sorted(r.sessions)
        for sid in lost:
            self.pins.pop(sid, None)
            self.lost[sid] = lost_message(sid, index, incarnation, why)
        r.sessions.clear()
        return lost

    def expire(self, index: int, incarnation: str, local_ids: list[int], why: str) -> list[str]:
        """Replica ``index`` under ``incarnation`` closed these sessions (its ids) for
        want of calls: forget them and free their places; the sessions expired now."""
        r = self.replicas[index]
        if r.incarnation != incarnation:
            return []  # its sessions went with it
        gone = set(local_ids)
        expired = sorted(sid for sid in r.sessions if self.pins[sid].local in gone)
        for sid in expired:
            del self.pins[sid]
            r.sessions.discard(sid)
            self.expired[sid] = f"session {sid} was closed by replica {index}: {why}"
            self.expired_count += 1
        while len(self.expired) > CLOSED_KEPT:
            self.expired.popitem(last=False)
        return expired

    def is_up(self, index: int, incarnation: str) -> bool:
        return self.replicas[index].incarnation == incarnation

    # ---------------------------------------------------------------- sessions
    def choose(self) -> tuple[int, str]:
        """Reserve a place for a new session on the up replica with the most headroom."""
        up = [r for r in self.replicas if r.incarnation is not None]
        best = max(up, key=lambda r: (r.headroom, -r.index), default=None)
        if best is None or best.headroom <= 0:
            self.refused += 1
            cap = sum(r.capacity for r in up)
            raise Overloaded(
                f"no capacity for a new session: {len(up)} of {len(self.replicas)} replicas "
                f"up, {cap - sum(r.headroom for r in up)} of {cap} session places taken"
            )
        best.opening += 1
        return best.index, best.incarnation

    def opened(
        self, index: int, incarnation: str, local: int | None, sid: str | None = None
    ) -> str | None:
        """End a reservation: with the replica's session id, pin and return a new
        session id — or ``sid``, a lost session restored there, which keeps its id;
        with None (the open failed), release the place."""
        r = self.replicas[index]
        r.opening -= 1
        if local is None or r.incarnation != incarnation:
            return None
        if sid is None:
            sid = session_id(incarnation, local)
        self.lost.pop(sid, None)
        self.pins[sid] = Pin(index, incarnation, local)
        r.sessions.add(sid)
        return sid

    def lookup(self, sid: str) -> Pin:
        pin = self.pins.get(sid)
        if pin is not None:
            return pin
        if sid in self.lost:
            raise SessionLost(self.lost[sid])
        if sid in self.expired:
            raise SessionUnknown(self.expired[sid])
        raise SessionUnknown(f"no open session {sid!r}: never opened here, or closed")

    def close(self, sid: str) -> Pin | None:
        """Forget the session; its pin if it was open (a lost one is only forgotten)."""
        if self.lost.pop(sid, None) is not None or self.expired.pop(sid, None) is not None:
            return None
        pin = self.lookup(sid)
        del self.pins[sid]
        self.replicas[pin.replica].sessions.discard(sid)
        return pin

    def stats(self) -> dict:
        return {
            "replicas": [
                {
                    "index": r.index,
                    "up": r.incarnation is not None,
                    "incarnation": r.incarnation,
                    "open": len(r.sessions),
                    "headroom": r.headroom,
                }
                for r in self.replicas
            ],
            "open": len(self.pins),
            "lost": len(self.lost),
            "expired": self.expired_count,
            "refused": self.refused,
        }
