"""The driver: matched blocks of fresh worker processes into one result document.

Block ``b`` seeds everything the workload seeds with ``seed + b``, the same for every
cell; its cell order is rotated left by ``b`` (a cyclic Latin square); every (block,
cell) runs in a fresh process. The document (``<out>.json``) is rewritten after every
worker, with its table and plot (``.md``, ``.png``) at the end.

* ``--merge`` adds this call's cells to the document at ``--out`` (refused unless the
  device, seed, step counts and measurement flags agree): a cell run again replaces
  its earlier result per block (kept under ``replaced``), cells pair by block whichever
  call ran them, ``calls`` lists every call. ``--missing-only`` launches only pairs
  without an ok result.
* The one time-budget policy (``--time-budget S``): a worker starts only if what is
  left of ``S`` (less 15 s for the reports) covers the slowest worker of that cell seen
  so far, else of any cell (or the workload's first-worker estimate, if larger); its
  timeout is capped by what is left. One not started is ``"skipped"``.
* A cell that reports ``"failed"`` is not launched in later blocks of the call;
  CUDA-only cells are not launched with ``--device cpu``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from . import document
from .cli import REPORT_RESERVE_S
from .process import WorkerProcess, git_info, write_json
from .stats import median, rotate
from .workload import Workload


def say(*parts: str) -> None:
    print("".join(parts), file=sys.stderr)


def worker_command(
    wl: Workload, args: argparse.Namespace, cell: str, block: int, seed: int, timeout: float
) -> list[str]:
    flags = {"cell": cell, "block": block, "seed": seed, "device": args.device}
    flags.update({d: getattr(args, d) for d in [*wl.dests().values(), *wl.own_dests]})
    flags.update(worker_timeout=round(timeout), threads=args.threads)
    cmd = [sys.executable, "-m", wl.module, "--worker"]
    for dest, value in flags.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not None and value is not False:
            cmd += [flag, str(value)]
    return cmd


def run_cell_process(
    wl: Workload, args: argparse.Namespace, cell: str, block: int, seed: int, timeout: float
) -> dict:
    """One fresh worker process; its JSON result or a failure record."""
    budget = f", --time-budget {args.time_budget:.0f}" if args.time_budget else ""
    cmd, env = worker_command(wl, args, cell, block, seed, timeout), document.cell_env(wl, cell)
    proc = WorkerProcess(cmd, env, label=f"block {block} {cell}", quiet=args.quiet_workers)
    why = f"worker exceeded its timeout of {timeout:.0f} s (--worker-timeout "
    why += f"{args.worker_timeout:.0f}{budget})"
    return {"cell": cell, "block": block, "seed": seed, **proc.result(timeout, why)}


def estimate_worker_s(
    cell: str, blocks: Sequence[dict], first: Mapping[str, float] = {}
) -> float | None:
    """Seconds the next worker of ``cell`` is expected to take (the module docstring)."""
    ran = [
        (c, float(r["process_wall_s"]))
        for b in blocks
        for c, r in (b.get("results") or {}).items()
        if r.get("process_wall_s") is not None and r.get("status") != "skipped"
    ]
    own = [w for c, w in ran if c == cell]
    if own:
        return max(own)
    floor = [first[cell]] if cell in first else []
    return max([w for _, w in ran] + floor) if ran or floor else None


class Budget:
    """``--time-budget``: whether the next worker may start, and its timeout."""

    def __init__(self, args: argparse.Namespace, first: Mapping[str, float]) -> None:
        self.seconds, self.timeout, self.first = args.time_budget, args.worker_timeout, first
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def decide(self, cell: str, blocks: Sequence[dict]) -> tuple[str | None, float, float | None]:
        """(why not to launch, or None; the worker's timeout; the estimate)."""
        est = estimate_worker_s(cell, blocks, self.first)
        if not self.seconds:
            return None, self.timeout, est
        left = self.seconds - REPORT_RESERVE_S - self.elapsed()
        if est is not None and left < est:
            why = f"{left:.0f} s left of --time-budget {self.seconds:.0f} s, worker estimate {est:.0f} s"
            return f"not launched: {why}", 0.0, est
        return None, max(1.0, min(self.timeout, left)), est


def place(block: dict, cell: str, res: dict) -> bool:
    """Put a result in its block; a launched one replaces an earlier call's (kept under
    ``replaced``), a skip record never replaces anything. True if placed."""
    old = block["results"].get(cell)
    if res.get("status") == "skipped" and old is not None:
        return False
    if old is not None:
        block.setdefault("replaced", []).append(old)
    block["results"][cell] = res
    return True


class Call:
    """One driver call writing into the document at ``--out``."""

    def __init__(
        self,
        wl: Workload,
        args: argparse.Namespace,
        cells: list[str],
        not_run: dict[str, str],
        prior: dict | None,
    ) -> None:
        self.wl, self.args, self.cells, self.not_run = wl, args, cells, not_run
        prior = prior or {}
        self.blocks = document.merge_blocks(prior.get("blocks") or [], args.blocks, args.seed)
        self.calls = list(prior.get("calls") or [])
        if prior and not self.calls:  # a document from before calls were kept
            self.calls = [{"command": c} for c in prior.get("commands") or [prior.get("command")]]
        self.index = len(self.calls)
        self.record: dict[str, Any] = {
            "index": self.index,
            "command": f"python -m {wl.module} " + shlex.join(args._argv),
            "cells": cells,
            "blocks": args.blocks,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **git_info(args.git_commit),
            "time_budget_s": args.time_budget,
            "launched": 0,
            "skipped": [],
            "complete": False,
        }
        self.calls.append(self.record)
        self.budget = Budget(args, wl.first_worker_est_s)
        self.failed: dict[str, str] = {}  # cell -> why it is not launched again

    def write(self, complete: bool) -> dict:
        rec, results = self.record, [r for b in self.blocks for r in b["results"].values()]
        rec.update(wall_s=self.budget.elapsed(), complete=complete)
        mine = [r for r in results if r.get("call") == self.index and r.get("hostname")]
        rec["hosts"] = sorted({r["hostname"] for r in mine})
        cells = document.cells_in(self.wl, self.blocks, self.cells)
        doc = document.build(self.wl, self.args, self.blocks, self.calls, cells, self.not_run)
        doc["wall_s"] = sum(float(c.get("wall_s") or 0.0) for c in self.calls)
        doc["complete"] = complete
        budget = [s["why"] for s in rec["skipped"] if "--time-budget" in s["why"]]
        doc["budget_stop"] = budget[0] if budget else None
        write_json(document.artefact(self.args.out, ".json"), doc)
        return doc

    def run_block(self, bi: int) -> None:
        seed = self.args.seed + bi
        block = next(b for b in self.blocks if int(b["block"]) == bi)
        order = rotate(self.cells, bi)
        block.setdefault("orders", []).append({"call": self.index, "order": order})
        block["order"] = block.get("order") or order
        for cell in order:
            tag = f"{self.wl.module}: block {bi + 1}/{self.args.blocks} seed {seed} cell {cell}"
            old = block["results"].get(cell) or {}
            if self.args.missing_only and old.get("status") == "ok":
                say(tag, f": kept (ok in call {old.get('call', 0)})")
                continue
            skip, timeout, est = self.budget.decide(cell, self.blocks)
            skip = f"not launched: {self.failed[cell]}" if cell in self.failed else skip
            if skip:
                rec = {"status": "skipped", "error": skip, "cell": cell, "block": bi, "seed": seed}
                placed = place(block, cell, {**rec, "call": self.index})
                self.record["skipped"].append({"block": bi, "cell": cell, "why": skip})
                say(tag, f": {skip}", "" if placed else " (earlier result kept)")
                continue
            say(tag, f" (elapsed {self.budget.elapsed():.0f} s, estimate {est or 0:.0f} s)")
            res = run_cell_process(self.wl, self.args, cell, bi, seed, timeout)
            place(block, cell, {**res, "call": self.index})
            self.record["launched"] += 1
            self.log(bi, cell, res)
            self.write(False)
            if cell == self.wl.reference and not self.args.no_reference_repeat:
                self.repeat_reference(bi, seed, block)

    def repeat_reference(self, bi: int, seed: int, block: dict) -> None:
        """The reference again, in a fresh process with the same seed and inputs: a cell is
        only exact against a reference that reproduces itself (stats.reference_check)."""
        ref, old = self.wl.reference, block.get("reference_repeat") or {}
        first = block["results"].get(ref) or {}
        tag = f"{self.wl.module}: block {bi + 1}/{self.args.blocks} {ref} again"
        if first.get("status") != "ok" or (self.args.missing_only and old.get("status") == "ok"):
            return
        skip, timeout, _ = self.budget.decide(ref, self.blocks)
        if skip:
            self.record["skipped"].append({"block": bi, "cell": f"{ref} (again)", "why": skip})
            say(tag, f": {skip}; its reproducibility is unchecked")
            return
        say(tag, " (is the reference reproducible?)")
        res = run_cell_process(self.wl, self.args, ref, bi, seed, timeout)
        block["reference_repeat"] = {**res, "call": self.index}
        self.record["launched"] += 1
        self.log(bi, f"{ref} (again)", res)
        self.write(False)

    def log(self, bi: int, cell: str, res: dict) -> None:
        msg = str(res.get("status"))
        if res.get("status") == "ok":
            shas = " ".join(f"{s.name} {str(res.get(s.key))[:12]}" for s in self.wl.streams)
            msg += f" p50 {median(res.get('window_ms') or []) or 0.0:.1f} ms {shas}"
        else:
            msg += f": {res.get('error')}"
        if res.get("status") == "failed":
            self.failed[cell] = f"failed in block {bi}: {res.get('reason') or res.get('error')}"
        say(f"{self.wl.module}: block {bi} {cell}: {msg} ({res.get('process_wall_s', 0):.0f} s)")


def drive(wl: Workload, args: argparse.Namespace) -> int:
    not_run = {}
    for c in args.cells:
        if args.device.startswith("cpu") and wl.cell(c).needs_cuda:
            not_run[c] = f"needs CUDA; not launched with --device {args.device}"
            say(f"{wl.module}: cell {c} {not_run[c]}")
    cells = [c for c in args.cells if c not in not_run]
    if not cells:
        say(f"{wl.module}: no cell left to run")
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prior = None
    if args.merge and document.artefact(out, ".json").exists():
        prior = json.loads(document.artefact(out, ".json").read_text())
        problems = document.merge_problems(wl, prior, args)
        if problems:
            say(
                f"{wl.module}: --merge refused, {out}.json has other settings: ",
                "; ".join(problems),
            )
            return 2
    call = Call(wl, args, cells, not_run, prior)
    if wl.reference not in document.cells_in(wl, call.blocks, cells):
        say(f"{wl.module}: {wl.reference} is not among the cells: no ratios, no exactness")
    for bi in range(args.blocks):
        call.run_block(bi)
    document.write_reports(wl, call.write(True), out)
    say(f"wrote {out}.json, {out}.md, {out}.png")
    return 0
