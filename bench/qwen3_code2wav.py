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

``vllm_omni_code2wav`` is the public competitor: vllm-omni 0.30.0's
``CUDAGraphDecoderWrapper`` (the file alone, ``bench.workloads.vllm_omni_graphs``; no vLLM
server) on the same stock model, warmed up as vllm-omni's ``enable_cudagraph`` does with
its deploy config (codec chunk 25, left context 25); each window goes through the
wrapper's ``decode``, the stock loop cuts it. It replays a window in the smallest captured
bucket that holds it: 25 and 50 fit exactly, a turn's last window (35 frames) replays
zero-padded in the 50-frame graph, so ``exact`` can be false there (the setup record counts
the windows per bucket).
"""

from __future__ import annotations

import math
from typing import Any

from bench import decoders as D
from bench.decoders import DecoderCell
from bench.harness import Cell, CellFailed, Stream, WorkerContext, Workload, main

TURN_FRAMES = 210  # contracts/qwen3_code2wav.clock: n_codes


class TurnStream:
    """Seeded turns of ``turn_frames`` codes, each through the vendor loop (CodeStream)."""

    def __init__(self, W: Any, model: Any, seed: int, n_chunks: int, turn_frames: int) -> None:
        self.W, self.model, self.turn_frames = W, model, turn_frames
        per_turn = len(W.windows(turn_frames))
        n_turns = math.ceil(n_chunks / per_turn)
        self.codes = W.code_stream(seed, n_turns * turn_frames)
        self.turn, self.current = 0, None
        self.decode = None  # a window's decode: None is the model (stock)

    def step(self) -> Any:
        if self.current is None or self.current.done:
            t, n = self.turn, self.turn_frames
            # each turn is the caller's own [1, 16, N] tensor, as generate() holds it
            turn = self.codes[..., t * n : (t + 1) * n].clone()
            self.current = self.W.CodeStream(self.model, turn, decode=self.decode)
            self.turn = t + 1
        return self.current.stream_chunk()


VLLM_OMNI_CELL = DecoderCell(
    "vllm_omni_code2wav",
    "control: vllm-omni 0.30.0 CUDAGraphDecoderWrapper (graphs per window bucket 2..325 "
    "frames, windows zero-padded up to their bucket) on the stock model, warmed up for "
    "codec chunk 25 / left context 25",
    needs_cuda=True,
    failure="vllm-omni CUDAGraphDecoderWrapper",
)


def vllm_omni_setup(cell: Cell, stream: TurnStream, info: dict) -> None:
    """``vllm_omni_code2wav``: the wrapper captured on the model, every window through its
    ``decode``; ``info`` records the capture sizes and the windows met per bucket."""
    from bench.workloads import vllm_omni_graphs as G

    reason = G.unavailable_reason(G.CODE2WAV_WRAPPER_FILE)
    if reason is not None:
        raise CellFailed("vllm-omni is not installed", reason)
    W = stream.W
    device = next(stream.model.parameters()).device
    wrapper = G.bind_code2wav_graphs(stream.model, device, W.CHUNK_FRAMES, W.LEFT_CONTEXT)
    windows: dict[str, int] = {}  # "<frames>-><bucket>" -> calls (filled while streaming)

    def decode(codes: Any) -> Any:
        shape = wrapper._select_replay_shape(codes.shape[0], codes.shape[-1], wrapper.graphs)
        key = f"{codes.shape[-1]}->{shape[1] if shape else 'eager'}"
        windows[key] = windows.get(key, 0) + 1
        return wrapper.decode(codes)

    stream.decode = decode
    info["vllm_omni"] = {
        "version": G.VERSION,
        "capture_sizes": list(wrapper.capture_sizes),
        "graphs": len(wrapper.graphs),
        "windows_to_bucket": windows,
    }


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
    extra_setup=vllm_omni_setup,
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
    cells=D.cells("Qwen3OmniMoeCode2Wav.forward", extra=(VLLM_OMNI_CELL,)),
    reference="stock",
    start=start,
    streams=(
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_sha256", count_key="n_samples"),
    ),
    title=lambda doc: "Qwen3-Omni Code2Wav streaming benchmark (transformers "
    f"{doc.get('vendor_version')}, seeded random weights, fp32, batch 1)",
    description="Matched-block benchmark of the stock Qwen3-Omni Code2Wav chunked_decode loop "
    "(transformers 4.57.6, seeded random weights) against the generated duplexcadence adapter, "
    "torch.compile controls and vllm-omni's Code2Wav CUDA-graph wrapper.",
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
