"""AS2D (issue 25, seeds/001) on transformers 4.57.6 Whisper: decoupled drafting and
verification against target-only and serial speculative decoding, eager and graphed.

    python -m bench.as2d --device cuda --blocks 1 --requests 12 --warmup 1 \\
        --tokens-per-request 160 --source oracle --epsilon 0.22 \\
        --out bench/results/as2d_h200

The loops are bench/workloads/whisper_as2d.py's (read its docstring), over the target at
whisper-large-v3's shape and a drafter at whisper-tiny's widths (seeded random weights,
fp32, static caches, batch 1). One step is one request: its features are encoded, its
prompt prefilled, ``--tokens-per-request`` token IDs committed (the step's output, hashed;
its time is the request's latency from arrival). The cells:

* ``stock``        target alone, eager: the reference (greedy, width-1 calls).
* ``adapter``      target alone, graphed (contracts/whisper_decoder.clock).
* ``hf_generate``  the vendor's own ``generate()`` greedy (its DynamicCache), eager.
* ``hf_assisted``  the vendor's ``generate(assistant_model=drafter)``: its serial
  speculative decoding with the real (random) drafter, eager (it refuses static caches).
* ``sd`` / ``sd_graphed``         serial speculative decoding, eager / both graphed.
* ``as2d`` / ``as2d_graphed``     decoupled (AS2D), eager / both graphed
  (contracts/whisper_drafter.clock for the drafter).

``--budget-policy cost`` makes the decoupled cells verify, each round, the number of
ready candidates with the most expected tokens per millisecond (``whisper_as2d.Budget``),
on a table of the cell's own target call times per width measured at set-up (recorded
as ``call_ms_by_width``); ``fixed`` (default) verifies all of them up to ``--budget``.

Two exactness tiers. Tier 2, every cell: a request's tokens equal the target's greedy
ones (the harness compares each step's hash with ``stock``'s; ``target_greedy_match_rate``
counts the requests that match). Tier 1, the graphed cells: after the measured phases one
more request runs live on the graphed models and again on fresh eager ones on the same
round schedule; every token ID, width, accepted count, published candidate and cache
byte at the committed positions must be equal (``replay_equals_eager``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.decoders import catalog_check
from bench.harness import Cell, Stream, WorkerContext, Workload, main
from bench.harness.document import ok_results

TOKENS = Stream(
    "tokens", "int64", key="tokens_sha256", step_key="step_sha256", count_key="n_tokens"
)
GRAPHED = "as2d_graphed"  # the arm of the headline


@dataclass(frozen=True)
class As2dCell(Cell):
    loop: str = "alone"  # whisper_as2d.Arm's loop, or "hf" (the vendor's generate())
    bind: bool = False
    assistant: bool = False  # hf: generate(assistant_model=drafter)


CELLS = (
    As2dCell("stock", "target alone, eager (the reference)"),
    As2dCell("adapter", "target alone, graphed (generated adapter)", loop="alone", bind=True),
    As2dCell("hf_generate", "the vendor's generate() greedy, eager", loop="hf"),
    As2dCell(
        "hf_assisted",
        "the vendor's generate(assistant_model=drafter): serial speculative decoding with "
        "the random drafter, eager",
        loop="hf",
        assistant=True,
    ),
    As2dCell("sd", "serial speculative decoding, eager", loop="serial"),
    As2dCell(
        "sd_graphed",
        "serial speculative decoding, target and drafter graphed",
        loop="serial",
        bind=True,
    ),
    As2dCell("as2d", "AS2D: decoupled drafter thread and verifier, eager", loop="decoupled"),
    As2dCell(
        GRAPHED,
        "AS2D: decoupled drafter thread and verifier, both graphed",
        loop="decoupled",
        bind=True,
    ),
)

FLAGS = {
    "--tokens-per-request": dict(type=int, default=160, help="token IDs a request commits"),
    "--source": dict(
        choices=("oracle", "drafter"),
        default="oracle",
        help="what the drafter publishes: the target's greedy tokens corrupted with "
        "--epsilon (controlled acceptance), or its own argmax (random weights: ~0)",
    ),
    "--epsilon": dict(type=float, default=0.22, help="oracle corruption rate (0.22: ~3 of 8)"),
    "--budget": dict(type=int, default=8, help="candidates verified per round at most (B)"),
    "--budget-policy": dict(
        choices=("fixed", "cost"),
        default="fixed",
        help="how many ready candidates AS2D verifies: all up to --budget (the paper's), or "
        "the number with the most expected tokens per ms at the bound target's measured "
        "call cost per width (whisper_as2d.Budget)",
    ),
    "--dtype": dict(
        choices=("float32", "bfloat16"),
        default="float32",
        help="the models' dtype (bfloat16: the float32 weights rounded; tier 2 may differ)",
    ),
    "--shapes": dict(
        default="large-v3,draft",
        help="target,drafter shapes (transformers_whisper.SHAPES; tiny,draft-tiny: the "
        "CPU smoke run's, their contracts compiled with their widths)",
    ),
}
MEASURE = (
    "tokens_per_request",
    "source",
    "epsilon",
    "budget",
    "budget_policy",
    "dtype",
    "shapes",
)


class As2dRun:
    """One (block, cell): target (and drafter) built, the cell's arm set up."""

    def __init__(self, ctx: WorkerContext) -> None:
        from bench.workloads import transformers_whisper as W
        from bench.workloads import whisper_as2d as A

        reason = W.unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.W, self.A, self.ctx, self.cell, self.args = W, A, ctx, ctx.cell, ctx.args
        self.binding = self.drafter_binding = None
        self.cost_ms: dict[int, float] | None = None  # the cost rule's table (setup)
        self.requests: list[dict] = []
        ctx.result["vendor_version"] = W.installed_version()

    def _arm(self, target: Any, drafter: Any) -> Any:
        a = self.args
        loop = "alone" if self.cell.loop == "hf" else self.cell.loop
        return self.A.Arm(loop, target, drafter, a.source, a.epsilon, a.budget, self.cost_ms)

    def build(self) -> None:
        import torch

        W, a, device = self.W, self.args, self.ctx.device
        self.shapes = a.shapes.split(",")
        self.dtype = getattr(torch, a.dtype)
        self.model = W.build_whisper(self.shapes[0], a.seed, device, self.dtype)
        self.target = W.new_state(self.model)
        uses_drafter = self.cell.loop in ("serial", "decoupled") or self.cell.assistant
        self.drafter_model = None
        if uses_drafter:
            self.drafter_model = W.build_whisper(self.shapes[1], a.seed + 1, device, self.dtype)
        self.drafter = W.new_state(self.drafter_model) if self.drafter_model else None
        self.ctx.result["model"] = {
            "params": sum(p.numel() for p in self.model.parameters()),
            "drafter_params": (
                sum(p.numel() for p in self.drafter_model.parameters())
                if self.drafter_model
                else None
            ),
        }
        # request k's seed; one more for the exactness check after the measured phases
        self.seeds = [W.subseed(a.seed, 100 + k) for k in range(self.ctx.n_steps + 1)]
        self.oracle: dict[int, list[int]] = {}
        if a.source == "oracle" and self.cell.loop in ("serial", "decoupled"):
            n = a.tokens_per_request  # the target's greedy tokens, eager, before binding
            self.oracle = {s: self.A.trajectory(self.target, s, n) for s in self.seeds}
        self.arm = self._arm(self.target, self.drafter)

    def setup(self) -> Any:
        if self.cell.bind:
            self.bind()
        if self.cell.loop == "decoupled" and self.args.budget_policy == "cost":
            # the cost rule's table: this cell's own target calls (graphed or eager)
            self.ctx.result["call_ms_by_width"] = timed = self.call_ms_by_width()
            self.cost_ms = {int(w): ms for w, ms in timed["target"].items()}
            self.arm = self._arm(self.target, self.drafter)
        return self.binding

    def bind(self) -> None:
        W, device = self.W, self.ctx.device
        # on the CPU (a smoke run) the graphs' policy runs on the simulate backend
        backend = "simulate" if device.type == "cpu" else None
        bind = lambda state, shape: W.bind_adapter(  # noqa: E731
            state, device, capture=False, backend=backend, shape=shape
        )
        self.binding = bind(self.target, self.shapes[0])
        self.binding.capture(progress=False)
        if self.drafter is not None:
            self.drafter_binding = bind(self.drafter, self.shapes[1])
            self.drafter_binding.capture(progress=False)

    def step(self) -> dict:
        import torch

        seed, n = self.seeds[len(self.requests)], self.args.tokens_per_request
        if self.cell.loop == "hf":
            assistant = self.drafter_model if self.cell.assistant else None
            tokens = self.W.vendor_greedy(self.model, seed, n, assistant=assistant)
            self.requests.append({"seed": seed})
            return {TOKENS.name: torch.tensor(tokens)}
        out = self.arm.run(seed, n, oracle=self.oracle.get(seed))
        self.requests.append(request_record(seed, out))
        return {TOKENS.name: torch.tensor(out.tokens)}

    def after(self, phase: str) -> None:
        self.ctx.result.setdefault("requests_by_phase", {})[phase] = len(self.requests)

    def finish(self, result: dict) -> None:
        result["requests"] = self.requests
        if self.binding is None:
            return
        result.update(catalog_check(self.binding, "whisper_decoder"))
        if self.drafter_binding is not None:
            drafter = catalog_check(self.drafter_binding, "whisper_drafter")
            for key in ("catalog_predicted", "signatures_observed"):
                result[key] = result[key] + [f"drafter.{s}" for s in drafter[key]]
            result["catalog_met"] = result["catalog_met"] and drafter["catalog_met"]
        result["replay_equals_eager"] = self.replay_equals_eager()
        if "call_ms_by_width" not in result:
            result["call_ms_by_width"] = self.call_ms_by_width()

    def call_ms_by_width(self) -> dict:
        """A bound decoder call's wall time at each width 1..budget + 1 (the target's, and
        the drafter's where bound), the LM head included: what a verify round costs
        against a greedy step. Host-timed around 20 calls (2 on the CPU) after 2."""
        import time

        import torch

        W, device = self.W, self.ctx.device
        sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
        reps = 20 if device.type == "cuda" else 2
        out = {}
        for name, state in (("target", self.target), ("drafter", self.drafter)):
            if state is None:
                continue
            request = W.Request(state, self.seeds[0])
            request.prefill()
            out[name] = {}
            for w in range(1, self.args.budget + 2):
                tokens = torch.full((1, w), W.PROMPT[-1], device=device)
                for _ in range(2):
                    request.decode(tokens, len(W.PROMPT))
                sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    request.decode(tokens, len(W.PROMPT))
                sync()
                out[name][str(w)] = (time.perf_counter() - t0) * 1e3 / reps
        return out

    def replay_equals_eager(self) -> dict:
        """Tier 1 (module docstring): one more request, graphed live vs eager replay."""
        import torch

        W, A, a, device = self.W, self.A, self.args, self.ctx.device
        seed, n = self.seeds[-1], a.tokens_per_request
        target = W.new_state(W.build_whisper(self.shapes[0], a.seed, device, self.dtype))
        drafter = None
        if self.drafter is not None:
            drafter = W.new_state(W.build_whisper(self.shapes[1], a.seed + 1, device, self.dtype))
        oracle = A.trajectory(target, seed, n) if a.source == "oracle" else None
        live = self.arm.run(seed, n, oracle=oracle)
        replay = self._arm(target, drafter).run(
            seed,
            n,
            oracle=oracle,
            schedule=live.schedule if self.cell.loop == "decoupled" else None,
        )
        drafted = len(live.published) if self.cell.loop == "decoupled" else W.POSITIONS
        pairs = list(zip(A.committed_cache(self.target, n), A.committed_cache(target, n)))
        if drafter is not None:
            k = min(drafted, W.POSITIONS - len(W.PROMPT) + 1)
            pairs += zip(A.committed_cache(self.drafter, k), A.committed_cache(drafter, k))
        fields = ("tokens", "schedule", "widths", "accepted")
        out = {f: getattr(live, f) == getattr(replay, f) for f in fields}
        out["published"] = replay.published[: len(live.published)] == live.published
        out["caches"] = all(torch.equal(x, y) for x, y in pairs)
        out["equal"] = all(out.values())
        out["rounds"] = len(live.widths)
        return out


