"""Channel: a producer's append-only buffer that another call of the session reads.

AS2D's drafter runs on its own stream and publishes its candidates 8 at a time; the
verifier, on another, reads whatever is ready when its round starts (issue 25). A
contract declares the buffer (``channel candidates { dtype int64  dims [448]  batch 8
clock round }``, compiler/channel_rules.py); this module is what it becomes:

* ``publish(values)`` (the producer) appends up to ``batch`` entries: one copy into host
  memory on the producer's current stream, then an event recorded behind it. The
  producer and the reader share no lock: the list of (end, event) pairs only grows, and
  an entry never changes once published (producers serialise among themselves, readers
  among themselves, each side on its own lock: two producer threads append whole
  batches, one after the other);
* ``ready()`` (the reader, once per tick of the channel's clock) counts the leading
  entries whose copy's event completed, monotone, and records the count: ``schedule``;
* ``read(start, end)`` returns entries below the last count ``ready()`` gave.

Which entries were ready depends on timing, so a run is replayed on its schedule:
``Channel(decl, device, replay=schedule)`` gives the recorded counts instead (the
producer having run inline first, every one of them is published; a count past what was
published, or a tick past the recording, is an error, never a guess). ``close()`` tells
the producer to stop. Bad input (a batch too long, past the capacity, of another dtype)
raises before anything is copied.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class ChannelDecl:
    """A declared channel: ``capacity`` entries of ``dtype``, published up to ``batch``
    at a time, readiness recorded per tick of ``clock``."""

    name: str
    dtype: str
    capacity: int
    batch: int
    clock: str

    def __post_init__(self) -> None:
        dtype = getattr(torch, str(self.dtype), None)
        if not isinstance(dtype, torch.dtype) or dtype.is_complex:
            raise ValueError(
                f"channel {self.name}: dtype {self.dtype!r} is not a real or integer torch dtype"
            )
        for what in ("capacity", "batch"):
            if type(getattr(self, what)) is not int:
                raise TypeError(f"channel {self.name}: {what} must be an int")
        if not 1 <= self.batch <= self.capacity:
            raise ValueError(
                f"channel {self.name}: batch {self.batch} must be in 1..capacity {self.capacity}"
            )


class ChannelError(RuntimeError):
    """A channel used past what it holds or what its replay recorded."""


class Channel:
    def __init__(
        self, decl: ChannelDecl, device: torch.device | str, replay: Sequence[int] | None = None
    ) -> None:
        self.decl = decl
        self.cuda = torch.device(device).type == "cuda"
        dtype = getattr(torch, decl.dtype)
        self.host = torch.zeros(decl.capacity, dtype=dtype, pin_memory=self.cuda)
        self._batches: list[tuple[int, Any]] = []  # (end, event): appended by the producer
        self._seen = self._ready = 0
        self.closed = False
        self.schedule: list[int] = []  # what ready() gave, tick by tick
        self.replay = None if replay is None else [int(n) for n in replay]
        self._producing, self._reading = threading.Lock(), threading.Lock()

    @property
    def published(self) -> int:
        """Entries published so far (their copies may still be in flight)."""
        return self._batches[-1][0] if self._batches else 0

    def publish(self, values: torch.Tensor) -> None:
        d = self.decl
        if not isinstance(values, torch.Tensor):
            raise TypeError(
                f"channel {d.name}: publish takes a tensor, got {type(values).__name__}"
            )
        if values.dtype != self.host.dtype:
            raise TypeError(f"channel {d.name}: publish got {values.dtype}, declared {d.dtype}")
        n = values.numel()
        if not 1 <= n <= d.batch:
            raise ValueError(f"channel {d.name}: a publish appends 1..{d.batch} entries, got {n}")
        with self._producing:
            start = self.published
            if start + n > d.capacity:
                raise ChannelError(
                    f"channel {d.name}: {start} + {n} entries is past its capacity {d.capacity}"
                )
            self.host[start : start + n].copy_(values.reshape(-1), non_blocking=self.cuda)
            event = None
            if self.cuda:
                event = torch.cuda.Event()
                event.record()
            self._batches.append((start + n, event))

    def ready(self) -> int:
        """The leading entries readable now, recorded (one call per tick of the clock)."""
        with self._reading:
            return self._ready_now()

    def _ready_now(self) -> int:
        if self.replay is None:
            n = self._poll()
        else:
            tick = len(self.schedule)
            if tick >= len(self.replay):
                raise ChannelError(
                    f"channel {self.decl.name}: tick {tick} is past the {len(self.replay)} "
                    "ticks of the replayed schedule"
                )
            n = self.replay[tick]
            if n > self._poll_all():
                raise ChannelError(
                    f"channel {self.decl.name}: the schedule has {n} entries ready at tick "
                    f"{tick}, only {self.published} were published"
                )
            self._ready = max(self._ready, n)
        self.schedule.append(n)
        return n

    def read(self, start: int, end: int) -> list:
        """Entries ``start`` to ``end`` (below the last ``ready()`` count), as numbers;
        none where ``start == end`` (a reader whose cursor ran past what is ready)."""
        if start == end >= 0:
            return []
        if not 0 <= start <= end <= self._ready:
            raise ChannelError(
                f"channel {self.decl.name}: read {start}..{end} outside the {self._ready} "
                "entries ready"
            )
        return self.host[start:end].tolist()

    def contents(self) -> list:
        """Every entry published, once copied (the producer's whole output, after it
        stopped); not a read of the schedule."""
        return self.host[: self._poll_all()].tolist()

    def close(self) -> None:
        """The reader is done: the producer stops at its next publish."""
        self.closed = True

    def _poll(self) -> int:
        while self._seen < len(self._batches):
            end, event = self._batches[self._seen]
            if event is not None and not event.query():
                break
            self._ready, self._seen = end, self._seen + 1
        return self._ready

    def _poll_all(self) -> int:
        """Every published entry, waiting for copies in flight (a replay is driven)."""
        for _, event in self._batches[self._seen :]:
            if event is not None:
                event.synchronize()
        return self.published
