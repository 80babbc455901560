"""Benchmarks of transformers' Whisper (4.57.6) decoder on a static cache vs the generated
adapter (issue 25; the cells are bench/decoders.py's). Two entry points, one per loop:

    python -m bench.whisper_greedy --device cuda --blocks 1 --tokens 240 --warmup 2 \\
        --profile-tokens 2 --cells stock,adapter,compile --compile-timeout 240 \\
        --out bench/results/whisper_greedy_h200
    python -m bench.whisper_verify --device cuda --blocks 1 --rounds 243 --warmup 9 \\
        --profile-rounds 0 --cells stock,adapter --out bench/results/whisper_verify_h200
    python -m bench.whisper_verify ... --widths 9 --epsilon 0.22   # speculative, ~3 of 8

The workload is PyPI ``transformers==4.57.6`` as ``bench.workloads.transformers_whisper``
builds it (``WhisperForConditionalGeneration`` at large-v3's shape, seeded random
weights, fp32, eager attention, batch 1) over the vendor's static ``EncoderDecoderCache``.
One step of ``whisper_greedy`` is one greedy token (the target alone: a width-1 decoder
call and the LM head); one step of ``whisper_verify`` is one verify round, widths
cycling over ``--widths`` (the last committed token and up to 8 drafts in one call: seeded
random tokens, or with ``--epsilon e`` the target's own greedy tokens each corrupted with
probability e, a drafter of controlled acceptance); its per-step times are the mean over
widths. Hashed: the int64 token IDs each step commits (``n_tokens``: tokens per round x
rounds, so tokens/s = n_tokens / rounds / round time). The request's prompt (its first call, which fills the cross-attention cache)
runs when the stream opens, before any cell binds. The compile controls wrap the
decoder module's ``forward`` (the vendor's own graph path is a static cache under
``torch.compile``).
"""

from __future__ import annotations

from typing import Any

from bench import decoders as D
from bench.harness import Stream, WorkerContext, Workload


def _w() -> Any:
    from bench.workloads import transformers_whisper as W

    return W


TOKENS = Stream(
    "tokens", "int64", key="tokens_sha256", step_key="step_sha256", count_key="n_tokens"
)
PARTS = {
    # part: (how a stream opens on a model, the step's unit)
    "greedy": (lambda m, args, n: _w().GreedyStream(_w().new_state(m), args.seed, n), "token"),
    "verify": (
        lambda m, args, n: _w().VerifyStream(
            _w().new_state(m),
            args.seed,
            n,
            widths=tuple(int(w) for w in args.widths.split(",")),
            epsilon=args.epsilon,
        ),
        "round",
    ),
}


# the verify loop's own flags: which widths its rounds cycle and where the drafts come from
VERIFY_FLAGS = {
    "--widths": dict(
        default="1,2,3,4,5,6,7,8,9",
        help="the widths the rounds cycle (w - 1 drafts each); one width: a fixed draft length",
    ),
    "--epsilon": dict(
        type=float,
        default=None,
        help="drafts from the target's own greedy tokens, each replaced by a random one "
        "with this probability (0.22: about 3 of 8 accepted); unset: random drafts",
    ),
}
VERIFY_DESTS = ("widths", "epsilon")


def workload(part: str) -> Workload:
    """The benchmark of Whisper's ``part`` loop (module docstring)."""
    open_stream, unit = PARTS[part]
    # 240 greedy tokens; 243 = 27 rounds at each width 1..9 (warm-up: one of each)
    steps, warmup = (240, 2) if part == "greedy" else (243, 9)
    decoder = D.Decoder(
        workload="transformers_whisper",
        adapter="whisper_decoder",
        build=lambda args, device: _w().build_whisper("large-v3", args.seed, device),
        open=open_stream,
        bind=lambda s, device, backend=None: _w().bind_adapter(
            s.state, device, capture=False, backend=backend
        ),
        compile_site=lambda s: (s.state.whisper.model.decoder, "forward"),
        output=TOKENS.name,
    )

    def start(ctx: WorkerContext) -> D.DecoderRun:
        return D.DecoderRun(ctx, decoder)

    return Workload(
        name=f"whisper_{part}",
        unit=unit,
        cells=D.cells("WhisperDecoder.forward"),
        reference="stock",
        start=start,
        streams=(TOKENS,),
        title=lambda doc: f"Whisper large-v3 decoder, {part} (transformers "
        f"{doc.get('vendor_version')}, seeded random weights, fp32, static cache, batch 1)",
        description=f"Matched-block benchmark of transformers' Whisper decoder ({part}: "
        + ("one greedy token per call" if part == "greedy" else "verify rounds at widths 1..9")
        + ") on the vendor's static cache against the generated duplexcadence adapter and "
        "torch.compile controls.",
        defaults={f"{unit}s": steps, "warmup": warmup, f"profile_{unit}s": 0},
        quick={
            "device": "cpu",
            "blocks": 1,
            "warmup": 1,
            f"{unit}s": 1,
            f"profile_{unit}s": 0,
            "cells": ["stock", "adapter"],
            "threads": 1,
            "out": f"bench/results/whisper_{part}_quick",
            "worker_timeout": 900.0,
        },
        flags=D.FLAGS if part == "greedy" else {**D.FLAGS, **VERIFY_FLAGS},
        measure_flags=() if part == "greedy" else tuple(VERIFY_DESTS),
        doc_keys=D.DOC_KEYS,
        settings=lambda args: {
            "compile_timeout_s": args.compile_timeout,
            "shape": "large-v3",
            "dtype": "float32",
            "attention": "eager",
            "cache": "static (448 decoder positions, 1500 encoder frames)",
            "batch": 1,
        },
        cell_summary=D.adapter_summary,
        cell_notes=D.adapter_notes,
    )
