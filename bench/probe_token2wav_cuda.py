"""One-off GPU probe: stock vs bound Token2Wav on CUDA, exactness and what blocks capture.

Usage (GPU machine): python -m bench.probe_token2wav_cuda [--chunks N]
Prints, for the stock stream (B0) and the bound stream (capture on): per-chunk wall
time, PCM SHA-256, peak memory, the binding report, and the host-sync sources seen
in one stock chunk (torch.cuda.set_sync_debug_mode). Not a benchmark: bench.token2wav is.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import time
import traceback
import warnings

import torch

from bench.workloads import token2wav as W


def stream(t2w, n_chunks, seed):
    pcm, times = [], []
    for chunk in W.token_stream(seed, n_chunks):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pcm.append(W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk))
        torch.cuda.synchronize()
        times.append(round((time.perf_counter() - t0) * 1e3, 1))
    digest = hashlib.sha256(b"".join(p.astype("<f4").tobytes() for p in pcm)).hexdigest()
    return pcm, times, digest


def sync_sources(t2w, seed):
    """Stack locations of host syncs in one steady chunk of the stock stream."""
    chunks = W.token_stream(seed, 3)
    W.stream_chunk(t2w, chunks[0].tokens, False)
    sources = {}
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            W.stream_chunk(t2w, chunks[1].tokens, False)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        stack = [
            f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}"
            for f in traceback.extract_stack()
        ]
        key = (
            str(w.message).splitlines()[0][:120]
            + " @ "
            + f"{w.filename.split('site-packages/')[-1]}:{w.lineno}"
        )
        sources[key] = sources.get(key, 0) + 1
    return sources


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}

    t2w = W.build_token2wav(args.seed, device="cuda")
    out["sync_sources"] = sync_sources(t2w, args.seed)
    del t2w
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    t2w = W.build_token2wav(args.seed, device="cuda")
    _, times, digest = stream(t2w, args.chunks, args.seed)
    out["B0"] = {"ms": times, "sha": digest, "peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    del t2w
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()

    from duplexcadence.generated import stepaudio2_token2wav as adapter

    held = []
    t2w = W.build_token2wav(
        args.seed,
        device="cuda",
        before_priming=lambda m: held.append(adapter.bind(m, device="cuda", capture=False)),
    )
    binding = held[0]
    t0 = time.perf_counter()
    binding.capture(progress=False)
    out["capture_s"] = round(time.perf_counter() - t0, 2)
    out["peak_after_capture_mib"] = torch.cuda.max_memory_allocated() / 2**20
    _, times, digest = stream(t2w, args.chunks, args.seed)
    out["bound"] = {
        "ms": times,
        "sha": digest,
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
        "exact": digest == out["B0"]["sha"],
    }
    out["stats"] = binding.stats()
    print(json.dumps(out, indent=1, default=str))
    print(binding.report())


if __name__ == "__main__":
    main()
