"""Voice prompts of any length on the generated Token2Wav adapter (issue 14), on CPU.

The contract declares the prompt as a session parameter (`param f_prompt in 50..600
frame`). For prompts the vendor example does not use, stock `Token2wav.stream()` and
the same stream bound with `params={"f_prompt": p}` (bound before priming, as the
bench's SRc cells) must give bit-identical PCM, the carry must be trimmed at the
session's own prompt, and every flow and vocoder call must be admitted by exactly one
class of that value's catalog (what ExactShapeReplay replays on CUDA; on CPU the calls
run eager, so admission is checked by signature and aliased pointer as in
test_token2wav_adapter.py). Minutes on two cores: run one prompt at a time.
"""

from __future__ import annotations

import gc

import pytest
import torch

from bench.workloads import unavailable_reason

pytestmark = pytest.mark.slow

_REASON = unavailable_reason("token2wav")
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

from bench.workloads import token2wav as W  # noqa: E402

from duplexcadence.generated import stepaudio2_token2wav as adapter  # noqa: E402
from duplexcadence.runtime import materialize  # noqa: E402
from duplexcadence.runtime.serving.params import classes_at  # noqa: E402
from duplexcadence.runtime.engine.signature import signature_and_leaves  # noqa: E402

SEED = 0
N_CHUNKS = 4  # 3 steady chunks (the stock trim fires on the third) + the final one


def _pcm(t2w, observe=None) -> list:
    out = []
    for chunk in W.token_stream(SEED, N_CHUNKS):
        out.append(torch.from_numpy(W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk)))
        if observe:
            observe(t2w)
    return out


def _admission(binding, name: str) -> list:
    """Wrap lane 0's engine of callable `name` (it sees the arguments after the carries
    were adopted): per call, the classes of the binding's value that would replay it,
    by signature and aliased pointers."""
    (decl,) = [k for k in binding.decl.callables if k.name == name]
    keys = []
    for cls in classes_at(binding.decl, decl, binding.params_key):
        args, kwargs, aliased = materialize(cls, binding.regions, torch.device("cpu"), None)
        sig, leaves = signature_and_leaves(args, kwargs)
        ptrs = tuple((i, t.data_ptr()) for i, t in enumerate(leaves) if id(t) in aliased)
        keys.append((cls.name, sig, ptrs))
        del args, kwargs, leaves
    lane = binding.lanes[0]
    engine = lane.engines[name]
    admitted: list = []

    def call(*args, **kwargs):
        sig, leaves = signature_and_leaves(args, kwargs)
        admitted.append(
            [
                n
                for n, s, ptrs in keys
                if s == sig and all(leaves[i].data_ptr() == p for i, p in ptrs)
            ]
        )
        return engine(*args, **kwargs)

    lane.engines[name] = call
    return admitted


@pytest.mark.parametrize("frames", [100, 450])
def test_any_prompt_is_exact_and_admitted_on_every_chunk(frames):
    stock = _pcm(W.build_token2wav(SEED, prompt_frames=frames))
    gc.collect()
    held: list = []
    t2w = W.build_token2wav(
        SEED,
        prompt_frames=frames,
        before_priming=lambda m: held.append(
            adapter.bind(
                m, device="cpu", capture=False, progress=False, params={"f_prompt": frames}
            )
        ),
    )
    (binding,) = held
    carry = binding.regions["estimator_carry"]
    assert carry.retention.head == frames and carry.retention.tail == 100
    # allocated at the bound value, not the domain's top (600 + 100)
    assert carry.tensor.shape[4] == frames + 100
    assert binding.regions["solver_workspace"].tensor.shape[4] == frames + 100 + 56
    flow = _admission(binding, "flow_chunk")
    vocoder = _admission(binding, "vocoder")
    lengths: list = []
    got = _pcm(t2w, lambda m: lengths.append(m.stream_cache["estimator_att_cache"].shape[4]))
    assert len(got) == len(stock) == N_CHUNKS
    for i, (a, b) in enumerate(zip(got, stock)):
        assert torch.equal(a, b), f"PCM of chunk {i} differs at a {frames}-frame prompt"
    # trimmed at the session's own prompt: prompt + 100 from the third chunk on
    assert lengths[: N_CHUNKS - 1] == [frames + 50, frames + 100, frames + 100]
    assert carry.data_ptr() == t2w.stream_cache["estimator_att_cache"].data_ptr()
    # every call, the first and the final chunk's included, has exactly one class
    assert [len(m) for m in flow] == [1] * N_CHUNKS, flow
    assert [len(m) for m in vocoder] == [1] * N_CHUNKS, vocoder
    assert flow[0][0].startswith(f"conformer_carry={frames},estimator_carry={frames},")
    binding.unbind()
