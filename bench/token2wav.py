"""Factorial benchmark of the stock streaming Token2Wav vs the generated adapter (issue 4).

    python -m bench.token2wav --device cuda --blocks 4 --chunks 16 --warmup 3 \\
        --out bench/results/token2wav_h200
    python -m bench.token2wav --quick            # CPU smoke: 1 block, B0 and S, 2 chunks

The driver runs every (block, cell) in a FRESH PROCESS (``python -m bench.token2wav
--worker ...``), which prints one JSON line; the driver aggregates (bench/stats.py) and
writes ``<out>.json``, ``<out>.md`` and ``<out>.png`` (bench/report.py). Block ``b`` uses
seed ``seed + b`` for weights, prompt and token stream, identical for every cell of the
block; the cell order is rotated by one per block (a cyclic Latin square) so no cell
always runs first.

Cells (DESIGN §6, paper Table 4):

* ``B0`` stock ``Token2wav.stream()`` eager, nothing bound.
* ``S`` ``bind()`` with ``DUPLEXCADENCE_DISABLE_REPLAY=1``: demand-sized, address-stable
  regions, in-place writeback carries, device-resident constants; every call eager.
* ``SRc`` ``bind()`` with replay: ``flow.inference_chunk`` (encoder + 10-step solver)
  and ``hift.forward`` replayed at the chunk clock, one graph per catalog class
  captured by ``Binding.capture()`` once the prompt is primed (bind() itself runs before
  the model reaches the device); anything not admitted runs eager and is counted by reason.
* ``vendor_bucket`` control: the vendor's own ``flow.scatter_cuda_graph(True)`` before
  streaming (DiT graphs for chunk buckets {30, 48, 96}; the live 50/56-frame chunk never
  hits one, so the counters show how many estimator calls replayed). CUDA only.
* ``R``, ``Rc``, ``SR``, ``vendor_rebucket``, ``compile_ro``: listed with
  ``{"status": "not implemented", "reason": ...}``; nothing is faked.

One worker, in order (everything after the build streams the same token stream):

1. pin the determinism envelope (cudnn.deterministic=True, cudnn.benchmark=False) and
   build the vendor object (``bench.workloads.token2wav.build_token2wav``);
2. cell set-up (``bind`` — capture happens here, before any traffic — or the vendor
   bucket graphs); its wall time and the binding's capture/warm-up seconds are
   reported, outside the window;
3. ``--warmup`` chunks, untimed;
4. the measured window: ``--chunks`` chunks, each timed with ``time.perf_counter``
   between two ``torch.cuda.synchronize()`` calls (CUDA) and nothing else added;
5. split pass: ``--split-chunks`` chunks with whatever is installed at
   ``flow.inference_chunk`` and ``hift.forward`` (stock or bound) wrapped, synchronised
   around each part: flow / vocoder / rest wall time. Kept out of the window because
   the extra synchronisations change host/device overlap;
6. profile pass (CUDA only): ``--profile-chunks`` chunks under ``torch.profiler`` (CPU +
   CUDA activities), same wrappers as 5. From its trace: device-busy time per chunk
   (sum of kernel durations), kernels executed per chunk, host kernel-launch calls and
   graph launches per chunk, and kernel time inside the flow / vocoder ranges. On CPU
   the chunks stream uninstrumented and these numbers are null;
7. the final chunk (``last_chunk=True``), untimed, for exactness coverage.

Memory (CUDA): ``torch.cuda.reset_peak_memory_stats`` at each phase boundary and
``max_memory_allocated`` at its end; the process peak is the maximum over all phases
(= what one reading at exit would give), the window peak that of phase 4.

PCM: SHA-256 of the concatenated float32 bytes of every chunk of phases 3-7 (the same
chunks in every cell), plus one SHA per chunk so a divergence can be located.
"""

from __future__ import annotations

import argparse
import importlib
import collections
import contextlib
import gc
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = "bench/results/token2wav_h200"
MIB = 2**20
DISABLE_ENV = "DUPLEXCADENCE_DISABLE_REPLAY"  # runtime/controls.py
# The determinism envelope pinned in every cell, B0 included (DESIGN §6b).
ENVELOPE = {"cudnn.deterministic": True, "cudnn.benchmark": False}


@dataclass(frozen=True)
class Cell:
    name: str
    what: str
    implemented: bool
    bind: bool = False
    replay: bool = False
    needs_cuda: bool = False
    reason: str = ""
    # the generated adapter the cell binds, and whether it binds before the model
    # reaches the device (the state rule) or after priming (stock buffers kept)
    adapter: str = "stepaudio2_token2wav"
    bind_before_priming: bool = True


