"""Benchmark of the stock Kyutai Moshi streaming loop vs the generated adapter (issue 5).

The workload is PyPI ``moshi==0.2.13`` as ``bench.workloads.moshi`` builds it: Mimi fp32
+ the full 7B LM config (``FULL_7B``) in bf16, seeded random weights, batch 1, greedy.
One *frame* is 80 ms of audio (1920 samples at 24 kHz): ``mimi.encode`` -> one
``lm_gen.step`` (text + 8 audio tokens) -> ``mimi.decode``, run with
``bench.workloads.moshi.step_frame`` (which also enters the vendor's ``no_compile()``).

Cells (every one with ``NO_TORCH_COMPILE=1`` in the worker's environment, so
torch.compile is off and all cells run the same eager kernels):

* ``eager``   vendor code, its CUDA graphs off (``NO_CUDA_GRAPH=1``). The reference.
* ``vendor``  vendor code with its own ``CUDAGraphed`` wrappers on (``NO_CUDA_GRAPH``
  unset): LM ``forward_text`` and ``depformer_step``, Mimi encoder/decoder (+ their
  transformers). Each wrapper runs its first call eagerly and captures on its second;
  the decoder first runs on frame 2 (LM delay 1), so ``--warmup`` must be >= 3 for the
  window to see only replays.
* ``adapter`` vendor graphs off (``NO_CUDA_GRAPH=1``) + our generated adapter, bound by
  ``bench.workloads.moshi.bind_adapter(mimi, lm_gen, device)`` on the freshly built,
  streaming-started pair. The workload module owns the binding protocol (bind, capture
  and any reset); it returns the ``Binding``. If it is missing or raises, the worker
  prints a failure record and the driver carries on.

Driver and workers: the driver runs every (block, cell) in a FRESH PROCESS
(``python -m bench.moshi --worker ...``) that prints one JSON line; the driver
aggregates and writes ``<out>.json``, ``<out>.md`` and ``<out>.png``. Block ``b`` uses
seed ``seed + b`` (weights, codebooks, input PCM), identical for every cell of the
block; the cell order is rotated left by ``b`` (a cyclic Latin square).

One worker, in order:

1. pin the determinism envelope (cudnn.deterministic=True, cudnn.benchmark=False; read
   back and recorded at start, window and end) and build (``build_moshi(..., start=True)``);
2. cell set-up, timed, outside the window (adapter: ``bind_adapter``; its capture and
   warm-up seconds come from ``Binding.stats()``);
3. ``--warmup`` frames, untimed (the vendor graphs capture here);
4. the measured window: ``--frames`` frames, each timed with ``time.perf_counter``
   between two ``torch.cuda.synchronize()`` calls (CPU: no synchronisation); the outputs
   are copied to the host after the second synchronisation, outside the timing;
5. profile pass (CUDA only): ``--profile-frames`` frames under ``torch.profiler`` (CPU +
   CUDA activities), summarised by ``bench.token2wav.summarize_trace``: device-busy ms
   per frame (sum of kernel durations), kernels executed, host kernel-launch calls and
   graph launches per frame. On CPU these frames stream uninstrumented.

Memory (CUDA): ``max_memory_allocated``, reset at each phase boundary; the process peak
is the maximum over phases (build, setup, warmup, window, profile). Adapter replay
counters (hits, misses by reason, per callable) are taken from ``Binding.stats()``
before and after the window.

Exactness: SHA-256 over the token IDs (the int64 bytes of each frame's [text + 8 audio]
ids, in order, frames without output skipped) and over the float32 PCM bytes, for all
frames of phases 3-5; plus one SHA per frame of each (null for a frame without output)
so a divergence can be located. A cell is ``exact`` when both SHAs equal the eager
cell's in every block where both ran.

On the GPU (one H200; see the report of issue 5 for timings)::

    python -m bench.moshi --device cuda --blocks 4 --frames 32 --warmup 4 \\
        --profile-frames 3 --time-budget 480 --out bench/results/moshi_h200
    python -m bench.moshi --device cuda --tiny ...     # the tiny LM, a fast GPU check
    python -m bench.moshi --quick                      # CPU smoke: 1 block, tiny LM,
                                                       # eager + adapter, 3 frames

``--time-budget S`` stops launching workers once the time left is below the slowest
worker seen so far (and caps each worker's timeout by the time left); whatever did not
run is recorded as ``skipped`` and its cells are ``partial``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

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
DEFAULT_OUT = "bench/results/moshi_h200"
QUICK_OUT = "bench/results/moshi_quick"
MIB = 2**20
REFERENCE = "eager"
RATIO_REFS = ("eager", "vendor")
DISABLE_ENV = "DUPLEXCADENCE_DISABLE_REPLAY"  # runtime/controls.py; never set here
VENDOR_GRAPH_ENV = "NO_CUDA_GRAPH"
COMPILE_ENV = "NO_TORCH_COMPILE"


@dataclass(frozen=True)
class Cell:
    name: str
    what: str
    vendor_graphs: bool = False
    bind: bool = False


CELLS: dict[str, Cell] = {
    c.name: c
    for c in (
        Cell("eager", "vendor code, its CUDA graphs off (NO_CUDA_GRAPH=1)"),
        Cell(
            "vendor",
            "vendor's own CUDAGraphed wrappers on (NO_CUDA_GRAPH unset): LM forward_text "
            "and depformer_step, Mimi encoder/decoder and their transformers",
            vendor_graphs=True,
        ),
        Cell(
            "adapter",
            "vendor graphs off (NO_CUDA_GRAPH=1) + the generated adapter bound by "
            "bench.workloads.moshi.bind_adapter",
            bind=True,
        ),
    )
}
DEFAULT_CELLS = list(CELLS)


def cell_env(cell: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker environment of a cell (torch.compile always off; vendor graphs per cell)."""
    env = dict(os.environ if base is None else base)
    env.pop(DISABLE_ENV, None)
    env[COMPILE_ENV] = "1"
    if CELLS[cell].vendor_graphs:
        env.pop(VENDOR_GRAPH_ENV, None)
    else:
        env[VENDOR_GRAPH_ENV] = "1"
    return env


