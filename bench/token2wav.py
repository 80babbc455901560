"""Factorial benchmark of the stock streaming Token2Wav vs the generated adapters (issue 4).

    python -m bench.token2wav --device cuda --blocks 4 --chunks 16 --warmup 3 \\
        --out bench/results/token2wav_h200
    python -m bench.token2wav --quick            # CPU smoke: 1 block, B0 and S, 2 chunks

The workload (the harness, ``bench/harness``, does the rest): the released
``minicpmo-utils==1.0.6`` streaming decoder (flow + HiFT, fp32, batch 1, seeded random
weights, ``bench.workloads.token2wav``) driven by the vendor's own ``Token2wav.stream()``;
one step is one 25-token chunk (+3 lookahead), and a ``last_chunk=True`` chunk follows
every pass. Parts: ``flow`` (``flow.inference_chunk``) and ``vocoder`` (``hift.forward``).
The hashed stream is the float32 PCM; ``tokens_sha256`` records the input tokens. The
cells (DESIGN §6, paper Table 4) say what they are in ``CELLS``; the compile controls
(``compile_ro``, ``compile_default``, ``compile_mat``: one torch.compile mode each) compile
on its first calls (use ``--warmup 3`` so the extents 302/352/402 are all seen), and
anything it raises, or running past ``--compile-timeout``, is a ``"failed"`` record.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import signal
from collections import Counter
from dataclasses import dataclass
from typing import Any

from duplexcadence.runtime.controls import DISABLE_ENV

from bench.harness import Cell, CellFailed, Stream, WorkerContext, Workload, main
from bench.workloads import unavailable_reason


@dataclass(frozen=True)
class T2WCell(Cell):
    """A Token2Wav cell: whether and which adapter it binds, and when (before the model
    reaches the device: the state rule; after priming: stock buffers kept)."""

    bind: bool = False
    adapter: str = "stepaudio2_token2wav"
    bind_before_priming: bool = True
    float16: bool = False  # the vendor's own switch: the flow runs under autocast(fp16)
    # mel frames of the voice prompt (2 per prompt token; the vendor's example prompt is
    # 151 tokens: 302); an adapter binds it as its session parameter f_prompt
    prompt_frames: int = 302
    compile_mode: str | None = None  # a torch.compile control: its mode (COMPILE_KW besides)


STEP, REPLAY_ONLY = "stepaudio2_token2wav_step", "stepaudio2_token2wav_replay_only"
CELLS = (
    T2WCell("B0", "stock Token2wav.stream() eager, nothing bound"),
    T2WCell(
        "S",
        "state rule only: bind() with DUPLEXCADENCE_DISABLE_REPLAY=1 (demand-sized "
        "address-stable regions, writeback carries, device constants; all calls eager)",
        env={DISABLE_ENV: "1"},
        bind=True,
    ),
    T2WCell(
        "R",
        f"replay at the step clock, stock state: {STEP}_replay_only bound after priming "
        "replays the DiT estimator once per Euler step; encoder, solver loop, vocoder eager",
        needs_cuda=True,
        bind=True,
        adapter=STEP + "_replay_only",
        bind_before_priming=False,
    ),
    T2WCell(
        "Rc",
        f"replay at the chunk clock, stock state: {REPLAY_ONLY} binds the stock buffers as "
        "they are and stages the moving stock carry into captured buffers of its layout",
        needs_cuda=True,
        bind=True,
        adapter=REPLAY_ONLY,
        bind_before_priming=False,
    ),
    T2WCell(
        "SR",
        f"state rule + replay at the step clock: {STEP}, bound before the model reaches the "
        "device, replays the DiT estimator once per Euler step; misses run eager",
        bind=True,
        adapter=STEP,
    ),
    T2WCell(
        "SRc",
        "state rule + replay at the chunk clock: flow.inference_chunk (encoder + 10-step "
        "solver) and hift.forward captured, one graph per catalog class; misses run eager",
        bind=True,
    ),
    T2WCell(
        "B0_fp16",
        "stock with the vendor's Token2wav.float16 = True: stream() runs the flow under "
        'torch.amp.autocast("cuda", dtype=float16)',
        float16=True,
    ),
    T2WCell(
        "SRc_fp16",
        "SRc with Token2wav.float16 = True: the flow classes captured under the declared "
        "ambient state autocast(cuda, float16) replay (the contract captures both states)",
        bind=True,
        float16=True,
        exact_against="B0_fp16",
    ),
    T2WCell(
        "vendor_bucket",
        "control: vendor flow.scatter_cuda_graph(True) (DiT graphs for buckets 30/48/96), "
        "then stock stream()",
        needs_cuda=True,
    ),
    T2WCell(
        "vendor_rebucket",
        "control: the vendor DiT graph path (padded mask + attention cache) with its graphs "
        "captured for the live chunk sizes 50 and 56 (max cache 500), then stock stream()",
        needs_cuda=True,
    ),
)

# Voice prompts of other lengths (issue 14): stock and SRc at each, SRc exact against
# the stock cell of its own prompt. B0 and SRc are the 302-frame case. Not in the
# default cell list; run with --cells B0,SRc,B0_p100,SRc_p100,...
PROMPTS = (100, 200, 450, 600)
PROMPT_CELLS = tuple(
    cell
    for p in PROMPTS
    for cell in (
        T2WCell(f"B0_p{p}", f"B0 with a {p}-frame voice prompt ({p // 2} tokens)", prompt_frames=p),
        T2WCell(
            f"SRc_p{p}",
            f"SRc with a {p}-frame voice prompt, bound with params={{'f_prompt': {p}}}",
            bind=True,
            prompt_frames=p,
            exact_against=f"B0_p{p}",
        ),
    )
)


def compile_cell(name: str, mode: str) -> T2WCell:
    """A torch.compile control of ``Token2WavRun.COMPILE_SITES`` in ``mode``."""
    return T2WCell(
        name,
        f'control: torch.compile(mode="{mode}", dynamic=False) of the flow\'s '
        "inference_chunk and the vocoder, compiled on their first calls",
        needs_cuda=True,
        failure=f"torch.compile / {mode}",
        compile_mode=mode,
    )


COMPILE_CELLS = (
    compile_cell("compile_ro", "reduce-overhead"),
    compile_cell("compile_default", "default"),
    compile_cell("compile_mat", "max-autotune-no-cudagraphs"),
)
CELLS += COMPILE_CELLS

# The vendor's bucket list (decoder_dit.py DiT._init_cuda_graph_chunk) and the live chunk:
# steady chunks are 50 frames (25 tokens x 2), the final one 56; the attended estimator
# cache is 302 (prompt), 352, then 402 (prompt + the stock 100).
VENDOR_BUCKETS = {30: 500, 48: 500, 96: 1000}  # chunk frames -> max attended cache frames
REBUCKET = {50: 500, 56: 500}
COMPILE_KW = {"dynamic": False, "fullgraph": False}


# ----------------------------------------------------------------- vendor controls
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

    def zeros(*shape: int, dt: Any = dtype) -> Any:
        return torch.zeros(shape, dtype=dt, device=device)

    graphs, buffers = {}, {}
    with torch.no_grad():
        for chunk, cache in buckets.items():
            inputs = [
                zeros(2, 320, chunk),
                zeros(2, 1, 512),
                torch.ones((2, chunk, cache + chunk), dtype=torch.bool, device=device),
                zeros(16, 2, 1024, 2),  # cnn cache
                zeros(16, 2, 8, cache, 128),  # attention cache
            ]
            new_cnn, new_att = zeros(16, 2, 1024, 2), zeros(16, 2, 8, cache + chunk, 128)
            est.blocks_forward_chunk(*inputs, new_cnn, new_att)
            graphs[chunk] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[chunk]):
                out = est.blocks_forward_chunk(*inputs, new_cnn, new_att)
            buffers[chunk] = {"static_inputs": inputs, "static_outputs": [out, new_cnn, new_att]}
    est.max_size_chunk = dict(buckets)
    est.inference_buffers_chunk = buffers
    est.graph_chunk = graphs
    est.use_cuda_graph = True


def dynamo_counters() -> dict:
    """``torch._dynamo.utils.counters`` as plain numbers."""
    from torch._dynamo.utils import counters

    return {
        str(g): {str(k)[:200]: int(v) for k, v in dict(c).items() if isinstance(v, (int, float))}
        for g, c in counters.items()
    }


def counters_delta(after: dict, before: dict) -> dict:
    """What the (monotonic) counters added, groups without change left out."""
    diff = {g: Counter(v) - Counter(before.get(g, {})) for g, v in after.items()}
    return {g: dict(d) for g, d in diff.items() if d}


def compile_callables(t2w: Any, info: dict, mode: str, sites: tuple[str, ...]) -> None:
    """Install compiled callables at ``sites`` (dotted paths) on the instances.
    ``torch.compile`` is lazy: it compiles on the first call of each new shape (the
    warm-up chunks and the 56-frame final chunk), all outside the window."""
    import torch

    from bench.harness.profile import _owner_and_name

    kwargs = {"mode": mode, **COMPILE_KW}
    info["compile_kwargs"] = kwargs  # inductor config left at its defaults
    info["compile_sites"] = list(sites)
    info["dynamo_counters_before"] = dynamo_counters()
    try:
        for site in sites:
            owner, name = _owner_and_name(t2w, site)
            setattr(owner, name, torch.compile(getattr(owner, name), **kwargs))
    except Exception as e:  # noqa: BLE001
        raise CellFailed("torch.compile raised while wrapping", f"{type(e).__name__}: {e}") from e


def arm_compile_budget(seconds: float, ctx: WorkerContext) -> None:
    """SIGALRM after ``seconds``: the handler raises CellFailed in the main thread, so a
    compile that runs past its budget ends in a failure record, not a killed process."""
    if not hasattr(signal, "setitimer"):
        return
    ctx.result["compile_timeout_s"] = seconds

    def expired(signum: int, frame: Any) -> None:
        raise CellFailed(
            f"compile budget exceeded (--compile-timeout {seconds:.0f} s)",
            f"still in phase {ctx.result.get('phase')!r}",
        )

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    ctx.stack.callback(signal.setitimer, signal.ITIMER_REAL, 0.0)


# ---------------------------------------------------------------------- the worker
def import_adapter(cell: T2WCell) -> Any:
    name = f"duplexcadence.generated.{cell.adapter}"
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - ImportError, or whatever the module raises
        raise CellFailed(
            f"cell {cell.name}: adapter module {name} is not importable", f"{type(e).__name__}: {e}"
        ) from e


class Token2WavRun:
    """One (block, cell): the vendor object built, the cell set up, chunks streamed.

    The release it drives is a class attribute, so the 1.0.7 driver
    (``bench/token2wav107.py``) is this class with its own workload module."""

    RELEASE = "token2wav"  # bench.workloads.RELEASES key
    WORKLOAD_MODULE = "bench.workloads.token2wav"
    COMPILE_SITES = ("flow.inference_chunk", "hift.forward")

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx, self.cell = ctx, ctx.cell
        self.adapter = self.binding = self.model = None
        if self.cell.bind:  # an adapter that is not there fails before the build
            ctx.result["adapter"] = self.cell.adapter
            self.adapter = import_adapter(self.cell)
            from duplexcadence.runtime import replay_enabled

            if replay_enabled() != (DISABLE_ENV not in self.cell.env):
                raise RuntimeError(f"cell {self.cell.name}: replay_enabled() is {replay_enabled()}")
        self.W = W = importlib.import_module(self.WORKLOAD_MODULE)
        reason = unavailable_reason(self.RELEASE)
        if reason is not None:
            raise RuntimeError(reason)
        ctx.result["minicpmo_utils"] = W.installed_version()
        stream = W.token_stream(ctx.args.seed, ctx.n_steps)
        inputs = json.dumps([[c.tokens, c.last_chunk] for c in stream]).encode()
        ctx.result["tokens_sha256"] = hashlib.sha256(inputs).hexdigest()
        self.inputs = iter(stream)

    def _bind(self, model: Any) -> None:
        self.binding = self.adapter.bind(
            model,
            device=self.ctx.device,
            audit=False,
            capture=False,
            progress=False,
            **self._params(),
        )

    def _params(self) -> dict:
        """The prompt length as the contract's session parameter, where it declares one."""
        declared = {p.name for p in self.adapter.DECLARED.params}
        if "f_prompt" in declared:
            return {"params": {"f_prompt": self.cell.prompt_frames}}
        if self.cell.prompt_frames != self.W.PROMPT_FRAMES:
            raise CellFailed(
                f"cell {self.cell.name}: adapter {self.cell.adapter} fixes the prompt at "
                f"{self.W.PROMPT_FRAMES} frames (no session parameter f_prompt)"
            )
        return {}

    def build(self) -> None:
        early = self.cell.bind and self.cell.bind_before_priming
        self.ctx.result["prompt_frames"] = self.cell.prompt_frames
        self.model = self.W.build_token2wav(
            self.ctx.args.seed,
            self.ctx.device,
            prompt_frames=self.cell.prompt_frames,
            before_priming=self._bind if early else None,
        )

    def setup(self) -> Any:
        t2w, info, name = self.model, self.ctx.setup, self.cell.name
        t2w.float16 = self.cell.float16
        if self.cell.bind:
            if self.binding is None:  # binds the primed model, keeping its stock buffers
                self._bind(t2w)
            self.binding.capture(progress=False)  # before traffic; no-op with replay off
            # what it bound and captured is in the result's binding_stats
        elif name == "vendor_bucket":
            t2w.flow.scatter_cuda_graph(True)
            count_vendor_graphs(t2w.flow.decoder.estimator, info)
        elif name == "vendor_rebucket":
            rebucket_vendor_graphs(t2w.flow.decoder.estimator, REBUCKET)
            count_vendor_graphs(t2w.flow.decoder.estimator, info)
            info["vendor_buckets_replaced"] = {str(k): v for k, v in VENDOR_BUCKETS.items()}
        elif self.cell.compile_mode:
            args = self.ctx.args  # from here to the end of the worker, every compile included
            budget = max(1.0, min(args.compile_timeout, args.worker_timeout - 45.0))
            arm_compile_budget(budget, self.ctx)
            compile_callables(t2w, info, self.cell.compile_mode, self.COMPILE_SITES)
        return self.binding

    def step(self) -> dict:
        chunk = next(self.inputs)
        return {"pcm": self.W.stream_chunk(self.model, chunk.tokens, chunk.last_chunk)}

    def after(self, phase: str) -> None:
        """A compile control: what compiling cost (set-up + first calls) and what it compiled
        inside the window (a recompile there would be a latency spike)."""
        info = self.ctx.setup
        if self.cell.compile_mode and phase == "warmup":
            timings = self.ctx.result["timings_s"]
            info["compile_and_first_calls_s"] = timings["setup"] + timings["warmup"]
            self.at_window = dynamo_counters()
        elif self.cell.compile_mode and phase == "window":
            window = counters_delta(dynamo_counters(), self.at_window)
            info["frames_compiled_in_window"] = window.get("frames", {}).get("total", 0)

    def finish(self, result: dict) -> None:
        info = self.ctx.setup
        result["carry_lengths_end"] = self.W.carry_lengths(self.model)
        if "vendor_counts" in info:
            info["vendor_counts"] = dict(info["vendor_counts"])
        if self.cell.compile_mode:
            total = counters_delta(dynamo_counters(), info["dynamo_counters_before"])
            info["dynamo_counters_total"] = total
            # frames dynamo converted: first compiles, recompiles (new shapes with
            # dynamic=False) and the resume frames after graph breaks
            info["frames_compiled"] = total.get("frames", {}).get("total", 0)
            info["unique_graphs"] = total.get("stats", {}).get("unique_graphs", 0)
            info["graph_breaks"] = sum(total.get("graph_break", {}).values())


