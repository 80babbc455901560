"""The generated Token2Wav adapter on the released minicpmo-utils 1.0.6 code, on CPU.

Stock `Token2wav.stream()` with seeded random weights vs the same stream after
`bind()`: every chunk's mel and float32 PCM must be bit-identical, the retention
must trim at least twice, and the carry must keep one address throughout.
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.workloads import token2wav as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from duplexcadence.generated import stepaudio2_token2wav as adapter  # noqa: E402

SEED = 0
N_CHUNKS = 6  # 5 steady chunks (the stock trim fires on chunks 3, 4 and 5) + the final one


def _record_mels(t2w) -> list:
    """Wrap whatever flow.inference_chunk is now, keeping a copy of each chunk's mel."""
    mels, inner = [], t2w.flow.inference_chunk

    def recording(*args, **kwargs):
        feat, cache = inner(*args, **kwargs)
        mels.append(feat.detach().clone())
        return feat, cache

    t2w.flow.inference_chunk = recording
    return mels


def _stream(t2w, observe=None) -> tuple[list, list]:
    mels = _record_mels(t2w)
    pcm = []
    for chunk in W.token_stream(SEED, N_CHUNKS):
        pcm.append(torch.from_numpy(W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk)))
        if observe:
            observe(t2w)
    return mels, pcm


@pytest.fixture(scope="module")
def stock() -> tuple[list, list]:
    t2w = W.build_token2wav(SEED)
    out = _stream(t2w)
    del t2w
    gc.collect()
    return out


@pytest.fixture(scope="module")
def bound():
    t2w = W.build_token2wav(SEED)  # re-seeds the global generators exactly as for stock
    binding = adapter.bind(t2w, device="cpu", audit=True)
    carry = binding.regions["estimator_carry"]
    seen = {"ptrs": set(), "lengths": [], "conformer_ptrs": set()}

    def observe(model):
        est = model.stream_cache["estimator_att_cache"]
        conf = model.stream_cache["conformer_att_cache"]
        seen["ptrs"].add(est.data_ptr())
        seen["conformer_ptrs"].add(conf.data_ptr())
        seen["lengths"].append(est.shape[4])

    mels, pcm = _stream(t2w, observe)
    yield {"t2w": t2w, "binding": binding, "carry": carry, "seen": seen, "mels": mels, "pcm": pcm}
    binding.unbind()


def test_every_chunk_bit_identical(stock, bound):
    stock_mels, stock_pcm = stock
    assert len(bound["pcm"]) == len(stock_pcm) == N_CHUNKS
    for i in range(N_CHUNKS):
        assert torch.equal(bound["mels"][i], stock_mels[i]), f"mel of chunk {i} differs"
        assert bound["pcm"][i].dtype == torch.float32
        assert torch.equal(bound["pcm"][i], stock_pcm[i]), f"PCM of chunk {i} differs"


def test_retention_trimmed_in_place_at_one_address(bound):
    carry = bound["carry"]
    # the stock rule would have trimmed on chunks 3, 4 and 5; the writeback did instead
    assert bound["seen"]["lengths"] == [352, 402, 402, 402, 402, 402]
    assert bound["seen"]["ptrs"] == {carry.data_ptr()}
    assert bound["seen"]["conformer_ptrs"] == {
        bound["binding"].regions["conformer_carry"].data_ptr()
    }
    # audit mode compared every writeback with the stock concatenation
    assert carry.audit_checks >= N_CHUNKS and carry.audit_divergences == 0


def test_regions_are_demand_sized(bound):
    t2w = bound["t2w"]
    assert tuple(t2w.flow.decoder.att_cache_buffer.shape) == (10, 16, 2, 8, 458, 128)
    assert tuple(bound["carry"].tensor.shape) == (10, 16, 2, 8, 402, 128)
    stats = bound["binding"].stats()
    assert set(stats["callables"]) == {"flow_chunk", "vocoder"}
    # on CPU the engine runs eager and says why
    flow = stats["callables"]["flow_chunk"]
    assert flow["hits"] == 0 and sum(flow["misses"].values()) == N_CHUNKS
