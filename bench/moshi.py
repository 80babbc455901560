"""Benchmark of the stock Kyutai Moshi streaming loop vs the generated adapter (issue 5).

    python -m bench.moshi --device cuda --blocks 4 --frames 32 --warmup 4 \\
        --profile-frames 3 --time-budget 480 --out bench/results/moshi_h200
    python -m bench.moshi --quick          # CPU smoke: the tiny LM (--tiny), eager + adapter

One step is one 80 ms frame of ``bench.workloads.moshi.step_frame`` (7B LM bf16 + Mimi
fp32, seeded random weights, batch 1, greedy); the hashed streams are the token IDs
and the PCM. Every cell runs with ``NO_TORCH_COMPILE=1`` (the same eager kernels). The
vendor's ``CUDAGraphed`` wrappers capture on their second call and the decoder first
runs on frame 2 (LM delay 1), so ``--warmup`` >= 3.
"""

from __future__ import annotations

import os
from typing import Any

from bench.harness import Cell, Stream, WorkerContext, Workload, main
from bench.workloads import moshi as moshi_workload
from bench.workloads import unavailable_reason

VENDOR_GRAPH_ENV = "NO_CUDA_GRAPH"
COMPILE_ENV = "NO_TORCH_COMPILE"

CELLS = (
    Cell(
        "eager", "vendor code, its CUDA graphs off (NO_CUDA_GRAPH=1)", env={VENDOR_GRAPH_ENV: "1"}
    ),
    Cell(
        "vendor",
        "vendor's own CUDAGraphed wrappers on (NO_CUDA_GRAPH unset): LM forward_text "
        "and depformer_step, Mimi encoder/decoder and their transformers",
        env={VENDOR_GRAPH_ENV: None},
    ),
    Cell(
        "adapter",
        "vendor graphs off (NO_CUDA_GRAPH=1) + the generated adapter bound by "
        "bench.workloads.moshi.bind_adapter",
        env={VENDOR_GRAPH_ENV: "1"},
    ),
)


def vendor_graph_state(mimi: Any, lm_gen: Any) -> dict:
    """Which vendor CUDAGraphed wrappers hold a captured graph (None: no wrapper)."""
    out: dict[str, Any] = {}
    mimi_graphs = ("encoder", "decoder", "tr_enc", "tr_dec")
    for owner, names in ((lm_gen, ("main", "depth")), (mimi, mimi_graphs)):
        for n in names:
            g = getattr(getattr(owner, "_streaming_state", None), f"graphed_{n}", None)
            out[f"graphed_{n}"] = None if g is None else getattr(g, "_graph", None) is not None
    return out


class MoshiRun:
    """One (block, cell): Mimi + LMGen built and streaming, frames stepped."""

    def __init__(self, ctx: WorkerContext) -> None:
        if unavailable_reason("moshi"):
            raise RuntimeError(unavailable_reason("moshi"))
        from moshi.utils import compile as vendor_compile

        from bench.workloads import moshi as W

        self.ctx, self.W, self.model = ctx, W, None
        ctx.result["moshi"] = W.installed_version()
        # The environment is the cell: check the vendor reads it as intended.
        want = ctx.cell.env.get(VENDOR_GRAPH_ENV) is None
        if vendor_compile._is_cuda_graph_enabled() != want:
            raise RuntimeError(
                f"cell {ctx.cell.name} needs vendor CUDA graphs {'on' if want else 'off'} "
                f"({VENDOR_GRAPH_ENV}={os.environ.get(VENDOR_GRAPH_ENV)!r})"
            )
        if not os.environ.get(COMPILE_ENV):
            raise RuntimeError(f"{COMPILE_ENV} is not set: torch.compile would differ by cell")
        self.inputs = iter(W.pcm_stream(ctx.args.seed, ctx.n_steps))

    def build(self) -> None:
        import torch

        W, args = self.W, self.ctx.args
        lm_kwargs = W.TINY_LM_KWARGS if args.tiny else W.FULL_7B
        self.mimi, self.lm_gen = W.build_moshi(
            args.seed, self.ctx.device, torch.bfloat16, lm_kwargs, greedy=True, start=True
        )
        self.model = self.mimi
        lm, mimi = self.lm_gen.lm_model, self.mimi
        dtype = lambda m: str(next(m.parameters()).dtype).replace("torch.", "")  # noqa: E731
        self.ctx.result["model"] = {
            "lm_kwargs": "TINY" if args.tiny else "FULL_7B",
            "lm_params": sum(p.numel() for p in lm.parameters()),
            "lm_dtype": dtype(lm),
            "mimi_params": sum(p.numel() for p in mimi.parameters()),
            "mimi_dtype": dtype(mimi),
            "lm_dim": getattr(lm, "dim", None),
            "lm_layers": len(getattr(getattr(lm, "transformer", None), "layers", []) or []),
            **{"dep_q": lm.dep_q, "num_codebooks": lm.num_codebooks, "greedy": True, "batch": 1},
        }

    def setup(self) -> Any:
        if self.ctx.cell.name != "adapter":
            return None
        return self.W.bind_adapter(self.mimi, self.lm_gen, self.ctx.device)

    def step(self) -> dict:
        toks, outs = self.W.step_frame(self.mimi, self.lm_gen, next(self.inputs))
        assert len(toks) == len(outs) <= 1, "one LM step per 1920-sample frame"
        return {"tokens": toks[0] if toks else None, "pcm": outs[0] if outs else None}

    def after(self, phase: str) -> None:
        pass

    def finish(self, result: dict) -> None:
        result["vendor_graphs_captured"] = vendor_graph_state(self.mimi, self.lm_gen)


