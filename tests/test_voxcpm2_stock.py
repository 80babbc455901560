"""The stock VoxCPM2 streaming AudioVAE decoder (voxcpm 2.0.3), seeded random weights, CPU.

Drives the vendor's own ``audio_vae.streaming_decode()`` / ``decode_chunk`` loop through
bench.workloads.voxcpm2 and pins what the stock code does: 7680 float32 samples per
``[1, 64, 4]`` latent patch, the 26 padding-state tensors the vendor carries (their
shapes are the contract's regions, their bytes its demand, the storage they keep alive
its stock figure), and that a fresh build with the same seed reproduces the stream's
SHA-256 bit for bit.
"""

from __future__ import annotations

import gc
import hashlib

import numpy as np
import pytest
import torch
from real_models import one_intra_op_thread  # noqa: F401 (autouse fixture)

from bench.workloads import voxcpm2 as W

pytestmark = pytest.mark.slow

_REASON = W.unavailable_reason()
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)

SEED = 0
N_CHUNKS = 4


def _sha256(chunks: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(np.ascontiguousarray(c, dtype=np.float32).tobytes())
    return h.hexdigest()


def _run(seed: int) -> dict:
    vae = W.build_vae(seed)
    out = {"pcm": [], "states": []}
    with W.StockStream(vae) as stream:
        for z in W.latent_stream(seed, N_CHUNKS):
            out["pcm"].append(stream.stream_chunk(z))
            out["states"].append(W.state_summary(stream))
    del vae
    gc.collect()
    return out


@pytest.fixture(scope="module")
def first_run() -> dict:
    return _run(SEED)


def test_latent_stream_is_seeded() -> None:
    a, b = W.latent_stream(SEED, 2), W.latent_stream(SEED, 2)
    assert [(tuple(z.shape), z.dtype) for z in a] == [((1, 64, 4), torch.bfloat16)] * 2
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a[0], W.latent_stream(SEED + 1, 1)[0])


def test_stock_chunk_shapes(first_run: dict) -> None:
    assert [p.shape for p in first_run["pcm"]] == [(W.CHUNK_SAMPLES,)] * N_CHUNKS
    for p in first_run["pcm"]:
        assert p.dtype == np.float32 and np.isfinite(p).all()
        assert float(np.abs(p).max()) > 0
    assert not np.array_equal(first_run["pcm"][0], first_run["pcm"][1])


def test_stock_state_is_the_contracts_regions(first_run: dict) -> None:
    from duplexcadence.generated.voxcpm2 import contract

    # region -> module path under vae.decoder: its site is stream._states[id(vae.decoder.
    # <path>)], the identity step's module path (("attr", "vae"), ("attr", "decoder"), ...)
    def module_path(site: tuple) -> str:
        kind, steps = site[-1]
        assert kind == "identity" and steps[:2] == (("attr", "vae"), ("attr", "decoder"))
        return ".".join(str(value) for _, value in steps[2:])

    by_path = {module_path(r.site): name for name, r in contract.REGIONS.items() if r.site}
    for states in first_run["states"]:  # the same 26 entries after every chunk
        assert {s["path"] for s in states} == set(by_path)
        for s in states:
            assert s["shape"] == contract.REGIONS[by_path[s["path"]]].spec.shape, s["path"]
        assert len(states) == 26
        assert sum(s["nbytes"] for s in states) == 647_424
    # The stock holds each state as a view of its layer's input: in steady state the
    # storage kept alive per session is the contract's `stock` total (rho 27.9).
    steady = first_run["states"][-1]
    assert len({s["storage_ptr"] for s in steady}) == 26
    assert sum(s["storage_nbytes"] for s in steady) == 18_082_304
    assert not any(
        s["stride"] == torch.empty(s["shape"]).stride() for s in steady
    ), "a stock state is a compact tensor, not a view of its layer's input"


def test_fresh_build_same_seed_is_bit_identical(first_run: dict) -> None:
    second = _run(SEED)
    assert _sha256(second["pcm"]) == _sha256(first_run["pcm"])
    for i, (a, b) in enumerate(zip(first_run["pcm"], second["pcm"])):
        assert np.array_equal(a, b), f"chunk {i} differs"
