"""Retention policies: how much of a growing history stays live, and where.

Contract of this layer: each policy is a frozen value with
  * ``retained_length(incoming, written)`` — pure integer arithmetic: how many
    frames are live after retaining ``incoming`` frames;
  * ``plan(incoming, written)`` — the writeback as copy segments
    ``(dst, src, length)`` along the clock axis, so the carry can apply it with
    ``copy_`` into narrowed views and never allocate;
  * ``reference(history, axis, prev, written)`` — the *stock* semantics written the
    way released code writes it (``torch.cat`` of slices, a fresh tensor), used only
    by the audit to prove the writeback right.

Two families differ in what ``history`` means:
  * ``HeadTail`` and ``Window`` (``appends = False``) receive the whole logical
    history of length ℓ (e.g. ``cat(carry, new)`` produced by the model) and keep
    a fixed selection of it at storage offset 0.
  * ``Ring`` (``appends = True``) receives only the *new* frames and writes them at
    slot ``t mod N`` for absolute frame index ``t``; ``written`` (frames ever
    written) is the ring's state, and consumers mask by position, as Moshi's ring
    KV cache does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple, Union

import torch


class Segment(NamedTuple):
    """Copy ``length`` frames from ``history[src:]`` to ``carry[dst:]`` (clock axis)."""

    dst: int
    src: int
    length: int


def _nonneg(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


@dataclass(frozen=True)
class HeadTail:
    """Keep the first ``head`` and the last ``tail`` frames, in storage order.

    Writeback for ℓ > P+R: ``C[0:P] ← H[0:P]; C[P:P+R] ← H[ℓ−R:ℓ]``; otherwise the
    whole history is kept, ``C[0:ℓ] ← H[0:ℓ]``. (Stock code written as
    ``H[..., -R:]`` keeps *everything* when R = 0; this policy means "no tail".)
    """

    head: int
    tail: int
    appends: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _nonneg("head", self.head)
        _nonneg("tail", self.tail)

    @property
    def capacity(self) -> int:
        return self.head + self.tail

    def retained_length(self, incoming: int, written: int = 0) -> int:
        return min(incoming, self.head + self.tail)

    def plan(self, incoming: int, written: int = 0) -> tuple[Segment, ...]:
        p, r = self.head, self.tail
        if incoming > p + r:
            segs = (Segment(0, 0, p), Segment(p, incoming - r, r))
        else:
            segs = (Segment(0, 0, incoming),)
        return tuple(s for s in segs if s.length)

    def reference(
        self, history: torch.Tensor, axis: int, prev: torch.Tensor | None = None, written: int = 0
    ) -> torch.Tensor:
        n = history.shape[axis]
        p, r = self.head, self.tail
        if n > p + r:
            return torch.cat([history.narrow(axis, 0, p), history.narrow(axis, n - r, r)], dim=axis)
        return torch.cat([history], dim=axis)


@dataclass(frozen=True)
class Window:
    """Sliding window: keep the last ``width`` frames at storage offset 0."""

    width: int
    appends: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _nonneg("width", self.width)

    @property
    def capacity(self) -> int:
        return self.width

    def retained_length(self, incoming: int, written: int = 0) -> int:
        return min(incoming, self.width)

    def plan(self, incoming: int, written: int = 0) -> tuple[Segment, ...]:
        k = min(incoming, self.width)
        return (Segment(0, incoming - k, k),) if k else ()

    def reference(
        self, history: torch.Tensor, axis: int, prev: torch.Tensor | None = None, written: int = 0
    ) -> torch.Tensor:
        n = history.shape[axis]
        k = min(n, self.width)
        return torch.cat([history.narrow(axis, n - k, k)], dim=axis)


@dataclass(frozen=True)
class Ring:
    """Ring of ``capacity`` slots: absolute frame ``t`` lives at slot ``t mod N``.

    ``retain(new)`` writes the new frames at the current write offset and advances
    it; when more than N frames arrive at once only the last N can survive, so
    only those are copied. The live view is slots ``[0, min(written, N))`` — after
    the first wrap it is the whole ring, in rotated order (consumers use the
    offset ``written mod N`` or absolute positions to mask, as in Moshi).
    """

    capacity: int
    appends: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _nonneg("capacity", self.capacity)
        if self.capacity == 0:
            raise ValueError("ring capacity must be positive")

    def retained_length(self, incoming: int, written: int = 0) -> int:
        return min(written + incoming, self.capacity)

    def plan(self, incoming: int, written: int = 0) -> tuple[Segment, ...]:
        n = self.capacity
        k = min(incoming, n)
        if k == 0:
            return ()
        src0 = incoming - k
        dst0 = (written + incoming - k) % n
        first = min(k, n - dst0)
        segs = [Segment(dst0, src0, first)]
        if k > first:
            segs.append(Segment(0, src0 + first, k - first))
        return tuple(segs)

    def reference(
        self, history: torch.Tensor, axis: int, prev: torch.Tensor | None = None, written: int = 0
    ) -> torch.Tensor:
        """Stock semantics by concatenation: unroll the ring, append, keep the
        last N, roll back into slot order."""
        n = self.capacity
        live = min(written, n)
        if live:
            if prev is None:
                raise ValueError("ring reference needs the previous ring contents")
            o = written % n
            if written <= n:
                logical = prev.narrow(axis, 0, live)
            else:  # oldest frame sits at slot o
                logical = torch.cat(
                    [prev.narrow(axis, o, n - o), prev.narrow(axis, 0, o)], dim=axis
                )
            stream = torch.cat([logical, history], dim=axis)
        else:
            stream = torch.cat([history], dim=axis)
        total = written + history.shape[axis]
        k = min(total, n)
        kept = stream.narrow(axis, stream.shape[axis] - k, k)
        if total <= n:
            return kept
        s = (total - n) % n  # slot of the oldest kept frame
        return torch.cat([kept.narrow(axis, n - s, s), kept.narrow(axis, 0, n - s)], dim=axis)


Retention = Union[HeadTail, Window, Ring]
