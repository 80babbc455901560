"""The stock streaming Token2Wav (minicpmo-utils 1.0.6), seeded random weights, on CPU.

Drives the vendor's own ``Token2wav.stream()`` through bench.workloads.token2wav and pins
what the stock code does: the estimator / conformer carries after each chunk, the PCM
lengths, and that a fresh build with the same seed reproduces every chunk bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("token2wav")  # looks at specs only: imports nothing
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import token2wav as W  # noqa: E402

from token2wav_reference import N_CHUNKS, run_stock, stock_reference  # noqa: E402

SEED = 0  # N_CHUNKS: 5 steady chunks + the final one; the trim first fires on chunk 3


@pytest.fixture(scope="module")
def first_run():
    return stock_reference(SEED, N_CHUNKS)


def test_token_stream_matches_stock_client() -> None:
    chunks = W.token_stream(SEED, N_CHUNKS)
    assert [len(c.tokens) for c in chunks] == [28] * N_CHUNKS
    assert [c.last_chunk for c in chunks] == [False] * (N_CHUNKS - 1) + [True]
    for prev, cur in zip(chunks, chunks[1:]):  # windows overlap by the 3 lookahead tokens
        assert prev.tokens[25:] == cur.tokens[:3]
    assert chunks[0].tokens == W.token_stream(SEED, N_CHUNKS)[0].tokens


def test_stock_carries_and_pcm_lengths(first_run: dict) -> None:
    # estimator carry: 302 prompt frames + 50 per chunk, cut back to 302 + 100 once longer
    assert first_run.attended == [302, 352, 402, 402, 402, 402]
    assert first_run.carry == [352, 402, 402, 402, 402, 402]
    assert first_run.conformer == [352, 402, 402, 402, 402, 402]
    assert first_run.hift == [(8, 3840, 3840)] * N_CHUNKS
    # 50 mel frames x 480 per steady chunk; the final chunk is 56 frames + the 8 carried
    assert [p.shape[0] for p in first_run.pcm] == [24000] * 5 + [30720]
    for p in first_run.pcm:
        assert p.dtype == torch.float32 and bool(torch.isfinite(p).all())
    assert not first_run.pcm[0][:3840].any()  # stock first chunk: 160 ms of silence
    assert all(float(p[3840:].abs().max()) > 0 for p in first_run.pcm)


def test_fresh_build_same_seed_is_bit_identical(first_run: dict) -> None:
    second = run_stock(SEED, N_CHUNKS)
    assert len(second.pcm) == N_CHUNKS
    for i, (a, b) in enumerate(zip(first_run.pcm, second.pcm)):
        assert torch.equal(a, b), f"chunk {i} differs"
    assert all(torch.equal(a, b) for a, b in zip(first_run.mels, second.mels))
