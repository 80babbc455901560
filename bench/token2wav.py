"""Factorial benchmark of the stock streaming Token2Wav vs the generated adapter (issue 4).

    python -m bench.token2wav --device cuda --blocks 4 --chunks 16 --warmup 3 \\
        --out bench/results/token2wav_h200
    python -m bench.token2wav --quick            # CPU smoke: 1 block, B0 and S, 2 chunks

Split over several calls into ONE document (each call stays inside a time limit):

    python -m bench.token2wav --device cuda --blocks 4 --chunks 16 --warmup 3 \\
        --cells B0,S,Rc,SRc,vendor_bucket --time-budget 520 --out OUT
    python -m bench.token2wav --device cuda --blocks 4 --chunks 16 --warmup 3 \\
        --cells R,SR,vendor_rebucket,compile_ro --time-budget 520 --merge --out OUT
    # anything a budget skipped, later:  ... --cells <all> --missing-only --out OUT

The driver runs every (block, cell) in a FRESH PROCESS (``python -m bench.token2wav
--worker ...``), which prints one JSON line; the driver aggregates (bench/stats.py) and
writes ``<out>.json``, ``<out>.md`` and ``<out>.png`` (bench/report.py). Block ``b`` uses
seed ``seed + b`` for weights, prompt and token stream, identical for every cell of the
block; the cell order is rotated by one per block (a cyclic Latin square) so no cell
always runs first.

``--merge`` adds this call's cells to the document already at ``--out`` (same device,
seed, chunks, warm-up, split/profile chunks, else refused): blocks are kept, a cell run
again replaces its earlier result per block (kept under ``replaced``), every cell is
paired with B0 of the same block whichever call ran it, and ``commands``/``calls`` list
every call (git commit, hosts, wall time, what was skipped). ``--missing-only`` launches
only (block, cell) pairs without an ok result. ``--time-budget S`` launches a worker only
if what is left of ``S`` (less 15 s for the reports) covers the slowest worker of that
cell seen so far (else of any cell; 180 s for a first compile_ro); a worker not launched
is recorded ``"skipped"`` and its cell ``partial``. A worker that reports ``"failed"``
(adapter not importable, CUDA needed, compile failed or over ``--compile-timeout``) is
not launched again in later blocks of the call. CUDA-only cells are not launched with
``--device cpu`` (listed as not run).

Cells (DESIGN §6, paper Table 4):

* ``B0`` stock ``Token2wav.stream()`` eager, nothing bound.
* ``S`` ``bind()`` with ``DUPLEXCADENCE_DISABLE_REPLAY=1``: demand-sized, address-stable
  regions, in-place writeback carries, device-resident constants; every call eager.
* ``R`` replay at the step clock, stock state: the generated
  ``stepaudio2_token2wav_step_replay_only`` adapter bound after priming (stock buffers
  kept) replays ``flow.decoder.estimator.forward_chunk`` once per Euler step. CUDA only.
* ``Rc`` replay at the chunk clock, stock state: ``stepaudio2_token2wav_replay_only``
  bound after priming. CUDA only.
* ``SR`` state rule + step-clock replay: ``stepaudio2_token2wav_step`` bound before the
  model reaches the device, estimator replayed per Euler step.
* ``SRc`` ``bind()`` with replay: ``flow.inference_chunk`` (encoder + 10-step solver)
  and ``hift.forward`` replayed at the chunk clock, one graph per catalog class
  captured by ``Binding.capture()`` once the prompt is primed (bind() itself runs before
  the model reaches the device); anything not admitted runs eager and is counted by reason.
* ``vendor_bucket`` control: the vendor's own ``flow.scatter_cuda_graph(True)`` before
  streaming (DiT graphs for chunk buckets {30, 48, 96}; the live 50/56-frame chunk never
  hits one, so the counters show how many estimator calls replayed). CUDA only.
* ``vendor_rebucket`` control: ``rebucket_vendor_graphs`` builds the vendor's static
  buffers and captures its graphs exactly as ``DiT._init_cuda_graph_chunk`` does, but for
  chunk sizes 50 and 56 with max attended cache 500 (covers 302/352/402), then sets
  ``use_cuda_graph``; the stock ``DiT.forward_chunk`` takes its padded-mask graph branch.
  Same counters as vendor_bucket. Whether it is bit-exact with B0 is measured, not
  assumed (the graph attends a padded, masked cache; the eager path an unmasked one).
  CUDA only.
* ``compile_ro`` control: ``torch.compile(mode="reduce-overhead", dynamic=False,
  fullgraph=False)`` of ``flow.inference_chunk`` and ``hift.forward`` assigned on the
  instances (inductor config untouched). Compilation happens on the first call of each
  shape: the warm-up chunks (and the final chunk), never the window; the worker reports
  compile + first-call seconds and dynamo's counters (frames compiled, graph breaks,
  frames compiled inside the window). Anything it raises, or running past
  ``--compile-timeout`` (SIGALRM from set-up on), is a ``"failed"`` record. CUDA only.

A cell is a result only if it ran in every block and its PCM is bit-identical to B0's
in each (``counts_as_result``); the report marks every other cell.

One worker, in order (everything after the build streams the same token stream):

1. pin the determinism envelope (cudnn.deterministic=True, cudnn.benchmark=False) and
   build the vendor object (``bench.workloads.token2wav.build_token2wav``);
2. cell set-up (``bind`` — capture happens here, before any traffic — or the vendor
   bucket graphs, or the compiled callables); its wall time and the binding's
   capture/warm-up seconds are reported, outside the window;
3. ``--warmup`` chunks, each timed alone (``warmup_ms``; compile_ro compiles here:
   use ``--warmup 3`` or more so the cache extents 302/352/402 are all seen);
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
import signal
import socket
import sys
import tempfile
import time
import traceback
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from bench.harness import (
    counter_delta,
    first_ok,
    git_info,
    json_default,
    replay_block,
    replay_counters,
    run_worker_process,
    write_json,
)

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
            "replay at the step clock, stock state (no state rule): the generated "
            "stepaudio2_token2wav_step_replay_only adapter, bound after priming, replays "
            "flow.decoder.estimator.forward_chunk once per Euler step (10 per chunk); the "
            "encoder, the solver loop and the vocoder run eager",
            True,
            bind=True,
            replay=True,
            needs_cuda=True,
            adapter="stepaudio2_token2wav_step_replay_only",
            bind_before_priming=False,
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
            "state rule + replay at the step clock: the generated stepaudio2_token2wav_step "
            "adapter, bound before the model reaches the device, replays "
            "flow.decoder.estimator.forward_chunk once per Euler step; misses run eager",
            True,
            bind=True,
            replay=True,
            adapter="stepaudio2_token2wav_step",
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
            "control: the vendor DiT graph path (DiT.forward_chunk, padded mask + padded "
            "attention cache) with its graphs captured for the live chunk sizes 50 and 56 "
            "(max attended cache 500) instead of 30/48/96, then stock stream()",
            True,
            needs_cuda=True,
        ),
        Cell(
            "compile_ro",
            'control: torch.compile(mode="reduce-overhead", dynamic=False, fullgraph=False) '
            "of flow.inference_chunk and hift.forward (the callables SRc replays), compiled "
            "on their first calls outside the window",
            True,
            needs_cuda=True,
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


class CellFailed(RuntimeError):
    """A cell that cannot run as asked (adapter missing, CUDA needed, compile failed or
    over its budget). The worker reports ``{"status": "failed", "reason", "error"}`` and
    the driver launches that cell in no further block of the run."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason + (f": {detail}" if detail else ""))
        self.reason = reason
        self.detail = detail


