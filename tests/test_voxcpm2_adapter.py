"""The generated VoxCPM2 adapter (contracts/voxcpm2.clock) on the stock streaming loop, CPU.

What CPU can check: the signatures the vendor loop passes to the declared callable
(``vae.decode``, reached through ``StreamingVAEDecoder.decode_chunk``) are exactly the
catalog ``clockc`` predicted (one class); bound after the first chunk (when the vendor's
state entries exist), the adapter keeps every PCM sample equal to an unbound stream's,
holds each of the 26 pinned regions at its site at one address while the stock code
rebinds the entries every chunk, and unbind() puts the stock ``decode`` back. The graphs
themselves are for the GPU benchmark.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)
from real_models import predicted_signatures, recording

from bench.workloads import voxcpm2 as W  # noqa: E402
from duplexcadence.runtime import SiteError  # noqa: E402

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

SEED = 3
N_CHUNKS = 4


@pytest.fixture(scope="module")
def vae() -> torch.nn.Module:
    return W.build_vae(SEED)


def test_observed_signatures_are_the_predicted_catalog(vae) -> None:
    from duplexcadence.generated.voxcpm2 import adapter, contract

    latents = W.latent_stream(SEED, N_CHUNKS)
    model = types.SimpleNamespace(vae=vae)
    with recording(model, _site(adapter, "decode")) as calls:
        W.run_stream(vae, latents)
    assert "decode" not in vars(vae)  # the recorder is gone again
    assert [c[1] for c in calls] == [(((1, 64, 4), (256, 4, 1), "torch.float32", 0),)] * N_CHUNKS
    predicted = predicted_signatures(contract.CATALOG["decode"])
    assert len(predicted) == 1
    assert {sig for sig, _ in calls} == set(predicted)


@pytest.mark.xfail(
    strict=True,
    raises=SiteError,
    reason="issue 15: the vendor keys its conv states by id(module); the workload's "
    "ConvStates accessor is not a plain container, which the closed site language (issue 11) "
    "refuses at bind; the contract needs a site step keyed by a module's identity",
)
def test_bound_adapter_is_bit_identical_and_keeps_pins(vae) -> None:
    latents = W.latent_stream(SEED, N_CHUNKS)
    stock = W.run_stream(vae, latents)

    with W.StockStream(vae) as stream:
        with pytest.raises(RuntimeError, match="first chunk"):
            W.bind_adapter(stream, "cpu")
        pcm = [stream.stream_chunk(latents[0])]  # the vendor creates its state entries here
        binding = W.bind_adapter(stream, "cpu")
        states = W.ConvStates(stream.decoder)
        pinned = {name: (r.tensor, r.tensor.data_ptr()) for name, r in binding.regions.items()}
        assert len(pinned) == 26
        for z in latents[1:]:
            before = {path: states[path] for path in states}
            pcm.append(stream.stream_chunk(z))
            for path in states:  # the stock code rebound each entry; the pin put it back
                assert states[path] is before[path]
        for name, (tensor, ptr) in pinned.items():
            assert tensor.data_ptr() == ptr, name
        assert set(binding.stats()["callables"]) == {"decode"}
        binding.unbind()
        assert "decode" not in vars(vae) or vae.decode.__func__ is type(vae).decode

    assert len(pcm) == len(stock)
    for i, (a, b) in enumerate(zip(pcm, stock)):
        assert np.array_equal(a, b), f"chunk {i} differs"


def _site(adapter, name):
    """A callable's binding site, as the generated declaration gives it."""
    return next(k.site for k in adapter.DECLARED.callables if k.name == name)
