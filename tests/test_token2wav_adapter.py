"""The generated Token2Wav adapters on the released minicpmo-utils 1.0.6 code, on CPU.

Stock `Token2wav.stream()` with seeded random weights vs the same stream after
`bind()`: every chunk's mel and float32 PCM must be bit-identical, the retention
must trim at least twice, and the carry must keep one address throughout.

The step-clock adapters (cells SR and R) are bound the way bench/token2wav.py binds
them: SR before the prompt is primed, R after. On CPU their replays run eager, so
besides exactness these tests check admission without graphs: every steady Euler
step's live arguments must match exactly one catalog class by signature and aliased
slot pointers, as ExactShapeReplay would admit them on CUDA.
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("token2wav")  # looks at specs only: imports nothing
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import token2wav as W  # noqa: E402

from duplexcadence.generated import stepaudio2_token2wav as adapter  # noqa: E402
from duplexcadence.generated import stepaudio2_token2wav_step as step_adapter  # noqa: E402
from duplexcadence.generated import (  # noqa: E402
    stepaudio2_token2wav_step_replay_only as step_replay_only_adapter,
)
from duplexcadence.runtime import materialize  # noqa: E402
from duplexcadence.runtime.engine.signature import signature_and_leaves  # noqa: E402

from token2wav_reference import N_CHUNKS, stock_reference, stream  # noqa: E402

SEED = 0


def _stream(t2w, observe=None) -> tuple[list, list]:
    return stream(t2w, SEED, N_CHUNKS, observe)


@pytest.fixture(scope="module")
def stock() -> tuple[list, list]:
    run = stock_reference(SEED, N_CHUNKS)  # shared with test_token2wav_stock.py
    return run.mels, run.pcm


@pytest.fixture(scope="module")
def bound():
    """The bound stream's outputs and every fact the tests read, the model freed before
    the next module fixture builds its own (one Token2Wav alive at a time: the suite's
    peak memory)."""
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
    facts = {
        "seen": seen,
        "mels": mels,
        "pcm": pcm,
        "carry_ptr": carry.data_ptr(),
        "carry_shape": tuple(carry.tensor.shape),
        "carry_audit": (carry.audit_checks, carry.audit_divergences),
        "conformer_ptr": binding.regions["conformer_carry"].data_ptr(),
        "workspace_shape": tuple(t2w.flow.decoder.att_cache_buffer.shape),
        "stats": binding.stats(),
    }
    binding.unbind()
    del t2w, binding, carry
    gc.collect()
    return facts


def test_every_chunk_bit_identical(stock, bound):
    stock_mels, stock_pcm = stock
    assert len(bound["pcm"]) == len(stock_pcm) == N_CHUNKS
    for i in range(N_CHUNKS):
        assert torch.equal(bound["mels"][i], stock_mels[i]), f"mel of chunk {i} differs"
        assert bound["pcm"][i].dtype == torch.float32
        assert torch.equal(bound["pcm"][i], stock_pcm[i]), f"PCM of chunk {i} differs"


def test_retention_trimmed_in_place_at_one_address(bound):
    # the stock rule would have trimmed on chunks 3, 4 and 5; the writeback did instead
    assert bound["seen"]["lengths"] == [352, 402, 402, 402, 402, 402]
    assert bound["seen"]["ptrs"] == {bound["carry_ptr"]}
    assert bound["seen"]["conformer_ptrs"] == {bound["conformer_ptr"]}
    # audit mode compared every writeback with the stock concatenation
    checks, divergences = bound["carry_audit"]
    assert checks >= N_CHUNKS and divergences == 0


def test_regions_are_demand_sized(bound):
    # sized for the value bound (the default f_prompt = 302 of 50..600), not the domain's
    # top: 302 + 100 retained (+ 56 in flight for the workspace); a larger value grows it
    assert bound["workspace_shape"] == (10, 16, 2, 8, 458, 128)
    assert bound["carry_shape"] == (10, 16, 2, 8, 402, 128)
    stats = bound["stats"]
    assert set(stats["callables"]) == {"flow_chunk", "vocoder"}
    # on CPU the engine runs eager and says why
    flow = stats["callables"]["flow_chunk"]
    assert flow["hits"] == 0 and sum(flow["misses"].values()) == N_CHUNKS


# ------------------------------------------------------------- step-clock adapters
N_STEPS = 10
# attended carry extent of each chunk (the stock trim keeps 402 from chunk 3 on)
EXTENTS = [302, 352, 402, 402, 402]


def _catalog_keys(module, binding) -> list:
    """(class name, signature, aliased (leaf, pointer) pairs) of every estimator class,
    computed as ExactShapeReplay computes them at capture (one class at a time, so the
    staging buffers of the strided classes are never all alive at once)."""
    keys = []
    for cls in module.CATALOG["estimator_step"]:
        args, kwargs, aliased = materialize(cls, binding.regions, torch.device("cpu"), None)
        sig, leaves = signature_and_leaves(args, kwargs)
        ptrs = tuple((i, t.data_ptr()) for i, t in enumerate(leaves) if id(t) in aliased)
        keys.append((cls.name, sig, ptrs))
    return keys


def _record_admission(t2w, keys) -> list:
    """Wrap the bound estimator step: for every call, the class that would replay it."""
    est = t2w.flow.decoder.estimator
    inner = est.forward_chunk

    def forward_chunk(*args, **kwargs):
        sig, leaves = signature_and_leaves(args, kwargs)
        matches = [
            name
            for name, s, ptrs in keys
            if s == sig and all(leaves[i].data_ptr() == p for i, p in ptrs)
        ]
        assert len(matches) <= 1, matches
        admitted.append(matches[0] if matches else None)
        return inner(*args, **kwargs)

    admitted: list = []
    est.forward_chunk = forward_chunk
    return admitted


def _assert_step_catalog_admits_steady_steps(admitted, label) -> None:
    assert len(admitted) == N_STEPS * N_CHUNKS
    for c, extent in enumerate(EXTENTS):
        got = admitted[c * N_STEPS : (c + 1) * N_STEPS]
        assert got == [label(extent, c, k) for k in range(N_STEPS)], f"chunk {c}"
    # the final chunk (56 frames) is admitted by nobody: its steps run eager
    assert admitted[-N_STEPS:] == [None] * N_STEPS


@pytest.fixture(scope="module")
def bound_sr():
    """SR: state rule + replay at the step clock, bound before priming (as bench SR)."""
    held: list = []
    t2w = W.build_token2wav(
        SEED,
        before_priming=lambda m: held.append(
            step_adapter.bind(m, device="cpu", audit=True, capture=False, progress=False)
        ),
    )
    binding = held[0]
    binding.capture(progress=False)
    admitted = _record_admission(t2w, _catalog_keys(step_adapter, binding))
    ptrs: set = set()
    mels, pcm = _stream(t2w, lambda m: ptrs.add(m.stream_cache["estimator_att_cache"].data_ptr()))
    carry, est = binding.regions["estimator_carry"], t2w.flow.decoder.estimator
    facts = {
        "mels": mels,
        "pcm": pcm,
        "admitted": admitted,
        "ptrs": ptrs,
        "carry_ptr": carry.data_ptr(),
        "carry_audit": (carry.audit_checks, carry.audit_divergences),
        "estimator_workspace_shape": tuple(est.att_cache_buffer.shape),
        "dit_cnn_is_the_region": est.cnn_cache_buffer.data_ptr()
        == binding.regions["dit_cnn"].data_ptr(),
        "stats": binding.stats(),
    }
    binding.unbind()
    held.clear()  # the binding holds the model: freed before the next fixture builds its own
    del t2w, binding, carry, est
    gc.collect()
    return facts


@pytest.fixture(scope="module")
def bound_r():
    """R: replay at the step clock on the stock state, bound after priming (as bench R)."""
    t2w = W.build_token2wav(SEED)
    binding = step_replay_only_adapter.bind(
        t2w, device="cpu", audit=False, capture=False, progress=False
    )
    binding.capture(progress=False)
    admitted = _record_admission(t2w, _catalog_keys(step_replay_only_adapter, binding))
    mels, pcm = _stream(t2w)
    decoder = t2w.flow.decoder
    facts = {
        "mels": mels,
        "pcm": pcm,
        "admitted": admitted,
        # allocate stock: the regions are the stock tensors, nothing was resized
        "regions_are_the_stock": (
            binding.regions["dit_workspace"].tensor is decoder.estimator.att_cache_buffer,
            binding.regions["estimator_cnn"].tensor is decoder.cnn_cache_buffer,
        ),
        "workspace_shape": tuple(decoder.att_cache_buffer.shape),
        "stats": binding.stats(),
    }
    binding.unbind()
    del t2w, binding, decoder
    gc.collect()
    return facts


@pytest.mark.parametrize("cell", ["bound_sr", "bound_r"])
def test_step_clock_every_chunk_bit_identical(stock, cell, request):
    bound = request.getfixturevalue(cell)
    stock_mels, stock_pcm = stock
    assert len(bound["pcm"]) == len(stock_pcm) == N_CHUNKS
    for i in range(N_CHUNKS):
        assert torch.equal(bound["mels"][i], stock_mels[i]), f"{cell}: mel of chunk {i} differs"
        assert torch.equal(bound["pcm"][i], stock_pcm[i]), f"{cell}: PCM of chunk {i} differs"


def test_sr_state_rule_and_step_catalog(bound_sr):
    assert bound_sr["ptrs"] == {bound_sr["carry_ptr"]}
    checks, divergences = bound_sr["carry_audit"]
    assert checks >= N_CHUNKS and divergences == 0
    # the step contract declares f_prompt in 50..600 too, bound at 302: 302 + 100 + 56
    assert bound_sr["estimator_workspace_shape"] == (16, 2, 8, 458, 128)
    assert bound_sr["dit_cnn_is_the_region"]
    stats = bound_sr["stats"]
    assert set(stats["callables"]) == {"estimator_step"}
    assert stats["eager"] == {"flow_chunk": "declared `mode eager`"}
    # on CPU every step runs eager by design: the prompt's 10 steps (before capture) and
    # each chunk's are all counted `no_cuda`
    assert stats["callables"]["estimator_step"]["misses"] == {
        "no_cuda": N_STEPS * (N_CHUNKS + 1),
    }
    _assert_step_catalog_admits_steady_steps(
        bound_sr["admitted"], lambda t, c, k: f"estimator_carry={t},i={k},frames=50"
    )


def test_r_stock_state_and_step_catalog(bound_r):
    # allocate stock: the regions are the stock tensors, nothing was resized
    assert bound_r["regions_are_the_stock"] == (True, True)
    assert bound_r["workspace_shape"] == (16, 16, 2, 8, 1000, 128)
    stats = bound_r["stats"]
    assert set(stats["callables"]) == {"estimator_step"} and stats["eager"] == {}
    assert stats["callables"]["estimator_step"]["misses"] == {"no_cuda": N_STEPS * N_CHUNKS}
    # the stock carry is a view of the 1000-frame workspace until the first trim
    rows = [1000, 1000, 1000, 402, 402]
    _assert_step_catalog_admits_steady_steps(
        bound_r["admitted"],
        lambda t, c, k: f"i={k},t_att={t},row={rows[c]},frames=50",
    )
