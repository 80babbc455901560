"""The command line of ``python -m bench.cadence``: the sweep's flags, and the worker
mode the sweep launches (which imports only what serving needs)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from .trace import VOICE_POLICIES, TraceSettings, session


def load(spec: str) -> Any:
    """``module[:ATTR]`` -> the SessionWorkload (attribute ``SESSIONS`` by default)."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "SESSIONS")


TRACE_FLAGS = (
    "trace_seed", "duration", "period", "ramp", "turn_chunks", "silence", "p_reset", "voices"
)  # fmt: skip


def trace_settings(args: argparse.Namespace) -> TraceSettings:
    """The flags in ``TRACE_FLAGS`` order, which is ``TraceSettings``' field order."""
    values = (getattr(args, k) for k in TRACE_FLAGS)
    return TraceSettings(*(tuple(v) if isinstance(v, list) else v for v in values))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cadence", description="paced sessions per GPU"
    )
    p.add_argument("--workload", required=True, help="module[:ATTR] of a SessionWorkload")
    p.add_argument("--arms", help="comma-separated arms (default: all)")
    p.add_argument("--n", default="1,4,8,16,24,32,36", help="N list for every arm")
    p.add_argument("--arm-n", action="append", default=[], metavar="ARM=N,N", help="own N list")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of trace per run")
    p.add_argument("--period", type=float, default=1.0, help="seconds between chunks of a turn")
    p.add_argument("--deadline-ms", type=float, default=1000.0, help="a later chunk is a miss")
    p.add_argument("--ramp", type=float, default=10.0, help="sessions arrive within this many s")
    p.add_argument("--turn-chunks", type=_ints, default=[3, 12], help="min,max chunks per turn")
    p.add_argument("--silence", type=_floats, default=[1.0, 4.0], help="min,max s between turns")
    p.add_argument("--p-reset", type=float, default=0.5, help="chance a new turn resets")
    p.add_argument("--trace-seed", type=int, default=0)
    p.add_argument(
        "--voices",
        choices=VOICE_POLICIES,
        default="default",
        help="how sessions' voices vary: the workload's few (default), every session its "
        "own (clone), or five fixed voices of five sizes (five)",
    )
    p.add_argument(
        "--references",
        type=_session_range,
        default=range(4),
        help="sessions with a solo reference run: N (the first N) or A:B (sessions A..B-1)",
    )
    p.add_argument("--reference-batch", type=int, default=1, help="sessions per reference process")
    p.add_argument(
        "--reference-repeats",
        type=int,
        default=2,
        help="the first K referenced sessions run solo a second time: is the reference "
        "reproducible? (default 2; 0 skips the check)",
    )
    p.add_argument("--time-budget", type=float, help="seconds for the whole sweep")
    p.add_argument("--setup-estimate", type=float, default=60.0, help="set-up s before one is seen")
    p.add_argument("--setup-timeout", type=float, default=300.0, help="s for workers to get ready")
    p.add_argument("--no-stop-at-miss", dest="stop_at_miss", action="store_false")
    p.add_argument("--rerender", action="store_true", help="re-summarise the JSON at --out")
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpu-index", type=int, default=0, help="NVML index of the device")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", help="output path without suffix (default: results/sessions_<gpu>)")
    p.add_argument("--resume", action="store_true", help="keep the runs in the JSON at --out")
    p.add_argument(
        "--rerun",
        action="store_true",
        help="with --resume: run each (arm, N) again where the JSON has it; the new run "
        "counts, the old one stays in runs",
    )
    p.add_argument("--quiet-workers", action="store_true")
    p.add_argument("--git-commit")
    for flag in ("--worker", "--unpaced"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--arm", "--sessions", "--ready", "--go", "--barrier-timeout"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args._argv = argv
    return args


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _session_range(text: str) -> range:
    a, _, b = text.partition(":")
    return range(int(a), int(b)) if b else range(int(a))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wl = load(args.workload)
    if not args.worker:
        from . import sweep

        return sweep.run(wl, args)
    from . import serve

    specs = [session(trace_settings(args), i) for i in _ints(args.sessions)]
    args.ready, args.go = (Path(x) if x else None for x in (args.ready, args.go))
    args.barrier_timeout = float(args.barrier_timeout or 300)
    return 0 if serve.worker_main(wl, args, specs)["status"] == "ok" else 1