def _import_adapter(cell: Cell) -> Any:
    name = f"duplexcadence.generated.{cell.adapter}"
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - ImportError, or whatever the module raises
        raise CellFailed(
            f"cell {cell.name}: adapter module {name} is not importable",
            f"{type(e).__name__}: {e}",
        ) from e


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
    adapter = _import_adapter(cell)
    bind = lambda model: held.append(  # noqa: E731
        adapter.bind(model, device=device, audit=False, capture=False, progress=False)
    )
    return bind if cell.bind_before_priming else None


# The vendor's bucket list (decoder_dit.py DiT._init_cuda_graph_chunk) and the live chunk.
VENDOR_BUCKETS = {30: 500, 48: 500, 96: 1000}  # chunk frames -> max attended cache frames
# Steady chunks are 50 frames (25 tokens x 2), the final one 56 (+ 3 lookahead tokens x 2);
# the attended estimator cache is 302 (prompt), 352, then 402 (prompt + the stock 100).
REBUCKET = {50: 500, 56: 500}


def count_vendor_graphs(est: Any, info: dict) -> dict:
    """Count ``est.forward_chunk`` calls and graph replays (``est.graph_chunk[size]``
    lookups, which the vendor does once per replay) into ``info['vendor_counts']``."""
    counts = {"estimator_calls": 0, "bucket_replays": 0}

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
    info["vendor_max_size"] = {int(k): int(v) for k, v in est.max_size_chunk.items()}
    info["vendor_counts"] = counts  # filled while streaming
    return counts