# ============================================================================ worker


def _vendor_graph_state(mimi: Any, lm_gen: Any) -> dict:
    """Which vendor CUDAGraphed wrappers hold a captured graph (None: no wrapper)."""
    out: dict[str, Any] = {}
    for owner, names in (
        (lm_gen, ("graphed_main", "graphed_depth")),
        (mimi, ("graphed_encoder", "graphed_decoder", "graphed_tr_enc", "graphed_tr_dec")),
    ):
        state = getattr(owner, "_streaming_state", None)
        for n in names:
            g = getattr(state, n, None)
            out[n] = None if g is None else getattr(g, "_graph", None) is not None
    return out


class _Hashes:
    """Token-ID and PCM SHA-256 over all frames, plus one of each per frame."""

    def __init__(self) -> None:
        self.tokens = hashlib.sha256()
        self.pcm = hashlib.sha256()
        self.frame_tokens: list[str | None] = []
        self.frame_pcm: list[str | None] = []
        self.token_ids: list[list[int] | None] = []
        self.n_samples = 0

    def add(self, toks: list, outs: list) -> None:
        import numpy as np

        assert len(toks) == len(outs) <= 1, "one LM step per 1920-sample frame"
        if not toks:
            self.frame_tokens.append(None)
            self.frame_pcm.append(None)
            self.token_ids.append(None)
            return
        ids = np.ascontiguousarray(toks[0].detach().cpu().numpy().reshape(-1), dtype=np.int64)
        pcm = np.ascontiguousarray(outs[0].detach().cpu().numpy().reshape(-1), dtype=np.float32)
        tb, pb = ids.tobytes(), pcm.tobytes()
        self.tokens.update(tb)
        self.pcm.update(pb)
        self.frame_tokens.append(hashlib.sha256(tb).hexdigest())
        self.frame_pcm.append(hashlib.sha256(pb).hexdigest())
        self.token_ids.append([int(v) for v in ids])
        self.n_samples += pcm.size


