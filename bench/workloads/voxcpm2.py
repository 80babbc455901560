"""Stock VoxCPM2 streaming AudioVAE decoder (``voxcpm`` 2.0.3), seeded random weights.

The workload is the released code of PyPI ``voxcpm==2.0.3`` (Apache-2.0), imported from
the installed distribution; nothing of it is copied here. The decoder path is
``voxcpm/modules/audiovae/audio_vae_v2.py``: ``AudioVAE`` and its ``StreamingVAEDecoder``.

What this module adds around the vendor code, and nothing more:

* ``import_audio_vae()`` imports ``voxcpm.modules.audiovae.audio_vae_v2`` without running
  ``voxcpm/__init__.py`` (which imports ``voxcpm.core`` and so the whole TTS stack:
  transformers, librosa, torchaudio, modelscope, ...): it registers a bare ``voxcpm``
  parent package with the real ``__path__``. ``voxcpm/modules/__init__.py`` is empty and
  ``voxcpm/modules/audiovae/__init__.py`` imports only the two VAE modules (numpy, torch,
  pydantic), so those run as released.
* ``build_vae()`` makes ``AudioVAE()`` with the default ``AudioVAEConfig`` (what
  ``VoxCPM2Model.from_local`` builds when the checkpoint's config has no
  ``audio_vae_config``, voxcpm2.py:1122-1123; the defaults give the released 64-d latent,
  decoder rates 8x6x5x2x2x2 = 1920 samples per latent frame, 48 kHz out, depthwise,
  sample-rate conditioning) with the vendor's own random init under a fixed seed, fp32
  (``from_local`` casts the VAE to fp32, voxcpm2.py:1154), eval, then moved. The weight-norm
  hooks stay (the stock never removes them: every call recomputes the weights).
* ``StockStream`` is the body of the vendor's streaming loop (``VoxCPM2Model._generate``,
  voxcpm2.py:649-654, and ``_generate_with_prompt_cache``, voxcpm2.py:936-941), under
  ``torch.inference_mode()`` as those methods run: ``with audio_vae.streaming_decode() as
  vae_dec`` once per utterance, then per chunk ``vae_dec.decode_chunk(latent_pred.to(
  torch.float32)).squeeze(1).cpu()``.
* ``latent_stream()`` gives seeded latent patches as ``_inference`` yields them in
  streaming mode (voxcpm2.py:1081-1085): ``[1, 64, 4]`` (one patch of 4 latent frames,
  160 ms at 25 Hz) in the model dtype (``VoxCPMConfig.dtype`` defaults to bfloat16).
* ``ConvStates`` reads and writes the vendor's per-layer padding state (a dict on the
  ``StreamingVAEDecoder`` keyed by ``id(module)``, audio_vae_v2.py:546-575) by the
  module's path, so a ``.clock`` contract can name each entry as a site (the language has
  no site keyed by a module's identity: see the report of issue 15).

Seeding (``subseed(seed, k) = 16 * seed + k``): weights <- ``torch.manual_seed(subseed(
seed, 0))``; latents <- a private CPU generator at ``subseed(seed, 1)``. The decoder draws
no randomness (``use_noise_block`` is False). Weights are made on the CPU and then moved,
so a CUDA build has bit-identical weights to a CPU build.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from bench.workloads import register_bare_parent
from bench.workloads import installed_version as _installed_version
from bench.workloads import release_missing, subseed

DIST_NAME = "voxcpm"
DIST_VERSION = "2.0.3"
REQUIREMENTS = "bench/requirements-voxcpm2.txt"

LATENT_DIM = 64  # AudioVAEConfig.latent_dim == VoxCPMConfig.feat_dim
PATCH_SIZE = 4  # VoxCPMConfig.patch_size: latent frames per streamed patch
SAMPLES_PER_LATENT = 1920  # prod(AudioVAEConfig.decoder_rates) = 8*6*5*2*2*2
CHUNK_SAMPLES = PATCH_SIZE * SAMPLES_PER_LATENT  # 7680 samples = 160 ms at 48 kHz
SAMPLE_RATE = 48000  # AudioVAEConfig.out_sample_rate
LATENT_DTYPE = torch.bfloat16  # VoxCPMConfig.dtype: what _inference yields before .to(fp32)

_MODULE = "voxcpm.modules.audiovae.audio_vae_v2"
_module_cache: types.ModuleType | None = None


def installed_version() -> str | None:
    return _installed_version(DIST_NAME)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can)."""
    return release_missing("voxcpm", DIST_NAME, DIST_VERSION, REQUIREMENTS, ("numpy", "pydantic"))


def import_audio_vae() -> types.ModuleType:
    """The released ``audio_vae_v2`` module, imported without ``voxcpm/__init__.py``."""
    global _module_cache
    if _module_cache is not None:
        return _module_cache
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    register_bare_parent("voxcpm")
    _module_cache = importlib.import_module(_MODULE)
    return _module_cache


def build_vae(seed: int = 0, device: Any = "cpu") -> torch.nn.Module:
    """The released ``AudioVAE()`` (default config), seeded random weights, fp32, eval."""
    av = import_audio_vae()
    torch.manual_seed(subseed(seed, 0))
    vae = av.AudioVAE(av.AudioVAEConfig())
    return vae.to(dtype=torch.float32).eval().to(torch.device(device))