def request_record(seed: int, t: Any) -> dict:
    """A request's numbers (``whisper_as2d.Transcript``): decode seconds after the
    prefill, rounds, the histogram of widths and of accepted counts (rounds that verified
    at least one candidate)."""
    hist = lambda xs: {str(k): xs.count(k) for k in sorted(set(xs))}  # noqa: E731
    record = {
        "seed": seed,
        "decode_s": t.decode_s,
        "rounds": len(t.widths),
        "accepted": hist([a for a, w in zip(t.accepted, t.widths) if w > 1]),
        "widths": hist(t.widths),
    }
    if any(t.schedule):  # decoupled: how far the drafter's published entries led the cursor
        cursor, lead = 1, []
        for ready, a in zip(t.schedule, t.accepted):
            lead.append(ready - cursor)
            cursor += a + 1
        record["rounds_none_ready"] = sum(x <= 0 for x in lead)
        record["first_round_with_candidates"] = next((i for i, x in enumerate(lead) if x > 0), None)
        record["lead_mean"] = sum(lead) / len(lead)
    return record


def _window(r: dict) -> list[dict]:
    """The requests of a result's measured window."""
    phases = r["requests_by_phase"]
    return r["requests"][phases["warmup"] : phases["window"]]


def tokens_per_s(doc: dict, cell: str) -> float | None:
    """Committed tokens after the prefill per second of decoding, over every measured
    request of every block (tokens and seconds summed, then divided)."""
    reqs = [q for r in ok_results(doc, cell) if r for q in _window(r) if "decode_s" in q]
    n = doc["settings"].get("tokens_per_request") or 0
    seconds = sum(q["decode_s"] for q in reqs)
    return (n - 1) * len(reqs) / seconds if reqs and seconds else None


