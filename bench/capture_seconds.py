"""What capture costs: the SRc Token2Wav contract's ``binding.capture()`` at bind (a
float32 deployment), seconds per class (warm-up, capture), then a new prompt length's
classes on the same, idle lane (``binding.use``). CUDA only.

    python -m bench.capture_seconds --values 150,388 > capture.json

bench/results/capture_token2wav_h200.json holds the H200 runs (this driver's logic, run
from a scratch copy before it moved here)."""

from __future__ import annotations

import argparse
import importlib
import json
import time

import torch

from bench.workloads import token2wav as W

CONTRACT = "stepaudio2_token2wav"


def class_seconds(binding) -> dict:
    return {
        name: [
            (
                c.get("name"),
                round(c.get("warmup_s", 0), 3),
                round(c.get("capture_s", 0), 3),
                c.get("status"),
            )
            for c in s.get("classes", [])
        ]
        for name, s in binding.stats()["callables"].items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", default="150,388", help="f_prompt values to capture after bind")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.capture_seconds: needs CUDA (capture is what it measures)")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    adapter = importlib.import_module(f"duplexcadence.generated.{CONTRACT}")
    dev, held = torch.device("cuda"), []
    t0 = time.perf_counter()
    W.build_token2wav(
        seed=0,
        device=dev,
        before_priming=lambda t: held.append(
            adapter.bind(t, device=dev, capture=False, progress=False, ambient=("float32",))
        ),
    )
    out: dict = {"build_s": round(time.perf_counter() - t0, 2)}
    binding = held[0]
    t0 = time.perf_counter()
    binding.capture(progress=False)
    out["capture_s_at_bind"] = round(time.perf_counter() - t0, 3)
    out["classes"] = class_seconds(binding)
    out["new_value_use_s"] = {}
    for v in [int(x) for x in args.values.split(",") if x]:
        t0 = time.perf_counter()
        binding.use({"f_prompt": v})
        torch.cuda.synchronize()
        out["new_value_use_s"][str(v)] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
