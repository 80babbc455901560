"""Attended extents in closed form: per region (Criterion 3.5) and jointly per callable.

A region's attended extent starts at A⁻, grows by the stride s per call and is
truncated at A by its retention, so it takes the values

    A⁻, A⁻ + s, A⁻ + 2s, ...  (below A),  then A forever,

K = ⌈(A − A⁻) / s⌉ + 1 of them (K = 1 when s = 0 or A⁻ = A). A region on a stepped
clock (`clock commit = 1..8 per round`: a verifier commits its accepted count) grows
by any amount of a set S per call, so it attends A⁻ + n for every n < W = A − A⁻ that
is a sum of amounts of S (0 included), then A: K = 1 + #{n < W : n ∈ ⟨S⟩}, counted
by `AmountSet.count_below` in closed form (equal to ⌈W/s⌉ + 1 when S = {s}). Nothing here
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
import heapq
import math
from dataclasses import dataclass

# `operator` regions restart every call; `unit` and `chunk` are one level.
LIFETIME_LEVEL = {"operator": 0, "unit": 1, "chunk": 1, "turn": 2, "session": 3, "process": 4}
# Joint counts of mixed lifetimes are exact up to this many states per level (more
# than the largest budget, so scope is always decided exactly); past it the width
# is reported as the bound.
JOINT_EXACT_LIMIT = 2000


# A listed amount set {s1, s2, ...} is counted through its Apéry set (one smallest sum
# per residue modulo its smallest amount, after dividing out the gcd): a table of that
# many entries, whatever the window. Validation refuses larger tables (CLK019).
APERY_LIMIT = 4096


@dataclass(frozen=True)
class AmountSet:
    """What a stepped clock advances by per call: every amount of lo..hi, or the listed
    ones. `count_below(x)` counts the sums of amounts (with repetition, the empty sum 0
    included) below x in closed form; `kth(k)` is the k-th of them in increasing order."""

    lo: int
    hi: int
    listed: tuple[int, ...] = ()  # sorted, distinct; empty: every amount in lo..hi

    @classmethod
    def of(cls, amounts) -> "AmountSet":
        """The set of these amounts (a run of consecutive ones is the range lo..hi)."""
        listed = tuple(sorted(set(amounts)))
        if listed[-1] - listed[0] == len(listed) - 1:
            return cls(listed[0], listed[-1])
        return cls(listed[0], listed[-1], listed)

    def shown(self) -> str:
        if not self.listed:
            return f"{self.lo}..{self.hi}"
        return "{" + ", ".join(map(str, self.listed)) + "}"

    @property
    def gcd(self) -> int:
        return math.gcd(*self.listed) if self.listed else math.gcd(self.lo, self.hi - self.lo)

    @property
    def apery_size(self) -> int:
        """Entries of the table a listed set is counted by (0 for an interval)."""
        return self.lo // self.gcd if self.listed and len(self.listed) > 1 else 0

    def count_below(self, x: int) -> int:
        if x <= 0:
            return 0
        if self.lo == self.hi:
            return -(-x // self.lo)  # 0, s, 2s, ... below x
        if not self.listed:
            return self._interval_count_below(x)
        g = self.gcd
        a, apery = self._apery()
        m = -(-x // g)  # sums are multiples of g: count g·j < x, j < m, in units of g
        return sum(max(0, -(-(m - w) // a)) for w in apery)

    def _interval_count_below(self, x: int) -> int:
        """Sums of k amounts fill [k·lo, k·hi]; these intervals are disjoint while
        k < k0 = ⌈(lo − 1) / d⌉ (d = hi − lo) and cover [k0·lo, ∞) from k0 on."""
        lo, hi, d = self.lo, self.hi, self.hi - self.lo
        k0 = -(-(lo - 1) // d)
        full = min(k0 - 1, (x - 1) // hi)  # intervals 0..full lie wholly below x
        out = (full + 1) + d * full * (full + 1) // 2
        k = full + 1  # the next interval, cut by x (or the covered tail)
        if k < k0:
            return out + max(0, x - k * lo)
        return out + max(0, x - k0 * lo)

    @functools.cache
    def _apery(self) -> tuple[int, tuple[int, ...]]:
        """(a, w): a = the smallest amount / gcd; w[r] = the smallest sum ≡ r (mod a),
        in units of the gcd (Dijkstra over the residues: a·|S| steps)."""
        g = self.gcd
        amounts = [s // g for s in self.listed]
        a = amounts[0]
        best = [None] * a
        best[0] = 0
        heap = [(0, 0)]
        while heap:
            w, r = heapq.heappop(heap)
            if w != best[r]:
                continue
            for s in amounts[1:]:
                nw, nr = w + s, (r + s) % a
                if best[nr] is None or nw < best[nr]:
                    best[nr] = nw
                    heapq.heappush(heap, (nw, nr))
        return a, tuple(w for w in best if w is not None)

    def sums_below(self, x: int) -> list[int]:
        """Every sum below x, in increasing order (the caller bounds their number by
        ``count_below``): one range per residue of the Apéry table, or per run of sums
        of k amounts of an interval."""
        if x <= 0:
            return []
        if self.listed and len(self.listed) > 1:
            g = self.gcd
            a, apery = self._apery()
            return sorted(n for w in apery for n in range(w * g, x, a * g))
        out: set[int] = set()
        k = 0
        while k * self.lo < x:
            out.update(range(k * self.lo, min(k * self.hi, x - 1) + 1))
            k += 1
        return sorted(out)

    def kth(self, k: int) -> int:
        """The k-th sum (0-based) in increasing order: the smallest n with k + 1 sums
        at or below it (the k-th is at most k·lo: 0, lo, ..., k·lo are k + 1 sums)."""
        lo, hi = 0, k * self.lo
        while lo < hi:
            mid = (lo + hi) // 2
            if self.count_below(mid + 1) >= k + 1:
                hi = mid
            else:
                lo = mid + 1
        return lo


@dataclass(frozen=True)
class Progression:
    """The attended extents of one region: start, start + stride, ... truncated at bound
    (or start + every sum of `steps` below the bound, on a stepped clock)."""

    start: int
    stride: int
    bound: int
    steps: AmountSet | None = None

    @property
    def count(self) -> int:
        """K = ⌈W / s⌉ + 1, W = bound − start; 1 when the extent never moves; on a
        stepped clock 1 + the sums of amounts below W."""
        window = self.bound - self.start
        if self.steps is not None and window > 0:
            return self.steps.count_below(window) + 1
        if window <= 0 or self.stride <= 0:
            return 1
        return -(-window // self.stride) + 1

    def at(self, i: int) -> int:
        """The extent after i calls (on a stepped clock: the i-th reachable extent,
        which is the order the joint counts need: a region that has advanced further
        attends a later one)."""
        if self.steps is not None:
            return self.bound if i >= self.count - 1 else self.start + self.steps.kth(i)
        if self.stride <= 0:
            return self.start
        return min(self.start + i * self.stride, self.bound)

    def values(self, limit: int) -> tuple[int, ...] | None:
        """All K extents in call order, or None when there are more than `limit`."""
        if self.count > limit:
            return None
        if self.steps is not None:  # listed from the sums at once, not one search each
            sums = self.steps.sums_below(self.bound - self.start)
            return tuple(self.start + n for n in sums) + (self.bound,)
        return tuple(self.at(i) for i in range(self.count))

    def flush_count(self, flushes: tuple[int, ...]) -> int:
        """Extents reached only when one partial flush of f frames interrupts the stream:
        start + f + m·s below the bound, for every f not a multiple of the stride (a
        flush by a multiple of s lands on steady extents). Flushes of one residue
        reach a nested family, so the smallest of each residue counts. (A stepped
        clock declares no flush: validation refuses it, CLK021.)"""
        if self.steps is not None or self.stride <= 0 or self.count == 1:
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
            if self.steps is None and self.stride > 0 and f % self.stride and self.count > 1:
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
