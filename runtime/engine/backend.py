"""Graph backends: the only code that touches CUDA graphs and device generators.

Contract of this layer: a backend can (a) say whether it can capture on a device,
(b) give a memory pool, (c) read/write the device generator state, (d) run a
callable eagerly the way warm-up must run (on the capture stream), and (e) capture
a callable once, returning static outputs and a ``replay()``. ``ExactShapeReplay``
holds all policy (admission, effects, transparency, counters); backends hold none.

``CudaGraphBackend`` follows ``torch.cuda.make_graphed_callables``: warm-up on a
side stream, capture on that stream into a (shared) pool. Device RNG state goes
through ``get_rng_state``/``set_rng_state``, which write the default generator's
seed and offset *in place* — the state object a graph registered at capture — so
the first replay after a restore draws what eager would (measured on the H200;
``graphsafe_set_state(clone_state())`` swaps the object and does not).

``FakeGraphBackend`` runs on any device: "capture" calls the function once and
keeps its outputs as the static outputs; "replay" calls it again on the static
inputs and copies the results into those same static outputs, which reproduces
the aliasing hazard the output rule guards against. Each replay's host side (every
op's non-tensor arguments, the addresses it reads) is checked against the capture's
(host_program.py): a value a real graph would have frozen raises ``StaleHostValue``.
It can stand in a ``torch.Generator`` as the "device" generator so effect probing is testable on CPU.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import torch

from . import host_program
from .outputs import tree_leaves


class Captured(Protocol):
    outputs: Any

    def replay(self) -> None: ...


class GraphBackend(Protocol):
    name: str

    def available(self, device: torch.device) -> bool: ...
    def new_pool(self, device: torch.device) -> Any: ...
    def device_rng_state(self, device: torch.device) -> torch.Tensor | None: ...
    def set_device_rng_state(self, state: torch.Tensor | None, device: torch.device) -> None: ...
    def memory(self, device: torch.device) -> tuple[int | None, int | None]: ...
    def run_eager(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, n: int
    ) -> Any: ...
    def capture(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, pool: Any
    ) -> Captured: ...


class _CudaCaptured:
    def __init__(self, graph: "torch.cuda.CUDAGraph", outputs: Any) -> None:
        self.graph = graph
        self.outputs = outputs

    def replay(self) -> None:
        self.graph.replay()


# One warm-up/capture stream per device for the whole process, shared by every
# engine: each stream that runs a GEMM gets its own cuBLAS workspace from the caching
# allocator (tens of MiB on Hopper, counted in memory_allocated), so a stream per
# callable would raise the process peak by one workspace per callable.
_CAPTURE_STREAMS: dict[int, "torch.cuda.Stream"] = {}


def capture_stream(device: torch.device) -> "torch.cuda.Stream":
    """The process's shared warm-up/capture stream of ``device`` (lane 0 replays on it)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _CAPTURE_STREAMS[idx]


