"""The stock Qwen3-Omni Code2Wav (transformers 4.57.6), seeded random weights, on CPU.

Drives the vendor's ``chunked_decode`` loop one iteration per chunk through
bench.workloads.qwen3_code2wav and pins: the windows the loop decodes (25 new frames
each, 25 frames of left context once available), the samples each chunk yields, that the
chunked stream is byte-identical to the vendor's own ``chunked_decode`` over the same
codes (a second run through the same kernels, so this is also the run-to-run check), and
that a fresh build with the same seed has bit-identical weights.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)

from bench.workloads import qwen3_code2wav as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

SEED = 0
N_FRAMES = 30  # one full chunk (window 25) and a final partial one (window 25 + 5)
TAIL = 555  # samples every call drops at its end (the causal transposed convs' trim)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return W.build_code2wav(SEED)


def _weights_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_windows_follow_chunked_decode() -> None:
    assert W.windows(N_FRAMES) == [(0, 25), (25, 30)]
    assert W.windows(210) == [(0, 25)] + [(25, 50)] * 7 + [(25, 35)]
    assert W.windows(50, chunk_size=300) == [(0, 50)]  # generate's offline call


def test_code_stream_is_seeded() -> None:
    a = W.code_stream(SEED, N_FRAMES)
    assert tuple(a.shape) == (1, 16, N_FRAMES) and a.dtype == torch.int64
    assert int(a.min()) >= 0 and int(a.max()) < W.CODEBOOK_SIZE
    assert torch.equal(a, W.code_stream(SEED, N_FRAMES))
    assert not torch.equal(a, W.code_stream(SEED + 1, N_FRAMES))


def test_model_facts(model) -> None:
    assert sum(p.numel() for p in model.parameters()) == 216_016_577
    assert int(model.total_upsample) == W.SAMPLES_PER_FRAME
    assert model.config._attn_implementation == "sdpa"
    assert _weights_sha256(model) == _weights_sha256(W.build_code2wav(SEED))


def test_stock_stream_equals_vendor_chunked_decode(model) -> None:
    codes = W.code_stream(SEED, N_FRAMES)
    pcm = W.run_stream(model, codes)
    # a call on n frames yields n * 1920 - 555 samples; the context's are cut off
    assert [p.shape for p in pcm] == [(25 * 1920 - TAIL,), (5 * 1920 - TAIL,)]
    for p in pcm:
        assert p.dtype == np.float32 and np.isfinite(p).all() and float(np.abs(p).max()) > 0
    vendor = W.vendor_chunked_decode(model, codes)
    stream = np.concatenate(pcm)
    assert vendor.dtype == np.float32 and vendor.shape == stream.shape
    assert (
        hashlib.sha256(vendor.tobytes()).hexdigest() == hashlib.sha256(stream.tobytes()).hexdigest()
    )
