"""The command line every workload shares: ``python -m bench.<workload> [flags]``.

Step counts are named after the workload's unit (``--chunks``, ``--split-chunks``,
``--profile-chunks``; ``--frames``, ``--profile-frames``); the workload adds its own
flags. ``--quick`` applies the workload's CPU smoke settings (explicit flags win).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from .workload import Workload

REPORT_RESERVE_S = 15.0  # kept back under --time-budget for writing .json/.md/.png


def _cells_arg(wl: Workload):  # noqa: ANN202
    def parse(text: str) -> list[str]:
        names = [c.strip() for c in text.split(",") if c.strip()]
        unknown = [c for c in names if c not in wl.by_name]
        if unknown:
            known = ", ".join(wl.by_name)
            raise argparse.ArgumentTypeError(f"unknown cell(s) {unknown}; known: {known}")
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError("a cell is named twice")
        return names

    return parse


# The flags every workload shares: (flag, argparse keywords).
COMMON = (
    ("--blocks", dict(type=int, default=4, help="matched blocks (block b: seed + b)")),
    ("--device", dict(help="cuda or cpu (default: cuda if available)")),
    ("--seed", dict(type=int, default=0, help="seed of block 0")),
    ("--threads", dict(type=int, help="torch.set_num_threads in workers")),
    ("--out", dict(help="output path without suffix (.json, .md, .png)")),
    ("--worker-timeout", dict(type=float, default=600.0, help="seconds per worker")),
    ("--quiet-workers", dict(action="store_true", help="do not echo worker stderr")),
    ("--time-budget", dict(type=float, metavar="S", help="seconds for this call (driver.py)")),
    ("--merge", dict(action="store_true", help="add this call's cells to the JSON at --out")),
    ("--missing-only", dict(action="store_true", help="run only pairs without an ok result")),
    (
        "--no-reference-repeat",
        dict(
            action="store_true",
            help="skip the reference's second fresh run per block (then its reproducibility, "
            "and so every exact result, is unchecked)",
        ),
    ),
    ("--git-commit", dict(help="commit to record when the tree has no .git")),
    ("--rerender", dict(metavar="JSON", help="re-aggregate a result JSON; runs nothing")),
    ("--worker", dict(action="store_true", help=argparse.SUPPRESS)),
    ("--cell", dict(help=argparse.SUPPRESS)),
    ("--block", dict(type=int, default=0, help=argparse.SUPPRESS)),
)


def parser(wl: Workload) -> argparse.ArgumentParser:
    u = wl.unit
    p = argparse.ArgumentParser(prog=f"python -m {wl.module}", description=wl.description)
    cells = "; ".join(f"{c.name}: {c.what}" for c in wl.cells)
    p.add_argument("--cells", type=_cells_arg(wl), help=f"comma-separated cells. {cells}")
    p.add_argument(f"--{u}s", type=int, help=f"{u}s measured per block")
    p.add_argument("--warmup", type=int, help=f"{u}s streamed before the window")
    if "split" in wl.dests():
        p.add_argument(f"--split-{u}s", type=int, help="steps of the part-by-part pass")
    p.add_argument(f"--profile-{u}s", type=int, help=f"{u}s of the torch.profiler pass (CUDA)")
    for flag, kwargs in COMMON:
        p.add_argument(flag, **kwargs)
    quick = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in wl.quick.items())
    p.add_argument("--quick", action="store_true", help=f"CPU smoke settings: {quick}")
    for flag, kwargs in wl.flags.items():
        p.add_argument(flag, **kwargs)
    p.set_defaults(cells=[c.name for c in wl.cells], out=f"bench/results/{wl.name}_h200")
    p.set_defaults(**wl.defaults)
    return p


def parse_args(wl: Workload, argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = parser(wl)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    given = {a.split("=")[0] for a in argv if a.startswith("--")}
    if args.quick:
        for dest, value in wl.quick.items():
            if "--" + dest.replace("_", "-") not in given:
                setattr(args, dest, value)
    if args.device is None and not args.rerender:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    for phase, dest in wl.dests().items():
        least = 1 if phase == "window" else 0
        if getattr(args, dest) is None or getattr(args, dest) < least:
            p.error(f"--{dest.replace('_', '-')} must be >= {least}")
    if args.blocks < 1:
        p.error("--blocks must be >= 1")
    if args.worker and args.cell not in wl.by_name:
        p.error("--worker needs --cell")
    if args.time_budget is not None and args.time_budget <= REPORT_RESERVE_S:
        p.error(f"--time-budget must be > {REPORT_RESERVE_S:.0f} s")
    args.merge = args.merge or args.missing_only
    args._argv = argv
    return args


def main(wl: Workload, argv: Sequence[str] | None = None) -> int:
    """A worker imports only what it runs (no pandas/scipy/matplotlib); the driver all."""
    args = parse_args(wl, argv)
    if args.worker:
        from .worker import worker_main

        result = worker_main(wl, args)
        if result["status"] != "ok":
            # The result is out; whatever a failed cell left running (an interrupted
            # inductor compile's pool) must not hold the exit.
            sys.stderr.flush()
            os._exit(0)
        return 0
    from .document import rerender
    from .driver import drive

    return rerender(wl, Path(args.rerender)) if args.rerender else drive(wl, args)
