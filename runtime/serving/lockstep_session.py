"""The session's side of a lockstep pool (lockstep.py): a session on one slot, the
frames it hands in, and the error a full pool raises."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .lockstep import LockstepPool


class PoolFull(RuntimeError):
    """Every slot of the pool holds a session."""


@dataclass
class LockstepFrame:
    """One session's row handed to the pool, and its result once a tick served it."""

    row: torch.Tensor
    slot: int
    timeout_s: float
    submitted_at: float = field(default_factory=time.perf_counter)
    done_at: float | None = None  # time.perf_counter() when its tick ended
    done: threading.Event = field(default_factory=threading.Event)
    out: Any = None
    error: BaseException | None = None

    def result(self) -> Any:
        """The session's row of its tick's outputs; waits for the tick."""
        if not self.done.wait(self.timeout_s):
            raise TimeoutError(f"lockstep slot {self.slot}: no tick in {self.timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"lockstep tick failed: {self.error}") from self.error
        return self.out

    def finish(self, out: Any = None, error: BaseException | None = None) -> None:
        self.out, self.error, self.done_at = out, error, time.perf_counter()
        self.done.set()


class LockstepSession:
    """One session on one slot of a ``LockstepPool``; ``step``/``submit`` from one thread
    at a time (its frames are served in the order they were handed in)."""

    def __init__(self, pool: "LockstepPool", slot: int) -> None:
        self.pool, self.slot, self.closed, self.steps = pool, slot, False, 0

    def submit(self, x: torch.Tensor) -> LockstepFrame:
        """Hand in one call of this session (``x``: its row, leading extent 1) without
        waiting; served after the frames it handed in before. Blocks only while
        ``max_ahead`` of its frames wait unserved."""
        if self.closed:
            raise RuntimeError(f"lockstep session on slot {self.slot} is closed")
        frame = self.pool._submit(self, x)
        self.steps += 1
        return frame

    def step(self, x: torch.Tensor) -> Any:
        """Serve one call of this session; returns its row of the outputs once the tick
        that served it has run."""
        return self.submit(x).result()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool._release(self)

    def __enter__(self) -> "LockstepSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
