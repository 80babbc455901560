"""Stock Qwen3-Omni Code2Wav (``transformers`` 4.57.6), seeded random weights.

The workload is the released code of PyPI ``transformers==4.57.6`` (Apache-2.0),
``models/qwen3_omni_moe``, imported from the installed distribution; nothing of it is
copied here. ``bench/requirements-qwen3-code2wav.txt`` says why 4.57.6 and how to install.

What this module adds around the vendor code, and nothing more:

* ``build_code2wav()`` makes ``Qwen3OmniMoeCode2Wav._from_config(
  Qwen3OmniMoeCode2WavConfig())`` exactly as ``Qwen3OmniMoeForConditionalGeneration.
  enable_talker`` does (modeling_qwen3_omni_moe.py:3779), under a fixed seed: the
  config defaults are the released Code2Wav's (codebook 2048 x 16 quantizers, 1024-d
  8-layer pre-transformer with 16 heads and sliding window 72, upsampling 2x2 then
  decoder rates 8x5x4x3: 1920 samples per 12.5 Hz code frame, 24 kHz), the attention
  implementation is what ``_from_config`` picks (sdpa), the weights are the vendor's own
  ``_init_weights`` (normal, std 0.02; no parameter is left degenerate: the zero ones are
  biases and the log-scale SnakeBeta alpha/beta, exp(0) = 1). Built on the CPU in fp32,
  eval, then moved (and cast, if asked: the released checkpoint is bf16).
* ``CodeStream`` drives the vendor's own loop, ``Qwen3OmniMoeCode2Wav.chunked_decode``
  (modeling_qwen3_omni_moe.py:3752-3763), one iteration per ``stream_chunk()``: the same
  ``start_index`` / ``context_size`` arithmetic, the same view ``codes[..., start -
  context : end]`` of the whole code tensor, ``self(codes_chunk)`` and the same
  ``[..., context * total_upsample:]`` cut, then ``.float()`` as ``generate`` returns it
  (:4048). The concatenated chunks are bit-identical to the vendor's ``chunked_decode``
  (tests/test_qwen3_code2wav_stock.py checks it). The streaming parameters are the
  serving ones: 25 new frames per call (vllm-omni's ``codec_chunk_frames``) with the
  vendor's ``left_context_size=25``, so windows are 25, 50, 50, ... and a final partial
  one; ``generate`` itself calls it with ``chunk_size=300`` (offline).
* ``code_stream()`` gives seeded talker codes ``[1, 16, N]`` int64, as ``generate``
  stacks them (:4041-4045).

Code2Wav keeps no state between calls: each call re-decodes its left context (a
windowed recompute). Seeding (``subseed(seed, k) = 16 * seed + k``): weights <-
``torch.manual_seed(subseed(seed, 0))``; codes <- a private CPU generator at
``subseed(seed, 1)``. The decoder draws no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.workloads import installed_version as _installed_version
from bench.workloads import release_missing, subseed

DIST_NAME = "transformers"
DIST_VERSION = "4.57.6"
REQUIREMENTS = "bench/requirements-qwen3-code2wav.txt"

NUM_QUANTIZERS = 16
CODEBOOK_SIZE = 2048
SAMPLES_PER_FRAME = 1920  # total_upsample = prod(upsampling_ratios + upsample_rates)
SAMPLE_RATE = 24000
CHUNK_FRAMES = 25  # new code frames per streamed call (vllm-omni codec_chunk_frames)
LEFT_CONTEXT = 25  # chunked_decode's left_context_size default


def installed_version() -> str | None:
    return _installed_version(DIST_NAME)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can). Only metadata and
    import specs are checked (importing transformers costs seconds at test collection);
    every module the Code2Wav path imports at import time is in the list."""
    return release_missing(
        "transformers",
        DIST_NAME,
        DIST_VERSION,
        REQUIREMENTS,
        ("numpy", "regex", "tokenizers", "huggingface_hub", "safetensors", "yaml", "requests"),
    )


def _vendor() -> tuple[Any, Any]:
    from transformers.models.qwen3_omni_moe import (
        configuration_qwen3_omni_moe,
        modeling_qwen3_omni_moe,
    )

    return configuration_qwen3_omni_moe, modeling_qwen3_omni_moe


