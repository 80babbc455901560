"""Stock Mimi (``transformers`` 4.57.6) streaming encoder and decoder, seeded random weights.

The workload is the released code of PyPI ``transformers==4.57.6`` (Apache-2.0),
``models/mimi``, imported from the installed distribution; nothing of it is copied here.
It needs what bench/workloads/qwen3_code2wav.py needs (the same transformers and its
import-time dependencies: ``bench/requirements-qwen3-code2wav.txt``).

What this module adds around the vendor code, and nothing more:

* ``build_mimi()``: ``MimiModel(MimiConfig())`` under a fixed seed, eval: the default
  config is kyutai/mimi's architecture (24 kHz, SEANet 8x6x5x4 with 64 filters, an
  8-layer 512-d transformer of 8 heads x 64 with sliding window 250, downsample to
  12.5 Hz, 32 quantizers of 2048), the weights the vendor's own ``_init_weights``; the
  codebooks, which the vendor starts at zeros (every code 0), get seeded normal
  centroids, and their lazily cached ``embed`` is made before any capture. Placement:
  each ``MimiConv1d`` keeps ``stride``, ``kernel_size`` and ``padding_total`` as 0-dim
  int64 buffers, which ``.to(cuda)`` moves to the device; its forward then computes its
  paddings from them and pads with them (``F.pad`` with tensor pads, ``x[..., -pad:]``),
  a host sync per conv (~40 a frame), which no CUDA graph can capture (the H200 run at
  d2ff29a: every class ``capture_failed``). ``keep_scalars_on_host`` keeps those
  buffers on the CPU, as built, for every cell (the stock too): integer arithmetic, the
  same values and bytes (``tests/test_mimi_encoder.py``'s cuda test compares the codes
  with the vendor's placement over 244 frames).
* ``new_stream_state(model)``: the stream's state as the vendor's streaming encode keeps
  it — a ``DynamicCache(config=...)`` (8 ``DynamicSlidingWindowLayer``) and the
  ``MimiConv1dPaddingCache`` that ``MimiModel.encode`` builds when passed None
  (modeling_mimi.py, ``use_streaming and padding_cache is None``: the same per-layer
  paddings, modes and channels) — in a ``SimpleNamespace(mimi, cache, padding)``, the
  object the adapter binds (contracts/mimi_encoder.clock). Each cache layer is
  initialized as the vendor's ``lazy_initialization`` does, with empty keys/values of
  the layer's own dims ``[1, heads, 0, head_dim]`` instead of its 1-d ``tensor([])``:
  the carry the adapter keeps there needs the dims; ``torch.cat`` of either with the
  first keys gives the same bytes (tests/test_mimi_encoder.py checks it against a stream
  whose state the vendor made itself).
* ``new_decoder_state(model)``: ``SimpleNamespace(mimi, cache)``, the decoder's
  ``DynamicCache`` (the same 8 sliding-window layers), initialized the same way.
* ``CodeStream``: seeded codes ``[1, 32, 1]`` per ``step()`` through ``model.decode(codes,
  decoder_past_key_values=cache, return_dict=False)``, the vendor's frame-by-frame decode
  (its transformer keeps the cache; 4.57.6's decoder convolutions keep no state, so each
  frame's PCM is what that call returns); a step returns the frame's float32 PCM
  ``[1, 1, 1920]`` (contracts/mimi_decoder.clock).
* ``AudioStream``: seeded float32 audio, one 80 ms frame (1920 samples) per ``step()``
  through ``model.encode(frame, encoder_past_key_values=cache, padding_cache=padding,
  use_streaming=True, return_dict=False)``, the vendor's streaming call; a step returns
  the frame's codes ``[1, 32, 1]`` (int64 token IDs).

Seeding (``subseed(seed, k)``): weights <- ``torch.manual_seed(subseed(seed, 0))``; audio
<- a private CPU generator at ``subseed(seed, 1)``. The encoder draws no randomness.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from bench.workloads import installed_version as _installed_version
from bench.workloads import release_missing, subseed

DIST_NAME = "transformers"
DIST_VERSION = "4.57.6"
REQUIREMENTS = "bench/requirements-qwen3-code2wav.txt"  # the same transformers release

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # one 12.5 Hz code frame: SEANet hop 960 x downsample 2


def installed_version() -> str | None:
    return _installed_version(DIST_NAME)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can)."""
    return release_missing(
        "transformers",
        DIST_NAME,
        DIST_VERSION,
        REQUIREMENTS,
        ("numpy", "regex", "tokenizers", "huggingface_hub", "safetensors", "yaml", "requests"),
    )


