"""A worker process: one (block, cell), phase by phase, one JSON line on stdout.

Phases: ``import`` (the runtime's ``pin_determinism`` envelope, restored at the end;
the workload's ``Run`` made), ``build``, ``setup`` (re-pinned, and recorded, if set-up
moved a flag), ``warmup``, ``window`` (each step timed between two device
synchronisations, outputs hashed after the timing), ``split`` (workloads with parts),
``profile`` (``torch.profiler`` on CUDA; plain steps on CPU), ``final`` (untimed).
CUDA memory: ``max_memory_allocated`` reset at each phase boundary.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import os
import socket
import sys
import time
from typing import Any, Mapping

from duplexcadence.runtime import determinism_settings, pin_determinism
from duplexcadence.runtime.controls import DISABLE_ENV

from . import replay
from .process import print_result_line
from .profile import profile_pass, timed_parts
from .workload import Cell, CellFailed, Stream, WorkerContext, Workload

MIB = 2**20
# The envelope every cell runs under is pin_determinism()'s own defaults: the flags it
# pins (those left at None it leaves as found), in determinism_settings()'s keys.
ENVELOPE = {
    k: p.default
    for k, p in inspect.signature(pin_determinism).parameters.items()
    if p.default is not None
}


def envelope_holds(settings: Mapping[str, Any], extra: Mapping[str, bool] | None = None) -> bool:
    """The harness's envelope and a workload's own settings (``Workload.determinism``)."""
    pinned = settings.get("pinnable") or {}
    return all(settings.get(k) == v for k, v in ENVELOPE.items()) and all(
        pinned.get(k) == v for k, v in (extra or {}).items()
    )


class MemTracker:
    """Peak allocated/reserved MiB per phase (CUDA); the process peak is their max."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = torch.cuda if device.type == "cuda" else None
        self.device, self.current = device, None
        self.peaks: dict[str, float] = {}
        self.reserved: dict[str, float] = {}

    def phase(self, name: str | None) -> None:
        if self.cuda is None:
            return
        self.cuda.synchronize(self.device)
        if self.current is not None:
            self.peaks[self.current] = self.cuda.max_memory_allocated(self.device) / MIB
            self.reserved[self.current] = self.cuda.max_memory_reserved(self.device) / MIB
        self.current = name
        self.cuda.reset_peak_memory_stats(self.device)

    def allocated_mib(self) -> float | None:
        return None if self.cuda is None else self.cuda.memory_allocated(self.device) / MIB

    def summary(self) -> dict | None:
        return self.cuda and {
            "process_peak_mib": max(self.peaks.values(), default=None),
            "process_peak_reserved_mib": max(self.reserved.values(), default=None),
            "window_peak_mib": self.peaks.get("window"),
            "phase_peak_mib": dict(self.peaks),
            "phase_peak_reserved_mib": dict(self.reserved),
            "by_pool_at_end": self.by_pool(),
        }

    def by_pool(self) -> dict | None:
        """Reserved and allocated MiB per allocator pool now: the default pool and each
        CUDA-graph pool (a captured graph keeps its pool's segments), from the caching
        allocator's segments; where the memory of a cell goes, not only how much."""
        if self.cuda is None:
            return None
        index = self.device.index if self.device.index is not None else self.cuda.current_device()
        pools: dict[str, dict[str, float]] = {}
        for seg in self.cuda.memory_snapshot():
            if seg.get("device", index) != index:
                continue
            pool = tuple(seg.get("segment_pool_id", (0, 0)))
            name = "default" if pool == (0, 0) else f"graph pool {pool[0]}.{pool[1]}"
            entry = pools.setdefault(name, {"reserved_mib": 0.0, "allocated_mib": 0.0})
            entry["reserved_mib"] += seg["total_size"] / MIB
            entry["allocated_mib"] += seg["allocated_size"] / MIB
        ranked = sorted(pools.items(), key=lambda kv: -kv[1]["reserved_mib"])
        return {k: {f: round(v, 1) for f, v in e.items()} for k, e in ranked}


