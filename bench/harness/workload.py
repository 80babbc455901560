"""What a workload declares to the harness, and what the harness hands it in a worker.

A workload module (``bench/token2wav.py``, ``bench/moshi.py``) builds one ``Workload``
and calls ``bench.harness.main(WORKLOAD)``; everything model-specific lives in it.
The harness never imports a model.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol


@dataclass(frozen=True)
class Cell:
    """One configuration (paper Table 4: B0, S, SRc, ... or a control). ``env``: the
    worker's environment on top of the workload's ``base_env`` (None unsets). ``failure``:
    set for a cell whose own machinery may legitimately fail (``torch.compile``): what
    it raises is then a ``"failed"`` record with that reason. ``exact_against``: the cell
    whose bytes this one must equal (default: the workload's reference)."""

    name: str
    what: str
    needs_cuda: bool = False
    env: Mapping[str, str | None] = field(default_factory=dict)
    failure: str | None = None
    exact_against: str | None = None


@dataclass(frozen=True)
class Stream:
    """One named output stream a step yields, hashed as the bytes of ``dtype``: result
    keys of the SHA-256 over the stream (``key``), of the per-step SHA-256 list
    (``step_key``), of the step values as ints (``values_key``), of the element count."""

    name: str
    dtype: str
    key: str
    step_key: str
    values_key: str | None = None
    count_key: str | None = None


class CellFailed(RuntimeError):
    """A cell that cannot run as asked (adapter missing, CUDA needed, compile failed):
    a ``"failed"`` record; the driver launches it in no further block of the call."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f": {detail}" if detail else ""))
        self.reason, self.detail = reason, detail


@dataclass
class WorkerContext:
    """What a worker hands the ``Run``: the worker flags, the cell, the device, the result
    being filled, its ``setup`` record, an ExitStack closed at the end, and the number
    of steps of all phases (inputs to prepare)."""

    args: argparse.Namespace
    cell: Cell
    device: Any
    result: dict
    setup: dict
    stack: contextlib.ExitStack
    n_steps: int


class Run(Protocol):
    """One (block, cell) in a worker: ``build()`` puts the model on the device;
    ``setup()`` finishes the cell (bind, capture, controls) and returns the Binding or
    None; ``step()`` runs one unit and returns {stream: array, tensor or None} without
    a host synchronisation; ``after(phase)`` runs after each phase; ``finish(result)``
    adds the run's own fields. ``model``: where the workload's ``parts`` paths start."""

    model: Any

    def build(self) -> None: ...

    def setup(self) -> Any: ...

    def step(self) -> Mapping[str, Any]: ...

    def after(self, phase: str) -> None: ...

    def finish(self, result: dict) -> None: ...


def _none(*_: Any) -> Any:
    return {}


def _no_lines(*_: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Workload:
    """A benchmark the harness can run. ``unit`` names the step (``chunk``): the flags
    ``--{unit}s``, ``--profile-{unit}s`` (``--split-{unit}s`` with ``parts``) and result
    keys follow it. ``parts``: {name: dotted path from ``Run.model``} timed in the split
    pass and attributed in the profiler pass. ``final_steps``: untimed steps after every
    pass. ``flags``: the workload's own flags ({flag: argparse keywords}), forwarded to
    workers; those in ``measure_flags`` (dests) define the measurement (``--merge``
    refuses a mismatch)."""

    name: str
    unit: str
    cells: tuple[Cell, ...]
    reference: str
    start: Callable[[WorkerContext], Run]
    streams: tuple[Stream, ...]
    title: Callable[[dict], str]
    description: str = ""
    ratio_refs: tuple[str, ...] = ()
    parts: Mapping[str, str] = field(default_factory=dict)
    final_steps: int = 0
    defaults: Mapping[str, Any] = field(default_factory=dict)
    quick: Mapping[str, Any] = field(default_factory=dict)
    base_env: Mapping[str, str | None] = field(default_factory=dict)
    flags: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    measure_flags: tuple[str, ...] = ()
    doc_keys: tuple[str, ...] = ()
    settings: Callable[[argparse.Namespace], dict] = _none
    method: Mapping[str, str] = field(default_factory=dict)
    describe: Callable[[dict], list[str]] = _no_lines
    cell_summary: Callable[[list], dict] = _none
    cell_notes: Callable[[str, dict], list[str]] = _no_lines
    # top-level keys of the result document, computed from the finished document (the
    # workload's own headline numbers across cells), placed after "benchmark"
    headline: Callable[[dict], dict] = _none
    first_worker_est_s: Mapping[str, float] = field(default_factory=dict)
    deadline_ms: float | None = None
    module: str = ""  # what workers run as ``python -m``; default ``bench.<name>``
    # settings pinned in EVERY cell beside the harness's envelope, the reference included
    # (runtime/engine/determinism.py names): what the workload's reference needs to reproduce
    # itself, e.g. Moshi's {"cuda.cudnn_sdp": False}
    determinism: Mapping[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "module", self.module or f"bench.{self.name}")

    def cell(self, name: str) -> Cell:
        return self.by_name[name]

    @property
    def by_name(self) -> dict[str, Cell]:
        return {c.name: c for c in self.cells}

    @property
    def refs(self) -> tuple[str, ...]:
        """The cells ratios are taken against (the reference first)."""
        return self.ratio_refs or (self.reference,)

    @property
    def own_dests(self) -> list[str]:
        """The dests of the workload's own ``flags``."""
        return [f.removeprefix("--").replace("-", "_") for f in self.flags]

    def dests(self) -> dict[str, str]:
        """{phase: CLI dest} of the per-phase step counts, named after the unit."""
        u = self.unit
        out = {"warmup": "warmup", "window": f"{u}s", "profile": f"profile_{u}s"}
        return {**out, "split": f"split_{u}s"} if self.parts else out

    def counts(self, args: argparse.Namespace) -> dict[str, int]:
        """{phase: steps} of a call or a worker (warmup, window, split, profile, final)."""
        out = {"split": 0, **{p: int(getattr(args, d)) for p, d in self.dests().items()}}
        return {**out, "final": self.final_steps}