class CudaGraphBackend:
    """``stream``: warm up and capture on this stream instead of the shared one. A
    replay lane (lane.py) gives its own, so its graphs use that stream's cuBLAS
    workspace and never share one with another lane's graphs."""

    name = "cuda_graph"

    def __init__(self, stream: "torch.cuda.Stream | None" = None) -> None:
        self._own = stream

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    def _stream(self, device: torch.device) -> "torch.cuda.Stream":
        return self._own if self._own is not None else capture_stream(device)

    def new_pool(self, device: torch.device) -> Any:
        return torch.cuda.graph_pool_handle()

    def device_rng_state(self, device: torch.device) -> torch.Tensor | None:
        return torch.cuda.get_rng_state(device)

    def set_device_rng_state(self, state: torch.Tensor | None, device: torch.device) -> None:
        if state is not None:
            torch.cuda.set_rng_state(state, device)

    def memory(self, device: torch.device) -> tuple[int | None, int | None]:
        return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)

    def run_eager(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, n: int
    ) -> Any:
        out = None
        with torch.cuda.device(device):
            side = self._stream(device)
            cur = torch.cuda.current_stream(device)
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                for _ in range(n):
                    out = fn(*args, **kwargs)
            cur.wait_stream(side)
            # Capture is offline: a full sync keeps the next phase simple.
            torch.cuda.synchronize(device)
        return out

    def capture(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, pool: Any
    ) -> Captured:
        asked, pool = pool, _live_pool(pool)
        with torch.cuda.device(device):
            graph = torch.cuda.CUDAGraph()
            caller_stream = torch.cuda.current_stream(device)
            try:
                # thread_local: other sessions' threads keep running (and allocating,
                # synchronising) on their own lanes while a new value is captured here
                with torch.cuda.graph(
                    graph, pool=pool, stream=self._stream(device), capture_error_mode="thread_local"
                ):
                    out = fn(*args, **kwargs)
            except BaseException:
                # torch.cuda.graph's exit raised before leaving its stream context
                torch.cuda.set_stream(caller_stream)
                _stop_recording(device, pool if pool is not None else graph.pool())
                if asked is not None:
                    _REPLACED_POOLS[pool] = torch.cuda.graph_pool_handle()
                _end_generator_capture(device, self._stream(device))
                raise
            torch.cuda.synchronize(device)
        return _CudaCaptured(graph, out)


# Pools a failed capture recorded into -> the pool later captures into them use.
# Measured on the H200 (torch 2.11): after a capture invalidated mid-way, ending the
# pool's recording succeeds, yet the allocator still refuses to record into that pool
# again ("beginAllocateToPool: already recording to mempool_id"); the graphs already
# captured there keep their memory and replay, new ones go to a fresh pool.
_REPLACED_POOLS: dict[Any, Any] = {}


def _live_pool(pool: Any) -> Any:
    while pool in _REPLACED_POOLS:
        pool = _REPLACED_POOLS[pool]
    return pool


