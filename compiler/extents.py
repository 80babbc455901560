"""Attended extents in closed form: per region (Criterion 3.5) and jointly per callable.

A region's attended extent starts at A⁻, grows by the stride s per call and is
truncated at A by its retention, so it takes the values

    A⁻, A⁻ + s, A⁻ + 2s, ...  (below A),  then A forever,

K = ⌈(A − A⁻) / s⌉ + 1 of them (K = 1 when s = 0 or A⁻ = A). Nothing here
enumerates an extent: counts are closed forms, and value lists are produced only
up to a caller's limit, so a window of 2**31 frames costs what a window of 3 does.

Regions of one callable advance together while they live, and a region of a
shorter lifetime restarts whenever a longer one does (a turn boundary restarts
`turn` regions, not `session` ones). `joint_states` counts the joint extents that
arbitrary restarts can reach: exact for one lifetime (lock-step: max K), a sound
count for mixed lifetimes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

# `operator` regions restart every call; `unit` and `chunk` are one level.
LIFETIME_LEVEL = {"operator": 0, "unit": 1, "chunk": 1, "turn": 2, "session": 3, "process": 4}
# Joint counts of mixed lifetimes are exact up to this many states per level (more
# than the largest budget, so scope is always decided exactly); past it the width
# is reported as the bound.
JOINT_EXACT_LIMIT = 2000


@dataclass(frozen=True)
class Progression:
    """The attended extents of one region: start, start + stride, ... truncated at bound."""

    start: int
    stride: int
    bound: int

    @property
    def count(self) -> int:
        """K = ⌈W / s⌉ + 1, W = bound − start; 1 when the extent never moves."""
        window = self.bound - self.start
        if window <= 0 or self.stride <= 0:
            return 1
        return -(-window // self.stride) + 1

    def at(self, i: int) -> int:
        """The extent after i calls."""
        if self.stride <= 0:
            return self.start
        return min(self.start + i * self.stride, self.bound)

    def values(self, limit: int) -> tuple[int, ...] | None:
        """All K extents in call order, or None when there are more than `limit`."""
        if self.count > limit:
            return None
        return tuple(self.at(i) for i in range(self.count))

    def flush_count(self, flushes: tuple[int, ...]) -> int:
        """Extents reached only when one partial flush of f frames interrupts the stream:
        start + f + m·s below the bound, for every f not a multiple of the stride (a
        flush by a multiple of s lands on steady extents). Flushes of one residue
        reach a nested family, so the smallest of each residue counts."""
        if self.stride <= 0 or self.count == 1:
            return 0
        smallest: dict[int, int] = {}
        for f in flushes:
            if f % self.stride:
                r = f % self.stride
                smallest[r] = min(smallest.get(r, f), f)
        return sum(
            max(0, -(-(self.bound - self.start - f) // self.stride)) for f in smallest.values()
        )

    def flush_values(self, flushes: tuple[int, ...], limit: int) -> tuple[int, ...] | None:
        if self.flush_count(flushes) > limit:
            return None
        out: set[int] = set()
        for f in flushes:
            if self.stride > 0 and f % self.stride and self.count > 1:
                out.update(range(self.start + f, self.bound, self.stride))
        return tuple(sorted(out))


@functools.lru_cache(maxsize=256)
def _joint_count(sizes: tuple[int, ...]) -> int | None:
    """How many joint extents the levels reach (None: more than JOINT_EXACT_LIMIT per
    level with mixed lifetimes, where only `bound` is known).

    Level i has counted c_i calls since its last restart, c_1 <= c_2 <= ... (a longer
    lifetime restarts less often), and attends index x_i = min(c_i, M_i − 1). A tuple
    x is reachable iff every unsaturated x_i (below M_i − 1) is at least every x_j
    before it. Counted by a DP over the running maximum."""
    if not sizes:
        return 1
    if len(sizes) == 1:
        return sizes[0]
    top = max(sizes)
    if top > JOINT_EXACT_LIMIT:
        return None
    ways = [0] * top  # ways[r]: tuples so far whose running maximum is r
    ways[0] = 1
    for m in sizes:
        nxt = [0] * top
        prefix = 0
        for r in range(top):  # unsaturated x = r needs running max <= r
            prefix += ways[r]
            if r <= m - 2:
                nxt[r] += prefix
        for r in range(top):  # saturated x = m − 1
            nxt[max(r, m - 1)] += ways[r]
        ways = nxt
    return sum(ways)


def joint_count(sizes: list[int]) -> int | None:
    """How many joint extents levels of these sizes reach (see `_joint_count`)."""
    return _joint_count(tuple(m for m in sizes if m > 1))


def _level_sizes(progressions: list[Progression], lifetimes: list[str]) -> dict[int, int]:
    """Per lifetime level: the largest K among its regions (`operator` regions restart
    every call, so they only ever attend their start)."""
    sizes: dict[int, int] = {}
    for p, lifetime in zip(progressions, lifetimes):
        level = LIFETIME_LEVEL[lifetime]
        sizes[level] = max(sizes.get(level, 1), p.count if level else 1)
    return dict(sorted(sizes.items()))


def joint_width(progressions: list[Progression], lifetimes: list[str]) -> int | None:
    """How many joint extents a callable's regions reach (see `joint_count`)."""
    return joint_count(list(_level_sizes(progressions, lifetimes).values()))


def joint_states(progressions: list[Progression], lifetimes: list[str], limit: int):
    """The reachable joint extents (one tuple per state, regions in the given order),
    or None when there are more than `limit`."""
    sizes = _level_sizes(progressions, lifetimes)
    count = joint_count(list(sizes.values()))
    if count is None or count > limit:
        return None
    order = list(sizes)
    level_of = [LIFETIME_LEVEL[lt] for lt in lifetimes]
    out: list[tuple[int, ...]] = []

    def walk(i: int, running: int, chosen: dict[int, int]) -> None:
        if i == len(order):
            out.append(tuple(p.at(chosen[lv]) for p, lv in zip(progressions, level_of)))
            return
        level, m = order[i], sizes[order[i]]
        for x in range(running, m - 1):  # unsaturated: at least every index before it
            walk(i + 1, x, {**chosen, level: x})
        walk(i + 1, max(running, m - 1), {**chosen, level: m - 1})  # saturated

    walk(0, 0, {})
    # one level: call order (the walk yields it); several: one fixed order
    return out if len(order) <= 1 else sorted(set(out))


def prod_capped(values, cap: int) -> int:
    """math.prod, but stops growing past `cap` (the result is then cap + 1)."""
    out = 1
    for v in values:
        out *= v
        if out > cap:
            return cap + 1
    return out
