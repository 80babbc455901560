"""One-off GPU probe for issue 5: Moshi eager vs vendor graphs vs the generated adapter.

Usage (GPU machine): python -m bench.probe_moshi_cuda [--frames N] [--full] [--cells ...]
Each cell runs in its own process (vendor graph state and NO_CUDA_GRAPH are
process-wide); prints per-frame wall times, token-ID and PCM SHA-256 per cell, the
first differing frame, and the adapter's replay counters. Not the benchmark
(bench/moshi.py is).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def worker(cell: str, frames_n: int, seed: int, full: bool) -> dict:
    import torch

    from bench.workloads import moshi as W

    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    kw = W.FULL_7B if full else W.TINY_LM_KWARGS
    t0 = time.perf_counter()
    mimi, lm_gen = W.build_moshi(seed, "cuda", torch.bfloat16, kw)
    out: dict = {"cell": cell, "build_s": round(time.perf_counter() - t0, 2)}
    binding = None
    if cell == "adapter":
        t0 = time.perf_counter()
        binding = W.bind_adapter(mimi, lm_gen, "cuda")
        out["bind_capture_s"] = round(time.perf_counter() - t0, 2)
    frames = W.pcm_stream(seed, frames_n)
    times, tok_sha, pcm_sha = [], [], []
    toks_all, pcm_all = hashlib.sha256(), hashlib.sha256()
    torch.cuda.reset_peak_memory_stats()
    for chunk in frames:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        toks, pcm = W.step_frame(mimi, lm_gen, chunk)
        torch.cuda.synchronize()
        times.append(round((time.perf_counter() - t0) * 1e3, 2))
        tb = b"".join(t.cpu().numpy().tobytes() for t in toks)
        pb = b"".join(p.float().cpu().numpy().tobytes() for p in pcm)
        toks_all.update(tb)
        pcm_all.update(pb)
        tok_sha.append(hashlib.sha256(tb).hexdigest()[:8])
        pcm_sha.append(hashlib.sha256(pb).hexdigest()[:8])
    steady = sorted(times[4:]) or sorted(times)
    out.update(
        ms=times,
        p50_ms=steady[len(steady) // 2],
        tokens=toks_all.hexdigest()[:16],
        pcm=pcm_all.hexdigest()[:16],
        tok_frames=tok_sha,
        pcm_frames=pcm_sha,
        peak_mib=round(torch.cuda.max_memory_allocated() / 2**20, 1),
    )
    if binding is not None:
        st = binding.stats()
        out["replay"] = {
            n: {
                "hits": c["hits"],
                "misses": c["misses"],
                "rejected": c["rejected"],
                "classes": [(k["status"], k["detail"][:300]) for k in c["classes"]],
                "capture_s": round(c["capture_s"], 3),
            }
            for n, c in st["callables"].items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--full", action="store_true", help="the 7B LM instead of the tiny one")
    ap.add_argument("--cells", default="eager,vendor,adapter")
    ap.add_argument("--worker", default=None)
    a = ap.parse_args()
    if a.worker:
        print("RESULT " + json.dumps(worker(a.worker, a.frames, a.seed, a.full)), flush=True)
        return
    res = {}
    for cell in a.cells.split(","):
        env = dict(os.environ, NO_TORCH_COMPILE="1")
        env["NO_CUDA_GRAPH"] = "0" if cell == "vendor" else "1"
        cmd = [
            sys.executable,
            "-m",
            "bench.probe_moshi_cuda",
            "--worker",
            cell,
            "--frames",
            str(a.frames),
            "--seed",
            str(a.seed),
        ] + (["--full"] if a.full else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if not line:
            res[cell] = {"error": p.stderr[-3000:]}
        else:
            res[cell] = json.loads(line[0][7:])
        print(cell, json.dumps(res[cell])[:3000], flush=True)
    ref = res.get("eager", {})
    for cell, r in res.items():
        if "tokens" in r and "tokens" in ref:
            first = next(
                (i for i, (x, y) in enumerate(zip(r["tok_frames"], ref["tok_frames"])) if x != y),
                None,
            )
            firstp = next(
                (i for i, (x, y) in enumerate(zip(r["pcm_frames"], ref["pcm_frames"])) if x != y),
                None,
            )
            print(
                f"SUMMARY {cell}: p50 {r['p50_ms']} ms peak {r['peak_mib']} MiB exact_tokens="
                f"{r['tokens'] == ref['tokens']} exact_pcm={r['pcm'] == ref['pcm']} "
                f"first_token_diff={first} first_pcm_diff={firstp}",
                flush=True,
            )


if __name__ == "__main__":
    main()
