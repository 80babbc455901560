"""What a recorded run says about host state, and about itself (draft_findings.py reads
it for every hot callable): the host ints every call advances by one amount (counters
to declare), the ones that move otherwise, and the results that are the same on every
call (a stream that proves little: random weights that leave a codebook at zero).
Plain comparisons of what ``trace_draft.py`` recorded; it runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..state.sites import Step

if TYPE_CHECKING:
    from .draft_findings import RecordedCall


@dataclass
class CounterFinding:
    """A host int attribute every call of a callable advances by the same amount."""

    site: tuple[Step, ...]
    advances: int
    start: int  # its value when the first recorded call began


def counters(record: list["RecordedCall"]) -> tuple[list[CounterFinding], dict]:
    """(the host ints every call advanced by one positive amount, as counters; the other
    ints some call moved -> the amounts they moved by)."""
    paths = dict.fromkeys(p for c in record for p in c.advanced)
    counters, moved = [], {}
    for p in paths:
        deltas = [c.advanced.get(p, 0) for c in record]
        if deltas[0] > 0 and len(set(deltas)) == 1 and p in record[0].ints:
            counters.append(CounterFinding(p, deltas[0], record[0].ints[p]))
        else:
            moved[p] = deltas
    return counters, moved


def constant_results(results: list[dict]) -> list[tuple[Step, ...]]:
    """The result leaves (steps -> value, one dict per recorded call) equal on every call
    (three calls or more)."""
    if len(results) < 3:
        return []
    first = results[0]
    same = {s for s, v in first.items() if isinstance(v, torch.Tensor) and v.numel()}
    for now in results[1:]:
        same = {
            s
            for s in same
            if isinstance(now.get(s), torch.Tensor)
            and now[s].shape == first[s].shape
            and torch.equal(now[s], first[s])
        }
    return sorted(same, key=str)