def rebucket_vendor_graphs(est: Any, buckets: dict[int, int] = REBUCKET) -> None:
    """``DiT._init_cuda_graph_chunk`` (decoder_dit.py:433-475) for other buckets.

    Same static buffers (the vendor's literal shapes: CFG batch 2, 320 input channels,
    t-embedding 512, 16 blocks x 8 heads x 128 = k|v of head_dim 64, conv cache 1024 x 2),
    same eager call on the static buffers before capture, same ``torch.cuda.graph``
    capture under ``torch.no_grad()``; only the chunk sizes and max sizes are ours. Then
    ``use_cuda_graph = True`` as ``_init_cuda_graph_all`` sets it, so the stock
    ``DiT.forward_chunk`` takes its graph branch for these sizes when the attended cache
    fits. The vendor's 30/48/96 graphs are not captured.
    """
    import torch

    dtype, device = est.cnn_cache_buffer.dtype, est.cnn_cache_buffer.device
    graphs, buffers, max_sizes = {}, {}, {}
    with torch.no_grad():
        for chunk_size, max_size in buckets.items():
            max_sizes[chunk_size] = max_size
            static_x1 = torch.zeros((2, 320, chunk_size), dtype=dtype, device=device)
            static_t1 = torch.zeros((2, 1, 512), dtype=dtype, device=device)
            static_mask1 = torch.ones(
                (2, chunk_size, max_size + chunk_size), dtype=torch.bool, device=device
            )
            static_att_cache = torch.zeros((16, 2, 8, max_size, 128), dtype=dtype, device=device)
            static_cnn_cache = torch.zeros((16, 2, 1024, 2), dtype=dtype, device=device)
            static_inputs1 = [
                static_x1,
                static_t1,
                static_mask1,
                static_cnn_cache,
                static_att_cache,
            ]
            static_new_cnn_cache = torch.zeros((16, 2, 1024, 2), dtype=dtype, device=device)
            static_new_att_cache = torch.zeros(
                (16, 2, 8, max_size + chunk_size, 128), dtype=dtype, device=device
            )
            est.blocks_forward_chunk(
                static_inputs1[0],
                static_inputs1[1],
                static_inputs1[2],
                static_inputs1[3],
                static_inputs1[4],
                static_new_cnn_cache,
                static_new_att_cache,
            )
            graph_chunk = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph_chunk):
                static_out1 = est.blocks_forward_chunk(
                    static_x1,
                    static_t1,
                    static_mask1,
                    static_cnn_cache,
                    static_att_cache,
                    static_new_cnn_cache,
                    static_new_att_cache,
                )
            buffers[chunk_size] = {
                "static_inputs": static_inputs1,
                "static_outputs": [static_out1, static_new_cnn_cache, static_new_att_cache],
            }
            graphs[chunk_size] = graph_chunk
    est.max_size_chunk = max_sizes
    est.inference_buffers_chunk = buffers
    est.graph_chunk = graphs
    est.use_cuda_graph = True


COMPILE_KW = {"mode": "reduce-overhead", "dynamic": False, "fullgraph": False}