# --------------------------------------------------------------- results and report
def cell_summary(results: list) -> dict:
    """The vendor controls' graph counters (summed) and the compile controls' figures (medians)."""
    from bench.harness.stats import median

    setups = [r.get("setup") or {} for r in results if r and r.get("status") == "ok"]
    out: dict[str, Any] = {}
    vendor = [s for s in setups if s.get("vendor_counts") is not None]
    if vendor:
        sums = {k: sum(s["vendor_counts"][k] for s in vendor) for k in vendor[0]["vendor_counts"]}
        first = {"buckets": vendor[0]["vendor_buckets"], "max_size": vendor[0]["vendor_max_size"]}
        out["vendor_graphs"] = {"blocks": len(vendor), **first, **sums}
    comp = [s for s in setups if s.get("compile_kwargs")]
    if comp:
        keys = ("compile_and_first_calls_s", "frames_compiled", "unique_graphs", "graph_breaks")
        out["compile"] = {"blocks": len(comp), **{k: median(s.get(k) for s in comp) for k in keys}}
        in_window = sum(int(s.get("frames_compiled_in_window") or 0) for s in comp)
        out["compile"].update(frames_compiled_in_window=in_window)
        out["compile"]["compile_kwargs"] = comp[0]["compile_kwargs"]
    return out


