"""The stock Kyutai Moshi (moshi 0.2.13) streaming loop, seeded random weights, on CPU.

Drives the vendor's own Mimi + LMGen per-frame path (``mimi.encode`` -> ``lm_gen.step``
-> ``mimi.decode``, as ``moshi.server`` does) through bench.workloads.moshi with the tiny
LM config, and pins that a fresh build with the same seed reproduces every token ID and
every PCM sample bit for bit.
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("moshi")  # looks at specs only: imports nothing
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import moshi as W  # noqa: E402

SEED = 0
N_FRAMES = 6
DTYPE = torch.bfloat16  # the 7B LM's dtype; Mimi is always fp32


def _run(seed: int) -> tuple[list, list]:
    mimi, lm_gen = W.build_moshi(seed, "cpu", DTYPE, W.TINY_LM_KWARGS, greedy=True)
    out = W.run_frames(mimi, lm_gen, W.pcm_stream(seed, N_FRAMES))
    del mimi, lm_gen
    gc.collect()
    return out


@pytest.fixture(scope="module")
def two_runs() -> tuple[tuple[list, list], tuple[list, list]]:
    # One intra-op thread: the tiny model gains nothing from two, and on a shared 2-core
    # machine OpenMP spin-waiting made the same runs ~7x slower (8 s vs 60 s wall).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(SEED), _run(SEED)
    finally:
        torch.set_num_threads(threads)


def test_pcm_stream_is_seeded() -> None:
    a, b = W.pcm_stream(SEED, 2), W.pcm_stream(SEED, 2)
    assert [tuple(f.shape) for f in a] == [(1, 1, W.FRAME_SAMPLES)] * 2
    assert all(f.dtype == torch.float32 for f in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], W.pcm_stream(SEED + 1, 1)[0])


def test_stock_stream_shapes(two_runs) -> None:
    (tokens, pcm), _ = two_runs
    # max(delays) = 1: LMGen.step returns None on the first frame only (lm.py:774-776)
    assert tokens[0] is None and pcm[0] is None
    for ids, frame in zip(tokens[1:], pcm[1:]):
        assert ids is not None and len(ids) == 1 + 8  # text + 8 audio codebooks
        assert 0 <= ids[0] < W.TINY_LM_KWARGS["text_card"]
        assert all(0 <= t < W.TINY_LM_KWARGS["card"] for t in ids[1:])
        assert tuple(frame.shape) == (1, 1, W.FRAME_SAMPLES) and frame.dtype == torch.float32
        assert bool(torch.isfinite(frame).all())


def test_stock_stream_is_deterministic_and_nontrivial(two_runs) -> None:
    (tok_a, pcm_a), (tok_b, pcm_b) = two_runs
    assert tok_a == tok_b
    assert len(pcm_a) == len(pcm_b) == N_FRAMES
    for x, y in zip(pcm_a, pcm_b):
        assert (x is None and y is None) or torch.equal(x, y)
    flat = [t for ids in tok_a if ids is not None for t in ids]
    assert len(set(flat)) > 1, "every generated token ID is the same"
    texts = {ids[0] for ids in tok_a if ids is not None}
    assert len(texts) > 1, "the text stream is constant"
    live = [p for p in pcm_a if p is not None]
    assert any(float(p.abs().max()) > 0 for p in live), "decoded PCM is all zero"
    assert not torch.equal(live[0], live[1])
