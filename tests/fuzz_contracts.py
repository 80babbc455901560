"""Long fuzz run of the contract compiler: `python tests/fuzz_contracts.py --minutes 20`.

Alternates grammar-fuzzer inputs (hypothesis `from_lark`) and mutations of the seed
contracts, runs every property of `fuzzing.run_one` on each, and prints inputs
tried / accepted / rejected / bound, every failure with its traceback, the slowest
inputs, and inputs whose check + compile took over the time limit (the time to
import, bind and call on the fake model is reported apart). Each failing input is saved under
tests/fuzz_regressions/ (named by its hash), where the test suite replays it.
Exit status 1 if any property failed or any input took longer than --slow seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzzing import REGRESSIONS, SEEDS, grammar_strategy, mutate, run_one  # noqa: E402


class Tally:
    def __init__(self, slow_limit: float):
        self.n = self.accepted = self.bound = 0
        self.by_source: Counter[str] = Counter()
        self.codes: Counter[str] = Counter()
        self.failures: dict[str, tuple[str, str]] = {}
        self.slowest: list[tuple[float, str, str]] = []
        self.slow_limit = slow_limit
        self.over: list[tuple[float, str]] = []
        self.bind_seconds: list[float] = []

    def record(self, source: str, text: str) -> None:
        out = run_one(text)
        self.n += 1
        self.by_source[source] += 1
        self.accepted += out.accepted
        self.bound += out.bound
        if out.bound:
            self.bind_seconds.append(out.bind_seconds)
        self.codes.update(out.codes)
        self.slowest = sorted(self.slowest + [(out.seconds, source, text)], reverse=True)[:5]
        if out.seconds > self.slow_limit:
            self.over.append((out.seconds, text))
        if out.failure:
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            if digest not in self.failures:
                self.failures[digest] = (text, out.failure)
                REGRESSIONS.mkdir(exist_ok=True)
                (REGRESSIONS / f"crash_{digest}.clock").write_text(text)
                print(
                    f"\nFAILURE ({source}) saved as crash_{digest}.clock\n{out.failure}", flush=True
                )


def grammar_batch(tally: Tally, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(grammar_strategy())
    def run(text):
        tally.record("grammar", text)

    run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=2.0, help="seconds one input may take")
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    seeds = [p.read_text() for p in SEEDS]
    tally = Tally(args.slow)
    began = time.monotonic()
    deadline = began + args.minutes * 60
    last_report = began
    while time.monotonic() < deadline:
        grammar_batch(tally, 50)
        for _ in range(100):
            if time.monotonic() >= deadline:
                break
            tally.record("mutation", mutate(rnd.choice(seeds), rnd, seeds))
        if time.monotonic() - last_report > 60:
            last_report = time.monotonic()
            print(
                f"[{(last_report - began) / 60:5.1f} min] tried {tally.n}, accepted "
                f"{tally.accepted}, bound {tally.bound}, failures {len(tally.failures)}",
                flush=True,
            )
    minutes = (time.monotonic() - began) / 60
    print(f"\nfuzzed {minutes:.1f} min: inputs tried {tally.n} ({dict(tally.by_source)})")
    print(
        f"accepted {tally.accepted}, rejected {tally.n - tally.accepted} "
        f"(with positioned diagnostics), bound to a fake model {tally.bound}"
    )
    print(f"failures (tracebacks or broken properties): {len(tally.failures)}")
    print(f"inputs whose check + compile took over {args.slow:.1f} s: {len(tally.over)}")
    if tally.bind_seconds:
        ordered = sorted(tally.bind_seconds)
        print(
            f"bind on the fake model: median {ordered[len(ordered) // 2]:.2f} s, "
            f"max {ordered[-1]:.2f} s"
        )
    print("diagnostic codes seen:", dict(sorted(tally.codes.items())))
    print("slowest inputs (check + compile):")
    for seconds, source, text in tally.slowest:
        head = text.strip().splitlines()[:2]
        print(f"  {seconds:.2f} s ({source}): {' | '.join(head)[:100]}")
    return 1 if tally.failures or tally.over else 0


if __name__ == "__main__":
    sys.exit(main())