CELLS: dict[str, Cell] = {
    c.name: c
    for c in (
        Cell("B0", "stock Token2wav.stream() eager, nothing bound", True),
        Cell(
            "S",
            "state rule only: bind() with DUPLEXCADENCE_DISABLE_REPLAY=1 (demand-sized "
            "address-stable regions, writeback carries, device constants; all calls eager)",
            True,
            bind=True,
        ),
        Cell(
            "R",
            "replay at the step clock (estimator per Euler step), stock state",
            False,
            reason=(
                "contracts/stepaudio2_token2wav.clock declares only chunk-clock callables "
                "(flow_chunk at flow.inference_chunk, vocoder at hift.forward); there is no "
                "step-clock callable (flow.decoder.estimator.forward_chunk) in the generated "
                "adapter to replay"
            ),
        ),
        Cell(
            "Rc",
            "replay at the chunk clock, stock state (no state rule): "
            "contracts/stepaudio2_token2wav_replay_only.clock binds the stock buffers as they "
            "are and stages the moving stock carry into captured buffers of its stock layout",
            True,
            bind=True,
            replay=True,
            needs_cuda=True,
            adapter="stepaudio2_token2wav_replay_only",
            bind_before_priming=False,
        ),
        Cell(
            "SR",
            "state rule + replay at the step clock",
            False,
            reason="needs a step-clock callable in the contract (see R)",
        ),
        Cell(
            "SRc",
            "state rule + replay at the chunk clock: bind() captures flow.inference_chunk "
            "(encoder + 10-step solver) and hift.forward, one graph per catalog class; "
            "misses run eager",
            True,
            bind=True,
            replay=True,
        ),
        Cell(
            "vendor_bucket",
            "control: vendor flow.scatter_cuda_graph(True) (DiT graphs for buckets 30/48/96), "
            "then stock stream()",
            True,
            needs_cuda=True,
        ),
        Cell(
            "vendor_rebucket",
            "control: vendor DiT graph path re-bucketed to the live chunk (50 frames)",
            False,
            reason=(
                "needs _init_cuda_graph_chunk's hard-coded bucket list (30, 48, 96) and max "
                "sizes changed, i.e. a patched copy of vendor code; not written yet"
            ),
        ),
        Cell(
            "compile_ro",
            'control: torch.compile(mode="reduce-overhead") of flow.inference_chunk and '
            "hift.forward",
            False,
            reason="not written yet",
        ),
    )
}
DEFAULT_CELLS = [c.name for c in CELLS.values() if c.implemented]


# ============================================================================ helpers


def read_flags() -> dict:
    import torch

    return {
        "cudnn.deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
    }


