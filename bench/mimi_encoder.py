"""Benchmark of transformers' streaming Mimi encoder vs the generated adapter (issue 23;
the cells are bench/decoders.py's).

    python -m bench.mimi_encoder --device cuda --blocks 1 --frames 240 --warmup 2 \\
        --profile-frames 0 --cells stock adapter compile --compile-timeout 150 \\
        --out bench/results/mimi_encoder_h200
    python -m bench.mimi_encoder --quick          # CPU smoke: stock + adapter, 2 frames

The workload is PyPI ``transformers==4.57.6`` as ``bench.workloads.mimi_encoder`` builds
it (``MimiModel`` at its default config, seeded random weights and codebooks, fp32,
batch 1). One step is one 80 ms frame (1920 samples) through the vendor's streaming
``MimiModel.encode`` with its ``DynamicCache`` and ``MimiConv1dPaddingCache``; the hashed
stream is the int64 codes ``[1, 32, 1]`` of every frame. The stream must run past 125
frames for every class of the catalog to be met (the sliding window's keys fill at 249
tokens, 2 a frame) and to exercise the full-window class. The compile controls wrap
``MimiModel.encode``, the callable the contract declares.
"""

from __future__ import annotations

from typing import Any

from bench import decoders as D
from bench.harness import Stream, WorkerContext, Workload, main


def _w() -> Any:
    from bench.workloads import mimi_encoder as W

    return W


DECODER = D.Decoder(
    workload="mimi_encoder",
    adapter="mimi_encoder",
    build=lambda args, device: _w().build_mimi(args.seed, device),
    open=lambda m, args, n: _w().AudioStream(_w().new_stream_state(m), args.seed, n),
    bind=lambda s, device, backend=None: _w().bind_adapter(
        s.state, device, capture=False, backend=backend
    ),
    compile_site=lambda s: (s.state.mimi, "encode"),
    output="codes",
)


def start(ctx: WorkerContext) -> D.DecoderRun:
    return D.DecoderRun(ctx, DECODER)


WORKLOAD = Workload(
    name="mimi_encoder",
    unit="frame",
    cells=D.cells("MimiModel.encode"),
    reference="stock",
    start=start,
    streams=(
        Stream("codes", "int64", key="codes_sha256", step_key="frame_sha256", count_key="n_codes"),
    ),
    title=lambda doc: "Mimi streaming encoder benchmark (transformers "
    f"{doc.get('vendor_version')}, seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of transformers' streaming Mimi encoder (one 80 ms "
    "frame per call, its DynamicCache and padding cache as the call's state) against the "
    "generated duplexcadence adapter and torch.compile controls.",
    defaults={"frames": 240, "warmup": 2, "profile_frames": 0},
    quick={
        "device": "cpu",
        "blocks": 1,
        "warmup": 1,
        "frames": 1,
        "profile_frames": 0,
        "cells": ["stock", "adapter"],
        "threads": 1,
        "out": "bench/results/mimi_encoder_quick",
        "worker_timeout": 900.0,
    },
    flags=D.FLAGS,
    doc_keys=D.DOC_KEYS,
    settings=lambda args: {
        "compile_timeout_s": args.compile_timeout,
        "frame_samples": 1920,
        "sample_rate": 24000,
        "dtype": "float32",
        "batch": 1,
    },
    cell_summary=D.adapter_summary,
    cell_notes=D.adapter_notes,
    deadline_ms=80.0,
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
