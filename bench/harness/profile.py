"""The worker's instrumented passes: parts timed one by one, and the profiler summary.

* ``timed_parts`` wraps the callables a workload names as its ``parts`` (dotted paths
  from the model object, e.g. ``flow.inference_chunk``): each call is synchronised
  before and after, timed, and (when profiling) runs inside a ``bench::<part>``
  profiler range. Whatever was installed there (stock or bound) is put back on exit.
* ``summarize_trace`` turns a chrome trace of ``n`` steps into per-step device-busy
  time (sum of kernel durations), kernels executed, host kernel-launch and graph-launch
  calls, memcpy/memset time, and kernel time inside each part's range.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import tempfile
import time
from bisect import bisect_left
from itertools import accumulate
from typing import Any, Callable, Iterator, Mapping, Sequence

_KERNEL, _MEMCPY, _MEMSET = "kernel", "gpu_memcpy", "gpu_memset"
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}


def _owner_and_name(root: Any, path: str) -> tuple[Any, str]:
    *owners, name = path.split(".")
    for attr in owners:
        root = getattr(root, attr)
    return root, name


@contextlib.contextmanager
def timed_parts(
    root: Any, parts: Mapping[str, str], sync: Callable[[], None], record: dict, annotate: bool
) -> Iterator[dict]:
    """Wrap each part; its wall times (ms) go to ``record[name]``."""
    import torch

    restore = []
    for part, path in parts.items():
        owner, name = _owner_and_name(root, path)
        had = name in vars(owner)
        inner = getattr(owner, name)

        def call(*args: Any, _part: str = part, _inner: Any = inner, **kwargs: Any) -> Any:
            rng = torch.profiler.record_function(f"bench::{_part}")
            with rng if annotate else contextlib.nullcontext():
                sync()
                t0 = time.perf_counter()
                out = _inner(*args, **kwargs)
                sync()
                record.setdefault(_part, []).append((time.perf_counter() - t0) * 1e3)
            return out

        setattr(owner, name, call)
        restore.append((owner, name, had, inner))
    try:
        yield record
    finally:
        for owner, name, had, inner in reversed(restore):
            if had:
                setattr(owner, name, inner)
            else:
                delattr(owner, name)


def summarize_trace(
    events: Sequence[dict], n_steps: int, unit: str, parts: Sequence[str] = ()
) -> dict:
    """Per-step figures from chrome-trace events (``ph`` "X", ``cat``, ``name``, ``ts``
    and ``dur`` in µs) of a session that covers exactly ``n_steps`` steps. Kernel time
    inside a part's range (which synchronises at both ends) is attributed to it by
    kernel start time; the rest is ``other_busy_ms``."""
    kernels, memcpy, memset, launches, graphs = [], 0.0, 0.0, 0, 0
    ranges: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = str(e.get("cat", "")).lower(), str(e.get("name", ""))
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        if cat == _KERNEL:
            kernels.append((ts, dur))
        elif cat == _MEMCPY:
            memcpy += dur
        elif cat == _MEMSET:
            memset += dur
        elif cat in _RUNTIME_CATS and "GraphLaunch" in name:
            graphs += 1
        elif cat in _RUNTIME_CATS and ("LaunchKernel" in name or "LaunchCooperativeKernel" in name):
            launches += 1
        elif cat == "user_annotation" and name.startswith("bench::"):
            ranges[name[len("bench::") :]].append((ts, ts + dur))
    kernels.sort()
    starts, prefix = [k[0] for k in kernels], [0.0, *accumulate(d for _, d in kernels)]
    n = max(1, int(n_steps))
    out: dict[str, Any] = {
        f"{unit}s": n_steps,
        "busy_ms": prefix[-1] / 1e3 / n,
        f"kernels_per_{unit}": len(kernels) / n,
        f"kernel_launch_calls_per_{unit}": launches / n,
        f"graph_launch_calls_per_{unit}": graphs / n,
        "memcpy_ms": memcpy / 1e3 / n,
        "memset_ms": memset / 1e3 / n,
    }
    attributed = 0.0
    for part in parts:
        spans = [(bisect_left(starts, lo), bisect_left(starts, hi)) for lo, hi in ranges[part]]
        busy = sum(prefix[j] - prefix[i] for i, j in spans)
        attributed += busy
        out[f"{part}_busy_ms"] = busy / 1e3 / n if spans else None
        out[f"{part}_kernels_per_{unit}"] = sum(j - i for i, j in spans) / n if spans else None
    out["other_busy_ms"] = (prefix[-1] - attributed) / 1e3 / n
    return out


def profile_pass(
    step: Callable[[], None],
    sync: Callable[[], None],
    n: int,
    unit: str,
    root: Any,
    parts: Mapping[str, str],
) -> dict:
    """``n`` steps under ``torch.profiler`` (CPU + CUDA activities), parts annotated."""
    from torch.profiler import ProfilerActivity, profile, record_function

    record: dict[str, list[float]] = {}
    with timed_parts(root, parts, sync, record, annotate=True):
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                with record_function(f"bench::{unit}"):
                    sync()
                    step()
                    sync()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    out = summarize_trace(events, n, unit, tuple(parts))
    for part in parts:
        out[f"profiled_{part}_ms"] = record.get(part, [])
    return out
