"""The generated Moshi adapter (contracts/moshi.clock) on the stock streaming loop, CPU.

Binds the adapter to a tiny-LM Moshi whose streaming has started, as
``bench.workloads.moshi.bind_adapter`` does on the GPU, and checks what CPU can check:
every token ID and PCM sample equals an unbound build's (on CPU every call runs the
stock body plus the adapter's pins, so this pins the wrappers, not the graphs), the
pinned regions stay at their sites across frames while the stock code rebinds them,
and unbind() puts the stock callables back. The graphs themselves are checked on the
H200 (bench/moshi.py, every cell's token and PCM SHA-256 against eager).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("moshi")  # looks at specs only: imports nothing
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import moshi as W  # noqa: E402

SEED = 3
N_FRAMES = 5


@pytest.fixture(scope="module", autouse=True)
def _one_thread_no_vendor_graphs():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    old = os.environ.get("NO_CUDA_GRAPH")
    os.environ["NO_CUDA_GRAPH"] = "1"
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        if old is None:
            os.environ.pop("NO_CUDA_GRAPH", None)
        else:
            os.environ["NO_CUDA_GRAPH"] = old


def _build():
    return W.build_moshi(SEED, "cpu", torch.bfloat16, W.TINY_LM_KWARGS, greedy=True)


def test_adapter_matches_stock_and_keeps_pins() -> None:
    frames = W.pcm_stream(SEED, N_FRAMES)
    mimi, lm_gen = _build()
    stock_tokens, stock_pcm = W.run_frames(mimi, lm_gen, frames)
    del mimi, lm_gen
    gc.collect()

    mimi, lm_gen = _build()
    binding = W.bind_adapter(mimi, lm_gen, "cpu")
    offsets = binding.regions["lm_offsets"].tensor
    first = binding.regions["downsample_first"].tensor
    tokens, pcm = W.run_frames(mimi, lm_gen, frames)

    assert tokens == stock_tokens
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(pcm, stock_pcm))
    # the stock code rebinds both attributes every frame; the pins put them back
    assert lm_gen._streaming_state.offsets is offsets
    assert int(offsets) == N_FRAMES
    assert mimi.downsample.conv._streaming_state.first is first
    assert not bool(first)
    stats = binding.stats()
    assert set(stats["callables"]) >= {"mimi_encode", "lm_step", "mimi_decode"}

    binding.unbind()
    assert lm_gen.step.__func__ is type(lm_gen).step
    assert mimi.encode.__func__ is type(mimi).encode


def test_bind_adapter_refuses_vendor_graphs_and_unstarted_streaming(monkeypatch) -> None:
    mimi, lm_gen = W.build_moshi(
        SEED, "cpu", torch.bfloat16, W.TINY_LM_KWARGS, greedy=True, start=False
    )
    with pytest.raises(RuntimeError, match="start streaming"):
        W.bind_adapter(mimi, lm_gen, "cpu")
    monkeypatch.setenv("NO_CUDA_GRAPH", "0")
    with pytest.raises(RuntimeError, match="NO_CUDA_GRAPH"):
        W.bind_adapter(mimi, lm_gen, "cpu")