def pin_envelope() -> dict:
    import torch

    torch.backends.cudnn.deterministic = ENVELOPE["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = ENVELOPE["cudnn.benchmark"]
    return read_flags()


def envelope_holds(flags: dict) -> bool:
    return all(flags.get(k) == v for k, v in ENVELOPE.items())


class _Sync:
    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self._torch = torch
        self.device = device

    def __call__(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize(self.device)


class MemTracker:
    """Peak allocated/reserved bytes per phase (CUDA); the process peak is their max."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.device = device
        self.current: str | None = None
        self.peaks: dict[str, float] = {}
        self.reserved: dict[str, float] = {}

    def phase(self, name: str | None) -> None:
        if self.cuda and self.current is not None:
            self.torch.cuda.synchronize(self.device)
            self.peaks[self.current] = self.torch.cuda.max_memory_allocated(self.device) / MIB
            self.reserved[self.current] = self.torch.cuda.max_memory_reserved(self.device) / MIB
        self.current = name
        if self.cuda and name is not None:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def allocated_mib(self) -> float | None:
        if not self.cuda:
            return None
        return self.torch.cuda.memory_allocated(self.device) / MIB

    def summary(self) -> dict | None:
        if not self.cuda:
            return None
        return {
            "process_peak_mib": max(self.peaks.values()) if self.peaks else None,
            "process_peak_reserved_mib": max(self.reserved.values()) if self.reserved else None,
            "window_peak_mib": self.peaks.get("window"),
            "phase_peak_mib": dict(self.peaks),
            "phase_peak_reserved_mib": dict(self.reserved),
        }


@contextlib.contextmanager
def wrapped_parts(t2w: Any, sync: Callable[[], None], record: dict, annotate: bool = False):
    """Wrap what is installed at flow.inference_chunk and hift.forward (stock or bound).

    Each call is synchronised before and after and timed into ``record['flow']`` /
    ``record['vocoder']`` (ms); with ``annotate`` it also runs inside a profiler range
    ``bench::flow`` / ``bench::vocoder``. Everything is put back on exit.
    """
    import torch

    flow, hift = t2w.flow, t2w.hift
    had_flow = "inference_chunk" in vars(flow)
    had_hift = "forward" in vars(hift)
    inner_flow = flow.inference_chunk
    inner_hift = hift.forward

    def timed(part: str, fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            ctx = (
                torch.profiler.record_function(f"bench::{part}")
                if annotate
                else contextlib.nullcontext()
            )
            with ctx:
                sync()
                t0 = time.perf_counter()
                out = fn(*args, **kwargs)
                sync()
                record.setdefault(part, []).append((time.perf_counter() - t0) * 1e3)
            return out

        return call

    flow.inference_chunk = timed("flow", inner_flow)
    hift.forward = timed("vocoder", inner_hift)
    try:
        yield record
    finally:
        if had_flow:
            flow.inference_chunk = inner_flow
        else:
            del flow.inference_chunk
        if had_hift:
            hift.forward = inner_hift
        else:
            del hift.forward


# --------------------------------------------------------------- profiler trace summary

_KERNEL_CATS = {"kernel"}
_MEMCPY_CATS = {"gpu_memcpy"}
_MEMSET_CATS = {"gpu_memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}


def _is_kernel_launch(name: str) -> bool:
    return "LaunchKernel" in name or "LaunchCooperativeKernel" in name


def _is_graph_launch(name: str) -> bool:
    return "GraphLaunch" in name


def summarize_trace(events: Sequence[dict], n_chunks: int) -> dict:
    """Device-busy time, kernel and launch counts from a chrome trace of ``n_chunks`` chunks.

    ``events`` are chrome-trace events as ``torch.profiler`` exports them (``ph`` "X",
    ``cat``, ``name``, ``ts``/``dur`` in µs). The session covers exactly the profiled
    chunks, so per-chunk figures are session totals / ``n_chunks``. Kernel time inside
    the user ranges ``bench::flow`` / ``bench::vocoder`` (which synchronise at both
    ends) is attributed to them by kernel start time.
    """
    kernels, memcpy, memset, launches, graph_launches = [], 0.0, 0.0, 0, 0
    ranges: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        name = str(e.get("name", ""))
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        if cat in _KERNEL_CATS:
            kernels.append((ts, dur))
        elif cat in _MEMCPY_CATS:
            memcpy += dur
        elif cat in _MEMSET_CATS:
            memset += dur
        elif cat in _RUNTIME_CATS:
            if _is_graph_launch(name):
                graph_launches += 1
            elif _is_kernel_launch(name):
                launches += 1
        elif cat == "user_annotation" and name.startswith("bench::"):
            ranges[name[len("bench::") :]].append((ts, ts + dur))
    kernels.sort()
    starts = [k[0] for k in kernels]
    prefix = [0.0]
    for _, d in kernels:
        prefix.append(prefix[-1] + d)

    def busy_in(lo: float, hi: float) -> tuple[float, int]:
        i, j = bisect_left(starts, lo), bisect_left(starts, hi)
        return prefix[j] - prefix[i], j - i

    n = max(1, int(n_chunks))
    total = prefix[-1]
    out: dict[str, Any] = {
        "chunks": n_chunks,
        "busy_ms": total / 1e3 / n,
        "kernels_per_chunk": len(kernels) / n,
        "kernel_launch_calls_per_chunk": launches / n,
        "graph_launch_calls_per_chunk": graph_launches / n,
        "memcpy_ms": memcpy / 1e3 / n,
        "memset_ms": memset / 1e3 / n,
    }
    attributed = 0.0
    for part in ("flow", "vocoder"):
        spans = ranges.get(part, [])
        busy = sum(busy_in(lo, hi)[0] for lo, hi in spans)
        count = sum(busy_in(lo, hi)[1] for lo, hi in spans)
        attributed += busy
        out[f"{part}_busy_ms"] = busy / 1e3 / n if spans else None
        out[f"{part}_kernels_per_chunk"] = count / n if spans else None
    out["other_busy_ms"] = (total - attributed) / 1e3 / n
    return out


# ============================================================================ worker


def _replay_counters(binding: Any) -> dict:
    if binding is None:
        return {}
    return {
        name: {"hits": int(r.hits), "misses": {k: int(v) for k, v in r.misses.items()}}
        for name, r in binding.replays.items()
    }


def _counter_delta(after: dict, before: dict) -> dict:
    out = {}
    for name, a in after.items():
        b = before.get(name, {"hits": 0, "misses": {}})
        misses = {k: v - b["misses"].get(k, 0) for k, v in a["misses"].items()}
        out[name] = {
            "hits": a["hits"] - b["hits"],
            "misses": {k: v for k, v in misses.items() if v},
        }
    return out


def _replay_block(binding: Any, window: dict) -> dict | None:
    if binding is None:
        return None
    stats = binding.stats()
    callables = {}
    cap, warm = 0.0, 0.0
    for name, s in stats["callables"].items():
        cap += float(s.get("capture_s") or 0.0)
        warm += float(s.get("warmup_s") or 0.0)
        callables[name] = {
            "hits": s["hits"],
            "misses": s["misses"],
            "window_hits": window.get(name, {}).get("hits", 0),
            "window_misses": window.get(name, {}).get("misses", {}),
            "classes": len(s["classes"]),
            "captured_classes": sum(1 for c in s["classes"] if c["status"] == "captured"),
            "class_status": {c["name"]: c["status"] for c in s["classes"]},
            "rejected": s.get("rejected"),
            "effect": s.get("effect"),
            "invalidations": s.get("invalidations", 0),
            "capture_s": s.get("capture_s"),
            "warmup_s": s.get("warmup_s"),
            "capture_reserved_mib": (s.get("capture_reserved_bytes") or 0) / MIB,
            "capture_allocated_mib": (s.get("capture_allocated_bytes") or 0) / MIB,
        }
    return {"capture_s": cap, "warmup_s": warm, "callables": callables}


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if hasattr(o, "item"):
        try:
            return o.item()
        except Exception:  # noqa: BLE001
            pass
    return str(o)


def _binder(cell: Cell, device: Any, held: list) -> Any:
    """For bound cells: bind() before the model reaches the device (no capture yet), so
    the demand-sized regions replace the stock buffers before those ever take memory
    there; the serving flow a user of the adapter follows."""
    if not cell.bind:
        return None
    from duplexcadence.runtime import replay_enabled

    if replay_enabled() != cell.replay:
        raise RuntimeError(
            f"cell {cell.name} needs replay {'enabled' if cell.replay else 'disabled'} but "
            f"replay_enabled() is {replay_enabled()} ({DISABLE_ENV}={os.environ.get(DISABLE_ENV)!r})"
        )
    adapter = importlib.import_module(f"duplexcadence.generated.{cell.adapter}")
    bind = lambda model: held.append(  # noqa: E731
        adapter.bind(model, device=device, audit=False, capture=False, progress=False)
    )
    return bind if cell.bind_before_priming else None


def _setup_cell(cell: Cell, t2w: Any, device: Any, info: dict, binding: Any = None) -> Any:
    """Finish the cell on the built, primed object; returns the Binding (or None)."""
    if cell.bind:
        if binding is None:  # binds the primed model, keeping its stock buffers
            adapter = importlib.import_module(f"duplexcadence.generated.{cell.adapter}")
            binding = adapter.bind(t2w, device=device, audit=False, capture=False, progress=False)
        binding.capture(progress=False)  # before traffic; a no-op with replay disabled
        info["binding_determinism"] = binding.determinism
        info["binding_constants"] = dict(binding.constants)
        info["binding_eager"] = dict(binding.eager)
        info["regions"] = {
            name: {
                "shape": list(r.tensor.shape),
                "mib": r.tensor.numel() * r.tensor.element_size() / MIB,
            }
            for name, r in binding.regions.items()
        }
        return binding
    if cell.name == "vendor_bucket":
        est = t2w.flow.decoder.estimator
        counts = {"estimator_calls": 0, "bucket_replays": 0}
        t2w.flow.scatter_cuda_graph(True)

        class _CountingGraphs(dict):
            def __getitem__(self, key: Any) -> Any:
                counts["bucket_replays"] += 1
                return dict.__getitem__(self, key)

        est.graph_chunk = _CountingGraphs(est.graph_chunk)
        inner = est.forward_chunk

        def forward_chunk(*args: Any, **kwargs: Any) -> Any:
            counts["estimator_calls"] += 1
            return inner(*args, **kwargs)

        est.forward_chunk = forward_chunk
        info["vendor_buckets"] = sorted(est.graph_chunk.keys())
        info["vendor_max_size"] = dict(est.max_size_chunk)
        info["vendor_counts"] = counts  # filled while streaming
        return None
    if cell.name != "B0":
        raise RuntimeError(f"cell {cell.name} has no set-up")
    return None


def run_worker(args: argparse.Namespace, result: dict) -> None:
    import numpy as np
    import torch

    cell = CELLS[args.cell]
    if not cell.implemented:
        raise RuntimeError(f"cell {cell.name} is not implemented: {cell.reason}")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        if device.index is not None:
            torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    elif cell.needs_cuda:
        raise RuntimeError(f"cell {cell.name} needs CUDA (vendor CUDA-graph path)")
    if args.threads:
        torch.set_num_threads(args.threads)
    result.update(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        threads=torch.get_num_threads(),
        replay_env=os.environ.get(DISABLE_ENV),
    )
    sync = _Sync(device)
    mem = MemTracker(device)
    flags = {"start": pin_envelope()}
    result["determinism_flags"] = flags

    def phase(name: str) -> None:
        result["phase"] = name
        print(
            f"worker {cell.name}: {name} ({time.perf_counter() - t_start:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    t_start = time.perf_counter()
    phase("import")
    from bench.workloads import token2wav as W

    reason = W.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    result["minicpmo_utils"] = W.installed_version()

    n_total = args.warmup + args.chunks + args.split_chunks + args.profile_chunks + 1
    stream = W.token_stream(args.seed, n_total)
    result["tokens_sha256"] = hashlib.sha256(
        json.dumps([[c.tokens, c.last_chunk] for c in stream]).encode()
    ).hexdigest()
    result["n_chunks_streamed"] = n_total

    pcm_hash = hashlib.sha256()
    chunk_shas: list[str] = []
    n_samples = 0
    it = iter(stream)

    def one() -> None:
        nonlocal n_samples
        ch = next(it)
        pcm = W.stream_chunk(t2w, ch.tokens, ch.last_chunk)
        b = np.ascontiguousarray(pcm, dtype=np.float32).tobytes()
        pcm_hash.update(b)
        chunk_shas.append(hashlib.sha256(b).hexdigest())
        n_samples += pcm.shape[0]

    timings: dict[str, float] = {}
    result["timings_s"] = timings

    phase("build")
    mem.phase("build")
    t0 = time.perf_counter()
    held: list = []
    t2w = W.build_token2wav(args.seed, device, before_priming=_binder(cell, device, held))
    sync()
    timings["build"] = time.perf_counter() - t0

    phase("setup")
    mem.phase("setup")
    setup_info: dict[str, Any] = {}
    result["setup"] = setup_info
    alloc_before = mem.allocated_mib()
    t0 = time.perf_counter()
    binding = _setup_cell(cell, t2w, device, setup_info, held[0] if held else None)
    sync()
    timings["setup"] = time.perf_counter() - t0
    alloc_after = mem.allocated_mib()
    if alloc_before is not None:
        setup_info["allocated_delta_mib"] = alloc_after - alloc_before
    flags["after_setup"] = read_flags()
    if not envelope_holds(flags["after_setup"]):
        flags["repinned_after_setup"] = pin_envelope()

    phase("warmup")
    mem.phase("warmup")
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        one()
    sync()
    timings["warmup"] = time.perf_counter() - t0

    phase("window")
    gc.collect()
    flags["window"] = read_flags()
    before = _replay_counters(binding)
    mem.phase("window")
    result["window_start_allocated_mib"] = mem.allocated_mib()
    window_ms: list[float] = []
    for _ in range(args.chunks):
        sync()
        t0 = time.perf_counter()
        one()
        sync()
        window_ms.append((time.perf_counter() - t0) * 1e3)
    result["window_ms"] = window_ms
    window_counters = _counter_delta(_replay_counters(binding), before)

    phase("split")
    mem.phase("split")
    split: dict[str, list[float]] = {}
    chunk_ms: list[float] = []
    with wrapped_parts(t2w, sync, split):
        for _ in range(args.split_chunks):
            sync()
            t0 = time.perf_counter()
            one()
            sync()
            chunk_ms.append((time.perf_counter() - t0) * 1e3)
    result["split"] = {
        "chunk_ms": chunk_ms,
        "flow_ms": split.get("flow", []),
        "vocoder_ms": split.get("vocoder", []),
        "other_ms": [
            c - f - v for c, f, v in zip(chunk_ms, split.get("flow", []), split.get("vocoder", []))
        ],
    }

    phase("profile")
    mem.phase("profile")
    result["profile"] = None
    if args.profile_chunks and device.type == "cuda":
        result["profile"] = _profile_pass(t2w, sync, one, args.profile_chunks)
    else:
        for _ in range(args.profile_chunks):
            one()

    phase("final")
    mem.phase("final")
    one()
    sync()
    mem.phase(None)
    flags["end"] = read_flags()
    result["determinism"] = flags["window"]
    result["determinism_ok"] = all(
        envelope_holds(f) for k, f in flags.items() if k in ("start", "window", "end")
    )
    result["memory"] = mem.summary()
    result["pcm_sha256"] = pcm_hash.hexdigest()
    result["chunk_sha256"] = chunk_shas
    result["n_samples"] = n_samples
    result["carry_lengths_end"] = W.carry_lengths(t2w)
    result["replay"] = _replay_block(binding, window_counters)
    if binding is not None:
        result["binding_stats"] = binding.stats()
        result["binding_report"] = binding.report()
    if "vendor_counts" in setup_info:
        setup_info["vendor_counts"] = dict(setup_info["vendor_counts"])
    phase("done")
    result["status"] = "ok"


def _profile_pass(t2w: Any, sync: Callable, one: Callable, n: int) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    record: dict[str, list[float]] = {}
    with wrapped_parts(t2w, sync, record, annotate=True):
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                with record_function("bench::chunk"):
                    sync()
                    one()
                    sync()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    out = summarize_trace(events, n)
    out["profiled_flow_ms"] = record.get("flow", [])
    out["profiled_vocoder_ms"] = record.get("vocoder", [])
    return out


def worker_main(args: argparse.Namespace) -> int:
    real_stdout = sys.stdout
    result: dict[str, Any] = {
        "cell": args.cell,
        "block": args.block,
        "seed": args.seed,
        "status": "error",
        "pid": os.getpid(),
        "settings": {
            "warmup": args.warmup,
            "chunks": args.chunks,
            "split_chunks": args.split_chunks,
            "profile_chunks": args.profile_chunks,
        },
    }
    t0 = time.perf_counter()
    # Vendor code prints (e.g. "CUDA Graph initialized ..."): keep stdout for the JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            run_worker(args, result)
        except BaseException as e:  # noqa: BLE001 - the driver records whatever happened
            result["status"] = "error"
            result["error"] = f"{type(e).__name__}: {e}"
            result["traceback"] = traceback.format_exc()
            traceback.print_exc()
    result["worker_wall_s"] = time.perf_counter() - t0
    real_stdout.write(json.dumps(result, default=_json_default) + "\n")
    real_stdout.flush()
    return 0


# ============================================================================ driver


def _tee(stream: Any, sink: Any, prefix: str, tail: collections.deque, keep: list | None) -> None:
    for line in iter(stream.readline, ""):
        tail.append(line)
        if keep is not None:
            keep.append(line)
        if sink is not None:
            sink.write(prefix + line)
            sink.flush()
    stream.close()


def run_cell_process(cell: str, block: int, seed: int, args: argparse.Namespace) -> dict:
    """One fresh worker process; returns its JSON result or a failure record."""
    cmd = [
        sys.executable,
        "-m",
        "bench.token2wav",
        "--worker",
        "--cell",
        cell,
        "--block",
        str(block),
        "--seed",
        str(seed),
        "--device",
        args.device,
        "--warmup",
        str(args.warmup),
        "--chunks",
        str(args.chunks),
        "--split-chunks",
        str(args.split_chunks),
        "--profile-chunks",
        str(args.profile_chunks),
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ)
    env.pop(DISABLE_ENV, None)
    if CELLS[cell].bind and not CELLS[cell].replay:
        env[DISABLE_ENV] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=str(REPO), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out_lines: list[str] = []
    err_tail: collections.deque = collections.deque(maxlen=60)
    out_tail: collections.deque = collections.deque(maxlen=5)
    sink = None if args.quiet_workers else sys.stderr
    threads = [
        threading.Thread(
            target=_tee, args=(proc.stdout, None, "", out_tail, out_lines), daemon=True
        ),
        threading.Thread(
            target=_tee,
            args=(proc.stderr, sink, f"[block {block} {cell}] ", err_tail, None),
            daemon=True,
        ),
    ]
    for t in threads:
        t.start()
    status = None
    try:
        proc.wait(timeout=args.worker_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # our own child, by its handle
        proc.wait()
        status = "timeout"
    for t in threads:
        t.join(timeout=10)
    wall = time.perf_counter() - t0
    res = None
    for line in reversed(out_lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                res = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    stderr_tail = "".join(err_tail)[-4000:]
    if status == "timeout":
        res = dict(
            res or {},
            status="timeout",
            error=f"worker exceeded --worker-timeout {args.worker_timeout} s",
        )
    elif res is None:
        res = {
            "status": "crash",
            "error": f"worker exited with code {proc.returncode} and printed no result",
        }
    if res.get("status") != "ok":
        res["stderr_tail"] = stderr_tail
    res["returncode"] = proc.returncode
    res["process_wall_s"] = wall
    res["command"] = " ".join(shlex.quote(c) for c in cmd[1:])
    res.setdefault("cell", cell)
    res.setdefault("block", block)
    res.setdefault("seed", seed)
    return res


def _git(*argv: str) -> str | None:
    try:
        p = subprocess.run(
            ["git", *argv], cwd=str(REPO), capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def _git_info(override: str | None = None) -> dict:
    if override:
        return {"git_commit": override, "git_dirty": None, "git_commit_source": "--git-commit"}
    commit = _git("rev-parse", "HEAD") or os.environ.get("DUPLEXCADENCE_GIT_COMMIT")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _first_ok(blocks: list[dict], key: str) -> Any:
    for b in blocks:
        for r in b["results"].values():
            if r.get("status") == "ok" and r.get(key) is not None:
                return r[key]
    return None


def build_document(
    args: argparse.Namespace, argv: Sequence[str], cells: list[str], blocks: list[dict]
) -> dict:
    import torch

    from bench import stats

    agg = stats.aggregate(blocks, cells, reference="B0")
    cell_docs: dict[str, Any] = {}
    for name, c in CELLS.items():
        if name in agg:
            cell_docs[name] = {"what": c.what, **agg[name]}
        elif not c.implemented:
            cell_docs[name] = {"status": "not implemented", "what": c.what, "reason": c.reason}
        else:
            cell_docs[name] = {"status": "not run", "what": c.what, "reason": "not in --cells"}
    settings = {
        "device": args.device,
        "blocks": args.blocks,
        "chunks": args.chunks,
        "warmup": args.warmup,
        "split_chunks": args.split_chunks,
        "profile_chunks": args.profile_chunks,
        "seed": args.seed,
        "block_seeds": [args.seed + b for b in range(args.blocks)],
        "cells": cells,
        "threads": args.threads,
        "worker_timeout_s": args.worker_timeout,
        "quick": args.quick,
        "chunk_tokens": 25,
        "lookahead_tokens": 3,
        "prompt_frames": 302,
        "n_timesteps": 10,
        "dtype": "float32",
        "batch": 1,
    }
    return {
        "benchmark": "token2wav",
        "command": "python -m bench.token2wav"
        + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv)),
        **_git_info(args.git_commit),
        "torch": _first_ok(blocks, "torch") or torch.__version__,
        "cuda": _first_ok(blocks, "cuda") or torch.version.cuda,
        "cudnn": _first_ok(blocks, "cudnn"),
        "gpu": _first_ok(blocks, "device_name"),
        "python": sys.version.split()[0],
        "minicpmo_utils": _first_ok(blocks, "minicpmo_utils"),
        "determinism": {
            "envelope": ENVELOPE,
            "pinned_in_every_cell": True,
            "held_in_every_worker": all(
                r.get("determinism_ok")
                for b in blocks
                for r in b["results"].values()
                if r.get("status") == "ok"
            ),
            "read_back_per_cell": {
                c: [b["results"][c].get("determinism") for b in blocks if c in b["results"]]
                for c in cells
            },
        },
        "settings": settings,
        "method": {
            "window": "per-chunk wall, time.perf_counter between torch.cuda.synchronize() calls (CUDA), nothing else instrumented",
            "split": "separate pass after the window: flow.inference_chunk / hift.forward as installed (stock or bound) wrapped, synchronised around each part",
            "busy": "separate torch.profiler pass (CPU+CUDA) after the split pass: sum of kernel durations / chunk; kernels executed, host launch calls and graph launches per chunk; null on CPU",
            "memory": "torch.cuda.max_memory_allocated, reset at each phase boundary; process peak = max over phases (build, setup, warmup, window, split, profile, final)",
            "aggregation": "per-block median (p95: numpy linear percentile) -> median over blocks",
            "ratios": "per-block paired ratio cell/B0; geometric mean with a 95% t-interval on log ratios (df = blocks-1); none with one block",
            "exact": "SHA-256 of the concatenated float32 PCM of every streamed chunk equals B0's in every block",
            "pcm_sha256": "the first block's (seed = --seed); every block's is in pcm_sha256_by_block",
            "order": "cells rotated left by the block index (cyclic Latin square), each in a fresh process",
        },
        "cells": cell_docs,
        "blocks": blocks,
    }


def driver_main(args: argparse.Namespace, argv: Sequence[str]) -> int:

    cells = [c for c in args.cells if CELLS[c].implemented]
    skipped = [c for c in args.cells if not CELLS[c].implemented]
    for c in skipped:
        print(
            f"bench.token2wav: cell {c} is not implemented ({CELLS[c].reason}); listed only",
            file=sys.stderr,
        )
    if "B0" not in cells:
        print(
            "bench.token2wav: B0 is not among the cells: no ratios and no exactness",
            file=sys.stderr,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    blocks: list[dict] = []
    t_start = time.perf_counter()
    for b in range(args.blocks):
        seed = args.seed + b
        order = _rotate(cells, b)
        block = {"block": b, "seed": seed, "order": order, "results": {}}
        blocks.append(block)
        for cell in order:
            print(
                f"bench.token2wav: block {b + 1}/{args.blocks} seed {seed} cell {cell}",
                file=sys.stderr,
            )
            res = run_cell_process(cell, b, seed, args)
            block["results"][cell] = res
            msg = res.get("status")
            if res.get("status") == "ok":
                from bench.stats import median

                msg += f" p50 {median(res.get('window_ms') or []) or 0.0:.1f} ms sha {str(res.get('pcm_sha256'))[:12]}"
            else:
                msg += f": {res.get('error')}"
            print(f"bench.token2wav: block {b} {cell}: {msg}", file=sys.stderr)
            doc = build_document(args, argv, cells, blocks)
            doc["wall_s"] = time.perf_counter() - t_start
            doc["complete"] = False
            _write_json(out.with_suffix(".json"), doc)
    doc = build_document(args, argv, cells, blocks)
    doc["wall_s"] = time.perf_counter() - t_start
    doc["complete"] = True
    _write_json(out.with_suffix(".json"), doc)
    png_note = _write_reports(doc, out)
    print(
        f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')}"
        + ("" if png_note else f", {out.with_suffix('.png')}"),
        file=sys.stderr,
    )
    return 0


def _rotate(cells: list[str], k: int) -> list[str]:
    from bench.stats import rotate

    return rotate(cells, k)


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    os.replace(tmp, path)


# ============================================================================ CLI


def _cells_arg(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CELLS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown cell(s) {unknown}; known: {', '.join(CELLS)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("a cell is named twice")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    cells_help = "; ".join(
        f"{c.name}{'' if c.implemented else ' (not implemented)'}: {c.what}" for c in CELLS.values()
    )
    p = argparse.ArgumentParser(
        prog="python -m bench.token2wav",
        description="Matched-block benchmark of the stock streaming Token2Wav (minicpmo-utils 1.0.6, "
        "seeded random weights) against the generated duplexcadence adapter. Every (block, cell) "
        "runs in a fresh process; writes <out>.json, <out>.md and <out>.png.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--cells",
        type=_cells_arg,
        default=None,
        help=f"comma-separated cells (default: all implemented: {','.join(DEFAULT_CELLS)}). {cells_help}",
    )
    p.add_argument("--blocks", type=int, default=4, help="matched blocks (block b uses seed + b)")
    p.add_argument("--chunks", type=int, default=16, help="steady-state chunks measured per block")
    p.add_argument("--warmup", type=int, default=3, help="chunks streamed before the window")
    p.add_argument(
        "--split-chunks", type=int, default=4, help="chunks of the flow/vocoder split pass"
    )
    p.add_argument(
        "--profile-chunks", type=int, default=3, help="chunks of the torch.profiler pass (CUDA)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in workers")
    p.add_argument("--out", default=DEFAULT_OUT, help="output path without suffix")
    p.add_argument("--worker-timeout", type=float, default=600.0, help="seconds per worker process")
    p.add_argument("--quiet-workers", action="store_true", help="do not echo worker stderr")
    p.add_argument(
        "--git-commit",
        default=None,
        help="commit to record when the tree has no .git (else git rev-parse HEAD, "
        "else $DUPLEXCADENCE_GIT_COMMIT)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CPU smoke settings: --device cpu --blocks 1 --warmup 1 --chunks 2 "
        "--split-chunks 1 --profile-chunks 0 --cells B0,S --worker-timeout 1800 (explicit "
        "flags win), --out bench/results/token2wav_quick",
    )
    p.add_argument(
        "--rerender",
        metavar="JSON",
        default=None,
        help="only re-aggregate an existing result JSON (complete or partial) and rewrite its "
        ".json/.md/.png; runs nothing",
    )
    # internal
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cell", default=None, help=argparse.SUPPRESS)
    p.add_argument("--block", type=int, default=0, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    if args.quick:
        quick = {
            "--device": ("device", "cpu"),
            "--blocks": ("blocks", 1),
            "--warmup": ("warmup", 1),
            "--chunks": ("chunks", 2),
            "--split-chunks": ("split_chunks", 1),
            "--profile-chunks": ("profile_chunks", 0),
            "--cells": ("cells", ["B0", "S"]),
            "--out": ("out", "bench/results/token2wav_quick"),
            "--worker-timeout": ("worker_timeout", 1800.0),
        }
        for flag, (dest, value) in quick.items():
            if flag not in given:
                setattr(args, dest, value)
    if args.cells is None:
        args.cells = list(DEFAULT_CELLS)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("blocks", "chunks"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    for name in ("warmup", "split_chunks", "profile_chunks"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.worker and args.cell not in CELLS:
        p.error("--worker needs --cell")
    args._argv = argv
    return args


def rerender(path: Path) -> int:
    """Re-aggregate an existing result JSON (e.g. a partial one) and rewrite .json/.md/.png."""
    from bench import stats

    path = Path(path)
    doc = json.loads(path.read_text())
    cells = list(doc["settings"]["cells"])
    agg = stats.aggregate(doc["blocks"], cells, reference="B0")
    for name in cells:
        what = doc["cells"].get(name, {}).get("what", CELLS[name].what if name in CELLS else "")
        doc["cells"][name] = {"what": what, **agg[name]}
    _write_json(path.with_suffix(".json"), doc)
    _write_reports(doc, path)
    return 0


def _write_reports(doc: dict, out: Path) -> str | None:
    """The markdown table and the plot beside the JSON; returns the plot's note, if any."""
    from bench import report

    md = report.markdown(doc)
    png_note = report.plot(doc, out.with_suffix(".png"))
    if png_note:
        md += f"\n{png_note}\n"
    out.with_suffix(".md").write_text(md)
    print(md)
    return png_note


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.rerender:
        return rerender(Path(args.rerender))
    return driver_main(args, args._argv)


if __name__ == "__main__":
    sys.exit(main())