def dynamo_counters() -> dict:
    """``torch._dynamo.utils.counters`` as plain numbers (frames compiled, graphs,
    graph breaks, FX-graph cache hits/misses, cudagraph skips); {} if unavailable."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001
        return {}
    out: dict[str, dict[str, int]] = {}
    for group, c in counters.items():
        vals = {}
        for k, v in dict(c).items():
            if isinstance(v, (int, float)):
                vals[str(k)[:200]] = int(v)
        out[str(group)] = vals
    return out


def counters_delta(after: dict, before: dict) -> dict:
    out = {}
    for g, vals in after.items():
        d = {k: v - before.get(g, {}).get(k, 0) for k, v in vals.items()}
        d = {k: v for k, v in d.items() if v}
        if d:
            out[g] = d
    return out


def compile_callables(t2w: Any, info: dict) -> None:
    """Install compiled ``flow.inference_chunk`` and ``hift.forward`` on the instances.

    ``torch.compile`` is lazy: compilation (and the cudagraph-tree recording of
    reduce-overhead) happens on the first call of each new input shape, i.e. in the
    warm-up chunks (attended cache 302, 352, 402) and again for the 56-frame final chunk;
    all of it outside the window. The worker reports those seconds and the counters.
    """
    import torch

    info["compile_kwargs"] = dict(COMPILE_KW)
    info["torch_compile_note"] = "inductor config left at its defaults"
    try:
        info["recompile_limit"] = int(
            getattr(torch._dynamo.config, "recompile_limit", None)
            or getattr(torch._dynamo.config, "cache_size_limit")
        )
    except Exception:  # noqa: BLE001
        info["recompile_limit"] = None
    info["dynamo_counters_before"] = dynamo_counters()
    try:
        t2w.flow.inference_chunk = torch.compile(t2w.flow.inference_chunk, **COMPILE_KW)
        t2w.hift.forward = torch.compile(t2w.hift.forward, **COMPILE_KW)
    except Exception as e:  # noqa: BLE001
        raise CellFailed("torch.compile raised while wrapping", f"{type(e).__name__}: {e}") from e


def _setup_cell(cell: Cell, t2w: Any, device: Any, info: dict, binding: Any = None) -> Any:
    """Finish the cell on the built, primed object; returns the Binding (or None)."""
    if cell.bind:
        if binding is None:  # binds the primed model, keeping its stock buffers
            adapter = _import_adapter(cell)
            binding = adapter.bind(t2w, device=device, audit=False, capture=False, progress=False)
        binding.capture(progress=False)  # before traffic; a no-op with replay disabled
        info["adapter"] = cell.adapter
        info["bound_before_priming"] = cell.bind_before_priming
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
        t2w.flow.scatter_cuda_graph(True)
        count_vendor_graphs(t2w.flow.decoder.estimator, info)
        return None
    if cell.name == "vendor_rebucket":
        est = t2w.flow.decoder.estimator
        rebucket_vendor_graphs(est, REBUCKET)
        count_vendor_graphs(est, info)
        info["vendor_buckets_replaced"] = {str(k): v for k, v in VENDOR_BUCKETS.items()}
        return None
    if cell.name == "compile_ro":
        compile_callables(t2w, info)
        return None
    if cell.name != "B0":
        raise RuntimeError(f"cell {cell.name} has no set-up")
    return None


def _arm_compile_budget(seconds: float | None, result: dict) -> None:
    """SIGALRM after ``seconds``: the handler raises CellFailed in the main thread, so a
    compile that runs past its budget ends in a failure record, not a killed process."""
    if not seconds or seconds <= 0 or not hasattr(signal, "setitimer"):
        return
    result["compile_timeout_s"] = seconds

    def _expired(signum: int, frame: Any) -> None:
        raise CellFailed(
            f"compile budget exceeded (--compile-timeout {seconds:.0f} s)",
            f"still in phase {result.get('phase')!r}",
        )

    signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))


def _disarm_compile_budget() -> None:
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_REAL, 0.0)


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
        raise CellFailed(f"cell {cell.name} needs CUDA", f"--device {args.device}")
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
        hostname=socket.gethostname(),
    )
    if cell.bind:  # an adapter that is not there fails here, before the build
        result["adapter"] = cell.adapter
        _import_adapter(cell)
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
    compiled = cell.name == "compile_ro"
    if compiled:
        # from here to the end of the worker (every shape's compile included)
        _arm_compile_budget(args.compile_timeout, result)
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
    warmup_ms: list[float] = []
    for _ in range(args.warmup):
        t1 = time.perf_counter()
        one()
        sync()
        warmup_ms.append((time.perf_counter() - t1) * 1e3)
    sync()
    timings["warmup"] = time.perf_counter() - t0
    result["warmup_ms"] = warmup_ms
    if compiled:
        after_warmup = dynamo_counters()
        setup_info["compile_and_first_calls_s"] = timings["setup"] + timings["warmup"]
        setup_info["first_calls_ms"] = warmup_ms
        setup_info["dynamo_counters_warmup"] = counters_delta(
            after_warmup, setup_info["dynamo_counters_before"]
        )

    phase("window")
    gc.collect()
    flags["window"] = read_flags()
    before = replay_counters(binding)
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
    window_counters = counter_delta(replay_counters(binding), before)
    if compiled:
        after_window = dynamo_counters()
        setup_info["dynamo_counters_window"] = counters_delta(after_window, after_warmup)
        setup_info["frames_compiled_in_window"] = (
            setup_info["dynamo_counters_window"].get("frames", {}).get("total", 0)
        )

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
    result["replay"] = replay_block(binding, window_counters)
    if binding is not None:
        result["binding_stats"] = binding.stats()
        result["binding_report"] = binding.report()
    if "vendor_counts" in setup_info:
        setup_info["vendor_counts"] = dict(setup_info["vendor_counts"])
    if compiled:
        _disarm_compile_budget()
        setup_info["dynamo_counters_total"] = counters_delta(
            dynamo_counters(), setup_info["dynamo_counters_before"]
        )
        total = setup_info["dynamo_counters_total"]
        # frames dynamo converted: the two callables' first compiles, their recompiles
        # (new shapes: dynamic=False) and the resume frames after graph breaks
        setup_info["frames_compiled"] = total.get("frames", {}).get("total", 0)
        setup_info["unique_graphs"] = total.get("stats", {}).get("unique_graphs", 0)
        setup_info["graph_breaks"] = sum(total.get("graph_break", {}).values())
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
            _disarm_compile_budget()
            result.update(failure_record(args.cell, e, result.get("phase")))
            result["traceback"] = traceback.format_exc()
            traceback.print_exc()
    result["worker_wall_s"] = time.perf_counter() - t0
    real_stdout.write(json.dumps(result, default=json_default) + "\n")
    real_stdout.flush()
    if args.cell == "compile_ro" and result["status"] != "ok":
        # an interrupted inductor compile may leave pool threads/processes behind that
        # would hold the exit; the result is out, so leave at once
        sys.stderr.flush()
        os._exit(0)
    return 0


def failure_record(cell: str, e: BaseException, phase: str | None) -> dict:
    """The status fields of a worker that raised: "failed" (with a reason) for a cell
    that cannot run as asked -- CellFailed, or anything compile_ro raises (compilation
    and its cudagraph trees run inside the first calls) -- else "error"."""
    text = f"{type(e).__name__}: {e}"
    if isinstance(e, CellFailed):
        return {"status": "failed", "reason": e.reason, "error": text, "failed_phase": phase}
    if cell == "compile_ro" and not isinstance(e, KeyboardInterrupt):
        return {
            "status": "failed",
            "reason": f"torch.compile / reduce-overhead raised in phase {phase!r}",
            "error": text,
            "failed_phase": phase,
        }
    return {"status": "error", "error": text, "failed_phase": phase}


# ============================================================================ driver


def run_cell_process(
    cell: str,
    block: int,
    seed: int,
    args: argparse.Namespace,
    timeout: float | None = None,
    compile_timeout: float | None = None,
) -> dict:
    """One fresh worker process; returns its JSON result or a failure record.

    ``timeout`` (default ``--worker-timeout``) kills the worker; ``compile_timeout``
    (default ``--compile-timeout``) is compile_ro's own budget inside the worker.
    """
    timeout = args.worker_timeout if timeout is None else timeout
    compile_timeout = args.compile_timeout if compile_timeout is None else compile_timeout
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
    if cell == "compile_ro":
        cmd += ["--compile-timeout", f"{compile_timeout:.0f}"]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ)
    env.pop(DISABLE_ENV, None)
    if CELLS[cell].bind and not CELLS[cell].replay:
        env[DISABLE_ENV] = "1"
    res = run_worker_process(
        cmd,
        env,
        label=f"block {block} {cell}",
        timeout=timeout,
        quiet=args.quiet_workers,
        timeout_error=(
            f"worker exceeded its timeout {timeout:.0f} s (--worker-timeout "
            f"{args.worker_timeout:.0f}"
            + (f", --time-budget {args.time_budget:.0f}" if args.time_budget else "")
            + ")"
        ),
    )
    res.setdefault("cell", cell)
    res.setdefault("block", block)
    res.setdefault("seed", seed)
    return res


MERGE_KEYS = ("device", "chunks", "warmup", "split_chunks", "profile_chunks", "seed")
# Estimate for a cell's first worker when nothing of it has run yet (seconds); else the
# slowest worker seen of any cell. compile_ro compiles the flow's 10-step solver for
# three cache extents and the vocoder on its first calls.
FIRST_WORKER_EST_S = {"compile_ro": 180.0}
REPORT_RESERVE_S = 15.0  # kept back under --time-budget for writing .json/.md/.png


def merge_problems(prior: dict, settings: dict) -> list[str]:
    """Why a prior document cannot take this call's results (empty: it can)."""
    problems = []
    old = prior.get("settings") or {}
    for k in MERGE_KEYS:
        if k in old and old[k] != settings.get(k):
            problems.append(f"{k}: {old[k]!r} in the file, {settings.get(k)!r} now")
    for blk in prior.get("blocks") or []:
        want = settings["seed"] + int(blk["block"])
        if blk.get("seed") != want:
            problems.append(f"block {blk['block']} has seed {blk.get('seed')}, expected {want}")
    return problems


