"""The declarations of how a callable's arguments and host state reach it (part of
``declared.py``, the interface between generated code and the runtime): aliased
arguments, retained results, object arguments, host counters. Sites and steps are
written as dotted paths and parsed here into step tuples (``runtime/state/sites.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..state.counters import Advance, Tracks
from ..state.sites import Step, parse_path


def _steps(path: str | tuple[Step, ...] | None) -> tuple[Step, ...] | None:
    """A site as written (a dotted path) or as steps, as steps."""
    return parse_path(path) if isinstance(path, str) else path


def _normalise(obj: Any, **values: Any) -> None:
    for name, value in values.items():
        object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Aliased:
    """An argument the call must read at a region's own address.

    ``container`` is ``"args"`` (first step an index) or ``"kwargs"`` (first step a
    key). ``how``: ``carry`` adopts with retention, ``prefix`` copies the stock
    tensor's leading part in, ``slot`` (``region r[i]``) is read where the caller put
    it (admission pins its pointer)."""

    region: str
    container: Literal["args", "kwargs"]
    steps: tuple[Step, ...]
    how: Literal["carry", "prefix", "slot"]

    def __post_init__(self) -> None:
        _normalise(self, steps=_steps(self.steps))


@dataclass(frozen=True)
class StateObject:
    """`kwarg past: site cache` (compiler/objects.py): the call passes at ``steps`` of
    its kwargs the object the model holds at ``site`` (a transformers ``Cache``); each
    member region is the tensor at its steps inside the object. The catalog keys the
    call by the members (``kwargs["past"]["R"]``); the stock body gets the object."""

    steps: tuple[Step, ...]
    site: tuple[Step, ...]
    members: tuple[tuple[str, tuple[Step, ...]], ...]

    def __post_init__(self) -> None:
        _normalise(
            self,
            steps=_steps(self.steps),
            site=_steps(self.site),
            members=tuple((name, _steps(at)) for name, at in self.members),
        )


@dataclass(frozen=True)
class Retains:
    """``retains region from result...``: the history at ``steps`` of the result is
    written back into the carry, and the result then holds the carry's view."""

    region: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        _normalise(self, steps=_steps(self.steps))


@dataclass(frozen=True)
class Control:
    """``control NAME: DTYPE in LOW..HIGH from result...``: an integer the call returns
    at ``steps`` of its result that drives the host (runtime/state/control_outputs.py)."""

    name: str
    dtype: str
    low: int
    high: int
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        _normalise(self, steps=_steps(self.steps))


@dataclass(frozen=True)
class Counter:
    site: tuple[Step, ...]
    advances: int | Advance  # an amount, or one per value of a config variable
    start: int
    staged: bool = False  # read live by graphs through device buffers (engine/staging.py)
    tracks: Tracks | None = None  # captured where the stream meets a region's extent

    def __post_init__(self) -> None:
        _normalise(self, site=_steps(self.site))


@dataclass(frozen=True)
class Guard:
    """``guard PATH == VALUE``: the host value at ``site`` every class is captured with
    and every replay needs there (state/guards.py)."""

    site: tuple[Step, ...]
    value: bool | int | str

    def __post_init__(self) -> None:
        _normalise(self, site=_steps(self.site))
