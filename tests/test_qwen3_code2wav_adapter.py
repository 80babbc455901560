"""The generated Qwen3-Omni Code2Wav adapter (contracts/qwen3_code2wav.clock), CPU.

The contract is written for the bench turn (N = 210 code frames, 9 calls). What CPU can
check:

* the signatures the vendor's own ``chunked_decode`` passes to ``forward`` over that turn
  are exactly the 4 classes ``clockc`` predicted. The loop's arguments do not depend on
  what the decoder returns, so this run records each call and answers it with silence of
  the right length instead of decoding (9 real calls would take a minute on CPU); the
  first two calls of ``CodeStream`` over the same turn, decoded for real, are recorded
  too and must be the same;
* the codes window is a view of the whole turn (strides grow with N, the offset moves);
  declared `layout free`, it is keyed as a contiguous copy, so a turn of another length
  with the same final remainder meets the same catalog;
* bound on the fake graph backend, every call of a 60-frame turn (25, 50, 35) replays,
  the PCM is byte-identical to stock and unbind() restores ``forward``;
* the contract's bytes per session are the live window the decoder reads.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)
from real_models import contract_bytes_per_session, layout, predicted_signatures, recording

from duplexcadence.runtime import FakeGraphBackend, signature_of
from duplexcadence.runtime.serving.lane import _contiguous

from bench.workloads import qwen3_code2wav as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

SEED = 1
BENCH_TURN = 210  # contracts/qwen3_code2wav.clock: n_codes


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return W.build_code2wav(SEED)


class _LoopOnly:
    """A stand-in ``self`` for the vendor's ``chunked_decode``: each call of the decoder is
    recorded as the runtime keys it and answered by zeros of the length the decoder
    returns (n * 1920 - 555 samples)."""

    def __init__(self, total_upsample: int):
        self.total_upsample = total_upsample
        self.calls: list = []

    def __call__(self, codes: torch.Tensor) -> torch.Tensor:
        # keyed as the bound adapter keys it: the `layout free` window made contiguous
        self.calls.append((signature_of((_contiguous(codes),), {}), (layout(codes),)))
        return torch.zeros(1, 1, codes.shape[-1] * self.total_upsample - 555)


def _loop_signatures(model: torch.nn.Module, n_frames: int) -> list:
    """What the vendor's chunked_decode (the function itself) passes over an n-frame turn."""
    loop = _LoopOnly(int(model.total_upsample))
    type(model).chunked_decode(
        loop,
        W.code_stream(SEED, n_frames),
        chunk_size=W.CHUNK_FRAMES,
        left_context_size=W.LEFT_CONTEXT,
    )
    return loop.calls


def test_observed_signatures_are_the_predicted_catalog(model) -> None:
    from duplexcadence.generated.qwen3_code2wav import adapter, contract

    predicted = predicted_signatures(contract.CATALOG["decode"])
    assert len(predicted) == 3
    calls = _loop_signatures(model, BENCH_TURN)
    assert len(calls) == 9
    assert [c[1][0][0][2] for c in calls] == [25] + [50] * 7 + [35]
    assert [c[1][0][3] for c in calls] == [0, 0, 25, 50, 75, 100, 125, 150, 175]
    assert {sig for sig, _ in calls} == set(predicted)

    # the real decoder, first two chunks of the same turn: the same views
    stream = W.CodeStream(model, W.code_stream(SEED, BENCH_TURN))
    with recording(types.SimpleNamespace(code2wav=model), _site(adapter, "decode")) as real:
        stream.stream_chunk()
        stream.stream_chunk()
    assert "forward" not in vars(model)
    assert [lay for _, lay in real] == [lay for _, lay in calls[:2]]


def test_another_turn_length_meets_the_same_catalog(model) -> None:
    from duplexcadence.generated.qwen3_code2wav import contract

    predicted = set(predicted_signatures(contract.CATALOG["decode"]))
    calls = _loop_signatures(model, BENCH_TURN + 25)  # another N, the same final 10 frames
    strides = {c[1][0][1] for c in calls}
    assert strides == {(16 * (BENCH_TURN + 25), BENCH_TURN + 25, 1)}  # views of the turn
    assert {sig for sig, _ in calls} == predicted


def test_bound_adapter_replays_every_call_bit_identical(model) -> None:
    """Every class captures (the vendor builds its attention mask under torch.vmap and
    moves it with `.to(device)`: the host-constant mode must let that pass, hoist.py) and
    every call replays."""
    codes = W.code_stream(SEED, 60)  # windows 25, 50, 35: the catalog's three classes
    stock = W.run_stream(model, codes)
    binding = W.bind_adapter(model, "cpu", capture=False, backend=FakeGraphBackend())
    try:
        binding.capture(progress=False)
        assert "forward" in vars(model)
        bound = W.run_stream(model, codes)
        stats = binding.stats()["callables"]["decode"]
        assert stats["hits"] == len(stock) and stats["misses"] == {}
        assert stats["eager_calls"] == 0
        assert [c["status"] for c in stats["classes"]] == ["captured"] * 3
    finally:
        binding.unbind()
    assert model.forward.__func__ is type(model).forward
    assert len(bound) == len(stock)
    for i, (a, b) in enumerate(zip(bound, stock)):
        assert np.array_equal(a, b), f"chunk {i} differs"


def test_contract_bytes_per_session_are_the_live_window() -> None:
    """Nothing is carried between calls: what a session needs is the window the decoder
    reads (the largest: 16 x 50 int64); the stock caller keeps the whole turn."""
    largest = max(w for _, w in W.windows(BENCH_TURN))
    live = W.code_stream(SEED, largest)
    measured = live.numel() * live.element_size()
    declared = contract_bytes_per_session("qwen3_code2wav")
    assert abs(declared - measured) <= 0.05 * measured, (declared, measured)


def _site(adapter, name):
    """A callable's binding site, as the generated declaration gives it."""
    return next(k.site for k in adapter.DECLARED.callables if k.name == name)