def build_mimi(seed: int = 0, device: Any = "cpu", host_scalars: bool = True) -> torch.nn.Module:
    """The released MimiModel at its default config, seeded random weights, eval;
    ``host_scalars``: its scalar shape buffers kept on the host (module docstring)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    from transformers import MimiConfig, MimiModel

    torch.manual_seed(subseed(seed, 0))
    model = MimiModel(MimiConfig()).eval()
    with torch.no_grad():
        for codebook in _codebooks(model):
            # the vendor initializes every codebook to zeros (a trained one is learned):
            # every frame's codes would be 0. Seeded normal centroids make them vary.
            codebook.embed_sum.normal_()
            codebook._embed = None
    model = model.to(torch.device(device))
    if host_scalars:
        keep_scalars_on_host(model)
    for codebook in _codebooks(model):
        # ``embed`` is cached on its first quantize, a tensor attribute made by the call:
        # made here, once, so that no graph capture is the call that makes it
        codebook.embed  # noqa: B018
    return model


def keep_scalars_on_host(model: torch.nn.Module) -> list[str]:
    """Every non-persistent 0-dim integer buffer moved to the host; their names."""
    moved = []
    for path, m in model.named_modules():
        for name, t in list(m._buffers.items()):
            if (
                t is not None
                and name in m._non_persistent_buffers_set
                and t.dim() == 0
                and not t.is_floating_point()
                and t.device.type != "cpu"
            ):
                m._buffers[name] = t.cpu()
                moved.append(f"{path}.{name}")
    return moved


def _codebooks(model: Any) -> list[Any]:
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    return [m for m in model.modules() if isinstance(m, MimiEuclideanCodebook)]


def vendor_padding_cache(model: Any) -> Any:
    """The ``MimiConv1dPaddingCache`` ``MimiModel.encode`` makes when passed None."""
    from transformers.models.mimi.modeling_mimi import MimiConv1dPaddingCache

    convs = [model.encoder.get_submodule(n) for n in model.encoder._mimiconv1d_layer_names]
    convs.append(model.downsample)
    return MimiConv1dPaddingCache(
        num_layers=len(convs),
        per_layer_padding=[c.padding_total for c in convs],
        per_layer_padding_mode=[c.pad_mode for c in convs],
        per_layer_in_channels=[c.in_channels for c in convs],
    )


def new_stream_state(model: Any, *, initialized: bool = True) -> SimpleNamespace:
    """``SimpleNamespace(mimi=model, cache, padding)``: a fresh stream's state (module
    docstring). ``initialized`` False leaves the cache as the vendor makes it (its layers
    initialized lazily by the first call): the stock reference's."""
    cache = _new_cache(model, initialized)
    return SimpleNamespace(mimi=model, cache=cache, padding=vendor_padding_cache(model))


def new_decoder_state(model: Any, *, initialized: bool = True) -> SimpleNamespace:
    """``SimpleNamespace(mimi=model, cache)``: a fresh decoder stream's state."""
    return SimpleNamespace(mimi=model, cache=_new_cache(model, initialized))


def _new_cache(model: Any, initialized: bool) -> Any:
    """A ``DynamicCache(config=...)``; ``initialized``: each layer's keys and values empty
    tensors of the layer's dims (module docstring)."""
    from transformers.cache_utils import DynamicCache

    cfg = model.config
    cache = DynamicCache(config=cfg)
    if initialized:
        p = next(model.parameters())
        empty = torch.empty(
            1, cfg.num_key_value_heads, 0, cfg.head_dim, dtype=p.dtype, device=p.device
        )
        for layer in cache.layers:
            layer.lazy_initialization(empty)
            layer.keys, layer.values = empty.clone(), empty.clone()
    return cache


def audio(seed: int, n_frames: int) -> torch.Tensor:
    """Seeded audio ``[1, 1, n_frames * 1920]`` float32 on the CPU (std 0.1)."""
    g = torch.Generator().manual_seed(subseed(seed, 1))
    return torch.randn(1, 1, n_frames * FRAME_SAMPLES, generator=g) * 0.1


class AudioStream:
    """The vendor's streaming encode over seeded audio, one frame per ``step()``."""

    def __init__(self, state: SimpleNamespace, seed: int, n_frames: int) -> None:
        self.state = state
        device = next(state.mimi.parameters()).device
        self.audio = audio(seed, n_frames).to(device)
        self.frame = 0

    def step(self) -> torch.Tensor:
        s = self.state
        i = self.frame
        # each frame arrives in its own buffer, as a capture device hands it over
        x = self.audio[..., i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES].clone()
        self.frame += 1
        with torch.no_grad():
            codes, _, _ = s.mimi.encode(
                x,
                encoder_past_key_values=s.cache,
                padding_cache=s.padding,
                use_streaming=True,
                return_dict=False,
            )
        return codes


def codes(seed: int, n_frames: int) -> torch.Tensor:
    """Seeded codes ``[1, 32, n_frames]`` int64 on the CPU (codebook 2048)."""
    g = torch.Generator().manual_seed(subseed(seed, 2))
    return torch.randint(0, 2048, (1, 32, n_frames), generator=g)


class CodeStream:
    """The vendor's frame-by-frame decode over seeded codes, one frame per ``step()``."""

    def __init__(self, state: SimpleNamespace, seed: int, n_frames: int) -> None:
        self.state = state
        self.codes = codes(seed, n_frames).to(next(state.mimi.parameters()).device)
        self.frame = 0

    def step(self) -> torch.Tensor:
        s, i = self.state, self.frame
        self.frame += 1
        with torch.no_grad():
            pcm, _ = s.mimi.decode(
                self.codes[..., i : i + 1].clone(),
                decoder_past_key_values=s.cache,
                return_dict=False,
            )
        return pcm


def bind_adapter(
    state: SimpleNamespace, device: Any = None, *, capture: bool = True, backend: Any = None
) -> Any:
    """Bind the generated adapter (contracts/mimi_encoder.clock, or mimi_decoder.clock for
    a decoder state) to a stream's state."""
    from duplexcadence.generated import mimi_decoder, mimi_encoder

    adapter = mimi_encoder if hasattr(state, "padding") else mimi_decoder
    return adapter.bind(state, device=device, capture=capture, progress=False, backend=backend)
