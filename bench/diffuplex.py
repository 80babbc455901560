"""DiffuPlex's rolling wakes vs Moshi's autoregressive loop (issue 26, seeds/002).

    python -m bench.diffuplex --device cuda --frames 1000 --warmup 4 --time-budget 560 \\
        --cells ar_vendor,w1,ar_adapter,w16,w16_adapter --out bench/results/diffuplex_h200
    python -m bench.diffuplex --device cuda --frames 1000 --warmup 4 --merge \\
        --cells w8,w8_adapter,ar_eager --out bench/results/diffuplex_h200
    python -m bench.diffuplex --quick     # CPU smoke: the tiny LM

One step is one 80 ms frame of the server's loop body (``bench.workloads.moshi.step_frame``:
Mimi encode, the LM, Mimi decode; 7B LM bf16 + Mimi fp32, seeded random weights, batch 1,
greedy). The AR cells step the vendor's ``LMGen``; the wake cells step
``bench.workloads.moshi_wake.RollingWakes`` over the same model, its decisions from the
seeded schedule of ``--policy`` (calibrated to the paper's frames per wake), the same in
every wake cell of a block. Cells:

* ``ar_vendor`` (the reference: the vendor's loop as its server runs it, its CUDA graphs
  on), ``ar_eager`` (its graphs off), ``ar_adapter`` (contracts/moshi.clock: Mimi and the
  whole LM step graphed);
* ``w1``: the rolling loop at W = 1, its two LM calls through the vendor's ``CUDAGraphed``
  as ``LMGen`` wraps them: it must equal ``ar_vendor`` bit for bit (token IDs and float32
  PCM; the CPU tests compare the eager loops);
* ``w8``, ``w16``: W = 8 / 16, the LM eager; ``w8_adapter``, ``w16_adapter``: the wake's
  backbone and depformer graphed by contracts/moshi_wake.clock, each exact against its
  eager cell (W > 1 is another algorithm than AR and is not compared with it). In the
  wake cells Mimi runs under the vendor's own CUDA graphs (as deployed; the loop does
  not step ``LMGen``, so none of its LM graphs runs);
* ``w16_rule``: the sanity arm, W = 16 graphed with retention by the paper's confidence
  rule on the wake's own text at ``--rule-threshold`` (random weights: lowered).

Besides each frame's wall (the harness's window), the LM is timed by CUDA events around
each LM call, by part: an AR step's backbone and depformer calls (the vendor's two
``CUDAGraphed`` calls; our adapter's step is one graph, timed whole), and a whole wake
(its backbone call, its retained frames' text sampling and one depformer call over
them), recorded with its query length, with its depformer call timed inside it
(``wake_depformer``, with its rows r); the report gives wake p50/p99 per query length,
the LM time per second of interaction and a wake's cost against an AR step, and the
wake decisions (c, r, k) of every cell.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.harness import Cell, WorkerContext, Workload, main, replay
from bench.harness.document import ok_results
from bench.moshi import COMPILE_ENV, VENDOR_GRAPH_ENV
from bench.moshi import WORKLOAD as AR_WORKLOAD
from bench.workloads import moshi as moshi_workload
from bench.workloads import subseed

FRAME_MS = 80.0
NESTED = {"wake_depformer"}  # parts timed inside another part (a wake's depformer call)
WINDOWS = (8, 16)
HEADLINE_WINDOW = 16


def _wake_cells() -> tuple[Cell, ...]:
    out = []
    for w in WINDOWS:
        out.append(
            Cell(
                f"w{w}",
                f"rolling wakes W = {w}, the LM eager; Mimi under the vendor's graphs",
                env={VENDOR_GRAPH_ENV: None},
            )
        )
        out.append(
            Cell(
                f"w{w}_adapter",
                f"w{w} with the wake's backbone and depformer graphed "
                "(bench.workloads.moshi_wake.bind_adapter)",
                env={VENDOR_GRAPH_ENV: None},
                exact_against=f"w{w}",
            )
        )
    return tuple(out)


CELLS = (
    Cell(
        "ar_vendor",
        "LMGen.step loop as the vendor's server runs it, its CUDAGraphed wrappers on "
        "(the reference)",
        env={VENDOR_GRAPH_ENV: None},
    ),
    Cell(
        "ar_eager",
        "LMGen.step loop, vendor graphs off (NO_CUDA_GRAPH=1)",
        env={VENDOR_GRAPH_ENV: "1"},
    ),
    Cell(
        "ar_adapter",
        "LMGen.step loop, vendor graphs off + the generated Moshi adapter",
        env={VENDOR_GRAPH_ENV: "1"},
    ),
    Cell(
        "w1",
        "rolling wakes W = 1, through the vendor's CUDAGraphed wrappers as LMGen: equal to "
        "ar_vendor",
        env={VENDOR_GRAPH_ENV: None},
    ),
    *_wake_cells(),
    Cell(
        "w16_rule",
        "sanity arm: W = 16 graphed, retention by the paper's confidence rule on the wake's "
        "own text (moshi_wake.ConfidenceRule at --rule-threshold; random weights: the "
        "threshold lowered), revisions from the schedule; compared with no other cell",
        env={VENDOR_GRAPH_ENV: None},
        exact_against="w16_rule",  # its own reference: another algorithm and another rule
    ),
)


def window_of(cell: str) -> int | None:
    """A wake cell's W (None for an AR cell)."""
    return None if cell.startswith("ar_") else int(cell[1:].split("_")[0])


