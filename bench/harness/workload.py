"""What a workload declares to the harness, and what the harness hands it in a worker.

A workload module (``bench/token2wav.py``, ``bench/moshi.py``) builds one ``Workload``
and calls ``bench.harness.main(WORKLOAD)``. Everything model-specific lives in it:
its cells, the output streams to hash, the ``Run`` that builds, sets up and steps the
model in a worker process, and the few hooks that add its own fields to the results
and lines to the report. The harness never imports a model.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol


@dataclass(frozen=True)
class Cell:
    """One configuration of a benchmark (paper Table 4: B0, S, SRc, ... or a control).

    ``env``: the worker's environment for this cell on top of the workload's
    ``base_env`` (a value of None unsets the variable). ``failure``: set for a cell
    whose own machinery may legitimately fail (``torch.compile``): anything it raises
    is then a ``"failed"`` record with that reason, not a harness error. Workloads
    subclass Cell for their own options (which adapter, when to bind)."""

    name: str
    what: str
    needs_cuda: bool = False
    env: Mapping[str, str | None] = field(default_factory=dict)
    failure: str | None = None
    # the cell whose bytes this one must equal (default: the workload's reference):
    # a cell that changes the stock configuration is exact against that configuration
    exact_against: str | None = None


@dataclass(frozen=True)
class Stream:
    """One named output stream a step yields, hashed as the bytes of ``dtype``.

    ``key``: result key of the SHA-256 over the whole stream; ``step_key``: of the
    list of per-step SHA-256 (None for a step without output); ``values_key``: keep
    the step's values as ints (token IDs); ``count_key``: count its elements."""

    name: str
    dtype: str
    key: str
    step_key: str
    values_key: str | None = None
    count_key: str | None = None


class CellFailed(RuntimeError):
    """A cell that cannot run as asked (adapter missing, CUDA needed, compile failed or
    over its budget): a ``"failed"`` record, and the driver launches that cell in no
    further block of the call."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


@dataclass
class WorkerContext:
    """What a worker hands the workload's ``Run``: the parsed worker flags, the cell,
    the device, the result being filled (add fields to it), ``setup`` (the result's
    ``setup`` record), and an ExitStack closed when the worker ends (cleanups)."""

    args: argparse.Namespace
    cell: Cell
    device: Any
    result: dict
    setup: dict
    stack: contextlib.ExitStack
    n_steps: int  # steps the worker will take in all phases (inputs to prepare)


class Run(Protocol):
    """One (block, cell) in a fresh worker process.

    ``build()`` puts the model on the device; ``setup()`` finishes the cell (bind,
    capture, controls) and returns the Binding or None; ``step()`` runs one unit
    (chunk, frame) and returns {stream name: array or tensor or None}, without a
    host synchronisation of its own; ``after(phase)`` runs after each phase;
    ``finish(result)`` adds the run's own fields at the end. ``model`` is the object
    the workload's ``parts`` paths start from."""

    model: Any

    def build(self) -> None: ...

    def setup(self) -> Any: ...

    def step(self) -> Mapping[str, Any]: ...

    def after(self, phase: str) -> None: ...

    def finish(self, result: dict) -> None: ...


def _no_lines(*_: Any) -> list[str]:
    return []


def _no_fields(*_: Any) -> dict:
    return {}


@dataclass(frozen=True)
class Workload:
    """A benchmark the harness can run: cells, unit, streams and the worker's Run.

    ``unit`` names the step (``chunk``): the CLI flags ``--{unit}s``,
    ``--profile-{unit}s`` (and ``--split-{unit}s`` when ``parts`` are declared) and the
    result keys follow it. ``parts``: {name: dotted path from ``Run.model``} of
    callables timed separately in the split pass and attributed in the profiler
    pass. ``final_steps``: untimed steps after every pass (a last chunk).
    ``worker_flags``: the workload's own CLI dests forwarded to workers; those in
    ``measure_flags`` define the measurement (``--merge`` refuses a mismatch)."""

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
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    worker_flags: tuple[str, ...] = ()
    measure_flags: tuple[str, ...] = ()
    doc_keys: tuple[str, ...] = ()
    settings: Callable[[argparse.Namespace], dict] = _no_fields
    method: Mapping[str, str] = field(default_factory=dict)
    describe: Callable[[dict], list[str]] = _no_lines
    cell_summary: Callable[[list], dict] = _no_fields
    cell_notes: Callable[[str, dict], list[str]] = _no_lines
    first_worker_est_s: Mapping[str, float] = field(default_factory=dict)
    deadline_ms: float | None = None
    module: str = ""  # what workers run as ``python -m``; default ``bench.<name>``

    def __post_init__(self) -> None:
        if not self.module:
            object.__setattr__(self, "module", f"bench.{self.name}")

    def cell(self, name: str) -> Cell:
        return self.by_name[name]

    @property
    def by_name(self) -> dict[str, Cell]:
        return {c.name: c for c in self.cells}

    def dests(self) -> dict[str, str]:
        """{phase: CLI dest} of the per-phase step counts, named after the unit."""
        u = self.unit
        out = {"warmup": "warmup", "window": f"{u}s", "profile": f"profile_{u}s"}
        if self.parts:
            out["split"] = f"split_{u}s"
        return out

    def counts(self, args: argparse.Namespace) -> dict[str, int]:
        """{phase: steps} of a call or a worker (warmup, window, split, profile, final)."""
        out = {phase: int(getattr(args, dest)) for phase, dest in self.dests().items()}
        out.setdefault("split", 0)
        out["final"] = self.final_steps
        return out

    @property
    def refs(self) -> tuple[str, ...]:
        """The cells ratios are taken against (the reference first)."""
        return self.ratio_refs or (self.reference,)
