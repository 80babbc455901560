"""The eager section's lock: reentrant, first come first served, with a hand-over.

Contract of this layer. Eager code reads scratch through the model's sites, which all
lanes share (binding.py), so one eager call runs at a time. Served with many voices,
two kinds of work queue for it: sessions' eager steps (a few hundred ms each) and the
pool's background captures, which hold it one class at a time (capture_section.CaptureSection).
A plain ``threading.RLock`` wakes an arbitrary waiter: measured on the H200 with 16
voices, a value's capture took 12–16 s under load instead of 3.5 s idle, waiting
behind whichever eager steps won the race. This lock serves waiters in arrival order,
and ``hand_over()`` lets the holder give the lock to the next waiter for one section
and take it back right after it, ahead of everybody else: a capture and the eager
steps then alternate, a class of one and a section of the other.

Handing over to every step queued at the pause, not one, was measured too (H200, 16
voices in 4 serving processes, with 3 lanes each instead of 2): each step waited less,
but a voice's capture took 7 s instead of 4.3 s, so its session ran eager longer:
190 eager steps and 192 deadline misses of 590 chunks, against 103 and 105. Under
load a capture is what turns eager steps into replays; it keeps its one-class turns.
"""

from __future__ import annotations

import threading
from collections import deque


class EagerLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._queue: deque[object] = deque()  # waiters' tickets, the next one first

    def acquire(self) -> bool:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return True
            ticket = object()
            self._queue.append(ticket)
            self._wait_for(ticket)
            self._take(me)
            return True

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of an eager lock this thread does not hold")
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> "EagerLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def held_here(self) -> bool:
        """Whether the calling thread holds the lock."""
        return self._owner == threading.get_ident()

    def waiting(self) -> int:
        """Threads waiting for the lock now."""
        return len(self._queue)

    def hand_over(self) -> bool:
        """Let the next waiter hold the lock for its section, then take it back before
        any other waiter. The caller holds it once (not nested); False (and nothing
        done) when nobody waits."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me or self._depth != 1:
                raise RuntimeError("hand_over() needs the eager lock held once by this thread")
            if not self._queue:
                return False
            ticket = object()
            self._queue.insert(1, ticket)  # right behind the waiter it hands over to
            self._owner, self._depth = None, 0
            self._cond.notify_all()
            self._wait_for(ticket)
            self._take(me)
            return True

    def _wait_for(self, ticket: object) -> None:
        while self._owner is not None or self._queue[0] is not ticket:
            self._cond.wait()

    def _take(self, me: int) -> None:
        self._queue.popleft()
        self._owner, self._depth = me, 1
        self._cond.notify_all()
