"""Benchmark of the stock VoxCPM2 streaming AudioVAE decoder vs the generated adapter
(issue 15; the cells are bench/decoders.py's).

    python -m bench.voxcpm2 --device cuda --blocks 1 --chunks 24 --warmup 3 \\
        --profile-chunks 0 --compile-timeout 50 --time-budget 140 \\
        --out bench/results/voxcpm2_h200
    python -m bench.voxcpm2 --quick                 # CPU smoke: stock + adapter, 2 chunks

The workload is PyPI ``voxcpm==2.0.3`` as ``bench.workloads.voxcpm2`` builds it (the
released ``AudioVAE()``, seeded random weights, fp32, batch 1). One step is one streamed
patch: ``decode_chunk`` of a ``[1, 64, 4]`` latent -> 7680 samples (160 ms at 48 kHz),
inside the vendor's ``streaming_decode()``, opened once per block. The hashed stream is
the float32 PCM of every chunk. The compile controls wrap ``vae.decode`` (the callable the
contract declares; ``decode_chunk`` reaches it).
"""

from __future__ import annotations

from typing import Any

from bench import decoders as D
from bench.harness import Stream, WorkerContext, Workload, main


class VaeStream:
    """One utterance: the vendor stream opened, seeded latent patches fed one per step."""

    def __init__(self, W: Any, vae: Any, seed: int, n_chunks: int) -> None:
        self.stock = W.StockStream(vae).open()
        self.latents = iter(W.latent_stream(seed, n_chunks))

    def step(self) -> Any:
        return self.stock.stream_chunk(next(self.latents))


def _w() -> Any:
    from bench.workloads import voxcpm2 as W

    return W


DECODER = D.Decoder(
    workload="voxcpm2",
    adapter="voxcpm2",
    build=lambda args, device: _w().build_vae(args.seed, device),
    open=lambda vae, args, n: VaeStream(_w(), vae, args.seed, n),
    bind=lambda s, device, backend=None: _w().bind_adapter(
        s.stock, device, capture=False, backend=backend
    ),
    compile_site=lambda s: (s.stock.vae, "decode"),
)


def start(ctx: WorkerContext) -> D.DecoderRun:
    return D.DecoderRun(ctx, DECODER)


WORKLOAD = Workload(
    name="voxcpm2",
    unit="chunk",
    cells=D.cells("vae.decode"),
    reference="stock",
    start=start,
    streams=(
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_sha256", count_key="n_samples"),
    ),
    title=lambda doc: f"VoxCPM2 streaming AudioVAE benchmark (voxcpm {doc.get('vendor_version')}, "
    "seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock VoxCPM2 streaming AudioVAE decoder "
    "(voxcpm 2.0.3, seeded random weights) against the generated duplexcadence adapter and "
    "torch.compile controls.",
    defaults={"chunks": 24, "warmup": 3, "profile_chunks": 0},
    quick={
        "device": "cpu",
        "blocks": 1,
        "warmup": 1,
        "chunks": 2,
        "profile_chunks": 0,
        "cells": ["stock", "adapter"],
        "threads": 1,
        "out": "bench/results/voxcpm2_quick",
        "worker_timeout": 600.0,
    },
    flags=D.FLAGS,
    doc_keys=D.DOC_KEYS,
    settings=lambda args: {
        "compile_timeout_s": args.compile_timeout,
        "latent_frames_per_chunk": 4,
        "chunk_samples": 7680,
        "sample_rate": 48000,
        "dtype": "float32",
        "batch": 1,
    },
    cell_summary=D.adapter_summary,
    cell_notes=D.adapter_notes,
    deadline_ms=160.0,
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