class Hashes:
    """SHA-256 of each declared stream, over the whole stream and per step."""

    def __init__(self, streams: tuple[Stream, ...]) -> None:
        self.streams = streams
        self.whole = {s.name: hashlib.sha256() for s in streams}
        self.steps: dict[str, list] = {s.name: [] for s in streams}
        self.values: dict[str, list] = {s.name: [] for s in streams}
        self.counts = {s.name: 0 for s in streams}

    def add(self, outputs: Mapping[str, Any]) -> None:
        import numpy as np

        for s in self.streams:
            x = outputs.get(s.name)
            if x is not None:
                x = x.detach().cpu().numpy() if hasattr(x, "detach") else x
                x = np.ascontiguousarray(np.asarray(x).reshape(-1), dtype=s.dtype)
                self.whole[s.name].update(x.tobytes())
                self.counts[s.name] += x.size
            ok = x is not None  # a step without output: None in the per-step lists
            self.steps[s.name].append(hashlib.sha256(x.tobytes()).hexdigest() if ok else None)
            self.values[s.name].append([int(v) for v in x] if ok and s.values_key else None)

    def record(self) -> dict:
        out: dict[str, Any] = {}
        for s in self.streams:
            out[s.key], out[s.step_key] = self.whole[s.name].hexdigest(), self.steps[s.name]
            out.update({s.values_key: self.values[s.name]} if s.values_key else {})
            out.update({s.count_key: self.counts[s.name]} if s.count_key else {})
        return out


def resolve_device(args: Any, cell: Cell) -> Any:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        if device.index is not None:
            torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    elif cell.needs_cuda:
        raise CellFailed(f"cell {cell.name} needs CUDA", f"--device {args.device}")
    if args.threads:
        torch.set_num_threads(args.threads)
    return device


def env_keys(wl: Workload) -> list[str]:
    """The environment variables cells set or unset (recorded in every result)."""
    return sorted({DISABLE_ENV, *wl.base_env, *(k for c in wl.cells for k in c.env)})


class Phases:
    """The worker's phases over one ``Run`` (the module docstring)."""

    def __init__(self, wl: Workload, ctx: WorkerContext) -> None:
        self.wl, self.ctx, self.result = wl, ctx, ctx.result
        self.n = wl.counts(ctx.args)
        self.mem, self.hashes = MemTracker(ctx.device), Hashes(wl.streams)
        self.flags: dict[str, dict] = {}
        self.timings: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def sync(self) -> None:
        if self.mem.cuda is not None:
            self.mem.cuda.synchronize(self.ctx.device)

    def enter(self, name: str | None) -> None:
        if name is not None:
            self.result["phase"] = name
            elapsed = time.perf_counter() - self.t0
            print(f"worker {self.ctx.cell.name}: {name} ({elapsed:.1f} s)", file=sys.stderr)
        self.mem.phase(name)

    def steps(self, n: int) -> list[float]:
        ms = []
        for _ in range(n):
            self.sync()
            t0 = time.perf_counter()
            out = self.run.step()
            self.sync()
            ms.append((time.perf_counter() - t0) * 1e3)
            self.hashes.add(out)
        return ms

    def timed(self, phase: str, fn: Any, key: str | None = None) -> Any:
        """Run a phase as a whole, timed into ``timings_s`` (its output under ``key``)."""
        self.enter(phase)
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        self.timings[phase] = time.perf_counter() - t0
        if key is not None:
            self.result[key] = out
        self.run.after(phase)
        return out

    def settings(self, when: str) -> dict:
        self.flags[when] = determinism_settings(self.ctx.device)
        return self.flags[when]

    def prepare(self) -> None:
        self.result.update(determinism_flags=self.flags, timings_s=self.timings)
        self.settings("start")
        self.enter("import")
        self.run = self.wl.start(self.ctx)
        self.timed("build", self.run.build)
        before = self.mem.allocated_mib()
        self.binding = self.timed("setup", self.run.setup)
        if before is not None:
            self.ctx.setup["allocated_delta_mib"] = self.mem.allocated_mib() - before
        if not envelope_holds(self.settings("after_setup"), self.wl.determinism):
            self.flags["repinned_after_setup"] = self.ctx.stack.enter_context(
                pin_determinism(extra=self.wl.determinism)
            )

    def measure(self) -> None:
        unit, n, r = self.wl.unit, self.n, self.result
        self.timed("warmup", lambda: self.steps(n["warmup"]), key="warmup_ms")
        self.enter("window")
        gc.collect()
        self.settings("window")
        before = replay.counts(self.binding)
        self.mem.phase("window")
        r["window_start_allocated_mib"] = self.mem.allocated_mib()
        r["window_ms"] = self.steps(n["window"])
        r["replay"] = replay.record(self.binding, before)
        self.run.after("window")
        if self.wl.parts:
            self.enter("split")
            part_ms: dict[str, list[float]] = {p: [] for p in self.wl.parts}
            with timed_parts(self.run.model, self.wl.parts, self.sync, part_ms, annotate=False):
                total = self.steps(n["split"])
            r["split"] = {f"{unit}_ms": total, **{f"{p}_ms": v for p, v in part_ms.items()}}
            r["split"]["other_ms"] = [t - sum(v) for t, *v in zip(total, *part_ms.values())]
        self.enter("profile")
        r["profile"] = None
        if n["profile"] and self.mem.cuda is not None:
            step = lambda: self.hashes.add(self.run.step())  # noqa: E731
            parts = (self.run.model, self.wl.parts)
            r["profile"] = profile_pass(step, self.sync, n["profile"], unit, *parts)
        else:
            self.steps(n["profile"])
        self.enter("final")
        self.steps(n["final"])
        self.enter(None)

    def finish(self) -> None:
        r, binding = self.result, self.binding
        self.settings("end")
        r["determinism"] = self.flags["window"]
        r["determinism_ok"] = all(
            envelope_holds(self.flags[k], self.wl.determinism) for k in ("start", "window", "end")
        )
        r["memory"] = self.mem.summary()
        r.update(self.hashes.record())
        if binding is not None:
            r.update(binding_stats=binding.stats(), binding_report=binding.report())
        self.run.finish(r)
        r.update(phase="done", status="ok")


