"""What capture costs: the SRc Token2Wav contract's ``binding.capture()`` at bind (a
float32 deployment), seconds per class (warm-up, capture), then a new prompt length's
classes on the same, idle lane (``binding.use``). CUDA only.

    python -m bench.capture_seconds --values 150,388 > capture.json
    python -m bench.capture_seconds --breakdown   # where each phase's seconds go

bench/results/capture_token2wav_h200.json holds the H200 runs (this driver's logic, run
from a scratch copy before it moved here)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import time
from collections import Counter

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


class PhaseTimers:
    """Seconds spent in each phase of capture, by wrapping the functions that run them
    (the runtime's snapshot, materialise, eager runs; torch's capture begin/end, which
    instantiates the graph; device syncs). Recording is what a capture spends outside
    them. Wrapped only in this measuring process."""

    def __init__(self) -> None:
        import duplexcadence.runtime.engine.backend as backend
        import duplexcadence.runtime.engine.capture_state as capture_state
        import duplexcadence.runtime.engine.replay_capture as replay_capture

        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()
        self._undo: list = []
        self._wrap(capture_state.CaptureSnapshot, "__init__", "snapshot")
        self._wrap(capture_state.CaptureSnapshot, "restore", "restore")
        self._wrap(replay_capture, "materialize", "materialize")
        self._wrap(backend.CudaGraphBackend, "run_eager", "eager (probe, warm-up)")
        self._wrap(backend.CudaGraphBackend, "capture", "capture (all)")
        self._wrap(torch.cuda.CUDAGraph, "capture_begin", "capture_begin")
        self._wrap(torch.cuda.CUDAGraph, "capture_end", "capture_end (instantiate)")
        self._wrap(torch.cuda, "synchronize", "synchronize")

    def _wrap(self, owner, name: str, key: str) -> None:
        f = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1

        setattr(owner, name, timed)
        self._undo.append((owner, name, f))

    def take(self) -> dict:
        out = {k: {"s": round(v, 3), "calls": self.calls[k]} for k, v in self.seconds.items()}
        self.seconds.clear()
        self.calls.clear()
        return out


def eager_seconds(binding, callable_name: str, repeats: int = 3) -> dict:
    """One class's eager call, timed to the device's end: plain, and under the engine's
    host-constant mode (what probe, warm-up and capture run in), with its aten op count."""
    engine = binding.lanes[0].engines[callable_name]
    entry = next(e for e in engine._entries if e.status == "captured")
    args, kwargs = entry.inputs

    def timed(mode) -> float:
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad(), mode:
                engine.fn(*args, **kwargs)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return round(best, 4)

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountOps.n += 1
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), CountOps():
        engine.fn(*args, **kwargs)
    return {
        "class": entry.name,
        "eager_s": timed(contextlib.nullcontext()),
        "eager_host_constants_s": timed(engine.host_constants),
        "aten_ops": CountOps.n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--values", default="150,388", help="f_prompt values to capture after bind")
    p.add_argument(
        "--breakdown", action="store_true", help="seconds per capture phase, and eager calls"
    )
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
    timers = PhaseTimers() if args.breakdown else None
    t0 = time.perf_counter()
    binding.capture(progress=False)
    out["capture_s_at_bind"] = round(time.perf_counter() - t0, 3)
    out["classes"] = class_seconds(binding)
    if timers:
        out["phases_at_bind"] = timers.take()
    out["new_value_use_s"] = {}
    for v in [int(x) for x in args.values.split(",") if x]:
        t0 = time.perf_counter()
        binding.use({"f_prompt": v})
        torch.cuda.synchronize()
        out["new_value_use_s"][str(v)] = round(time.perf_counter() - t0, 3)
        if timers:
            out.setdefault("phases_new_value", {})[str(v)] = timers.take()
    if timers:
        out["eager"] = {n: eager_seconds(binding, n) for n in binding.lanes[0].engines}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
