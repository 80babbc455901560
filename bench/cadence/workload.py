"""What a session workload declares to the cadence harness (the package docstring
says how it is used)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from bench.harness.workload import Stream

from .trace import Chunk, SessionSpec

SHAPES = ("inproc", "procs")


@dataclass(frozen=True)
class Arm:
    """One way of serving N sessions. ``shape``: ``inproc`` (a worker process hosts its
    sessions, one client thread each: all N, or with ``processes`` P, P workers on the
    one GPU each host every P-th session, as a server with P replicas per GPU would)
    or ``procs`` (N worker processes, one session each, started together). ``options``
    are the workload's own (lanes, which adapter); ``env`` the worker environment on
    top of the workload's ``base_env`` (None unsets a variable)."""

    name: str
    shape: str
    what: str
    options: Mapping[str, Any] = field(default_factory=dict)
    needs_cuda: bool = False
    env: Mapping[str, str | None] = field(default_factory=dict)
    processes: int = 1

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"arm {self.name}: shape {self.shape!r} is not one of {SHAPES}")
        if self.processes < 1 or (self.shape == "procs" and self.processes != 1):
            raise ValueError(f"arm {self.name}: processes must be >= 1, and 1 for procs")

    def groups(self, n: int) -> list[list[int]]:
        """Which sessions each worker process of a run of N hosts."""
        if self.shape == "procs":
            return [[i] for i in range(n)]
        p = min(self.processes, n) or 1
        return [list(range(g, n, p)) for g in range(p)]


class Server(Protocol):
    """The arm's server in one worker process (built once by ``SessionWorkload.server``).

    ``open(spec)`` starts a session (its inputs come from ``spec.seed`` and each chunk's
    ``seq``) and returns a handle; ``submit(handle, chunk)`` serves one chunk and returns
    ``{stream name: array or tensor}`` once the output is ready on the host side
    (synchronise before returning); ``reset(handle)`` starts a new turn in place;
    ``close(handle)``. With the ``inproc`` shape these are called from one client thread
    per session at once: the server serialises them or runs them on lanes. ``stats()``
    (optional) is recorded with the run (lanes, capture seconds, ...). A server whose
    device memory lives in other processes (a Ray replica's) has ``reset_peak_memory()``
    and ``peak_mib()`` (both optional): the run's peak is then its count, not the
    worker's."""

    def open(self, spec: SessionSpec) -> Any: ...

    def submit(self, session: Any, chunk: Chunk) -> Mapping[str, Any]: ...

    def reset(self, session: Any) -> None: ...

    def close(self, session: Any) -> None: ...


@dataclass(frozen=True)
class SessionWorkload:
    """A model served by the cadence harness. ``server(arm, device)`` builds the arm's
    server (weights, binding, lanes) in a worker; ``reference``: the arm whose solo run
    of a session, in a fresh process, is that session's reference bytes; ``streams``:
    the outputs hashed per session (as ``bench.harness.Stream``)."""

    name: str
    arms: tuple[Arm, ...]
    reference: str
    streams: tuple[Stream, ...]
    server: Callable[[Arm, Any], Server]
    base_env: Mapping[str, str | None] = field(default_factory=dict)
    # settings pinned in every worker beside the envelope, the solo references included
    # (as ``bench.harness.Workload.determinism``)
    determinism: Mapping[str, bool] = field(default_factory=dict)

    def arm(self, name: str) -> Arm:
        return {a.name: a for a in self.arms}[name]

    cell = arm  # what bench.harness.document.cell_env looks a configuration up by
