"""Benchmarks of transformers' Mimi (4.57.6) streaming loops vs the generated adapters
(issue 23; the cells are bench/decoders.py's). Two entry points, one per loop:

    python -m bench.mimi_encoder --device cuda --blocks 1 --frames 240 --warmup 2 \\
        --profile-frames 2 --cells stock,adapter,compile --compile-timeout 120 \\
        --out bench/results/mimi_encoder_h200
    python -m bench.mimi_decoder --device cuda --blocks 1 --frames 240 --warmup 2 \\
        --profile-frames 2 --cells stock,adapter,compile --compile-timeout 120 \\
        --out bench/results/mimi_decoder_h200
    python -m bench.mimi_encoder --quick          # CPU smoke: stock + adapter, 1 frame

The workload is PyPI ``transformers==4.57.6`` as ``bench.workloads.transformers_mimi``
builds it (``MimiModel`` at its default config, seeded random weights and codebooks,
fp32, batch 1). One step is one 80 ms frame: the encoder's streaming ``encode`` of 1920
samples with its ``DynamicCache`` and ``MimiConv1dPaddingCache`` (hashed: the int64
codes ``[1, 32, 1]``), or the decoder's frame-by-frame ``decode`` of 32 codes with its
``DynamicCache`` (hashed: the float32 PCM ``[1, 1, 1920]``). A stream must run past 125
frames for every class of a catalog to be met (the sliding window's keys fill at 249
tokens, 2 a frame). The compile controls wrap the method the contract declares.
"""

from __future__ import annotations

from typing import Any

from bench import decoders as D
from bench.harness import Stream, WorkerContext, Workload


def _w() -> Any:
    from bench.workloads import transformers_mimi as W

    return W


PARTS = {
    # part: (the vendor method, how a stream opens on a model, the hashed Stream)
    "encoder": (
        "encode",
        lambda m, args, n: _w().AudioStream(_w().new_stream_state(m), args.seed, n),
        Stream("codes", "int64", key="codes_sha256", step_key="frame_sha256", count_key="n_codes"),
    ),
    "decoder": (
        "decode",
        lambda m, args, n: _w().CodeStream(_w().new_decoder_state(m), args.seed, n),
        Stream("pcm", "float32", key="pcm_sha256", step_key="frame_sha256", count_key="n_samples"),
    ),
}


def workload(part: str) -> Workload:
    """The benchmark of Mimi's streaming ``part`` (module docstring)."""
    method, open_stream, stream = PARTS[part]
    decoder = D.Decoder(
        workload="transformers_mimi",
        adapter=f"mimi_{part}",
        build=lambda args, device: _w().build_mimi(args.seed, device),
        open=open_stream,
        bind=lambda s, device, backend=None: _w().bind_adapter(
            s.state, device, capture=False, backend=backend
        ),
        compile_site=lambda s: (s.state.mimi, method),
        output=stream.name,
    )

    def start(ctx: WorkerContext) -> D.DecoderRun:
        return D.DecoderRun(ctx, decoder)

    return Workload(
        name=f"mimi_{part}",
        unit="frame",
        cells=D.cells(f"MimiModel.{method}"),
        reference="stock",
        start=start,
        streams=(stream,),
        title=lambda doc: f"Mimi streaming {part} benchmark (transformers "
        f"{doc.get('vendor_version')}, seeded random weights, fp32, batch 1)",
        description=f"Matched-block benchmark of transformers' streaming Mimi {part} (one 80 ms "
        "frame per call, its caches as the call's state) against the generated duplexcadence "
        "adapter and torch.compile controls.",
        defaults={"frames": 240, "warmup": 2, "profile_frames": 0},
        quick={
            "device": "cpu",
            "blocks": 1,
            "warmup": 1,
            "frames": 1,
            "profile_frames": 0,
            "cells": ["stock", "adapter"],
            "threads": 1,
            "out": f"bench/results/mimi_{part}_quick",
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