def run_worker(args: argparse.Namespace, result: dict) -> None:
    import torch

    from bench.token2wav import MemTracker, envelope_holds, pin_envelope, read_flags

    cell = CELLS[args.cell]
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        if device.index is not None:
            torch.cuda.set_device(device)
        device = torch.device("cuda", torch.cuda.current_device())
    if args.threads:
        torch.set_num_threads(args.threads)
    result.update(
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        threads=torch.get_num_threads(),
        env={k: os.environ.get(k) for k in (VENDOR_GRAPH_ENV, COMPILE_ENV, DISABLE_ENV)},
    )
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    mem = MemTracker(device)
    flags = {"start": pin_envelope()}
    result["determinism_flags"] = flags
    t_start = time.perf_counter()

    def phase(name: str) -> None:
        result["phase"] = name
        print(
            f"worker {cell.name}: {name} ({time.perf_counter() - t_start:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    phase("import")
    from bench.workloads import moshi as W

    reason = W.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    from moshi.utils import compile as vendor_compile

    result["moshi"] = W.installed_version()
    # The environment is the cell: check the vendor reads it as intended.
    graphs_on = vendor_compile._is_cuda_graph_enabled()
    if graphs_on != cell.vendor_graphs:
        raise RuntimeError(
            f"cell {cell.name} needs vendor CUDA graphs {'on' if cell.vendor_graphs else 'off'}, "
            f"but the vendor reads them {'on' if graphs_on else 'off'} "
            f"({VENDOR_GRAPH_ENV}={os.environ.get(VENDOR_GRAPH_ENV)!r})"
        )
    if not os.environ.get(COMPILE_ENV):
        raise RuntimeError(f"{COMPILE_ENV} is not set: torch.compile would differ between cells")

    n_total = args.warmup + args.frames + args.profile_frames
    frames = W.pcm_stream(args.seed, n_total)
    it = iter(frames)
    hashes = _Hashes()
    timings: dict[str, float] = {}
    result["timings_s"] = timings
    result["n_frames_streamed"] = n_total

    def step() -> tuple[list, list]:
        return W.step_frame(mimi, lm_gen, next(it))

    phase("build")
    mem.phase("build")
    t0 = time.perf_counter()
    lm_kwargs = W.TINY_LM_KWARGS if args.tiny else W.FULL_7B
    mimi, lm_gen = W.build_moshi(
        args.seed, device, torch.bfloat16, lm_kwargs, greedy=True, start=True
    )
    sync()
    timings["build"] = time.perf_counter() - t0
    lm = lm_gen.lm_model
    result["model"] = {
        "lm_kwargs": "TINY" if args.tiny else "FULL_7B",
        "lm_params": sum(p.numel() for p in lm.parameters()),
        "lm_dtype": str(next(lm.parameters()).dtype).replace("torch.", ""),
        "mimi_params": sum(p.numel() for p in mimi.parameters()),
        "mimi_dtype": str(next(mimi.parameters()).dtype).replace("torch.", ""),
        "lm_dim": getattr(lm, "dim", None),
        "lm_layers": len(getattr(getattr(lm, "transformer", None), "layers", []) or []),
        "dep_q": lm.dep_q,
        "num_codebooks": lm.num_codebooks,
        "greedy": True,
        "batch": 1,
    }

    phase("setup")
    mem.phase("setup")
    setup: dict[str, Any] = {}
    result["setup"] = setup
    alloc_before = mem.allocated_mib()
    t0 = time.perf_counter()
    binding = None
    if cell.bind:
        bind_adapter = getattr(W, "bind_adapter", None)
        if bind_adapter is None:
            raise RuntimeError(
                "bench.workloads.moshi.bind_adapter does not exist (the adapter binding "
                "protocol is not written yet)"
            )
        binding = bind_adapter(mimi, lm_gen, device)
        if binding is None:
            raise RuntimeError("bench.workloads.moshi.bind_adapter returned None, not a Binding")
    sync()
    timings["setup"] = time.perf_counter() - t0
    if alloc_before is not None:
        setup["allocated_delta_mib"] = mem.allocated_mib() - alloc_before
    if binding is not None:
        st = binding.stats()
        setup["capture_s"] = sum(
            float(s.get("capture_s") or 0.0) for s in (st.get("callables") or {}).values()
        )
        setup["binding_warmup_s"] = sum(
            float(s.get("warmup_s") or 0.0) for s in (st.get("callables") or {}).values()
        )
        setup["binding_eager"] = st.get("eager")
        setup["regions"] = {
            name: {"shape": r.get("shape"), "mib": r.get("mib")}
            for name, r in (st.get("regions") or {}).items()
        }
    flags["after_setup"] = read_flags()
    if not envelope_holds(flags["after_setup"]):
        flags["repinned_after_setup"] = pin_envelope()

    phase("warmup")
    mem.phase("warmup")
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        toks, outs = step()
        sync()
        hashes.add(toks, outs)
    timings["warmup"] = time.perf_counter() - t0

    phase("window")
    gc.collect()
    flags["window"] = read_flags()
    before = replay_counters(binding)
    mem.phase("window")
    window_ms: list[float] = []
    for _ in range(args.frames):
        sync()
        t0 = time.perf_counter()
        toks, outs = step()
        sync()
        window_ms.append((time.perf_counter() - t0) * 1e3)
        hashes.add(toks, outs)  # host copies, outside the timing
    result["window_ms"] = window_ms
    window_counters = counter_delta(replay_counters(binding), before)

    phase("profile")
    mem.phase("profile")
    result["profile"] = None
    if args.profile_frames and cuda:
        result["profile"] = _profile_pass(step, hashes, sync, args.profile_frames)
    else:
        for _ in range(args.profile_frames):
            toks, outs = step()
            hashes.add(toks, outs)
    sync()
    mem.phase(None)

    flags["end"] = read_flags()
    result["determinism"] = flags["window"]
    result["determinism_ok"] = all(
        envelope_holds(f) for k, f in flags.items() if k in ("start", "window", "end")
    )
    result["memory"] = mem.summary()
    result["tokens_sha256"] = hashes.tokens.hexdigest()
    result["pcm_sha256"] = hashes.pcm.hexdigest()
    result["frame_tokens_sha256"] = hashes.frame_tokens
    result["frame_pcm_sha256"] = hashes.frame_pcm
    result["frame_token_ids"] = hashes.token_ids
    result["n_samples"] = hashes.n_samples
    result["vendor_graphs_captured"] = _vendor_graph_state(mimi, lm_gen)
    if binding is not None:
        result["replay"] = replay_block(binding, window_counters)
        result["binding_stats"] = binding.stats()
        result["binding_report"] = binding.report()
    else:
        result["replay"] = None
    phase("done")
    result["status"] = "ok"


def _profile_pass(step: Callable, hashes: _Hashes, sync: Callable, n: int) -> dict:
    from torch.profiler import ProfilerActivity, profile, record_function

    from bench.token2wav import summarize_trace

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            with record_function("bench::frame"):
                toks, outs = step()
                sync()
            hashes.add(toks, outs)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = trace.get("traceEvents", trace) if isinstance(trace, dict) else trace
    s = summarize_trace(events, n)
    return {
        "frames": n,
        "busy_ms": s.get("busy_ms"),
        "kernels_per_frame": s.get("kernels_per_chunk"),
        "kernel_launch_calls_per_frame": s.get("kernel_launch_calls_per_chunk"),
        "graph_launch_calls_per_frame": s.get("graph_launch_calls_per_chunk"),
        "memcpy_ms": s.get("memcpy_ms"),
        "memset_ms": s.get("memset_ms"),
    }


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
            "frames": args.frames,
            "profile_frames": args.profile_frames,
            "tiny": args.tiny,
        },
    }
    t0 = time.perf_counter()
    # Vendor code may print: keep stdout for the one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        try:
            run_worker(args, result)
        except BaseException as e:  # noqa: BLE001 - the driver records whatever happened
            result["status"] = "error"
            result["error"] = f"{type(e).__name__}: {e}"
            result["traceback"] = traceback.format_exc()
            traceback.print_exc()
    result["worker_wall_s"] = time.perf_counter() - t0
    real_stdout.write(json.dumps(result, default=json_default) + "\n")
    real_stdout.flush()
    return 0


# ============================================================================ aggregation