def run_worker(wl: Workload, args: Any, result: dict) -> None:
    import torch

    cell = wl.cell(args.cell)
    device = resolve_device(args, cell)
    s = determinism_settings(device)
    result.update(
        device=str(device),
        device_name=s["device"] if device.type == "cuda" else "cpu",
        **{k: s[k] for k in ("torch", "cuda", "cudnn")},
        threads=torch.get_num_threads(),
        hostname=socket.gethostname(),
        env={k: os.environ.get(k) for k in env_keys(wl)},
    )
    n_steps = sum(wl.counts(args).values())
    result[f"n_{wl.unit}s_streamed"] = n_steps
    with contextlib.ExitStack() as stack:
        stack.enter_context(pin_determinism(extra=wl.determinism))
        result["setup"] = {}
        phases = Phases(
            wl, WorkerContext(args, cell, device, result, result["setup"], stack, n_steps)
        )
        phases.prepare()
        phases.measure()
        phases.finish()


def failure_record(cell: Cell, e: BaseException, phase: str | None) -> dict:
    """The status fields of a worker that raised: "failed" (with a reason) for a cell
    that cannot run as asked -- CellFailed, or anything a cell with a ``failure``
    reason raises -- else "error"."""
    out = {"status": "error", "error": f"{type(e).__name__}: {e}", "failed_phase": phase}
    if isinstance(e, CellFailed):
        out.update(status="failed", reason=e.reason)
    elif cell.failure and not isinstance(e, KeyboardInterrupt):
        out.update(status="failed", reason=f"{cell.failure} raised in phase {phase!r}")
    return out


def worker_main(wl: Workload, args: Any) -> dict:
    """Run the worker and print its result as one JSON line; returns the result."""
    t0, cell = time.perf_counter(), wl.cell(args.cell)
    result: dict[str, Any] = {"cell": args.cell, "block": args.block, "seed": args.seed}
    result.update(status="error", pid=os.getpid())
    result["settings"] = {d: getattr(args, d) for d in [*wl.dests().values(), *wl.measure_flags]}

    def run(result: dict) -> None:
        try:
            run_worker(wl, args, result)
        finally:
            result["worker_wall_s"] = time.perf_counter() - t0

    return print_result_line(run, result, lambda e: failure_record(cell, e, result.get("phase")))
