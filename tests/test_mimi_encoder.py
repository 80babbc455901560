"""transformers 4.57.6 Mimi's streaming encoder and frame-by-frame decoder under
contracts/mimi_encoder.clock and mimi_decoder.clock, on the CPU with the simulate backend
(a replay re-executes the captured tensor program, no Python): the vendor's cache objects
are the call's object arguments, layer 0's ``cumulative_length`` a staged counter. 40
frames, every output and every state tensor bit-identical to a stock stream whose state
the vendor made itself (two of them first: the reference reproduces itself)."""

import pytest
import torch

from real_models import one_intra_op_thread  # noqa: F401  (autouse)

W = pytest.importorskip("bench.workloads.transformers_mimi")
if W.unavailable_reason() is not None:
    pytest.skip(W.unavailable_reason(), allow_module_level=True)

FRAMES = 40


def stock_run(model, initialized: bool):
    state = W.new_stream_state(model, initialized=initialized)
    stream = W.AudioStream(state, seed=0, n_frames=FRAMES)
    return [stream.step() for _ in range(FRAMES)], state


@pytest.fixture(scope="module")
def model():
    return W.build_mimi(seed=0)


@pytest.fixture(scope="module")
def reference(model):
    codes, state = stock_run(model, initialized=False)
    again, _ = stock_run(model, initialized=False)
    assert all(torch.equal(a, b) for a, b in zip(codes, again)), "stock does not reproduce itself"
    # the contract's state starts initialized (empty keys of the layer's dims): the same bytes
    initialized, _ = stock_run(model, initialized=True)
    assert all(torch.equal(a, b) for a, b in zip(codes, initialized))
    # random weights must not leave the codes constant (a test that could not fail)
    assert len({tuple(c.flatten().tolist()) for c in codes}) > FRAMES // 2
    return codes, state


def test_the_whole_encode_replays_exactly_after_the_first_frame(model, reference):
    want, stock_state = reference
    state = W.new_stream_state(model)
    binding = W.bind_adapter(state, device="cpu", backend="simulate")
    stream = W.AudioStream(state, seed=0, n_frames=FRAMES)
    for i in range(FRAMES):
        assert torch.equal(stream.step(), want[i]), f"frame {i}"
    encode = binding.stats()["callables"]["encode"]
    # frame 0 meets the downsample's `replicate` left context still None: eager
    assert encode["hits"] == FRAMES - 1 and encode["misses"] == {"signature": 1}, encode
    for got, ref in zip(state.cache.layers, stock_state.cache.layers):
        assert torch.equal(got.keys, ref.keys) and torch.equal(got.values, ref.values)
        assert got.cumulative_length == ref.cumulative_length == 2 * FRAMES
    for got, ref in zip(state.padding.padding_cache, stock_state.padding.padding_cache):
        assert torch.equal(got, ref)
    lane = binding.lanes[0]
    assert state.cache.layers[3].keys.data_ptr() == lane.regions["k3"].data_ptr()
    assert state.padding.padding_cache[14] is lane.regions["pad14"].tensor


def test_the_decoder_s_frame_by_frame_decode_replays_exactly(model):
    def run(state):
        stream = W.CodeStream(state, seed=0, n_frames=FRAMES)
        return [stream.step() for _ in range(FRAMES)]

    want = run(W.new_decoder_state(model, initialized=False))
    again = run(W.new_decoder_state(model, initialized=False))
    assert all(torch.equal(a, b) for a, b in zip(want, again)), "stock does not reproduce itself"
    state = W.new_decoder_state(model)
    binding = W.bind_adapter(state, device="cpu", backend="simulate")
    got = run(state)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    decode = binding.stats()["callables"]["decode"]
    # no member is made by the first call: every frame replays
    assert decode["hits"] == FRAMES and not decode["misses"], decode
    assert state.cache.layers[7].cumulative_length == 2 * FRAMES


@pytest.mark.cuda
def test_scalar_buffers_on_the_host_give_the_vendor_placement_s_codes_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    frames = 244  # past the sliding window (125 frames) and the bench's stream
    runs = []
    for host_scalars in (False, True):
        model = W.build_mimi(seed=0, device="cuda", host_scalars=host_scalars)
        stream = W.AudioStream(
            W.new_stream_state(model, initialized=False), seed=0, n_frames=frames
        )
        runs.append(torch.cat([stream.step() for _ in range(frames)], dim=-1).cpu())
    assert torch.equal(runs[0], runs[1])
