"""Host time per replayed call of a bound adapter, on the CPU, with the graph replay a no-op.

    python -m bench.host_path --workload voxcpm2 [--calls 2000] [--profile 25]
    python -m bench.host_path --workload qwen3_code2wav

On the H200 VoxCPM2's adapter ran at 1.96x its device-busy time (issue 15): the decoder
is one captured graph per chunk, so the gap is host time between the model's call and
``graph.replay()`` (the dispatcher, the call convention, aliasing, admission, the
write-through check, output hand-back). This measures that path alone, where it is
cheap to measure: the released model is built and its stream opened as the workload's
driver does (``bench/<workload>.py``'s ``DECODER``), the generated adapter is bound
with the fake graph backend (the real admission and output policy run) whose
replay does nothing, and each replayed callable is called through the model's site with
the inputs of its first captured class. Every timed call must replay (a miss fails the
run). Times are the process's CPU time (the machine may be shared), the best of 5
rounds. ``--profile N`` prints cProfile's top N functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import time
from typing import Any, Callable

import torch

from duplexcadence.runtime import FakeGraphBackend
from duplexcadence.runtime.state.sites import get_at


class NoReplayBackend(FakeGraphBackend):
    """The fake backend whose replay does nothing: what is timed is the runtime."""

    name = "fake_no_replay"

    def capture(self, fn: Callable, args: tuple, kwargs: dict, device: Any, pool: Any) -> Any:
        captured = super().capture(fn, args, kwargs, device, pool)
        captured.replay = lambda: None  # type: ignore[method-assign]
        return captured


def per_call_us(call: Callable[[], Any], n: int, rounds: int = 5) -> float:
    for _ in range(min(n, 50)):
        call()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(n):
            call()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="voxcpm2", choices=("voxcpm2", "qwen3_code2wav"))
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--turn-frames", type=int, default=50)  # qwen3_code2wav's stream
    p.add_argument("--profile", type=int, default=0, metavar="N")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    decoder = importlib.import_module(f"bench.{args.workload}").DECODER
    stream = decoder.open(decoder.build(args, "cpu"), args, 1)
    binding = decoder.bind(stream, "cpu", backend=NoReplayBackend())
    binding.capture(progress=False)
    for k in binding.decl.callables:
        engine = binding.replays.get(k.name)
        entry = next((e for e in engine._entries if e.status == "captured"), None)
        if entry is None:
            print(f"{k.name}: no captured class ({engine.stats()['classes']})")
            continue
        site, (a, kw) = get_at(binding.model, k.site), entry.inputs
        hits = engine.hits

        def call(site: Any = site, a: tuple = a, kw: dict = kw) -> Any:
            with torch.inference_mode():
                return site(*a, **kw)

        us = per_call_us(call, args.calls)
        s = engine.stats()
        if s["misses"] or s["hits"] == hits:
            raise SystemExit(f"{k.name}: the timed calls did not all replay: {s['misses']}")
        print(
            f"{args.workload}.{k.name}: {us:.1f} us host per replayed call "
            f"({len(engine.write_through)} write-through buffers, {len(k.aliased)} aliased)"
        )
        if args.profile:
            prof = cProfile.Profile()
            prof.runcall(lambda: [call() for _ in range(args.calls)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