def block_summary(res: Mapping[str, Any] | None) -> dict:
    """One worker's raw result -> the per-block numbers of that cell."""
    from bench.stats import median, percentile

    if not res or res.get("status") != "ok":
        return {"ok": False, "status": (res or {}).get("status", "missing")}
    window = res.get("window_ms") or []
    prof = res.get("profile") or {}
    mem = res.get("memory") or {}
    setup = res.get("setup") or {}
    return {
        "ok": True,
        "status": "ok",
        "p50_ms": median(window),
        "p95_ms": percentile(window, 95),
        "mean_ms": (sum(window) / len(window)) if window else None,
        "min_ms": min(window) if window else None,
        "max_ms": max(window) if window else None,
        "busy_ms": prof.get("busy_ms"),
        "kernels_per_frame": prof.get("kernels_per_frame"),
        "kernel_launch_calls_per_frame": prof.get("kernel_launch_calls_per_frame"),
        "graph_launch_calls_per_frame": prof.get("graph_launch_calls_per_frame"),
        "peak_mib": mem.get("process_peak_mib"),
        "window_peak_mib": mem.get("window_peak_mib"),
        "setup_s": (res.get("timings_s") or {}).get("setup"),
        "build_s": (res.get("timings_s") or {}).get("build"),
        "capture_s": setup.get("capture_s"),
        "worker_wall_s": res.get("process_wall_s", res.get("worker_wall_s")),
        "tokens_sha256": res.get("tokens_sha256"),
        "pcm_sha256": res.get("pcm_sha256"),
    }


_MEDIAN_KEYS = (
    "p50_ms",
    "p95_ms",
    "mean_ms",
    "busy_ms",
    "kernels_per_frame",
    "kernel_launch_calls_per_frame",
    "graph_launch_calls_per_frame",
    "peak_mib",
    "window_peak_mib",
    "setup_s",
    "build_s",
    "capture_s",
    "worker_wall_s",
)