def cell_summary(results: list) -> dict:
    ok = [r for r in results if r and r.get("status") == "ok"]
    return {"vendor_graphs_captured": ok[0].get("vendor_graphs_captured") if ok else None}


def cell_notes(name: str, c: dict) -> list[str]:
    graphs = c.get("vendor_graphs_captured") or {}
    if name != "vendor" or not graphs:
        return []
    held = ", ".join(f"{k} {v}" for k, v in graphs.items() if v is not None)
    return [f"- **vendor** CUDAGraphed wrappers holding a graph at the end (block 0): {held}"]


def describe(doc: dict) -> list[str]:
    m = doc.get("model") or {}
    return [
        f"- LM parameters {m.get('lm_params', 0):,}; Mimi parameters {m.get('mimi_params', 0):,}; "
        f"{COMPILE_ENV}=1 in every cell"
    ]


WORKLOAD = Workload(
    name="moshi",
    unit="frame",
    cells=CELLS,
    reference="eager",
    ratio_refs=("eager", "vendor"),
    start=MoshiRun,
    streams=(
        Stream(
            "tokens",
            "int64",
            key="tokens_sha256",
            step_key="frame_tokens_sha256",
            values_key="frame_token_ids",
        ),
        Stream(
            "pcm", "float32", key="pcm_sha256", step_key="frame_pcm_sha256", count_key="n_samples"
        ),
    ),
    title=lambda doc: f"Moshi streaming benchmark (moshi {doc.get('moshi')}, LM "
    f"{(doc.get('model') or {}).get('lm_kwargs')} {(doc.get('model') or {}).get('lm_dtype')}, "
    f"Mimi {(doc.get('model') or {}).get('mimi_dtype')}, seeded random weights, batch 1, greedy)",
    description="Matched-block benchmark of the stock Kyutai Moshi streaming loop (moshi "
    "0.2.13, 7B LM bf16 + Mimi fp32, seeded random weights, batch 1, greedy): eager vs the "
    "vendor's CUDA graphs vs the generated duplexcadence adapter.",
    defaults={"frames": 32, "warmup": 4, "profile_frames": 3},
    quick={
        "device": "cpu",
        "tiny": True,
        "blocks": 1,
        "warmup": 1,
        "frames": 3,
        "profile_frames": 0,
        "cells": ["eager", "adapter"],
        "threads": 1,
        "out": "bench/results/moshi_quick",
        "worker_timeout": 300.0,
    },
    base_env={COMPILE_ENV: "1"},
    # stock Moshi reproduces itself only with cuDNN's attention off (its fused kernel is
    # not run-to-run deterministic on the H200: `clockc reproduce`); pinned in every
    # cell, the reference too, as contracts/moshi.clock pins it for the adapter
    determinism=moshi_workload.DETERMINISM,
    flags={"--tiny": dict(action="store_true", help="the tiny LM instead of FULL_7B")},
    measure_flags=("tiny",),
    doc_keys=("moshi", "model"),
    settings=lambda args: {
        "tiny": args.tiny,
        "frame_samples": 1920,
        "sample_rate": 24000,
        "lm_dtype": "bfloat16",
        "mimi_dtype": "float32",
        "batch": 1,
        "greedy": True,
    },
    describe=describe,
    cell_summary=cell_summary,
    cell_notes=cell_notes,
    deadline_ms=80.0,
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
