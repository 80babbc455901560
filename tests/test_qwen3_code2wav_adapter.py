"""The generated Qwen3-Omni Code2Wav adapter (contracts/qwen3_code2wav.clock), CPU.

The contract is written for the bench turn (N = 210 code frames, 9 calls). What CPU can
check:

* the signatures the vendor's own ``chunked_decode`` passes to ``forward`` over that turn
  are exactly the 4 classes ``clockc`` predicted. The loop's arguments do not depend on
  what the decoder returns, so this run records each call and answers it with silence of
  the right length instead of decoding (9 real calls would take a minute on CPU); the
  first two calls of ``CodeStream`` over the same turn, decoded for real, are recorded
  too and must be the same;
* the same loop over a turn of another length passes signatures outside that catalog
  (the window is a view of the whole turn's codes: its strides grow with N), the gap
  the contract's comment states;
* bound, the adapter keeps the PCM byte-identical to stock and unbind() restores
  ``forward``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)
from real_models import layout, predicted_signatures, recording

from duplexcadence.runtime import signature_of

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
        self.calls.append((signature_of((codes,), {}), (layout(codes),)))
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
    assert len(predicted) == 4
    calls = _loop_signatures(model, BENCH_TURN)
    assert len(calls) == 9
    assert [c[1][0][0][2] for c in calls] == [25] + [50] * 7 + [35]
    assert [c[1][0][3] for c in calls] == [0, 0, 25, 50, 75, 100, 125, 150, 175]
    assert {sig for sig, _ in calls} == set(predicted)

    # the real decoder, first two chunks of the same turn: the same signatures
    stream = W.CodeStream(model, W.code_stream(SEED, BENCH_TURN))
    with recording(types.SimpleNamespace(code2wav=model), _site(adapter, "decode")) as real:
        stream.stream_chunk()
        stream.stream_chunk()
    assert "forward" not in vars(model)
    assert [sig for sig, _ in real] == [sig for sig, _ in calls[:2]]


def test_another_turn_length_leaves_the_catalog(model) -> None:
    from duplexcadence.generated.qwen3_code2wav import contract

    predicted = set(predicted_signatures(contract.CATALOG["decode"]))
    calls = _loop_signatures(model, BENCH_TURN + 25)
    strides = {c[1][0][1] for c in calls}
    assert strides == {(16 * (BENCH_TURN + 25), BENCH_TURN + 25, 1)}
    assert not predicted & {sig for sig, _ in calls}


def test_bound_adapter_is_bit_identical(model) -> None:
    codes = W.code_stream(SEED, 30)
    stock = W.run_stream(model, codes)
    binding = W.bind_adapter(model, "cpu")
    try:
        assert "forward" in vars(model)
        bound = W.run_stream(model, codes)
        stats = binding.stats()["callables"]["decode"]
        assert stats["hits"] == 0 and stats["eager_calls"] == len(stock)  # CPU: eager
    finally:
        binding.unbind()
    assert model.forward.__func__ is type(model).forward
    assert len(bound) == len(stock)
    for i, (a, b) in enumerate(zip(bound, stock)):
        assert np.array_equal(a, b), f"chunk {i} differs"


def _site(adapter, name):
    """A callable's binding site, as the generated declaration gives it."""
    return next(k.site for k in adapter.DECLARED.callables if k.name == name)