def merge_blocks(prior_blocks: Sequence[dict], n_blocks: int, seed: int) -> list[dict]:
    """The prior blocks (copied) extended to at least ``n_blocks`` blocks."""
    import copy

    blocks = [copy.deepcopy(b) for b in prior_blocks]
    have = {int(b["block"]) for b in blocks}
    for b in range(n_blocks):
        if b not in have:
            blocks.append({"block": b, "seed": seed + b, "order": [], "results": {}})
    blocks.sort(key=lambda b: int(b["block"]))
    return blocks


def place_result(block: dict, cell: str, res: dict) -> None:
    """Put a launched worker's result in its block; a result it replaces (an earlier
    call's) is kept under ``block['replaced']``."""
    old = block["results"].get(cell)
    if old is not None:
        block.setdefault("replaced", []).append(old)
    block["results"][cell] = res


def place_skip(block: dict, cell: str, res: dict) -> bool:
    """Record a worker not launched, unless an earlier call left a result there."""
    if cell in block["results"]:
        return False
    block["results"][cell] = res
    return True


def estimate_worker_s(cell: str, blocks: Sequence[dict]) -> float | None:
    """Seconds the next worker of ``cell`` is expected to take: the slowest worker of
    that cell seen so far (this call or a merged one), else the larger of the slowest
    worker of any cell and ``FIRST_WORKER_EST_S`` for the cell; None if nothing ran."""
    own, anyc = [], []
    for b in blocks:
        for c, r in (b.get("results") or {}).items():
            w = r.get("process_wall_s")
            if w is None or r.get("status") == "skipped":
                continue
            anyc.append(float(w))
            if c == cell:
                own.append(float(w))
    if own:
        return max(own)
    floor = FIRST_WORKER_EST_S.get(cell)
    if anyc:
        return max([max(anyc)] + ([floor] if floor else []))
    return floor


