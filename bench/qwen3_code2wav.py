"""Benchmark of the stock Qwen3-Omni Code2Wav streaming loop vs the generated adapter
(issue 15; the cells are bench/decoders.py's).

    python -m bench.qwen3_code2wav --device cuda --blocks 1 --chunks 18 --warmup 2 \\
        --profile-chunks 0 --compile-timeout 50 --time-budget 140 \\
        --out bench/results/qwen3_code2wav_h200
    python -m bench.qwen3_code2wav --quick          # CPU smoke: stock + adapter, 2 chunks

The workload is PyPI ``transformers==4.57.6`` as ``bench.workloads.qwen3_code2wav`` builds
it (``Qwen3OmniMoeCode2Wav`` at its default config, seeded random weights, fp32, batch 1).
One step is one iteration of the vendor's ``chunked_decode`` (25 new code frames, 25 of
left context: 2 s of 24 kHz PCM). The codes are turns of ``--turn-frames`` (210: the
contract's catalog turn, 9 calls with windows 25, 50 x 7, 35); a step past a turn's end
starts the next turn, so every window class recurs. The hashed stream is the float32 PCM
of every chunk. The compile controls wrap ``forward`` (the callable the contract declares).
vllm-omni's Code2Wav graph wrapper needs its server stack, so it is not a cell here.
"""

from __future__ import annotations

import math
from typing import Any

from bench import decoders as D
from bench.harness import Stream, WorkerContext, Workload, main

TURN_FRAMES = 210  # contracts/qwen3_code2wav.clock: n_codes


class TurnStream:
    """Seeded turns of ``turn_frames`` codes, each through the vendor loop (CodeStream)."""

    def __init__(self, W: Any, model: Any, seed: int, n_chunks: int, turn_frames: int) -> None:
        self.W, self.model, self.turn_frames = W, model, turn_frames
        per_turn = len(W.windows(turn_frames))
        n_turns = math.ceil(n_chunks / per_turn)
        self.codes = W.code_stream(seed, n_turns * turn_frames)
        self.turn, self.current = 0, None

    def step(self) -> Any:
        if self.current is None or self.current.done:
            t, n = self.turn, self.turn_frames
            # each turn is the caller's own [1, 16, N] tensor, as generate() holds it
            turn = self.codes[..., t * n : (t + 1) * n].clone()
            self.current, self.turn = self.W.CodeStream(self.model, turn), t + 1
        return self.current.stream_chunk()


def _w() -> Any:
    from bench.workloads import qwen3_code2wav as W

    return W


DECODER = D.Decoder(
    workload="qwen3_code2wav",
    adapter="qwen3_code2wav",
    build=lambda args, device: _w().build_code2wav(args.seed, device),
    open=lambda m, args, n: TurnStream(_w(), m, args.seed, n, args.turn_frames),
    bind=lambda s, device, backend=None: _w().bind_adapter(
        s.model, device, capture=False, backend=backend
    ),
    compile_site=lambda s: (s.model, "forward"),
)


def start(ctx: WorkerContext) -> D.DecoderRun:
    return D.DecoderRun(ctx, DECODER)


FLAGS = {
    **D.FLAGS,
    "--turn-frames": dict(
        type=int,
        default=TURN_FRAMES,
        help="code frames per turn (the contract's catalog is the 210-frame turn's)",
    ),
}


WORKLOAD = Workload(
    name="qwen3_code2wav",
    unit="chunk",
    cells=D.cells("Qwen3OmniMoeCode2Wav.forward"),
    reference="stock",
    start=start,
    streams=(
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_sha256", count_key="n_samples"),
    ),
    title=lambda doc: "Qwen3-Omni Code2Wav streaming benchmark (transformers "
    f"{doc.get('vendor_version')}, seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock Qwen3-Omni Code2Wav chunked_decode loop "
    "(transformers 4.57.6, seeded random weights) against the generated duplexcadence adapter "
    "and torch.compile controls.",
    defaults={"chunks": 18, "warmup": 2, "profile_chunks": 0},
    quick={
        "device": "cpu",
        "blocks": 1,
        "warmup": 1,
        "chunks": 1,
        "profile_chunks": 0,
        "cells": ["stock", "adapter"],
        "threads": 1,
        "out": "bench/results/qwen3_code2wav_quick",
        "worker_timeout": 900.0,
    },
    flags=FLAGS,
    measure_flags=("turn_frames",),
    doc_keys=D.DOC_KEYS,
    settings=lambda args: {
        "compile_timeout_s": args.compile_timeout,
        "turn_frames": args.turn_frames,
        "chunk_frames": 25,
        "left_context_frames": 25,
        "sample_rate": 24000,
        "dtype": "float32",
        "batch": 1,
    },
    cell_summary=D.adapter_summary,
    cell_notes=D.adapter_notes,
    deadline_ms=2000.0,
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