def match_rate(doc: dict, cell: str) -> float | None:
    """Tier 2: the fraction of ``cell``'s requests (every phase, every block) whose token
    IDs equal the target-only greedy reference's (``stock``)."""
    pairs = [
        (a, b)
        for r, ref in zip(ok_results(doc, cell), ok_results(doc, "stock"))
        if r and ref
        for a, b in zip(r[TOKENS.step_key], ref[TOKENS.step_key])
    ]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def slower_fraction(doc: dict, cell: str, than: str) -> float | None:
    """The fraction of measured requests on which ``cell``'s latency exceeds ``than``'s
    for the same request (request k has the same seed in every cell)."""
    pairs = [
        (a, b)
        for r, ref in zip(ok_results(doc, cell), ok_results(doc, than))
        if r and ref
        for a, b in zip(r["window_ms"], ref["window_ms"])
    ]
    return sum(a > b for a, b in pairs) / len(pairs) if pairs else None


def acceptance(doc: dict, cell: str) -> dict:
    """Accepted candidates per verify round (rounds with at least one candidate)."""
    hist: dict[str, int] = {}
    for r in ok_results(doc, cell):
        for q in _window(r) if r else []:
            for k, v in q.get("accepted", {}).items():
                hist[k] = hist.get(k, 0) + v
    drafted = sum(hist.values())
    mean = sum(int(k) * v for k, v in hist.items()) / drafted if drafted else None
    return {"histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))), "mean": mean}


def none_ready(doc: dict, cell: str) -> float | None:
    """The fraction of a decoupled cell's measured rounds that found no candidate ready
    (the drafter behind the verifier: those rounds are greedy steps)."""
    reqs = [q for r in ok_results(doc, cell) if r for q in _window(r) if "rounds_none_ready" in q]
    rounds = sum(q["rounds"] for q in reqs)
    return sum(q["rounds_none_ready"] for q in reqs) / rounds if rounds else None


def headline(doc: dict) -> dict:
    """The issue's top-level keys (module docstring), from the finished document."""
    cells = [c.name for c in CELLS if any(ok_results(doc, c.name))]
    graphed = [c.name for c in CELLS if c.bind and c.name in cells]
    checks = [r["replay_equals_eager"] for c in graphed for r in ok_results(doc, c) if r]
    first = next((r for r in ok_results(doc, GRAPHED) if r), {})
    rates = {c: tokens_per_s(doc, c) for c in cells}
    base, ours = rates.get("adapter"), rates.get(GRAPHED)
    return {
        "replay_equals_eager": all(c["equal"] for c in checks) if checks else None,
        "replay_checks": {
            c: [r["replay_equals_eager"] for r in ok_results(doc, c) if r] for c in graphed
        },
        "catalog_predicted": first.get("catalog_predicted"),
        "signatures_observed": first.get("signatures_observed"),
        "speedup_vs_target_only_graphed": ours / base if ours and base else None,
        "target_greedy_match_rate": match_rate(doc, GRAPHED),
        "target_greedy_match_rate_by_cell": {c: match_rate(doc, c) for c in cells},
        "slower_than_target_only_graphed": slower_fraction(doc, GRAPHED, "adapter"),
        "tokens_per_s_after_prefill": rates,
        "accepted_per_round": {c: acceptance(doc, c) for c in cells},
        "call_ms_by_width": first.get("call_ms_by_width"),
        "rounds_none_ready": {c: none_ready(doc, c) for c in cells if "as2d" in c},
    }


def describe(doc: dict) -> list[str]:
    """The report's headline lines."""
    lines = [
        f"- source {doc['settings'].get('source')}, epsilon {doc['settings'].get('epsilon')}, "
        f"budget {doc['settings'].get('budget')} "
        f"({doc['settings'].get('budget_policy', 'fixed')}), "
        f"{doc['settings'].get('tokens_per_request')} tokens a request",
        f"- {GRAPHED} vs target alone graphed (tokens/s after prefill): "
        f"{_fmt(doc.get('speedup_vs_target_only_graphed'))}x; requests slower: "
        f"{_fmt(doc.get('slower_than_target_only_graphed'))}; tier 1 (replay = eager): "
        f"{doc.get('replay_equals_eager')}; tier 2 match rate: "
        f"{_fmt(doc.get('target_greedy_match_rate'))}",
        "",
        "| cell | tokens/s after prefill | mean accepted per round | greedy match rate "
        "| rounds with none ready |",
        "|:--|--:|--:|--:|--:|",
    ]
    for c, rate in (doc.get("tokens_per_s_after_prefill") or {}).items():
        mean = (doc.get("accepted_per_round") or {}).get(c, {}).get("mean")
        match = (doc.get("target_greedy_match_rate_by_cell") or {}).get(c)
        behind = (doc.get("rounds_none_ready") or {}).get(c)
        lines.append(f"| {c} | {_fmt(rate)} | {_fmt(mean)} | {_fmt(match)} | {_fmt(behind)} |")
    return lines


def _fmt(x: Any) -> str:
    return "–" if x is None else f"{x:.3g}"


def start(ctx: WorkerContext) -> As2dRun:
    return As2dRun(ctx)


WORKLOAD = Workload(
    name="as2d",
    unit="request",
    cells=CELLS,
    reference="stock",
    start=start,
    streams=(TOKENS,),
    title=lambda doc: "AS2D on Whisper large-v3 (transformers "
    f"{doc.get('vendor_version')}, seeded random weights, "
    f"{doc['settings'].get('dtype', 'float32')}, static caches, batch 1)",
    description="Decoupled audio speculative decoding (a drafter thread on its own CUDA "
    "stream, a verifier of the ready candidates) against target-only and serial "
    "speculative decoding, eager and graphed, and the vendor's generate() loops.",
    defaults={"requests": 12, "warmup": 1, "profile_requests": 0},
    quick={
        "device": "cpu",
        "blocks": 1,
        "warmup": 0,
        "requests": 1,
        "profile_requests": 0,
        "cells": ["stock", "adapter", "hf_assisted", "sd_graphed", "as2d", "as2d_graphed"],
        "shapes": "tiny,draft-tiny",
        "tokens_per_request": 24,
        "threads": 1,
        "out": "bench/results/as2d_quick",
        "worker_timeout": 900.0,
    },
    flags=FLAGS,
    measure_flags=MEASURE,
    doc_keys=("vendor_version", "model"),
    headline=headline,
    describe=describe,
    settings=lambda args: {
        **{dest: getattr(args, dest) for dest in MEASURE},
        "target": "large-v3",
        "drafter": "draft (whisper-tiny widths, 4 decoder layers)",
        "attention": "eager",
        "cache": "static (448 decoder positions, 1500 encoder frames)",
        "batch": 1,
    },
)

if __name__ == "__main__":
    raise SystemExit(main(WORKLOAD))