def first_divergence(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict | None:
    """The first frame whose token or PCM SHA differs between two ok worker results."""
    if not a or not b or a.get("status") != "ok" or b.get("status") != "ok":
        return None
    for key in ("frame_tokens_sha256", "frame_pcm_sha256"):
        if len(a.get(key) or []) != len(b.get(key) or []):
            return {"what": key, "frame": None, "note": "different frame counts"}
    ta, tb = a.get("frame_tokens_sha256") or [], b.get("frame_tokens_sha256") or []
    pa, pb = a.get("frame_pcm_sha256") or [], b.get("frame_pcm_sha256") or []
    for i in range(len(ta)):
        if ta[i] != tb[i]:
            return {"what": "tokens", "frame": i}
        if pa[i] != pb[i]:
            return {"what": "pcm", "frame": i}
    return None


def aggregate(blocks: Sequence[Mapping[str, Any]], cells: Sequence[str]) -> dict:
    """Cells' summaries across blocks; ``blocks`` as the driver keeps them
    (``{"block": b, "seed": s, "results": {cell: worker_result}}``)."""
    from bench.stats import invert_ratio, median, paired_ratio, replay_summary

    def raw(c: str) -> list:
        return [(b.get("results") or {}).get(c) for b in blocks]

    rows = {c: [block_summary(r) for r in raw(c)] for c in set(cells) | set(RATIO_REFS)}
    out: dict[str, dict] = {}
    for c in cells:
        rs = rows[c]
        ok = [r for r in rs if r["ok"]]
        s: dict[str, Any] = {
            "status": "ok" if ok and len(ok) == len(rs) else ("partial" if ok else "failed"),
            "blocks_ok": f"{len(ok)}/{len(rs)}",
        }
        for k in _MEDIAN_KEYS:
            s[k] = median(r.get(k) for r in ok)
        for key in ("tokens_sha256", "pcm_sha256"):
            by_block = [r.get(key) if r["ok"] else None for r in rs]
            s[key] = by_block[0] if by_block else None
            s[key + "_by_block"] = by_block
        # exactness vs eager, block by block, where both ran
        ref = rows[REFERENCE]
        compared = equal = 0
        divergence = []
        for i, (r, e) in enumerate(zip(rs, ref)):
            if not (r["ok"] and e["ok"]):
                continue
            compared += 1
            same = (
                r["tokens_sha256"] is not None
                and r["tokens_sha256"] == e["tokens_sha256"]
                and r["pcm_sha256"] is not None
                and r["pcm_sha256"] == e["pcm_sha256"]
            )
            equal += same
            if not same:
                d = first_divergence(raw(c)[i], raw(REFERENCE)[i])
                divergence.append({"block": blocks[i].get("block", i), **(d or {})})
        if c == REFERENCE:
            s["exact"] = bool(ok)
            s["exact_note"] = "reference"
        else:
            s["exact"] = compared > 0 and equal == compared
            s["exact_blocks"] = f"{equal}/{compared}"
            if compared < len(ok):
                s["exact_note"] = (
                    f"{len(ok) - compared} block(s) without an eager result to compare"
                )
            if divergence:
                s["first_divergence"] = divergence
        if s["busy_ms"] and s["p50_ms"]:
            s["wall_over_busy"] = s["p50_ms"] / s["busy_ms"]
        else:
            s["wall_over_busy"] = None

        def col(rws: list, key: str) -> list:
            return [r.get(key) if r["ok"] else None for r in rws]

        for refname in RATIO_REFS:
            if c == refname:
                continue
            rr = rows[refname]
            lat = paired_ratio(col(rs, "p50_ms"), col(rr, "p50_ms"))
            s[f"p50_ratio_vs_{refname}"] = lat
            s[f"speedup_vs_{refname}"] = invert_ratio(lat)
            s[f"p95_ratio_vs_{refname}"] = paired_ratio(col(rs, "p95_ms"), col(rr, "p95_ms"))
            s[f"busy_ratio_vs_{refname}"] = paired_ratio(col(rs, "busy_ms"), col(rr, "busy_ms"))
            s[f"peak_ratio_vs_{refname}"] = paired_ratio(col(rs, "peak_mib"), col(rr, "peak_mib"))
        s["replay"] = replay_summary(raw(c))
        s["vendor_graphs_captured"] = next(
            (r.get("vendor_graphs_captured") for r in raw(c) if r and r.get("status") == "ok"), None
        )
        errors = [
            {
                "block": b.get("block"),
                "status": (r or {}).get("status", "missing"),
                "error": (r or {}).get("error"),
            }
            for b, r in zip(blocks, raw(c))
            if not r or r.get("status") != "ok"
        ]
        if errors:
            s["errors"] = errors
        s["per_block"] = rs
        out[c] = s
    return out


# ============================================================================ reports


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    if v is None:
        return "–"
    try:
        return fmt.format(v)
    except (TypeError, ValueError):
        return str(v)


def _ratio(r: dict | None, fmt: str = "{:.2f}") -> str:
    if not r:
        return "–"
    s = _f(r["geomean"], fmt) + "×"
    if r.get("ci95"):
        s += f" [{_f(r['ci95'][0], fmt)}, {_f(r['ci95'][1], fmt)}]"
    return s


def markdown(doc: dict) -> str:
    s = doc.get("settings", {})
    m = doc.get("model") or {}
    det = doc.get("determinism", {})
    lines = [
        f"# Moshi streaming benchmark (moshi {doc.get('moshi')}, LM {m.get('lm_kwargs')} "
        f"{m.get('lm_dtype')}, Mimi {m.get('mimi_dtype')}, seeded random weights, batch 1, greedy)",
        "",
        f"- command: `{doc.get('command')}`",
        f"- git commit: `{doc.get('git_commit')}`"
        + (" (dirty tree)" if doc.get("git_dirty") else ""),
        f"- torch {doc.get('torch')}, CUDA {doc.get('cuda')}, cuDNN {doc.get('cudnn')}, "
        f"device {doc.get('gpu')}, Python {doc.get('python')}",
        f"- LM parameters {_f(m.get('lm_params'), '{:,}')}; Mimi parameters {_f(m.get('mimi_params'), '{:,}')}",
        "- determinism envelope in every cell: "
        + ", ".join(f"{k}={v}" for k, v in (det.get("envelope") or {}).items())
        + f" (held in every worker: {det.get('held_in_every_worker')}); NO_TORCH_COMPILE=1 in every cell",
        f"- {s.get('blocks')} block(s) × {s.get('frames')} measured 80 ms frames after "
        f"{s.get('warmup')} warm-up; profiler pass {s.get('profile_frames')} frames; seeds "
        f"{s.get('block_seeds')}; every (block, cell) in a fresh process"
        + ("" if doc.get("complete", True) else "; **incomplete run**")
        + (f"; stopped by --time-budget: {doc['budget_stop']}" if doc.get("budget_stop") else ""),
        "",
        "| cell | exact | p50 ms | p95 ms | speedup vs eager [95% CI] | speedup vs vendor [95% CI] "
        "| busy ms | wall/busy | kernels/frame | launch calls/frame | peak MiB | peak vs eager "
        "| replay hits / misses in window | setup s (capture s) |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    notes = []
    for name, c in doc.get("cells", {}).items():
        status = c.get("status")
        if status == "not run":
            notes.append(f"- **{name}** not run: {c.get('reason')}")
            continue
        if status == "failed":
            lines.append(f"| {name} | failed | " + " | ".join(["–"] * 12) + " |")
            errs = "; ".join(f"block {e['block']}: {e.get('error')}" for e in c.get("errors", []))
            notes.append(f"- **{name}** failed: {errs}")
            continue
        lc = _f(c.get("kernel_launch_calls_per_frame"), "{:.0f}")
        if c.get("graph_launch_calls_per_frame"):
            lc += f" + {c['graph_launch_calls_per_frame']:.0f} graph"
        rep = c.get("replay") or {}
        if rep:
            misses = ", ".join(
                f"{k} {v}" for k, v in sorted((rep.get("window_misses") or {}).items())
            )
            replay = f"{rep.get('window_hits', 0)} / {misses or '0'}"
        else:
            replay = "–"
        if name == REFERENCE:
            exact = "ref" if c.get("exact") else "no"
        else:
            exact = "yes" if c.get("exact") else f"**NO** ({c.get('exact_blocks', '?')})"
        lines.append(
            "| "
            + " | ".join(
                [
                    name + (" (partial)" if status == "partial" else ""),
                    exact,
                    _f(c.get("p50_ms")),
                    _f(c.get("p95_ms")),
                    "1 (ref)" if name == "eager" else _ratio(c.get("speedup_vs_eager")),
                    "1 (ref)" if name == "vendor" else _ratio(c.get("speedup_vs_vendor")),
                    _f(c.get("busy_ms")),
                    _f(c.get("wall_over_busy"), "{:.2f}"),
                    _f(c.get("kernels_per_frame"), "{:.0f}"),
                    lc,
                    _f(c.get("peak_mib"), "{:.0f}"),
                    (
                        "1 (ref)"
                        if name == "eager"
                        else _ratio(c.get("peak_ratio_vs_eager"), "{:.3f}")
                    ),
                    replay,
                    _f(c.get("setup_s"), "{:.2f}")
                    + (
                        f" ({_f(c.get('capture_s'), '{:.2f}')})"
                        if c.get("capture_s") is not None
                        else ""
                    ),
                ]
            )
            + " |"
        )
        graphs = c.get("vendor_graphs_captured") or {}
        if name == "vendor" and graphs:
            notes.append(
                "- **vendor** CUDAGraphed wrappers holding a graph at the end (block 0): "
                + ", ".join(f"{k} {v}" for k, v in graphs.items() if v is not None)
            )
        if status == "partial":
            errs = "; ".join(
                f"block {e['block']}: {e['status']}: {e.get('error')}" for e in c.get("errors", [])
            )
            notes.append(f"- **{name}** partial ({c.get('blocks_ok')} blocks): {errs}")
        if name != REFERENCE and not c.get("exact"):
            notes.append(
                f"- **{name}** is not bit-exact vs eager ({c.get('exact_blocks')} blocks equal; "
                f"first divergence {c.get('first_divergence')}): its latency is not a result."
            )
    lines += [
        "",
        "SHA-256 (block 0) tokens / PCM: "
        + ", ".join(
            f"{n} `{str(c.get('tokens_sha256'))[:12]}` / `{str(c.get('pcm_sha256'))[:12]}`"
            for n, c in doc.get("cells", {}).items()
            if c.get("status") in ("ok", "partial")
        ),
        "",
        "p50/p95: per-block median / 95th percentile of the window's synchronised per-frame wall "
        "time (encode + LM step + decode), then the median over blocks. Ratios: per-block paired, "
        "geometric mean, 95% t-interval on log ratios (none with one block). busy: profiler "
        "kernel-time sum per frame (separate pass); launch calls: host kernel launches (+ graph "
        "launches) per frame. peak: process max_memory_allocated over all phases.",
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> str | None:
    """Latency p50/p95 and peak memory per cell; returns a note when no PNG was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no PNG: matplotlib is not installed)"
    cells = [
        (n, c)
        for n, c in doc.get("cells", {}).items()
        if c.get("status") in ("ok", "partial") and c.get("p50_ms") is not None
    ]
    if not cells:
        return "(no PNG: no cell produced numbers)"
    names = [n for n, _ in cells]
    x = list(range(len(names)))
    colors = ["#4c72b0" if (n == REFERENCE or c.get("exact")) else "#c44e52" for n, c in cells]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4.2))
    p50 = [c["p50_ms"] for _, c in cells]
    p95 = [c.get("p95_ms") or 0.0 for _, c in cells]
    ax1.bar([i - 0.2 for i in x], p50, width=0.4, color=colors, label="p50")
    ax1.bar([i + 0.2 for i in x], p95, width=0.4, color=colors, alpha=0.45, hatch="//", label="p95")
    for i, (a, b) in enumerate(zip(p50, p95)):
        ax1.annotate(f"{a:.1f}", (i - 0.2, a), ha="center", va="bottom", fontsize=8)
        ax1.annotate(f"{b:.1f}", (i + 0.2, b), ha="center", va="bottom", fontsize=7)
    ax1.axhline(80.0, color="grey", lw=0.8, ls="--", label="80 ms frame")
    ax1.set_xticks(x, names)
    ax1.set_xlim(-0.8, len(x) - 0.2)
    ax1.set_ylabel("per-frame wall (ms)")
    ax1.set_title("latency (median over blocks)", fontsize=9)
    ax1.legend(fontsize=8)
    peaks = [c.get("peak_mib") for _, c in cells]
    if any(p is not None for p in peaks):
        ax2.bar(x, [p or 0.0 for p in peaks], color=colors)
        for i, v in zip(x, peaks):
            if v is not None:
                ax2.annotate(f"{v:.0f}", (i, v), ha="center", va="bottom", fontsize=8)
        ax2.set_xticks(x, names)
        ax2.set_ylabel("process peak max_memory_allocated (MiB)")
        ax2.set_title("memory", fontsize=9)
    else:
        ax2.text(
            0.5,
            0.5,
            "no CUDA memory statistics\n(device: cpu)",
            ha="center",
            va="center",
            transform=ax2.transAxes,
        )
        ax2.set_axis_off()
    m = doc.get("model") or {}
    fig.suptitle(
        f"Moshi {m.get('lm_kwargs')} per 80 ms frame, {doc.get('gpu')} — red: not bit-exact vs eager",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


# ============================================================================ driver


def worker_command(cell: str, block: int, seed: int, args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable, "-m", "bench.moshi", "--worker",
        "--cell", cell, "--block", str(block), "--seed", str(seed),
        "--device", args.device,
        "--warmup", str(args.warmup), "--frames", str(args.frames),
        "--profile-frames", str(args.profile_frames),
    ]  # fmt: skip
    if args.tiny:
        cmd.append("--tiny")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def run_cell_process(
    cell: str, block: int, seed: int, args: argparse.Namespace, timeout: float | None = None
) -> dict:
    """One fresh worker process; returns its JSON result or a failure record."""
    cmd = worker_command(cell, block, seed, args)
    env = cell_env(cell)
    timeout = args.worker_timeout if timeout is None else timeout
    res = run_worker_process(
        cmd,
        env,
        label=f"block {block} {cell}",
        timeout=timeout,
        quiet=args.quiet_workers,
        timeout_error=f"worker exceeded its timeout of {timeout:.0f} s",
    )
    res["env"] = {k: env.get(k) for k in (VENDOR_GRAPH_ENV, COMPILE_ENV, DISABLE_ENV)}
    res.setdefault("cell", cell)
    res.setdefault("block", block)
    res.setdefault("seed", seed)
    return res


class Budget:
    """--time-budget: launch a worker only if the time left covers the slowest one seen."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.perf_counter):
        self.seconds = seconds
        self.clock = clock
        self.t0 = clock()
        self.slowest = 0.0

    def left(self) -> float | None:
        return None if self.seconds is None else self.seconds - (self.clock() - self.t0)

    def allows(self) -> tuple[bool, str]:
        left = self.left()
        if left is None:
            return True, ""
        if left <= 0 or left < self.slowest:
            return False, (
                f"{max(left, 0.0):.0f} s of the {self.seconds:.0f} s budget left, "
                f"slowest worker so far {self.slowest:.0f} s"
            )
        return True, ""

    def saw(self, wall_s: float | None) -> None:
        if wall_s is not None:
            self.slowest = max(self.slowest, float(wall_s))


def skipped_record(cell: str, block: int, seed: int, why: str) -> dict:
    return {
        "status": "skipped",
        "cell": cell,
        "block": block,
        "seed": seed,
        "error": f"not run: {why}",
    }


def build_document(
    args: argparse.Namespace, argv: Sequence[str], cells: list[str], blocks: list[dict]
) -> dict:
    import platform

    from bench.token2wav import ENVELOPE

    agg = aggregate(blocks, cells)
    cell_docs: dict[str, Any] = {}
    for name, c in CELLS.items():
        if name in agg:
            cell_docs[name] = {"what": c.what, **agg[name]}
        else:
            cell_docs[name] = {"status": "not run", "what": c.what, "reason": "not in --cells"}
    try:
        import torch

        torch_version, cuda_version = torch.__version__, torch.version.cuda
    except ImportError:  # pragma: no cover
        torch_version = cuda_version = None
    model = first_ok(blocks, "model") or {"lm_kwargs": "TINY" if args.tiny else "FULL_7B"}
    oks = [r for b in blocks for r in b["results"].values() if r.get("status") == "ok"]
    return {
        "benchmark": "moshi",
        "command": "python -m bench.moshi"
        + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv)),
        **git_info(args.git_commit),
        "torch": first_ok(blocks, "torch") or torch_version,
        "cuda": first_ok(blocks, "cuda") or cuda_version,
        "cudnn": first_ok(blocks, "cudnn"),
        "gpu": first_ok(blocks, "device_name"),
        "python": platform.python_version(),
        "moshi": first_ok(blocks, "moshi"),
        "model": model,
        "envelope": ENVELOPE,
        "determinism": {
            "envelope": ENVELOPE,
            "pinned_in_every_cell": True,
            "held_in_every_worker": bool(oks) and all(r.get("determinism_ok") for r in oks),
            "read_back_per_cell": {
                c: [b["results"][c].get("determinism") for b in blocks if c in b["results"]]
                for c in cells
            },
        },
        "settings": {
            "device": args.device,
            "blocks": args.blocks,
            "frames": args.frames,
            "warmup": args.warmup,
            "profile_frames": args.profile_frames,
            "seed": args.seed,
            "block_seeds": [args.seed + b for b in range(args.blocks)],
            "cells": cells,
            "tiny": args.tiny,
            "threads": args.threads,
            "worker_timeout_s": args.worker_timeout,
            "time_budget_s": args.time_budget,
            "quick": args.quick,
            "frame_samples": 1920,
            "sample_rate": 24000,
            "lm_dtype": "bfloat16",
            "mimi_dtype": "float32",
            "batch": 1,
            "greedy": True,
            "env": {
                c: {k: cell_env(c, {}).get(k) for k in (VENDOR_GRAPH_ENV, COMPILE_ENV)}
                for c in cells
            },
        },
        "method": {
            "window": "per-frame wall (encode + LM step + decode), time.perf_counter between two "
            "torch.cuda.synchronize() calls (CUDA); outputs copied to the host after the timing",
            "busy": "separate torch.profiler pass (CPU+CUDA) after the window: sum of kernel durations "
            "per frame; kernels executed, host kernel-launch calls and graph launches per frame; null on CPU",
            "memory": "torch.cuda.max_memory_allocated, reset at each phase boundary; process peak = "
            "max over phases (build, setup, warmup, window, profile)",
            "aggregation": "per-block median (p95: numpy linear percentile) -> median over blocks",
            "ratios": "per-block paired ratio cell/ref (ref = eager, vendor); geometric mean with a "
            "95% t-interval on log ratios (df = blocks-1); none with one block",
            "exact": "token-ID SHA-256 (int64) and float32 PCM SHA-256 over every frame (warm-up, "
            "window, profile) equal the eager cell's in every block where both ran",
            "order": "cells rotated left by the block index (cyclic Latin square), each in a fresh process",
        },
        "cells": cell_docs,
        "blocks": blocks,
    }


def _write_reports(doc: dict, out: Path) -> str | None:
    md = markdown(doc)
    note = plot(doc, out.with_suffix(".png"))
    if note:
        md += f"\n{note}\n"
    out.with_suffix(".md").write_text(md)
    print(md)
    return note


def driver_main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from bench.stats import median, rotate

    cells = list(args.cells)
    if REFERENCE not in cells:
        print(
            "bench.moshi: eager is not among the cells: no exactness, no ratios vs eager",
            file=sys.stderr,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.time_budget)
    blocks: list[dict] = []
    stop: str | None = None
    t_start = time.perf_counter()
    for b in range(args.blocks):
        seed = args.seed + b
        order = rotate(cells, b)
        block = {"block": b, "seed": seed, "order": order, "results": {}}
        blocks.append(block)
        for cell in order:
            if stop is None:
                fits, why = budget.allows()
                if not fits:
                    stop = why
                    print(f"bench.moshi: --time-budget: stopping ({why})", file=sys.stderr)
            if stop is not None:
                block["results"][cell] = skipped_record(cell, b, seed, f"--time-budget ({stop})")
                continue
            print(
                f"bench.moshi: block {b + 1}/{args.blocks} seed {seed} cell {cell}", file=sys.stderr
            )
            left = budget.left()
            timeout = (
                args.worker_timeout if left is None else max(1.0, min(args.worker_timeout, left))
            )
            res = run_cell_process(cell, b, seed, args, timeout=timeout)
            budget.saw(res.get("process_wall_s"))
            block["results"][cell] = res
            msg = str(res.get("status"))
            if res.get("status") == "ok":
                msg += (
                    f" p50 {median(res.get('window_ms') or []) or 0.0:.1f} ms tokens "
                    f"{str(res.get('tokens_sha256'))[:12]} pcm {str(res.get('pcm_sha256'))[:12]}"
                )
            else:
                msg += f": {res.get('error')}"
            print(
                f"bench.moshi: block {b} {cell}: {msg} ({res['process_wall_s']:.0f} s)",
                file=sys.stderr,
            )
            doc = build_document(args, argv, cells, blocks)
            doc.update(wall_s=time.perf_counter() - t_start, complete=False, budget_stop=stop)
            write_json(out.with_suffix(".json"), doc)
    doc = build_document(args, argv, cells, blocks)
    doc.update(wall_s=time.perf_counter() - t_start, complete=stop is None, budget_stop=stop)
    write_json(out.with_suffix(".json"), doc)
    note = _write_reports(doc, out)
    print(
        f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')}"
        + ("" if note else f", {out.with_suffix('.png')}"),
        file=sys.stderr,
    )
    return 0


def rerender(path: Path) -> int:
    """Re-aggregate an existing result JSON and rewrite its .json/.md/.png; runs nothing."""
    path = Path(path)
    doc = json.loads(path.read_text())
    cells = list(doc["settings"]["cells"])
    agg = aggregate(doc["blocks"], cells)
    for name in cells:
        doc["cells"][name] = {"what": CELLS[name].what, **agg[name]}
    write_json(path.with_suffix(".json"), doc)
    _write_reports(doc, path)
    return 0


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
    p = argparse.ArgumentParser(
        prog="python -m bench.moshi",
        description="Matched-block benchmark of the stock Kyutai Moshi streaming loop (moshi 0.2.13, "
        "7B LM bf16 + Mimi fp32, seeded random weights, batch 1, greedy): eager vs the vendor's CUDA "
        "graphs vs the generated duplexcadence adapter. Every (block, cell) runs in a fresh process; "
        "writes <out>.json, <out>.md and <out>.png.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--cells",
        type=_cells_arg,
        default=None,
        help="comma-separated cells (default: all). "
        + "; ".join(f"{c.name}: {c.what}" for c in CELLS.values()),
    )
    p.add_argument("--blocks", type=int, default=4, help="matched blocks (block b uses seed + b)")
    p.add_argument("--frames", type=int, default=32, help="80 ms frames measured per block")
    p.add_argument(
        "--warmup",
        type=int,
        default=4,
        help="frames streamed before the window (vendor graphs need >= 3)",
    )
    p.add_argument(
        "--profile-frames", type=int, default=3, help="frames of the torch.profiler pass (CUDA)"
    )
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--tiny", action="store_true", help="the tiny LM (TINY_LM_KWARGS) instead of FULL_7B"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in workers")
    p.add_argument("--out", default=DEFAULT_OUT, help="output path without suffix")
    p.add_argument("--worker-timeout", type=float, default=600.0, help="seconds per worker process")
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds for the whole run: no worker is launched once the time left is below the "
        "slowest worker seen (the rest are recorded as skipped), and each worker's timeout is "
        "capped by the time left",
    )
    p.add_argument("--quiet-workers", action="store_true", help="do not echo worker stderr")
    p.add_argument(
        "--git-commit",
        default=None,
        help="commit to record when the tree has no .git (else git rev-parse HEAD, else "
        "$DUPLEXCADENCE_GIT_COMMIT)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CPU smoke settings: --device cpu --tiny --blocks 1 --warmup 1 --frames 3 "
        "--profile-frames 0 --cells eager,adapter --threads 1 --worker-timeout 300 (explicit flags "
        f"win), --out {QUICK_OUT}",
    )
    p.add_argument(
        "--rerender", metavar="JSON", default=None,
        help="only re-aggregate an existing result JSON and rewrite its .json/.md/.png",
    )  # fmt: skip
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
            "--frames": ("frames", 3),
            "--profile-frames": ("profile_frames", 0),
            "--cells": ("cells", ["eager", "adapter"]),
            "--threads": ("threads", 1),
            "--out": ("out", QUICK_OUT),
            "--worker-timeout": ("worker_timeout", 300.0),
        }
        for flag, (dest, value) in quick.items():
            if flag not in given:
                setattr(args, dest, value)
        args.tiny = True
    if args.cells is None:
        args.cells = list(DEFAULT_CELLS)
    if args.device is None and not args.rerender:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in ("blocks", "frames"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    for name in ("warmup", "profile_frames"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.worker and args.cell not in CELLS:
        p.error("--worker needs --cell")
    args._argv = argv
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.rerender:
        return rerender(Path(args.rerender))
    return driver_main(args, args._argv)


if __name__ == "__main__":
    sys.exit(main())