def cells_in(blocks: Sequence[dict], first: Sequence[str] = ()) -> list[str]:
    """Every cell with a result in some block, in CELLS order (``first`` included)."""
    seen = set(first)
    for b in blocks:
        seen.update((b.get("results") or {}).keys())
    return [c for c in CELLS if c in seen] + sorted(c for c in seen if c not in CELLS)


def build_document(
    args: argparse.Namespace,
    argv: Sequence[str],
    cells: list[str],
    blocks: list[dict],
    calls: list[dict] | None = None,
    not_run: dict[str, str] | None = None,
) -> dict:
    """The result document. ``cells``: every cell with results (all calls merged);
    ``calls``: one record per driver call that wrote into it; ``not_run``: cells this
    call was asked for but did not launch, with the reason (e.g. CUDA-only on a CPU)."""
    import torch

    from bench import stats

    not_run = dict(not_run or {})
    command = "python -m bench.token2wav" + (
        "" if not argv else " " + " ".join(shlex.quote(a) for a in argv)
    )
    calls = list(calls or [{"command": command}])
    agg = stats.aggregate(blocks, cells, reference="B0")
    cell_docs: dict[str, Any] = {}
    for name, c in CELLS.items():
        if name in agg:
            cell_docs[name] = {"what": c.what, **agg[name]}
        elif not c.implemented:
            cell_docs[name] = {"status": "not implemented", "what": c.what, "reason": c.reason}
        elif name in not_run:
            cell_docs[name] = {"status": "not run", "what": c.what, "reason": not_run[name]}
        else:
            cell_docs[name] = {"status": "not run", "what": c.what, "reason": "not in --cells"}
    for name in cells:  # cells of a merged file this CELLS table no longer has
        if name not in cell_docs:
            cell_docs[name] = {"what": "", **agg[name]}
    settings = {
        "device": args.device,
        "blocks": len(blocks),
        "chunks": args.chunks,
        "warmup": args.warmup,
        "split_chunks": args.split_chunks,
        "profile_chunks": args.profile_chunks,
        "seed": args.seed,
        "block_seeds": [b["seed"] for b in blocks],
        "cells": cells,
        "threads": args.threads,
        "worker_timeout_s": args.worker_timeout,
        "compile_timeout_s": args.compile_timeout,
        "time_budget_s": args.time_budget,
        "quick": args.quick,
        "chunk_tokens": 25,
        "lookahead_tokens": 3,
        "prompt_frames": 302,
        "n_timesteps": 10,
        "dtype": "float32",
        "batch": 1,
    }
    ok = [r for b in blocks for r in b["results"].values() if r.get("status") == "ok"]
    return {
        "benchmark": "token2wav",
        "command": calls[-1]["command"],
        "commands": [c["command"] for c in calls],
        "calls": calls,
        **git_info(args.git_commit),
        "torch": first_ok(blocks, "torch") or torch.__version__,
        "cuda": first_ok(blocks, "cuda") or torch.version.cuda,
        "cudnn": first_ok(blocks, "cudnn"),
        "gpu": first_ok(blocks, "device_name"),
        "hosts": sorted({r["hostname"] for r in ok if r.get("hostname")}),
        "python": sys.version.split()[0],
        "minicpmo_utils": first_ok(blocks, "minicpmo_utils"),
        "determinism": {
            "envelope": ENVELOPE,
            "pinned_in_every_cell": True,
            "held_in_every_worker": all(r.get("determinism_ok") for r in ok),
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
            "merge": "with --merge, calls add their cells to the blocks already in the file; "
            "ratios pair each cell with B0 of the same block, whichever call ran it "
            "(each result carries its call index; calls[].hosts says where each ran)",
        },
        "cells": cell_docs,
        "blocks": blocks,
    }