def build_code2wav(
    seed: int = 0, device: Any = "cpu", dtype: torch.dtype = torch.float32
) -> torch.nn.Module:
    """The released Code2Wav at its default config, seeded random weights, eval."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    cfg_mod, modeling = _vendor()
    torch.manual_seed(subseed(seed, 0))
    model = modeling.Qwen3OmniMoeCode2Wav._from_config(cfg_mod.Qwen3OmniMoeCode2WavConfig())
    return model.eval().to(device=torch.device(device), dtype=dtype)


def code_stream(seed: int, n_frames: int) -> torch.Tensor:
    """Seeded talker codes ``[1, 16, n_frames]`` int64 on the CPU."""
    g = torch.Generator().manual_seed(subseed(seed, 1))
    return torch.randint(0, CODEBOOK_SIZE, (1, NUM_QUANTIZERS, n_frames), generator=g)


def windows(
    n_frames: int, chunk_size: int = CHUNK_FRAMES, left_context_size: int = LEFT_CONTEXT
) -> list[tuple[int, int]]:
    """(context, window) frames of every call chunked_decode makes over n_frames codes."""
    out, start = [], 0
    while start < n_frames:
        end = min(start + chunk_size, n_frames)
        context = left_context_size if start - left_context_size > 0 else start
        out.append((context, end - start + context))
        start = end
    return out


class CodeStream:
    """The vendor's ``chunked_decode`` loop over ``codes``, one iteration per call.

    ``codes`` is moved to the model's device once (as ``generate`` hands the whole talker
    code tensor to ``chunked_decode``); every call passes the model the same strided view
    the vendor loop passes. ``decode`` computes one window: the model itself (stock) or a
    control's per-window call on the same model (vllm-omni's graph wrapper's ``decode``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        codes: torch.Tensor,
        chunk_size: int = CHUNK_FRAMES,
        left_context_size: int = LEFT_CONTEXT,
        decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.model = model
        self.decode = model if decode is None else decode
        self.codes = codes.to(next(model.parameters()).device)
        self.chunk_size = chunk_size
        self.left_context_size = left_context_size
        self.start_index = 0

    @property
    def done(self) -> bool:
        return self.start_index >= self.codes.shape[-1]

    def __len__(self) -> int:
        return math.ceil(self.codes.shape[-1] / self.chunk_size)

    @torch.inference_mode()
    def stream_chunk(self) -> np.ndarray:
        """One iteration of chunked_decode (modeling_qwen3_omni_moe.py:3755-3762); the
        chunk's PCM as 1-D float32 on the host."""
        if self.done:
            raise StopIteration("the code stream is exhausted")
        codes, start_index = self.codes, self.start_index
        end_index = min(start_index + self.chunk_size, codes.shape[-1])
        context_size = (
            self.left_context_size if start_index - self.left_context_size > 0 else start_index
        )
        codes_chunk = codes[..., start_index - context_size : end_index]
        wav_chunk = self.decode(codes_chunk)
        wav = wav_chunk[..., context_size * self.model.total_upsample :]
        self.start_index = end_index
        return wav.float().reshape(-1).cpu().numpy()


def run_stream(
    model: torch.nn.Module,
    codes: torch.Tensor,
    chunk_size: int = CHUNK_FRAMES,
    left_context_size: int = LEFT_CONTEXT,
) -> list[np.ndarray]:
    stream = CodeStream(model, codes, chunk_size, left_context_size)
    return [stream.stream_chunk() for _ in range(len(stream))]


@torch.inference_mode()
def vendor_chunked_decode(
    model: torch.nn.Module,
    codes: torch.Tensor,
    chunk_size: int = CHUNK_FRAMES,
    left_context_size: int = LEFT_CONTEXT,
) -> np.ndarray:
    """The vendor's own ``chunked_decode`` over the whole stream, as ``generate`` calls it
    (then ``.float()``): the reference ``CodeStream`` must equal byte for byte."""
    codes = codes.to(next(model.parameters()).device)
    wav = model.chunked_decode(codes, chunk_size=chunk_size, left_context_size=left_context_size)
    return wav.float().reshape(-1).cpu().numpy()


def bind_adapter(
    model: torch.nn.Module, device: Any = None, *, capture: bool = True, backend: Any = None
) -> Any:
    """Bind the generated adapter (contracts/qwen3_code2wav.clock): the callable is the
    model's ``forward``, which ``self(codes_chunk)`` reaches through ``nn.Module.__call__``.
    ``backend``: a graph backend (tests pass ``FakeGraphBackend`` to replay on the CPU)."""
    import types

    from duplexcadence.generated import qwen3_code2wav as adapter

    return adapter.bind(
        types.SimpleNamespace(code2wav=model),
        device=device,
        capture=capture,
        progress=False,
        backend=backend,
    )