class LMTimer:
    """CUDA events (the host clock on a CPU) around each LM call, kept per phase as
    [part, query length, ms]: the harness calls ``after(phase)`` at each phase's end, and
    the calls since the last one belong to that phase."""

    def __init__(self, device: Any) -> None:
        import torch

        self.cuda = device.type == "cuda"
        self.event = lambda: torch.cuda.Event(enable_timing=True)
        self.pending, self.by_phase = [], {}

    def wrap(self, fn: Any, part: str, query: Any = lambda *args, **kwargs: 1) -> Any:
        """``fn`` timed as ``part``; ``query(*args, **kwargs)``, given the call's own
        arguments, gives its query length (or its rows)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.event() if self.cuda else time.perf_counter()
            if self.cuda:
                start.record()
            out = fn(*args, **kwargs)
            end = self.event() if self.cuda else time.perf_counter()
            if self.cuda:
                end.record()
            self.pending.append((part, query(*args, **kwargs), start, end))
            return out

        return timed

    def close(self, phase: str) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        ms = lambda a, b: a.elapsed_time(b) if self.cuda else (b - a) * 1e3  # noqa: E731
        self.by_phase[phase] = [[part, q, ms(a, b)] for part, q, a, b in self.pending]
        self.pending = []


class DiffuplexRun:
    """One (block, cell): Mimi and the LM built, the AR loop or the rolling wakes."""

    def __init__(self, ctx: WorkerContext) -> None:
        import os

        if moshi_workload.unavailable_reason():
            raise RuntimeError(moshi_workload.unavailable_reason())
        if not os.environ.get(COMPILE_ENV):
            raise RuntimeError(f"{COMPILE_ENV} is not set: torch.compile would differ by cell")
        self.ctx, self.model, self.loop = ctx, None, None
        self.timer: LMTimer | None = None  # set up with the cell (setup)
        self.window = window_of(ctx.cell.name)
        ctx.result["moshi"] = moshi_workload.installed_version()
        self.inputs = iter(moshi_workload.pcm_stream(ctx.args.seed, ctx.n_steps))

    def build(self) -> None:
        import torch

        from bench.workloads import moshi_wake as MW

        M, args, ar = moshi_workload, self.ctx.args, self.window is None
        kwargs = M.TINY_LM_KWARGS if args.tiny else M.FULL_7B
        self.mimi, self.lm_gen = M.build_moshi(
            args.seed, self.ctx.device, torch.bfloat16, kwargs, greedy=True, start=ar
        )
        self.model = self.mimi
        if not ar:  # the loop steps the LM's own stream, not LMGen's
            self.mimi.streaming_forever(1)
            self.lm_gen.lm_model.streaming_forever(1)
            if self.ctx.cell.name.endswith("_rule"):
                pad = self.lm_gen.lm_model.existing_text_padding_id
                schedule = MW.ConfidenceRule(
                    subseed(args.seed, 4), self.window, args.policy, args.rule_threshold, pad
                )
            else:
                schedule = getattr(MW.Schedule, args.policy)(subseed(args.seed, 4), self.window)
            self.loop = MW.RollingWakes(self.lm_gen, self.window, schedule, seed=args.seed)
        lm = self.lm_gen.lm_model
        self.ctx.result["model"] = {
            "lm_kwargs": "TINY" if args.tiny else "FULL_7B",
            "lm_params": sum(p.numel() for p in lm.parameters()),
            "lm_layers": len(lm.transformer.layers),
            "greedy": True,
            "batch": 1,
        }

    def setup(self) -> Any:
        from bench.workloads import moshi_wake as MW

        cell, binding = self.ctx.cell.name, None
        if cell == "ar_adapter":
            binding = moshi_workload.bind_adapter(self.mimi, self.lm_gen, self.ctx.device)
        elif cell.endswith(("_adapter", "_rule")):
            binding = MW.bind_adapter(self.loop, self.ctx.device)
        self.timer = timer = LMTimer(self.ctx.device)
        if cell == "ar_adapter":  # one graph for the whole LM step
            self.lm_step = timer.wrap(self.lm_gen.step, "step")
        elif self.loop is None:  # the vendor's two calls, as LMGen._step makes them
            state = self.lm_gen._streaming_state
            state.graphed_main = timer.wrap(state.graphed_main, "backbone")
            state.graphed_depth = timer.wrap(state.graphed_depth, "depformer")
            self.lm_step = self.lm_gen.step
        else:  # a wake (query length: c realized + W - 1 masked) and its depformer call
            loop = self.loop
            query = lambda: loop.wakes[-1].c + loop.window - 1  # noqa: E731
            # a wake is timed whole (its backbone call, sampling and the depformer over its
            # r retained frames), and its depformer call inside it (NESTED), with r
            rows = lambda t, texts, outs: len(texts)  # noqa: E731
            loop._voice = timer.wrap(loop._voice, "wake_depformer", rows)  # _wake calls it
            loop._wake = timer.wrap(loop._wake, "wake", query)  # tick() calls self._wake()
            self.lm_step = loop.tick
        return binding

    def step(self) -> dict:
        M = moshi_workload
        toks, outs = M.step_frame(self.mimi, self.lm_gen, next(self.inputs), step=self.lm_step)
        assert len(toks) == len(outs) <= 1, "one LM step per 1920-sample frame"
        return {"tokens": toks[0] if toks else None, "pcm": outs[0] if outs else None}

    def after(self, phase: str) -> None:
        if self.timer is not None:  # build's end comes before setup
            self.timer.close(phase)

    def finish(self, result: dict) -> None:
        result["lm_calls_by_phase"] = self.timer.by_phase
        if self.loop is not None:
            result["wakes"] = [[w.tick, w.c, w.r, w.k] for w in self.loop.wakes]
            result["window"] = self.window


# ------------------------------------------------------------------ the document
def _ok(doc: dict, cell: str) -> list[dict]:
    return [r for r in ok_results(doc, cell) if r]


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def lm_calls(doc: dict, cell: str) -> list[list]:
    """[part, query length, ms] of every LM call in ``cell``'s measured windows."""
    return [c for r in _ok(doc, cell) for c in r["lm_calls_by_phase"].get("window", [])]