def cell_notes(name: str, c: dict) -> list[str]:
    notes, vg, cp = [], c.get("vendor_graphs"), c.get("compile")
    if vg:
        notes.append(
            f"- **{name}** vendor DiT graphs: buckets {vg.get('buckets')} (max attended cache "
            f"{vg.get('max_size')}); {vg.get('bucket_replays')} graph replays of "
            f"{vg.get('estimator_calls')} estimator calls over {vg.get('blocks')} block(s)."
        )
    if cp:
        notes.append(
            f"- **{name}** torch.compile {cp.get('compile_kwargs')}: compile + first calls "
            f"{cp.get('compile_and_first_calls_s'):.1f} s (median; outside the window), "
            f"{cp.get('frames_compiled'):.0f} frames compiled, {cp.get('graph_breaks'):.0f} graph "
            f"breaks, {cp.get('frames_compiled_in_window')} frames compiled inside the window."
        )
    return notes


WORKLOAD = Workload(
    name="token2wav",
    unit="chunk",
    cells=CELLS + PROMPT_CELLS,
    reference="B0",
    start=Token2WavRun,
    streams=(
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_sha256", count_key="n_samples"),
    ),
    title=lambda doc: "Token2Wav streaming benchmark (minicpmo-utils "
    f"{doc.get('minicpmo_utils') or '1.0.6'}, seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock streaming Token2Wav (minicpmo-utils "
    "1.0.6, seeded random weights) against the generated duplexcadence adapters.",
    parts={"flow": "flow.inference_chunk", "vocoder": "hift.forward"},
    final_steps=1,
    defaults={
        "chunks": 16,
        "warmup": 3,
        "split_chunks": 4,
        "profile_chunks": 3,
        "cells": [c.name for c in CELLS],  # the prompt cells run when asked for
    },
    quick={
        "device": "cpu",
        "blocks": 1,
        "warmup": 1,
        "chunks": 2,
        "split_chunks": 1,
        "profile_chunks": 0,
        "cells": ["B0", "S"],
        "out": "bench/results/token2wav_quick",
        "worker_timeout": 1800.0,
    },
    flags={
        "--compile-timeout": dict(
            type=float,
            default=400.0,
            help="compile_ro: seconds from its set-up to the end of its worker (every shape's "
            "compile included); past it the worker reports status 'failed'",
        )
    },
    doc_keys=("minicpmo_utils",),
    settings=lambda args: {
        "compile_timeout_s": args.compile_timeout,
        "chunk_tokens": 25,
        "lookahead_tokens": 3,
        "prompt_frames": 302,  # cells B0_p<N> and SRc_p<N>: N (each result's prompt_frames)
        "n_timesteps": 10,
        "dtype": "float32",
        "batch": 1,
    },
    method={
        "split": "separate pass after the window: flow.inference_chunk / hift.forward as "
        "installed (stock or bound) wrapped, synchronised around each part"
    },
    cell_summary=cell_summary,
    cell_notes=cell_notes,
    # a compile control compiles the 10-step solver for three cache extents and the vocoder
    first_worker_est_s={c.name: 180.0 for c in COMPILE_CELLS},
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
