"""The public competitors as control cells of the one-callable decoders (issue 15):
nano-vllm-voxcpm's streaming VAE decoder on the stock VoxCPM2 AudioVAE
(``nanovllm_vae``), vllm-omni's Code2Wav CUDA-graph wrapper on the stock Qwen3-Omni
Code2Wav (``vllm_omni_code2wav``), and the ``compile_mat`` control shared with Token2Wav.

The cell declarations and the wrapper's bucket arithmetic are fast; the CPU streams
(real models, seeded random weights) are slow; the replayed wrapper needs CUDA.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("pandas", reason="the benchmark harness needs: pip install -e '.[bench]'")

from bench import qwen3_code2wav as Q  # noqa: E402
from bench import token2wav as T  # noqa: E402
from bench import voxcpm2 as V  # noqa: E402
from bench.workloads import nanovllm_vae as N  # noqa: E402
from bench.workloads import vllm_omni_graphs as G  # noqa: E402
from bench.workloads import qwen3_code2wav as QW  # noqa: E402
from bench.workloads import voxcpm2 as VW  # noqa: E402

needs_nanovllm = pytest.mark.skipif(
    N.unavailable_reason() is not None or VW.unavailable_reason() is not None,
    reason=str(N.unavailable_reason() or VW.unavailable_reason()),
)
needs_vllm_omni = pytest.mark.skipif(
    G.unavailable_reason(G.CODE2WAV_WRAPPER_FILE) is not None,
    reason=str(G.unavailable_reason(G.CODE2WAV_WRAPPER_FILE)),
)
needs_code2wav = pytest.mark.skipif(
    QW.unavailable_reason() is not None, reason=str(QW.unavailable_reason())
)


def test_control_cells_are_declared():
    t2w_mat = {c.name: c for c in T.COMPILE_CELLS}["compile_mat"]
    for wl in (V.WORKLOAD, Q.WORKLOAD):
        cell = wl.cell("compile_mat")
        assert cell.compile_mode == t2w_mat.compile_mode == "max-autotune-no-cudagraphs"
        assert cell.needs_cuda and cell.failure
        assert wl.cell("compile").compile_mode == "default"
        assert wl.cell("compile_ro").compile_mode == "reduce-overhead"
    assert not V.WORKLOAD.cell("nanovllm_vae").needs_cuda  # eager: it runs on the CPU
    assert Q.WORKLOAD.cell("vllm_omni_code2wav").needs_cuda
    assert "vllm_omni_code2wav" not in V.WORKLOAD.by_name
    assert "nanovllm_vae" not in Q.WORKLOAD.by_name


@needs_vllm_omni
def test_code2wav_wrapper_loads_alone_and_pads_the_last_window_of_a_turn():
    """The lone file imports without vLLM; with vllm-omni's deploy config (25 / 25) the
    windows of a 210-frame turn replay in buckets 25, 50 (exact sizes) and, for the last
    window of 35 frames, 50: zero-padded (so that cell cannot promise bytes)."""
    wrapper_cls = G.import_wrapper_module(G.CODE2WAV_WRAPPER_FILE).CUDAGraphDecoderWrapper
    assert "vllm" not in sys.modules and "vllm_omni" not in sys.modules
    sizes = wrapper_cls.compute_capture_sizes(QW.CHUNK_FRAMES, QW.LEFT_CONTEXT)
    assert sizes == [2, 4, 8, 16, 25, 32, 50, 64, 128, 256, 325]
    shapes = {(1, s) for s in sizes}
    buckets = {w: wrapper_cls._select_replay_shape(1, w, shapes)[1] for _, w in QW.windows(210)}
    assert buckets == {25: 25, 50: 50, 35: 50}


@pytest.mark.slow
@needs_nanovllm
def test_nanovllm_vae_stream_is_byte_identical_to_stock_on_cpu():
    """Same seed, same latents: the nano-vllm decoder (weight norm folded, bucket 1) yields
    the stock stream's bytes, and only its VAE modules were imported."""
    latents = VW.latent_stream(0, 3)
    with torch.inference_mode():
        stock = VW.run_stream(VW.build_vae(0), latents)
    vae = VW.build_vae(0)
    stream = N.NanoVaeStream(vae)
    got = [stream.stream_chunk(z) for z in latents]
    assert [a.tobytes() for a in got] == [a.tobytes() for a in stock]
    info = stream.describe()
    assert info["batch_size_buckets"] == [1] and info["weight_norm_folded"] > 0
    assert not any(
        m.startswith(("nanovllm_voxcpm.engine", "nanovllm_voxcpm.llm")) for m in sys.modules
    )


@pytest.mark.slow
@needs_nanovllm
def test_nanovllm_cell_replaces_the_stock_stream():
    """The cell's set-up closes the stock stream (its patches undone) and feeds the same
    latents to the control."""
    vae = VW.build_vae(0)
    s = V.VaeStream(VW, vae, seed=0, n_chunks=2)
    info: dict = {}
    V.nanovllm_setup(V.NANOVLLM_CELL, s, info)
    assert s.stock.decoder is None and info["nanovllm_vae"]["version"] == N.DIST_VERSION
    assert s.step().shape == (VW.CHUNK_SAMPLES,)


@pytest.mark.slow
@needs_code2wav
@needs_vllm_omni
def test_vllm_omni_wrapper_binds_the_stock_code2wav_on_cpu():
    """Bound on a CPU model the vendor's warm-up captures nothing and ``decode`` runs the
    stock forward: the turn through the cell's decode equals the stock turn byte for byte."""
    model = QW.build_code2wav(0)
    stock = Q.TurnStream(QW, model, seed=0, n_chunks=2, turn_frames=60)
    ctl = Q.TurnStream(QW, model, seed=0, n_chunks=2, turn_frames=60)
    info: dict = {}
    Q.vllm_omni_setup(Q.VLLM_OMNI_CELL, ctl, info)
    assert info["vllm_omni"]["graphs"] == 0
    for _ in range(2):
        assert ctl.step().tobytes() == stock.step().tobytes()
    assert info["vllm_omni"]["windows_to_bucket"] == {"25->eager": 1, "50->eager": 1}


@pytest.mark.cuda
@needs_code2wav
@needs_vllm_omni
def test_vllm_omni_wrapper_replays_exact_size_windows_bit_identical():
    """On CUDA the wrapper captures its buckets; the windows that fit a bucket exactly (25,
    50) replay bit-identical to the stock eager windows; the padded one (35 in 50) keeps the
    stock length."""
    model = QW.build_code2wav(0, "cuda")
    turn = 60  # windows 25, 50, 35
    stock = Q.TurnStream(QW, model, seed=0, n_chunks=3, turn_frames=turn)
    ref = [stock.step() for _ in range(3)]
    ctl = Q.TurnStream(QW, model, seed=0, n_chunks=3, turn_frames=turn)
    info: dict = {}
    Q.vllm_omni_setup(Q.VLLM_OMNI_CELL, ctl, info)
    got = [ctl.step() for _ in range(3)]
    assert info["vllm_omni"]["graphs"] == 11
    assert info["vllm_omni"]["windows_to_bucket"] == {"25->25": 1, "50->50": 1, "35->50": 1}
    assert got[0].tobytes() == ref[0].tobytes() and got[1].tobytes() == ref[1].tobytes()
    assert got[2].shape == ref[2].shape