def _calls(ms: list[float], seconds: float) -> dict:
    return {
        "calls": len(ms),
        "p50_ms": _pct(ms, 50),
        "p99_ms": _pct(ms, 99),
        "over_80ms": sum(m > FRAME_MS for m in ms) / len(ms) if ms else None,
        "ms_per_s": sum(ms) / seconds if seconds else None,
    }


def cell_lm(doc: dict, cell: str) -> dict:
    """``cell``'s LM calls in the window, per part (an AR cell's ``backbone`` and
    ``depformer``, or its graphed ``step``; a wake cell's whole ``wake`` and, inside it,
    its ``wake_depformer`` call): p50/p99, the fraction over 80 ms, ms per second of
    interaction (80 ms frames), and per query length for wakes; ``lm_ms_per_s``: all
    parts but the NESTED ones (already inside another)."""
    calls = lm_calls(doc, cell)
    seconds = sum(len(r["window_ms"]) for r in _ok(doc, cell)) * FRAME_MS / 1e3
    parts: dict[str, list[float]] = {}
    by_q: dict[int, list[float]] = {}
    for part, q, m in calls:
        parts.setdefault(part, []).append(m)
        if part == "wake":
            by_q.setdefault(int(q), []).append(m)
    return {
        "parts": {p: _calls(ms, seconds) for p, ms in parts.items()},
        "lm_ms_per_s": (
            sum(m for part, _, m in calls if part not in NESTED) / seconds if seconds else None
        ),
        "wake_by_query": {
            q: {"n": len(v), "p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)}
            for q, v in sorted(by_q.items())
        },
    }


def frames_per_wake(doc: dict, cell: str) -> float | None:
    """Frames played per wake over every wake of ``cell``'s streams (its last wake's
    frames, cut by the stream's end, left out)."""
    wakes = [w for r in _ok(doc, cell) for w in r.get("wakes", [])[:-1]]
    return sum(w[3] for w in wakes) / len(wakes) if wakes else None


def replay_checks(doc: dict) -> dict:
    """Per graphed wake cell: its bytes equal its eager cell's (the harness's exact), its
    decisions too, every call replayed (none eager, warm-up included), and the catalog
    captured against the query lengths the eager cell met."""
    out = {}
    for w in WINDOWS:
        cell, eager = f"w{w}_adapter", f"w{w}"
        if not _ok(doc, cell):
            continue
        pairs = list(zip(_ok(doc, cell), _ok(doc, eager)))
        counts = replay.summary(_ok(doc, cell)) or {}  # the harness's, over every phase
        met = {
            q
            for r in _ok(doc, eager)
            for calls in r["lm_calls_by_phase"].values()
            for part, q, _ in calls
            if part == "wake"
        }
        out[cell] = {
            "bytes_equal": doc["cells"].get(cell, {}).get("exact"),
            "decisions_equal": bool(pairs) and all(a["wakes"] == b["wakes"] for a, b in pairs),
            "eager_calls": sum((counts.get("misses") or {}).values()),
            "classes_captured": {
                n: c["captured_classes"] for n, c in (counts.get("callables") or {}).items()
            },
            "query_lengths_met": sorted(int(q) for q in met),
        }
    return out


def headline(doc: dict) -> dict:
    """The issue's top-level keys (module docstring), from the finished document."""
    cells = [c.name for c in CELLS if _ok(doc, c.name)]
    lm = {c: cell_lm(doc, c) for c in cells}
    checks = replay_checks(doc)
    part = lambda c, p, k: ((lm.get(c) or {}).get("parts", {}).get(p) or {}).get(k)  # noqa: E731
    total = lambda c: (lm.get(c) or {}).get("lm_ms_per_s")  # noqa: E731
    ratio = lambda a, b: a / b if a and b else None  # noqa: E731
    top = f"w{HEADLINE_WINDOW}_adapter"
    return {
        "w1_equals_lmgen": doc["cells"].get("w1", {}).get("exact") if "w1" in cells else None,
        "replay_equals_eager": (
            all(
                c["bytes_equal"] and c["decisions_equal"] and not c["eager_calls"]
                for c in checks.values()
            )
            if checks
            else None
        ),
        "replay_checks": checks,
        "wake_p99_ms_w16": part(top, "wake", "p99_ms"),
        "frames_per_wake": {c: frames_per_wake(doc, c) for c in cells if window_of(c)},
        # the LM (backbone and depformer) per second of interaction, our graphed AR step
        # (and the vendor's graphed one) against the graphed wakes; the backbone alone
        # (a wake less its depformer call), the vendor's graphed AR backbone
        "lm_time_ratio_ar_adapter_vs_w16_adapter": ratio(total("ar_adapter"), total(top)),
        "lm_time_ratio_ar_vendor_vs_w16_adapter": ratio(total("ar_vendor"), total(top)),
        "backbone_time_ratio_ar_vendor_vs_w16_adapter": ratio(
            part("ar_vendor", "backbone", "ms_per_s"),
            _minus(part(top, "wake", "ms_per_s"), part(top, "wake_depformer", "ms_per_s")),
        ),
        # a whole wake against a whole AR step (the vendor's backbone and depformer), p50
        "wake_cost_vs_ar_step": ratio(
            part(top, "wake", "p50_ms"),
            _plus(
                part("ar_vendor", "backbone", "p50_ms"), part("ar_vendor", "depformer", "p50_ms")
            ),
        ),
        "lm_calls": lm,
    }


def describe(doc: dict) -> list[str]:
    lines = [
        f"- policy {doc['settings'].get('policy')}; W = 1 equals LMGen (tokens, PCM): "
        f"{doc.get('w1_equals_lmgen')}; graphed wakes equal eager (bytes, decisions, no "
        f"eager call): {doc.get('replay_equals_eager')}",
        f"- wake p99 at W = 16 (graphed): {_fmt(doc.get('wake_p99_ms_w16'))} ms; LM time "
        "per interaction second, ar_adapter / w16_adapter: "
        f"{_fmt(doc.get('lm_time_ratio_ar_adapter_vs_w16_adapter'))}x, ar_vendor / "
        f"w16_adapter: {_fmt(doc.get('lm_time_ratio_ar_vendor_vs_w16_adapter'))}x; "
        "backbone alone, "
        "ar_vendor / w16_adapter: "
        f"{_fmt(doc.get('backbone_time_ratio_ar_vendor_vs_w16_adapter'))}x; a graphed "
        f"wake's p50 (with its depformer call) vs the vendor's graphed AR step: "
        f"{_fmt(doc.get('wake_cost_vs_ar_step'))}x",
        "",
        "| cell | frames per wake | LM part | calls | p50 ms | p99 ms | calls over 80 ms "
        "| ms per interaction s |",
        "|:--|--:|:--|--:|--:|--:|--:|--:|",
    ]
    fpw = doc.get("frames_per_wake") or {}
    for c, s in (doc.get("lm_calls") or {}).items():
        frames = _fmt(fpw.get(c, 1.0 if c.startswith("ar_") else None))
        for p, v in s["parts"].items():
            name = f"{p} (inside wake)" if p in NESTED else p
            lines.append(
                f"| {c} | {frames} | {name} | {v['calls']} | {_fmt(v['p50_ms'])} "
                f"| {_fmt(v['p99_ms'])} | {_fmt(v['over_80ms'])} | {_fmt(v['ms_per_s'])} |"
            )
        lines.append(f"| {c} | {frames} | **all** | | | | | {_fmt(s['lm_ms_per_s'])} |")
    lines += ["", "Wake p50 / p99 ms per query length (q = c + W - 1):", ""]
    for c, s in (doc.get("lm_calls") or {}).items():
        if (window_of(c) or 0) > 1 and s["wake_by_query"]:
            per = ", ".join(
                f"q{q} {_fmt(v['p50_ms'])}/{_fmt(v['p99_ms'])} (n {v['n']})"
                for q, v in s["wake_by_query"].items()
            )
            lines.append(f"- {c}: {per}")
    return lines


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _plus(a: float | None, b: float | None) -> float | None:
    return a + b if a is not None and b is not None else None


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:.3g}"


