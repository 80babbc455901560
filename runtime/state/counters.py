"""HostCounter: a host-side int the stock body advances on every call.

Some stock callables keep a Python int next to their device state (Moshi's
``LMGen`` counts steps in ``offset_cpu`` and returns nothing until it passes the
codebook delay). A graph cannot run that Python, so the contract declares the
counter and the engine does the body's host work itself:
  * admission: a call while the counter is below ``start`` runs eager (miss reason
    ``counter_before_start``) — the stock code takes a different branch there;
  * capture: warm-up and capture run with the counter set to ``start`` (the branch
    the graph is for) and the caller's value is restored afterwards;
  * replay: the counter advances by ``advances``, exactly as the body would have,
    once (``replay_advancing``: a backend that re-runs the body, the simulate one,
    would otherwise move it twice). ``advances`` is an amount, or an ``Advance``: the
    amount at each value of a configuration variable the class's name shows
    (``counter pos advances w``: a verify call of width w moves a position by w).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence


@dataclass(frozen=True)
class Tracks:
    """``tracks R``: the counter counts region R's clock, and R's attended extents run
    ``first, first + stride, ...`` up to ``last`` (where they stay). The class of R's
    extent ``e`` is what the stream meets on its k-th call, k = (e - first) / stride
    (the first k past the window for ``last``), so it is captured with the counter at
    ``start + k * advances``: the value live traffic brings to that class first, which
    is what the body's host decisions (a cache full yet?) must see."""

    region: str
    first: int
    stride: int
    last: int

    def __post_init__(self) -> None:
        if self.stride < 1 or not 0 <= self.first <= self.last:
            raise ValueError(f"tracks {self.region}: bad extents {self}")

    def calls_to(self, extent: int) -> int:
        """How many calls the stream makes before it meets ``extent``."""
        if extent >= self.last:
            return -(-(self.last - self.first) // self.stride)
        if extent < self.first or (extent - self.first) % self.stride:
            raise ValueError(f"tracks {self.region}: extent {extent} is off its progression")
        return (extent - self.first) // self.stride


@dataclass(frozen=True)
class Advance:
    """``advances w``: the amount at each value of configuration variable ``by``, which
    a class's name carries (``w=3,...``: the compiler's class labels)."""

    by: str
    amounts: Mapping[int, int]

    def __post_init__(self) -> None:
        if not self.amounts or min(self.amounts.values()) < 1:
            raise ValueError(f"advances by {self.by}: amounts must be >= 1, got {self.amounts}")

    def of_class(self, name: str) -> int:
        """The amount of the class named ``name``."""
        for part in name.split(","):
            key, eq, value = part.partition("=")
            if eq and key == self.by:
                return self.amounts[int(value)]
        raise KeyError(f"class {name!r} names no value of {self.by}")


@dataclass(frozen=True)
class HostCounter:
    name: str  # the dotted site, for reports
    read: Callable[[], int]
    write: Callable[[int], None]
    advances: int | Advance
    start: int
    # staged: what the body derives from it reaches a graph through device buffers
    # (engine/staging.py), so replays at any value read the live one
    staged: bool = False
    tracks: Tracks | None = None  # the region whose extent says where the stream is

    def at_class(self, extents: Mapping[str, int]) -> int:
        """The value a class with these region extents is captured at: ``start``, or
        where the stream meets the tracked region's extent (``Tracks``)."""
        t = self.tracks
        if t is None or extents.get(t.region) is None:
            return self.start
        step = self.advances
        assert isinstance(step, int)  # a tracked counter advances by one amount: __post_init__
        return self.start + t.calls_to(extents[t.region]) * step

    def __post_init__(self) -> None:
        by_class = isinstance(self.advances, Advance)
        if (not by_class and self.advances < 1) or self.start < 0:
            raise ValueError(
                f"counter {self.name}: advances must be >= 1 and start >= 0, "
                f"got advances={self.advances} start={self.start}"
            )
        if by_class and self.tracks is not None:
            raise ValueError(f"counter {self.name}: a tracked counter advances by one amount")

    def amount(self, cls: str) -> int:
        """What a replay of class ``cls`` advances the counter by."""
        a = self.advances
        return a.of_class(cls) if isinstance(a, Advance) else a

    def value(self) -> int:
        v = self.read()
        if not isinstance(v, int) or isinstance(
            v, bool
        ):  # a bool or a tensor here would be a binding error
            raise TypeError(f"counter {self.name} holds {type(v).__name__}, not int")
        return v

    def ready(self) -> bool:
        return self.value() >= self.start


def shown_advances(advances: int | Advance) -> int | dict:
    """A counter's ``advances`` as JSON: the amount, or {"by", "amounts"}."""
    if isinstance(advances, Advance):
        return {"by": advances.by, "amounts": {str(v): a for v, a in advances.amounts.items()}}
    return advances


def at_start(counters: Sequence[HostCounter], extents: Mapping[str, int] = {}) -> None:
    """Every counter where a class with these region extents is met (``start`` unless it
    tracks one of them): warm-up and capture take the branch the graph is for. (Host
    guards, guards.py, pass here too: they hold their value for every class.)"""
    for counter in counters:
        counter.write(counter.at_class(extents))


def replay_advancing(
    counters: Sequence[HostCounter], replay: Callable[[], None], amounts: Sequence[int]
) -> None:
    """Run ``replay`` (one graph launch); then every counter is one step past where it
    was before, by its amount for the replayed class (``amounts``, one per counter: the
    engine resolves them once per class, ``HostCounter.amount``). A graph runs no Python,
    so the step is the engine's; whatever the replay did to a counter (a simulated one
    re-runs the body) is overwritten."""
    if not counters:  # the replay hot path of most callables
        replay()
        return
    before = [c.value() for c in counters]
    replay()
    for counter, value, amount in zip(counters, before, amounts):
        counter.write(value + amount)
