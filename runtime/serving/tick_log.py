"""TickLog: where a lockstep pool's time goes, tick by tick.

A tick cycle is the tick itself (the batched call, the row masks and resets before it)
and the gap before the next one (the ticker waiting for sessions or for its clock's
beat). When sessions fall behind, the question is which of the two grew: on the H200 32
blocking client threads left a 10-20 ms gap after each 69 ms tick, and the ramp's ticks
ran 90-156 ms while row masks changed every tick (docs/results.md). So the log counts
both, the longest of each, the ticks the clock started without every session in
(``partial_ticks``), the model's row holds and resets with their seconds, and keeps the
first ``TIMELINE`` ticks as (start s since the pool, tick ms, gap ms, rows, partial).
"""

from __future__ import annotations

import time

TIMELINE = 2000  # ticks a pool keeps in its timeline


class TickLog:
    def __init__(self, width: int) -> None:
        self.width = width
        self.t0 = time.perf_counter()
        self._last_end: float | None = None  # when the last tick ended
        self.timeline: list[tuple[float, float, float, int, bool]] = []
        self.counters = {
            "ticks": 0, "partial_ticks": 0, "rows": 0, "parked": 0, "opened": 0,
            "tick_s": 0.0, "max_tick_s": 0.0, "gap_s": 0.0, "max_gap_s": 0.0,
            "holds": 0, "hold_s": 0.0, "resets": 0, "reset_s": 0.0,
        }  # fmt: skip

    def tick(self, start: float, end: float, rows: int, partial: bool) -> None:
        """One tick from ``start`` to ``end`` (``time.perf_counter()``) serving ``rows``
        sessions; ``partial``: the clock started it without every open session in."""
        c = self.counters
        gap = 0.0 if self._last_end is None else start - self._last_end
        self._last_end = end
        if len(self.timeline) < TIMELINE:
            self.timeline.append(
                (round(start - self.t0, 4), round(1e3 * (end - start), 2), round(1e3 * gap, 2),
                 rows, partial)
            )  # fmt: skip
        c["ticks"] += 1
        c["partial_ticks"] += partial
        c["rows"] += rows
        c["parked"] += self.width - rows
        c["tick_s"] += end - start
        c["max_tick_s"] = max(c["max_tick_s"], end - start)
        c["gap_s"] += gap
        c["max_gap_s"] = max(c["max_gap_s"], gap)

    def opened(self) -> None:
        """A session opened on a slot."""
        self.counters["opened"] += 1

    def held(self, seconds: float) -> None:
        """The model's row mask changed before a tick (``hold``), taking ``seconds``."""
        self.counters["holds"] += 1
        self.counters["hold_s"] += seconds

    def reset(self, seconds: float) -> None:
        """One ``reset`` call for the slots opened since the last tick."""
        self.counters["resets"] += 1
        self.counters["reset_s"] += seconds

    def stats(self) -> dict:
        c = dict(self.counters)
        ticks = c["ticks"] or 1
        return {**c, "rows_per_tick": c["rows"] / ticks, "tick_ms_mean": 1e3 * c["tick_s"] / ticks}
