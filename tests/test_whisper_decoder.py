"""transformers 4.57.6 Whisper's decoder on its static cache, bound by
contracts/whisper_decoder.clock (at the tiny shape: large-v3's 32 decoder layers, vocabulary
and positions, 4 heads of 8), on the simulate backend: verify rounds at every width 1..9
and greedy decoding across two requests replay, and every token ID and every byte of the
caches equals the unbound vendor's, which first reproduces itself."""

import pytest
import torch

from bench.workloads import transformers_whisper as W
from fuzzing import compiled_adapter

pytestmark = pytest.mark.skipif(
    W.unavailable_reason() is not None, reason=str(W.unavailable_reason())
)


def tiny_adapter():
    return compiled_adapter(W.contract_text("tiny"), "whisper_decoder.clock")


def run(stream_type, steps: int, adapter=None, **kw):
    """(the step outputs, the stream's state, the binding or None) of a fresh model."""
    state = W.new_state(W.build_whisper("tiny", seed=0))
    stream = stream_type(state, seed=3, **kw)
    binding = None
    if adapter is not None:
        binding = adapter.bind(state, device="cpu", backend="simulate", progress=False)
    return [stream.step() for _ in range(steps)], state, binding


def caches_equal(a, b) -> bool:
    pairs = [
        (x.keys, y.keys)
        for c in ("self_attention_cache", "cross_attention_cache")
        for x, y in zip(getattr(a.cache, c).layers, getattr(b.cache, c).layers, strict=True)
    ] + [
        (x.values, y.values)
        for c in ("self_attention_cache", "cross_attention_cache")
        for x, y in zip(getattr(a.cache, c).layers, getattr(b.cache, c).layers, strict=True)
    ]
    return all(torch.equal(x, y) for x, y in pairs)


def test_verify_rounds_at_every_width_replay_and_equal_the_vendor():
    stock, stock_state, _ = run(W.VerifyStream, 27)
    again, again_state, _ = run(W.VerifyStream, 27)
    # the reference reproduces itself: tokens and both caches, every byte
    assert all(torch.equal(a, b) for a, b in zip(stock, again, strict=True))
    assert caches_equal(stock_state, again_state)

    got, state, binding = run(W.VerifyStream, 27, tiny_adapter())
    assert all(torch.equal(a, b) for a, b in zip(got, stock, strict=True))
    assert caches_equal(state, stock_state)
    decode = binding.stats()["callables"]["decode"]
    # 3 rounds at each width: every class of the catalog met, no call eager
    assert decode["hits"] == 27 and not decode["misses"], decode
    assert {c["name"] for c in decode["classes"] if c["hits"] == 3} == {
        f"w={w},use_cache=True,return_dict=False" for w in range(1, 10)
    }


def test_drafts_of_controlled_acceptance_replay_at_a_fixed_width():
    """Speculative rounds at width 9 whose drafts are the target's own greedy tokens,
    each corrupted with probability 0.22 (about 3 of 8 accepted): bound equals stock."""
    stock, stock_state, _ = run(W.VerifyStream, 12, widths=(9,), epsilon=0.22)
    got, state, binding = run(W.VerifyStream, 12, tiny_adapter(), widths=(9,), epsilon=0.22)
    assert all(torch.equal(a, b) for a, b in zip(got, stock, strict=True))
    assert caches_equal(state, stock_state)
    committed = sum(t.shape[1] for t in got) / len(got)
    assert 1 < committed < 9, committed  # some drafts accepted, some not
    decode = binding.stats()["callables"]["decode"]
    assert decode["hits"] == 12 and not decode["misses"], decode


def test_a_second_request_s_prompt_runs_eager_and_its_tokens_replay():
    """450 greedy tokens: the 448 positions fill and a second request starts; its prompt
    call fills the cross-attention cache (the guard sends it eager), the rest replay."""
    stock, stock_state, _ = run(W.GreedyStream, 450)
    got, state, binding = run(W.GreedyStream, 450, tiny_adapter())
    assert all(torch.equal(a, b) for a, b in zip(got, stock, strict=True))
    assert caches_equal(state, stock_state)
    decode = binding.stats()["callables"]["decode"]
    assert decode["misses"] == {"host_guard": 1}, decode
    assert decode["hits"] == 450


def test_the_greedy_loop_decodes_what_the_vendor_s_generate_decodes():
    """The host loop over the static cache (width-1 calls) against transformers' own
    ``generate()`` greedy (a DynamicCache): the same 40 token IDs at the tiny shape."""
    model = W.build_whisper("tiny", seed=0)
    stream = W.GreedyStream(W.new_state(model), seed=3)
    ours = [int(stream.token)] + [int(stream.step()) for _ in range(39)]
    assert ours == W.vendor_greedy(model, W.subseed(3, 2), 40)
