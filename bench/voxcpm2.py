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

``nanovllm_vae`` is the public competitor: nano-vllm-voxcpm 2.0.5's
``BatchedStreamingVAEDecoder`` (``bench.workloads.nanovllm_vae``) on the same stock
``AudioVAE`` instance, driven as its ``VoxCPM2Runner`` drives it (weight norm folded, batch
bucket 1). It is eager: nano-vllm-voxcpm captures no CUDA graph of the VAE. It runs on the
CPU too, so ``--quick --cells stock,nanovllm_vae`` smoke-tests it.
"""

from __future__ import annotations

from typing import Any

from bench import decoders as D
from bench.decoders import DecoderCell
from bench.harness import Cell, CellFailed, Stream, WorkerContext, Workload, main


class VaeStream:
    """One utterance: the vendor stream opened, seeded latent patches fed one per step
    (to ``decode``: the stock stream's, or a control's that replaced it)."""

    def __init__(self, W: Any, vae: Any, seed: int, n_chunks: int) -> None:
        self.stock = W.StockStream(vae).open()
        self.latents = iter(W.latent_stream(seed, n_chunks))
        self.decode = self.stock.stream_chunk

    def step(self) -> Any:
        return self.decode(next(self.latents))


NANOVLLM_CELL = DecoderCell(
    "nanovllm_vae",
    "control: nano-vllm-voxcpm 2.0.5 BatchedStreamingVAEDecoder (per-stream conv states, "
    "batch-size buckets, no CUDA graph) on the stock AudioVAE, weight norm folded as its "
    "VoxCPM2Runner does, fp32 kept",
    failure="nano-vllm-voxcpm",
)


def nanovllm_setup(cell: Cell, stream: VaeStream, info: dict) -> None:
    """``nanovllm_vae``: the stock stream closed (its conv patches undone, before any chunk),
    nano-vllm's decoder installed on the same ``AudioVAE`` and fed the same latents."""
    from bench.workloads import nanovllm_vae as N

    reason = N.unavailable_reason()
    if reason is not None:
        raise CellFailed("nano-vllm-voxcpm is not installed", reason)
    stream.stock.close()
    nano = N.NanoVaeStream(stream.stock.vae)
    stream.decode = nano.stream_chunk
    info["nanovllm_vae"] = nano.describe()


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
    extra_setup=nanovllm_setup,
)


def start(ctx: WorkerContext) -> D.DecoderRun:
    return D.DecoderRun(ctx, DECODER)


WORKLOAD = Workload(
    name="voxcpm2",
    unit="chunk",
    cells=D.cells("vae.decode", extra=(NANOVLLM_CELL,)),
    reference="stock",
    start=start,
    streams=(
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_sha256", count_key="n_samples"),
    ),
    title=lambda doc: f"VoxCPM2 streaming AudioVAE benchmark (voxcpm {doc.get('vendor_version')}, "
    "seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock VoxCPM2 streaming AudioVAE decoder "
    "(voxcpm 2.0.3, seeded random weights) against the generated duplexcadence adapter, "
    "torch.compile controls and nano-vllm-voxcpm's streaming VAE decoder.",
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