def _stop_recording(device: torch.device, pool: Any) -> None:
    """After a failed capture: the allocator may still route this thread's allocations
    to the graph pool (``capture_end`` raised before ending it), and every later
    capture into the pool would fail ("already recording"). End it if it is open."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(idx, pool)
    except RuntimeError:
        pass  # capture_end had ended it: "not currently recording to mempool_id"


def _end_generator_capture(device: torch.device, stream: "torch.cuda.Stream") -> None:
    """After a failed capture: the generator state it registered (the default's, or a
    lane's swapped in) still says "capturing", so every later draw outside a capture
    raises. A tiny capture that draws nothing, of the same state, ends that cleanly."""
    scratch = torch.zeros(1, device=device)
    with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream, capture_error_mode="thread_local"):
        scratch.add_(1)
    torch.cuda.synchronize(device)


# ----------------------------------------------------------- per-lane generators
def default_generator(device: torch.device) -> torch.Generator:
    """The process's default generator of ``device`` (what unseeded draws use)."""
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[idx]
    return torch.default_generator


def generator_state(device: torch.device, seed: int | None) -> torch.Tensor:
    """A generator state for ``device``: seeded (offset 0, what ``torch.manual_seed(seed)``
    gives), or the default generator's state now when ``seed`` is None."""
    if seed is None:
        return default_generator(device).get_state()
    fresh = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()
    fresh.manual_seed(seed)
    return fresh.get_state()


def lane_generator(device: torch.device, first: bool) -> torch.Generator:
    """The generator a replay lane's graphs and eager calls draw from.

    On CUDA, lane 0 (``first``) uses the default generator's own state object, the
    one every graph captured outside a lane registers; every other lane gets a
    *cloned state object* (``clone_state``), which its graphs register at capture
    (``drawing_from``). A graph reads seed and offset from the state object it
    registered, so writing a session's state into the lane's object in place
    (``set_state``) before a replay makes it draw that session's numbers. On the CPU
    each lane has a plain generator whose state is copied in and out."""
    if device.type == "cuda":
        default = default_generator(device)
        return default.graphsafe_get_state() if first else default.clone_state()
    return torch.Generator().set_state(torch.default_generator.get_state())


_DRAWING = threading.local()


@contextmanager
def drawing_from(device: torch.device, gen: torch.Generator) -> Iterator[None]:
    """Make the default generator of ``device`` draw from ``gen`` for the body.

    CUDA: swap the default generator's state *object* (``graphsafe_set_state``), so a
    capture inside registers ``gen``'s state, and swap back after. CPU: copy the
    states in and out (CPU generators have no graph-safe state). Nested sections of
    the same generator in one thread are one section (an inner copy-in would rewind
    the draws the outer one has made)."""
    active = getattr(_DRAWING, "gens", None)
    if active is None:
        active = _DRAWING.gens = set()
    if id(gen) in active:
        yield
        return
    active.add(id(gen))
    try:
        with _swapped(device, gen):
            yield
    finally:
        active.discard(id(gen))


@contextmanager
def _swapped(device: torch.device, gen: torch.Generator) -> Iterator[None]:
    default = default_generator(device)
    if device.type == "cuda":
        saved = default.graphsafe_get_state()
        default.graphsafe_set_state(gen)
        try:
            yield
        finally:
            default.graphsafe_set_state(saved)
        return
    saved_state = default.get_state()
    default.set_state(gen.get_state())
    try:
        yield
    finally:
        gen.set_state(default.get_state())
        default.set_state(saved_state)


class _FakeCaptured:
    def __init__(
        self,
        backend: "FakeGraphBackend",
        fn: Callable,
        args: tuple,
        kwargs: dict,
        outputs: Any,
        program: list,
    ):
        self.backend = backend
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.outputs = outputs
        # the host program (host_program.py) per autograd context: the capture's; a
        # composite op (matmul) decomposes by whether its operands require grad, which
        # differs under inference mode, so a replay in another context than the
        # capture's is checked against the first replay in that context
        self.programs = {host_program.autograd_context(): program}

    def replay(self) -> None:
        self.backend.replays += 1
        context = host_program.autograd_context()
        if context not in self.programs:
            fresh, self.programs[context] = host_program.record(self.fn, self.args, self.kwargs)
            stale = None
        else:
            program = self.programs[context]
            fresh, stale = host_program.run_checked(self.fn, self.args, self.kwargs, program)
        for static, new in zip(tree_leaves(self.outputs), tree_leaves(fresh)):
            # A real graph writes its outputs at fixed addresses: emulate that.
            if isinstance(static, torch.Tensor) and static.data_ptr() != new.data_ptr():
                static.copy_(new)
        if stale is not None:  # the outputs are the body's: right, but a graph's would not be
            raise host_program.StaleHostValue(stale)


class FakeGraphBackend:
    name = "fake"

    def __init__(self, device_generator: torch.Generator | None = None) -> None:
        self.device_generator = device_generator
        self.captures = 0
        self.replays = 0
        self.eager_runs = 0
        self.fail_next_captures = 0  # the next n captures raise (capture-failure tests)

    def available(self, device: torch.device) -> bool:
        return True

    def new_pool(self, device: torch.device) -> Any:
        return ("fake-pool", id(self))

    def device_rng_state(self, device: torch.device) -> torch.Tensor | None:
        return None if self.device_generator is None else self.device_generator.get_state()

    def set_device_rng_state(self, state: torch.Tensor | None, device: torch.device) -> None:
        if state is not None and self.device_generator is not None:
            self.device_generator.set_state(state)

    def memory(self, device: torch.device) -> tuple[int | None, int | None]:
        return None, None

    def run_eager(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, n: int
    ) -> Any:
        out = None
        for _ in range(n):
            self.eager_runs += 1
            out = fn(*args, **kwargs)
        return out

    def capture(
        self, fn: Callable, args: tuple, kwargs: dict, device: torch.device, pool: Any
    ) -> Captured:
        if self.fail_next_captures > 0:
            self.fail_next_captures -= 1
            raise RuntimeError("simulated capture failure")
        self.captures += 1
        out, program = host_program.record(fn, args, kwargs)
        return _FakeCaptured(self, fn, args, kwargs, out, program)
