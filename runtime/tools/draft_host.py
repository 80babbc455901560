"""What a recorded run says about host state, and about itself (draft_findings.py reads
it for every hot callable): the host ints every call advances by one amount (counters
to declare), the ones that move otherwise, an argument that is an object the model
holds (a cache: an object argument to declare, with its tensors), and the results that
are the same on every call (a stream that proves little: random weights that leave a
codebook at zero).
Plain comparisons of what ``trace_draft.py`` recorded; it runs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..state.sites import Step, format_path

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


def held_object(name: str, key: tuple, record: "list[RecordedCall]") -> str | None:
    """What to declare for an argument that is, on every call, the one object the model
    holds at one path: an object argument, its tensors regions (language.md)."""
    seen = [c.held.get(key) for c in record]
    if any(h is None for h in seen) or len({h[0] for h in seen}) != 1:  # type: ignore[index]
        return None
    path = format_path(seen[0][0])  # type: ignore[index]
    members = []
    for steps in sorted(seen[-1][1], key=_step_order):  # type: ignore[index]
        values = [h[1].get(steps) for h in seen]  # type: ignore[index]
        present = [v for v in values if v is not None]
        if len(present) == len(values) and len({i for _, i in present}) == 1:
            continue  # the same tensor on every call: read, never rebound (not state)
        site = path + ("." if steps[0][0] == "attr" else "") + format_path(steps)
        first, last = present[0][0], present[-1][0]
        made = " (absent until a call made it)" if values[0] is None else ""
        if 0 in last:
            members.append(f"{site} {list(last)}: empty, no state (need not be declared)")
        elif first == last:
            members.append(f"{site} {list(first)} rebound every call: pinned{made}")
        else:
            members.append(f"{site} {list(first)} -> {list(last)}: a carry{made}")
    listed = "; ".join(members) if members else "no tensor it rebinds"
    return (
        f"{name}: argument {shown(key)} is the object the model holds at {path}: declare it "
        f"`kwarg {key[1]}: site {path}` and its tensors as regions at sites under it "
        f"(contracts/mimi_encoder.clock does): {listed}"
    )


def _step_order(steps: tuple) -> list:
    """Steps in reading order, indices as numbers (`[2]` before `[10]`)."""
    return [(k, v) if isinstance(v, int) else (k, -1, str(v)) for k, v in steps]


def shown(key: tuple) -> str:
    """An argument leaf's key as the draft's notes show it (`cache["k"]`, `[0]`)."""
    keyword, root, steps = key
    return root + format_path(steps) if steps and steps[0][0] != "attr" else root
