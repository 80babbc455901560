"""nano-vllm-voxcpm 2.0.5's streaming VAE decoder bound to the stock VoxCPM2 AudioVAE (a
control for bench/voxcpm2.py).

PyPI ``nano-vllm-voxcpm==2.0.5`` (MIT) is imported from the installed distribution, never
copied (``bench/requirements-voxcpm2.txt`` installs it with ``--no-deps``). Its VAE path
is ``nanovllm_voxcpm/layers/streaming_vae.py``: ``BatchedStreamingVAEDecoder``, which
patches every causal conv / transposed conv of ``vae.decoder`` to carry one padding state
per stream id (a dict per layer), gathers the states of a dynamic batch with
``torch.stack``, and pads the batch with zero latents up to its batch-size bucket
(``utils/batch_buckets.py``: 1, 2, 4, 8, ..., up to ``max_batch_size``). It captures no
CUDA graph: the graphs of nano-vllm-voxcpm are the LM decode and the prefill diffusion
(``engine/model_runner.py:1027-1150``), not the VAE. The module imports only torch and
``nanovllm_voxcpm.utils.batch_buckets``; ``import_streaming_vae()`` imports it without
running ``nanovllm_voxcpm/__init__.py`` (the engine: flash-attn, transformers, triton)
nor ``nanovllm_voxcpm/layers/__init__.py`` (the LoRA layers).

``NanoVaeStream`` drives one utterance as ``VoxCPM2Runner`` does
(``models/voxcpm2/runner.py``): at init ``vae.streaming_decoder(max_num_seqs)`` then
``warmup(feat_dim, patch_size)`` (:62-63; built here from the stock classes, since the
stock ``AudioVAE`` has no ``streaming_decoder`` method), per chunk ``decode_chunks(
latents.to(vae_dtype), [seq_id])[:, 0, :].to(float32).cpu()`` (:167-174). The runner also
folds weight norm out of the decoder and casts it to fp16 (``_prepare_vae_decoder_for_
inference``, :66-71): the fold is applied (``torch.nn.utils.remove_weight_norm``, which
computes the weight the stock hook computes on every call); the cast is not, so the
decoder stays the stock fp32 and its output is comparable byte for byte with stock.
At batch 1 with ``max_batch_size=1`` the bucket is 1: nothing is padded.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import numpy as np
import torch

from bench.workloads import installed_version as _installed_version
from bench.workloads import register_bare_parent, release_missing
from bench.workloads import voxcpm2 as V

DIST_NAME = "nano-vllm-voxcpm"
DIST_VERSION = "2.0.5"
REQUIREMENTS = "bench/requirements-voxcpm2.txt"
_MODULE = "nanovllm_voxcpm.layers.streaming_vae"


def installed_version() -> str | None:
    return _installed_version(DIST_NAME)


def unavailable_reason() -> str | None:
    """Why the control cannot be built here (None when it can)."""
    return release_missing("nanovllm_voxcpm", DIST_NAME, DIST_VERSION, REQUIREMENTS, ())


def import_streaming_vae() -> types.ModuleType:
    """The released ``streaming_vae`` module, imported without the package ``__init__``s."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    register_bare_parent("nanovllm_voxcpm")
    register_bare_parent("nanovllm_voxcpm.layers")
    return importlib.import_module(_MODULE)


def fold_weight_norm(vae: torch.nn.Module) -> int:
    """The weight-norm fold of ``VoxCPM2Runner._prepare_vae_decoder_for_inference`` (without
    its fp16 cast); returns how many modules were folded."""
    folded = 0
    for module in vae.decoder.modules():
        if hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
            folded += 1
    return folded


class NanoVaeStream:
    """One utterance through ``BatchedStreamingVAEDecoder`` on ``vae`` (whose stock
    streaming context must be closed: both patch the same convs' ``forward``)."""

    def __init__(self, vae: torch.nn.Module, max_batch_size: int = 1, fold: bool = True):
        av, sv = V.import_audio_vae(), import_streaming_vae()
        self.vae = vae
        self.folded = fold_weight_norm(vae) if fold else 0
        self.decoder = sv.BatchedStreamingVAEDecoder(
            vae, av.CausalConv1d, av.CausalTransposeConv1d, max_batch_size=max_batch_size
        )
        self.decoder.warmup(V.LATENT_DIM, V.PATCH_SIZE)
        self.stream_id = object()  # the runner's seq.seq_id
        self.chunks = 0

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    def describe(self) -> dict[str, Any]:
        return {
            "version": installed_version(),
            "class": "nanovllm_voxcpm.layers.streaming_vae.BatchedStreamingVAEDecoder",
            "batch_size_buckets": list(self.decoder._batch_size_buckets),
            "weight_norm_folded": self.folded,
            "patched_layers": len(self.decoder._states),
        }

    def stream_chunk(self, latent_pred: torch.Tensor) -> np.ndarray:
        """One chunk as the runner decodes it; the chunk's 7680 float32 samples. The
        latent is moved and cast as the stock loop does (device, then the VAE dtype)."""
        dtype = next(self.vae.parameters()).dtype
        z = latent_pred.to(self.device).to(dtype)
        audio = self.decoder.decode_chunks(z, [self.stream_id])[:, 0, :].to(torch.float32).cpu()
        self.chunks += 1
        assert audio.shape[0] == 1
        return audio.reshape(-1).numpy()

    def close(self) -> None:
        self.decoder.release(self.stream_id)


def run_stream(vae: torch.nn.Module, latents: list[torch.Tensor]) -> list[np.ndarray]:
    """A whole utterance through the control (the stock's ``run_stream`` counterpart)."""
    stream = NanoVaeStream(vae)
    try:
        return [stream.stream_chunk(z) for z in latents]
    finally:
        stream.close()