def latent_stream(seed: int, n_chunks: int) -> list[torch.Tensor]:
    """Seeded latent patches ``[1, 64, 4]`` in the model dtype, on the CPU."""
    g = torch.Generator().manual_seed(subseed(seed, 1))
    return [
        torch.randn((1, LATENT_DIM, PATCH_SIZE), generator=g).to(LATENT_DTYPE)
        for _ in range(n_chunks)
    ]


class StockStream:
    """One utterance of the vendor's streaming decode (voxcpm2.py:650-654).

    ``open()`` enters ``audio_vae.streaming_decode()`` (the vendor's context manager, which
    patches every causal conv of the decoder to carry its padding state); each
    ``stream_chunk(latent)`` is one iteration of the vendor loop body; ``close()`` exits
    the context (the patches are undone and the state dropped)."""

    def __init__(self, vae: torch.nn.Module):
        self.vae = vae
        self.decoder: Any = None  # the vendor StreamingVAEDecoder while open
        self.chunks = 0

    @property
    def device(self) -> torch.device:
        return next(self.vae.parameters()).device

    def open(self) -> "StockStream":
        if self.decoder is not None:
            raise RuntimeError("stream already open")
        self.decoder = self.vae.streaming_decode().__enter__()
        self.chunks = 0
        return self

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.__exit__(None, None, None)
            self.decoder = None

    def __enter__(self) -> "StockStream":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @torch.inference_mode()
    def stream_chunk(self, latent_pred: torch.Tensor) -> np.ndarray:
        """``vae_dec.decode_chunk(latent_pred.to(torch.float32)).squeeze(1).cpu()`` for one
        patch (moved to the VAE's device first, as ``_inference`` produces it there);
        returns the chunk's 7680 float32 samples."""
        if self.decoder is None:
            raise RuntimeError("open() the stream first")
        latent_pred = latent_pred.to(self.device)
        decode_audio = self.decoder.decode_chunk(latent_pred.to(torch.float32))
        decode_audio = decode_audio.squeeze(1).cpu()
        self.chunks += 1
        assert decode_audio.dtype == torch.float32 and decode_audio.shape[0] == 1
        return decode_audio.reshape(-1).numpy()


def run_stream(vae: torch.nn.Module, latents: list[torch.Tensor]) -> list[np.ndarray]:
    """A whole utterance: open, one ``stream_chunk`` per patch, close."""
    with StockStream(vae) as stream:
        return [stream.stream_chunk(z) for z in latents]


# ----------------------------------------------------------------- the padding state


def state_paths(decoder: Any) -> list[str]:
    """Paths (under ``vae.decoder``) of the modules the vendor patched, in patch order
    (``StreamingVAEDecoder._install`` walks ``named_modules()``, audio_vae_v2.py:532-542)."""
    names = {id(m): n for n, m in decoder._vae.decoder.named_modules()}
    return [names[id(mod)] for mod, _orig in decoder._originals]


class ConvStates:
    """The vendor's ``StreamingVAEDecoder._states`` (keyed by ``id(module)``) addressed by
    module path under ``vae.decoder``: ``states["model.2.block.1"]``. Reads and writes go
    straight to the vendor's dict; nothing is cached, so an entry rebound by the stock code
    is what the next read returns."""

    def __init__(self, decoder: Any):
        self._decoder = decoder

    def _key(self, path: str) -> int:
        return id(self._decoder._vae.decoder.get_submodule(path))

    def __getitem__(self, path: str) -> torch.Tensor:
        return self._decoder._states[self._key(path)]

    def __setitem__(self, path: str, value: torch.Tensor) -> None:
        self._decoder._states[self._key(path)] = value

    def __contains__(self, path: str) -> bool:
        return self._key(path) in self._decoder._states

    def __iter__(self) -> Iterator[str]:
        return iter(p for p in state_paths(self._decoder) if p in self)


def state_summary(stream: StockStream) -> list[dict[str, Any]]:
    """Per patched layer: the state tensor the stock code holds now (shape, strides,
    bytes) and the storage it keeps alive (the stock keeps a view of the layer's input)."""
    states = ConvStates(stream.decoder)
    out = []
    for path in states:
        t = states[path]
        out.append(
            {
                "path": path,
                "shape": tuple(t.shape),
                "stride": tuple(t.stride()),
                "nbytes": t.numel() * t.element_size(),
                "storage_nbytes": t.untyped_storage().nbytes(),
                "storage_ptr": t.untyped_storage().data_ptr(),
            }
        )
    return out


def bind_adapter(
    stream: StockStream, device: Any = None, *, capture: bool = True, backend: Any = None
) -> Any:
    """Bind the generated adapter (contracts/voxcpm2.clock) to a freshly opened stream.

    The bound object has two roots: ``vae`` (the callable ``vae.decode``, which
    ``decode_chunk`` calls) and ``stream`` (the vendor ``StreamingVAEDecoder``, whose
    ``_states`` dict the contract's sites key by module identity). The vendor creates
    each entry on a layer's first streaming call (the F.pad branch, zeros on the left);
    the contract declares them ``initial zeros``, so binding before the first chunk
    creates them as zeros and every chunk replays. ``backend``: a graph backend
    (tests pass ``FakeGraphBackend`` to replay on the CPU).
    """
    if stream.decoder is None or stream.chunks:
        raise RuntimeError("bind_adapter: bind a freshly opened stream, before its first chunk")
    from duplexcadence.generated import voxcpm2 as adapter

    model = types.SimpleNamespace(vae=stream.vae, stream=stream.decoder)
    return adapter.bind(model, device=device, capture=capture, progress=False, backend=backend)
