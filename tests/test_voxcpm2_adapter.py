"""The generated VoxCPM2 adapter (contracts/voxcpm2.clock) on the stock streaming loop, CPU.

What CPU can check: the signatures the vendor loop passes to the declared callable
(``vae.decode``, reached through ``StreamingVAEDecoder.decode_chunk``) are exactly the
catalog ``clockc`` predicted (one class); bound on a freshly opened stream (the vendor's
state entries, keyed by module identity, are created by bind as zeros), every chunk
replays on the fake graph backend with every PCM sample equal to an unbound stream's,
each of the 26 pinned regions stays at its site at one address while the stock code
rebinds the entries every chunk, and unbind() puts the stock ``decode`` back; the
decoder's weight norm (45 convs under old-style hooks) is folded at bind, with the PCM
still equal to the stock's, and unbind() puts it back; the contract's bytes per session
are the stock's state bytes within 5 %. The CUDA graphs themselves are for the GPU
benchmark.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)
from real_models import contract_bytes_per_session, predicted_signatures, recording

from bench.workloads import voxcpm2 as W  # noqa: E402
from duplexcadence.runtime import FakeGraphBackend  # noqa: E402

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


def test_bound_adapter_replays_every_chunk_bit_identical_and_keeps_pins(vae) -> None:
    """Bound on a freshly opened stream (the state entries do not exist yet: `initial
    zeros` creates them), every chunk replays on the fake graph backend, the PCM equals an
    unbound stream's, and each entry stays one compact tensor at one address."""
    latents = W.latent_stream(SEED, N_CHUNKS)
    stock = W.run_stream(vae, latents)
    decoder_state = {k: v.clone() for k, v in vae.decoder.state_dict().items()}
    assert len(_weight_norm_hooks(vae.decoder)) == 45

    with W.StockStream(vae) as stream:
        assert stream.decoder._states == {}  # the sites appear only on the first call
        binding = W.bind_adapter(stream, "cpu", capture=False, backend=FakeGraphBackend())
        # the decoder's weight norm is folded at bind: one weight per conv, no hooks
        folds = binding.stats()["folds"]["decoder_weight_norm"]
        assert folds["modules"] == 45 and folds["device_bytes_freed"] == 0  # on the host
        assert folds["host_bytes_kept"] == sum(
            v.nbytes for k, v in decoder_state.items() if k.endswith(("weight_g", "weight_v"))
        )
        assert _weight_norm_hooks(vae.decoder) == []
        assert not any(k.endswith(("_g", "_v")) for k in vae.decoder.state_dict())
        binding.capture(progress=False)
        states = W.ConvStates(stream.decoder)
        pinned = {name: (r.tensor, r.tensor.data_ptr()) for name, r in binding.regions.items()}
        assert len(pinned) == 26 and len(list(states)) == 26
        assert all(states[p].is_contiguous() and not states[p].any() for p in states)
        pcm = []
        for z in latents:
            before = {path: states[path] for path in states}
            pcm.append(stream.stream_chunk(z))
            for path in states:  # the stock code rebound each entry; the pin put it back
                assert states[path] is before[path]
        for name, (tensor, ptr) in pinned.items():
            assert tensor.data_ptr() == ptr, name
        stats = binding.stats()["callables"]["decode"]
        assert stats["hits"] == N_CHUNKS and stats["misses"] == {}
        assert stats["eager_calls"] == 0
        binding.unbind()
        assert vae.decode.__func__ is type(vae).decode

    assert len(pcm) == len(stock)
    for i, (a, b) in enumerate(zip(pcm, stock)):
        assert np.array_equal(a, b), f"chunk {i} differs"
    # unbind() put the stock weight norm back: same hooks, names, order and values
    assert len(_weight_norm_hooks(vae.decoder)) == 45
    restored = vae.decoder.state_dict()
    assert list(restored) == list(decoder_state)
    assert all(torch.equal(restored[k], v) for k, v in decoder_state.items())
    for i, (a, b) in enumerate(zip(W.run_stream(vae, latents), stock)):
        assert np.array_equal(a, b), f"unbound chunk {i} differs"


def test_binding_refuses_a_stream_already_decoding(vae) -> None:
    with W.StockStream(vae) as stream:
        stream.stream_chunk(W.latent_stream(SEED, 1)[0])
        with pytest.raises(RuntimeError, match="before its first chunk"):
            W.bind_adapter(stream, "cpu")


def test_contract_bytes_per_session_match_the_stock_state(vae) -> None:
    """clockc's bytes per session (contracts/voxcpm2.clock) within 5 % of the bytes of the
    state tensors the stock code keeps between chunks (sum of their nbytes)."""
    with W.StockStream(vae) as stream:
        for z in W.latent_stream(SEED, 2):
            stream.stream_chunk(z)
        measured = sum(s["nbytes"] for s in W.state_summary(stream))
    declared = contract_bytes_per_session("voxcpm2")
    assert abs(declared - measured) <= 0.05 * measured, (declared, measured)


@pytest.mark.cuda
def test_on_cuda_the_folded_decoder_replays_exactly_and_frees_its_originals() -> None:
    """Real CUDA graphs over the folded decoder: every chunk replays, the PCM equals the
    unfolded stock's (both under the contract's cuDNN settings), and the 45 convs' g and
    v leave the device (about the decoder's 175 MiB of parameters)."""
    vae = W.build_vae(SEED, "cuda")
    latents = W.latent_stream(SEED, N_CHUNKS)
    flags = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        stock = W.run_stream(vae, latents)
        originals = sum(
            p.nbytes for n, p in vae.decoder.named_parameters() if n.endswith(("_g", "_v"))
        )
        with W.StockStream(vae) as stream:
            binding = W.bind_adapter(stream, "cuda")
            folds = binding.stats()["folds"]["decoder_weight_norm"]
            # g and v leave; the weight each hook kept becomes the parameter
            assert folds["modules"] == 45 and folds["device_bytes_freed"] == originals
            assert all(p.device.type == "cuda" for p in vae.decoder.parameters())
            pcm = [stream.stream_chunk(z) for z in latents]
            stats = binding.stats()["callables"]["decode"]
            assert stats["hits"] == N_CHUNKS and stats["misses"] == {}
            binding.unbind()
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags
    for i, (a, b) in enumerate(zip(pcm, stock)):
        assert np.array_equal(a, b), f"chunk {i} differs"


def _weight_norm_hooks(module: torch.nn.Module) -> list:
    from torch.nn.utils.weight_norm import WeightNorm

    return [
        h
        for m in module.modules()
        for h in m._forward_pre_hooks.values()
        if isinstance(h, WeightNorm)
    ]


def _site(adapter, name):
    """A callable's binding site, as the generated declaration gives it."""
    return next(k.site for k in adapter.DECLARED.callables if k.name == name)
