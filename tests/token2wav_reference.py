"""The stock Token2Wav stream (minicpmo-utils 1.0.6, seeded weights, CPU) that the stock
and the adapter tests both compare with, streamed once per test process: a fresh build
and six chunks cost ~40 s on 2 cores, so the second module that needs the same seed's
stream reads it here instead of building its own (the stock test still makes a second,
uncached run to show that a fresh build reproduces it)."""

from __future__ import annotations

import functools
import gc
from dataclasses import dataclass

import torch

from bench.workloads import token2wav as W

# 5 steady chunks (the stock trim fires on chunks 3, 4 and 5) + the final one
N_CHUNKS = 6


def record_mels(t2w) -> list:
    """Wrap whatever flow.inference_chunk is now, keeping a copy of each chunk's mel."""
    mels, inner = [], t2w.flow.inference_chunk

    def recording(*args, **kwargs):
        feat, cache = inner(*args, **kwargs)
        mels.append(feat.detach().clone())
        return feat, cache

    t2w.flow.inference_chunk = recording
    return mels


def stream(t2w, seed: int, n_chunks: int, observe=None) -> tuple[list, list]:
    """(mels, PCM) of ``n_chunks`` chunks of ``W.token_stream(seed)`` through ``t2w``;
    ``observe(t2w)`` after each chunk."""
    mels = record_mels(t2w)
    pcm = []
    for chunk in W.token_stream(seed, n_chunks):
        pcm.append(torch.from_numpy(W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk)))
        if observe:
            observe(t2w)
    return mels, pcm


@dataclass(frozen=True)
class StockRun:
    mels: list  # each chunk's mel (flow.inference_chunk's feature), as torch tensors
    pcm: list  # each chunk's float32 PCM, as torch tensors
    attended: list  # the estimator carry's length before each chunk
    carry: list  # ... and after it
    conformer: list  # the conformer carry's length after each chunk
    hift: list  # (mel, source, speech) cache lengths of HiFT after each chunk


def run_stock(seed: int, n_chunks: int = N_CHUNKS) -> StockRun:
    """A fresh stock build streaming ``n_chunks`` chunks (uncached)."""
    t2w = W.build_token2wav(seed)
    before = W.carry_lengths(t2w)["estimator"]
    after: list[dict] = []
    mels, pcm = stream(t2w, seed, n_chunks, lambda m: after.append(W.carry_lengths(m)))
    del t2w
    gc.collect()
    carry = [a["estimator"] for a in after]
    return StockRun(
        mels,
        pcm,
        attended=[before] + carry[:-1],  # the length before chunk k is the one after k - 1
        carry=carry,
        conformer=[a["conformer"] for a in after],
        hift=[(a["hift_mel"], a["hift_source"], a["hift_speech"]) for a in after],
    )


@functools.lru_cache(maxsize=None)
def stock_reference(seed: int, n_chunks: int = N_CHUNKS) -> StockRun:
    """``run_stock(seed, n_chunks)``, once per process."""
    return run_stock(seed, n_chunks)