WORKLOAD = Workload(
    name="diffuplex",
    unit="frame",
    cells=CELLS,
    reference="ar_vendor",
    ratio_refs=("ar_vendor", "ar_adapter"),
    start=DiffuplexRun,
    streams=AR_WORKLOAD.streams,  # token IDs and float32 PCM, as bench.moshi hashes them
    title=lambda doc: f"DiffuPlex rolling wakes on Moshi (moshi {doc.get('moshi')}, LM "
    f"{(doc.get('model') or {}).get('lm_kwargs')} bfloat16, Mimi float32, seeded random "
    "weights, batch 1, greedy)",
    description="DiffuPlex's rolling multi-frame wakes over moshi 0.2.13's LM (W = 1, 8, "
    "16; eager and graphed by a generated contract) against the vendor's autoregressive "
    "LMGen loop (eager, vendor graphs, the generated Moshi adapter).",
    defaults={"frames": 64, "warmup": 4, "profile_frames": 0},
    quick={
        "device": "cpu",
        "tiny": True,
        "blocks": 1,
        "warmup": 1,
        "frames": 24,
        "profile_frames": 0,
        "cells": ["ar_vendor", "w1", "w8", "w8_adapter"],
        "threads": 1,
        "out": "bench/results/diffuplex_quick",
        "worker_timeout": 300.0,
    },
    base_env=AR_WORKLOAD.base_env,
    determinism=AR_WORKLOAD.determinism,
    flags={
        "--tiny": AR_WORKLOAD.flags["--tiny"],
        "--policy": dict(
            default="listen",
            choices=["listen", "speak"],
            help="the seeded wake schedule (moshi_wake.Schedule): the paper's Listen or "
            "Speak policy, calibrated",
        ),
        "--rule-threshold": dict(
            type=float,
            default=0.0,
            help="the sanity arm's confidence threshold (w16_rule; the paper's is 0.80, "
            "which a random model's ~1/vocabulary probabilities never reach)",
        ),
    },
    measure_flags=("tiny", "policy", "rule_threshold"),
    doc_keys=("moshi", "model"),
    settings=lambda args: {
        "tiny": args.tiny,
        "policy": args.policy,
        "rule_threshold": args.rule_threshold,
        "lm_dtype": "bfloat16",
        "mimi_dtype": "float32",
        "batch": 1,
        "greedy": True,
    },
    headline=headline,
    describe=describe,
    deadline_ms=FRAME_MS,
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