def driver_main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    cells = [c for c in args.cells if CELLS[c].implemented]
    not_run: dict[str, str] = {}
    for c in [c for c in args.cells if not CELLS[c].implemented]:
        print(
            f"bench.token2wav: cell {c} is not implemented ({CELLS[c].reason}); listed only",
            file=sys.stderr,
        )
    if args.device.startswith("cpu"):
        for c in [c for c in cells if CELLS[c].needs_cuda]:
            not_run[c] = f"needs CUDA; not launched with --device {args.device}"
            print(f"bench.token2wav: cell {c} {not_run[c]}", file=sys.stderr)
        cells = [c for c in cells if c not in not_run]
    if not cells:
        print("bench.token2wav: no cell left to run", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_suffix(".json")
    command = "python -m bench.token2wav" + (
        "" if not argv else " " + " ".join(shlex.quote(a) for a in argv)
    )
    prior: dict | None = None
    if args.merge and json_path.exists():
        prior = json.loads(json_path.read_text())
        settings_now = {k: getattr(args, k) for k in MERGE_KEYS}
        problems = merge_problems(prior, settings_now)
        if problems:
            print(
                f"bench.token2wav: --merge refused, {json_path} was run with other settings: "
                + "; ".join(problems),
                file=sys.stderr,
            )
            return 2
    elif args.merge:
        print(f"bench.token2wav: --merge: no {json_path} yet, starting it", file=sys.stderr)
    blocks = merge_blocks((prior or {}).get("blocks") or [], args.blocks, args.seed)
    calls = list((prior or {}).get("calls") or [])
    if prior is not None and not calls:  # a document written before calls were recorded
        calls = [{"command": c} for c in prior.get("commands") or [prior.get("command")]]
    call_index = len(calls)
    this_call: dict[str, Any] = {
        "index": call_index,
        "command": command,
        "cells": cells,
        "blocks": args.blocks,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **git_info(args.git_commit),
        "time_budget_s": args.time_budget,
        "launched": 0,
        "skipped": [],
        "complete": False,
    }
    calls.append(this_call)
    if "B0" not in cells_in(blocks, cells):
        print(
            "bench.token2wav: B0 is not among the cells (nor in the merged file): no ratios "
            "and no exactness",
            file=sys.stderr,
        )
    t_start = time.perf_counter()
    failed: dict[str, str] = {}  # cell -> why it is not launched again in this call

    def write(complete: bool) -> dict:
        this_call["wall_s"] = time.perf_counter() - t_start
        this_call["complete"] = complete
        this_call["hosts"] = sorted(
            {
                r["hostname"]
                for b in blocks
                for r in b["results"].values()
                if r.get("call") == call_index and r.get("hostname")
            }
        )
        doc = build_document(args, argv, cells_in(blocks, cells), blocks, calls, not_run)
        doc["wall_s"] = sum(float(c.get("wall_s") or 0.0) for c in calls)
        doc["complete"] = complete
        write_json(json_path, doc)
        return doc

    for bi in range(args.blocks):
        seed = args.seed + bi
        block = next(b for b in blocks if int(b["block"]) == bi)
        order = _rotate(cells, bi)
        block.setdefault("orders", []).append({"call": call_index, "order": order})
        if not block.get("order"):
            block["order"] = order
        for cell in order:
            tag = f"bench.token2wav: block {bi + 1}/{args.blocks} seed {seed} cell {cell}"
            old = block["results"].get(cell)
            if args.missing_only and old is not None and old.get("status") == "ok":
                print(f"{tag}: kept (ok in call {old.get('call', 0)})", file=sys.stderr)
                continue
            skip = None
            timeout, compile_timeout = args.worker_timeout, args.compile_timeout
            est = estimate_worker_s(cell, blocks)
            elapsed = time.perf_counter() - t_start
            if cell in failed:
                skip = f"not launched: {failed[cell]}"
            elif args.time_budget:
                remaining = args.time_budget - REPORT_RESERVE_S - elapsed
                if est is not None and remaining < est:
                    skip = (
                        f"not launched: {remaining:.0f} s left of --time-budget "
                        f"{args.time_budget:.0f} s, worker estimate {est:.0f} s"
                    )
                else:
                    timeout = max(1.0, min(timeout, remaining))
                    compile_timeout = max(1.0, min(compile_timeout, remaining - 45.0))
            if skip:
                placed = place_skip(
                    block,
                    cell,
                    {
                        "status": "skipped",
                        "error": skip,
                        "cell": cell,
                        "block": bi,
                        "seed": seed,
                        "call": call_index,
                    },
                )
                this_call["skipped"].append({"block": bi, "cell": cell, "why": skip})
                print(
                    f"{tag}: {skip}" + ("" if placed else " (earlier result kept)"), file=sys.stderr
                )
                continue
            print(
                f"{tag} (elapsed {elapsed:.0f} s"
                + (f", estimate {est:.0f} s" if est is not None else "")
                + (f", budget left {args.time_budget - elapsed:.0f} s" if args.time_budget else "")
                + ")",
                file=sys.stderr,
            )
            res = run_cell_process(cell, bi, seed, args, timeout, compile_timeout)
            res["call"] = call_index
            place_result(block, cell, res)
            this_call["launched"] += 1
            msg = res.get("status")
            if res.get("status") == "ok":
                from bench.stats import median

                msg += f" p50 {median(res.get('window_ms') or []) or 0.0:.1f} ms sha {str(res.get('pcm_sha256'))[:12]}"
            else:
                msg += f": {res.get('error')}"
            if res.get("status") == "failed":
                failed[cell] = f"failed in block {bi}: {res.get('reason') or res.get('error')}"
            print(
                f"bench.token2wav: block {bi} {cell}: {msg} ({res.get('process_wall_s', 0):.0f} s)",
                file=sys.stderr,
            )
            write(False)
    doc = write(True)
    png_note = _write_reports(doc, out)
    print(
        f"wrote {json_path}, {out.with_suffix('.md')}"
        + ("" if png_note else f", {out.with_suffix('.png')}"),
        file=sys.stderr,
    )
    return 0


def _rotate(cells: list[str], k: int) -> list[str]:
    from bench.stats import rotate

    return rotate(cells, k)


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
        "--compile-timeout",
        type=float,
        default=400.0,
        help="compile_ro: seconds from its set-up to the end of its worker (the compile of "
        "every shape included); past it the worker reports status 'failed'",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="seconds this call may take in all: a worker is not launched when what is "
        f"left (minus {REPORT_RESERVE_S:.0f} s for the reports) is below the slowest worker "
        "of that cell seen so far (else of any cell); it is recorded as 'skipped' and the "
        "cell as partial. Launched workers get at most what is left as their timeout",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="add this call's cells to the result JSON already at --out (same device, seed, "
        "chunks, warmup, split/profile chunks; refused otherwise): its blocks are kept, a "
        "cell run now replaces that cell's earlier result in each block it runs (the old "
        "one is kept under the block's 'replaced'), ratios are recomputed against B0 of the "
        "same block from whichever call ran it, and every call's command is kept in "
        "'commands' / 'calls'",
    )
    p.add_argument(
        "--missing-only",
        action="store_true",
        help="with --merge (implied): launch only the (block, cell) pairs that have no 'ok' "
        "result in the file yet, e.g. to finish what a --time-budget skipped",
    )
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
    if args.missing_only:
        args.merge = True
    if args.time_budget is not None and args.time_budget <= REPORT_RESERVE_S:
        p.error(f"--time-budget must be > {REPORT_RESERVE_S:.0f} s")
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
    write_json(path.with_suffix(".json"), doc)
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
