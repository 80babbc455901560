"""One-off GPU probe for issue 5: tiny-LM Moshi eager vs vendor graphs vs the adapter.

Usage (GPU machine): python -m bench.probe_moshi_cuda [--frames N] [--full]
Prints per-frame wall times, token-ID and PCM SHA-256 per cell, and the binding
report. Not a benchmark (that is issue 5's bench/moshi.py, still to write).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
import types

import torch

from bench.workloads import moshi as W


def run(mimi, lm_gen, frames):
    times, toks, pcm = [], [], []
    for chunk in frames:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        t, p = W.step_frame(mimi, lm_gen, chunk)
        torch.cuda.synchronize()
        times.append(round((time.perf_counter() - t0) * 1e3, 2))
        toks += [x.cpu() for x in t]
        pcm += [x.cpu() for x in p]
    tok_sha = hashlib.sha256(b"".join(x.numpy().tobytes() for x in toks)).hexdigest()[:16]
    pcm_sha = hashlib.sha256(b"".join(x.float().numpy().tobytes() for x in pcm)).hexdigest()[:16]
    return {"ms": times, "tokens": tok_sha, "pcm": pcm_sha}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="the 7B LM instead of the tiny one")
    a = ap.parse_args()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    kw = W.FULL_7B if a.full else W.TINY_LM_KWARGS
    frames = W.pcm_stream(a.seed, a.frames)
    out = {}

    os.environ["NO_CUDA_GRAPH"] = "1"
    mimi, lm_gen = W.build_moshi(a.seed, "cuda", torch.bfloat16, kw)
    out["eager"] = run(mimi, lm_gen, frames)
    del mimi, lm_gen

    os.environ["NO_CUDA_GRAPH"] = "0"
    mimi, lm_gen = W.build_moshi(a.seed, "cuda", torch.bfloat16, kw)
    out["vendor"] = run(mimi, lm_gen, frames)
    del mimi, lm_gen

    os.environ["NO_CUDA_GRAPH"] = "1"
    from duplexcadence.generated import moshi as adapter

    mimi, lm_gen = W.build_moshi(a.seed, "cuda", torch.bfloat16, kw, start=False)
    model = types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)
    binding = adapter.bind(model, device="cuda", capture=False)
    W.start_streaming(mimi, lm_gen)
    try:
        binding.capture(progress=False)
    except Exception as exc:  # report, keep going eager
        out["capture_error"] = f"{type(exc).__name__}: {exc}"
    mimi.reset_streaming()
    lm_gen.reset_streaming()
    torch.manual_seed(a.seed)
    out["adapter"] = run(mimi, lm_gen, frames)
    out["adapter"]["exact_vs_eager"] = (
        out["adapter"]["tokens"] == out["eager"]["tokens"]
        and out["adapter"]["pcm"] == out["eager"]["pcm"]
    )
    out["vendor"]["exact_vs_eager"] = (
        out["vendor"]["tokens"] == out["eager"]["tokens"]
        and out["vendor"]["pcm"] == out["eager"]["pcm"]
    )
    print(json.dumps(out, indent=1))
    print(binding.report())


if __name__ == "__main__":
    main()
