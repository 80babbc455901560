"""Stock streaming Token2Wav of ``minicpmo-utils==1.0.7``, seeded random weights.

The released 1.0.7 code (package ``stepaudio2``, Apache-2.0) imported from its own
folder, ``.vendor/minicpmo-utils-1.0.7`` (``bench/requirements-token2wav107.txt`` says
how it is installed beside the default 1.0.6): importing this module puts that folder
first on ``sys.path``, so a process that imports it runs 1.0.7 and nothing else (the
tests run it in a subprocess). Nothing of the vendor is copied here.

What 1.0.7 changes on the streaming path (against ``bench.workloads.token2wav``, whose
flow config, prompt, token stream and seeding this module reuses, one copy of each):

* the vocoder is CosyVoice3's ``CausalHiFTGenerator`` driven by
  ``causal_vocoder.bounded_vocoder.BoundedVocoder`` (16-frame internal blocks, float64
  F0 predictor and carried float64 phase, history bounded by ``limits``); its
  hyper-parameters are in ``config.yaml`` next to the checkpoint, not reachable here:
  ``HIFT_CONFIG`` reconstructs them (see there);
* ``set_stream_cache`` right-pads the prompt with its first three tokens (1.0.6: three
  silence tokens) and ``stream`` trims the conformer carry per scale and repacks it;
* ``UpsampleConformerEncoderV2.forward_chunk`` is decorated with
  ``@torch.compile(dynamic=True, backend="eager")``;
* ``_stream_vocode`` checks ``torch.isfinite(speech).all()`` (a device sync) per chunk;
* ``SineGen2.sine_waves`` (1 x 7,200,000 x 9 float32, 259 MB) is a plain attribute, so
  ``.to(device)`` leaves it on the CPU and every vocoder block gathers its noise there.

What this module does around the vendor code, and nothing more:

* ``import_stepaudio2()``: the submodules without ``stepaudio2/__init__.py``, with the
  1.0.6 module's import stand-ins plus ``yaml`` (``token2wav.py``'s config loader).
* ``build_token2wav()``: the vendor ``Token2wav`` via ``__new__`` with the attributes its
  ``__init__`` sets, the 1.0.6 flow (same code, same ``flow.yaml``) and the reconstructed
  causal vocoder, in the order ``__init__`` builds them (``.float().to(device).eval()``,
  then ``BoundedVocoder``, which turns the F0 predictor to float64), then the vendor's
  own ``set_stream_cache`` on a seeded prompt.
* The compile decorator is neutralised as vllm-omni 0.30.0 does for this model
  (``batched_token2wav._undecorate_dynamo``): the encoder instance gets the undecorated
  ``forward_chunk`` (``_torchdynamo_orig_callable``) in its ``__dict__``. The eager
  backend only traced and guarded (seconds per new chunk shape); the code it ran is
  this function. ``NEUTRALISE_COMPILE`` records it.
* ``stream_chunk()`` calls the vendor ``Token2wav.stream`` itself on every device: 1.0.7
  puts its tokens on ``self.device`` and disables autocast unless ``float16``.

Seeding as 1.0.6 (``subseed(seed, k)``): flow ← k=0, vocoder ← k=1 (its construction
also draws the ``sine_waves`` / ``rand_ini`` / ``uv`` tables), prompt ← k=2, tokens ← k=3,
then ``torch.manual_seed(seed)``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import workloads
from bench.workloads import subseed
from bench.workloads import token2wav as v106

VENDOR_DIR = Path(__file__).resolve().parents[2] / ".vendor" / "minicpmo-utils-1.0.7"
RELEASE = workloads.RELEASES["token2wav107"]


def activate() -> None:
    """Put the 1.0.7 folder first on sys.path; refuse if another stepaudio2 is imported."""
    loaded = sys.modules.get("stepaudio2")
    if loaded is not None and not any(
        str(p).startswith(str(VENDOR_DIR)) for p in getattr(loaded, "__path__", [])
    ):
        raise ImportError("stepaudio2 (1.0.6) is already imported in this process")
    if str(VENDOR_DIR) not in sys.path:
        sys.path.insert(0, str(VENDOR_DIR))


activate()

# The 1.0.6 reuse, by name (one copy of each fact).
FLOW_CONFIG, N_TIMESTEPS, PROMPT_FRAMES = v106.FLOW_CONFIG, v106.N_TIMESTEPS, v106.PROMPT_FRAMES
token_stream, make_prompt, TokenChunk = v106.token_stream, v106.make_prompt, v106.TokenChunk
ZERO_PARAM_FILL_STD = v106.ZERO_PARAM_FILL_STD
PROMPT_KEY = "bench-prompt"  # the key 1.0.7 files the prompt under (a prompt_wav path there)

# CausalHiFTGenerator(**HIFT_CONFIG["hift"], f0_predictor=CausalConvRNNF0Predictor(
# **HIFT_CONFIG["f0_predictor"])): the released config.yaml is CosyVoice3's
# (``cosyvoice3.yaml`` ``hift:``; Token2wav._load_config maps its tags
# cosyvoice.hifigan.generator.CausalHiFTGenerator / f0_predictor.CausalConvRNNF0Predictor
# to these classes). Each value is forced by a check 1.0.7 makes (K), a shape it
# hard-codes (S), the constructor default (C), or the CosyVoice3 yaml (Y).
HIFT_CONFIG: dict[str, dict[str, Any]] = {
    "hift": dict(
        in_channels=80,  # C, K (mel 80: load_causal_vocoder checks num_mels=80)
        base_channels=512,  # C, Y
        nb_harmonics=8,  # C, Y (SineGen2 tables have 9 = 8 + 1 columns)
        sampling_rate=24000,  # K (BoundedVocoder and load_causal_vocoder require 24 kHz)
        nsf_alpha=0.1,  # C, Y
        nsf_sigma=0.003,  # C, Y
        nsf_voiced_threshold=10,  # C, Y
        upsample_rates=[8, 5, 3],  # Y; K: prod x hop_len 4 = 480 samples per frame
        upsample_kernel_sizes=[16, 11, 7],  # Y
        istft_params={"n_fft": 16, "hop_len": 4},  # C, Y
        resblock_kernel_sizes=[3, 7, 11],  # C, Y
        resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],  # C, Y
        source_resblock_kernel_sizes=[7, 7, 11],  # Y (one per upsample stage)
        source_resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],  # Y
        lrelu_slope=0.1,  # C, Y
        audio_limit=0.99,  # C, Y
        conv_pre_look_right=4,  # C, Y; K: F0 right 3 + 4 + 1 = the checked 8-frame delay
    ),
    "f0_predictor": dict(num_class=1, in_channels=80, cond_channels=512),  # C, Y
}
NEUTRALISE_COMPILE = (
    "encoder.__dict__['forward_chunk'] = UpsampleConformerEncoderV2.forward_chunk"
    "._torchdynamo_orig_callable bound to the encoder (vllm-omni 0.30.0 "
    "batched_token2wav._undecorate_dynamo)"
)

_STAND_INS = {**v106._STAND_INS, "yaml": ("compose", "serialize")}
# the flow's modules are 1.0.6's (same code); the vocoder is the new causal one
_SUBMODULES = {
    **{k: v for k, v in v106._SUBMODULES.items() if k not in ("hifigan", "token2wav")},
    "generator": "stepaudio2.causal_vocoder.generator",
    "f0_predictor": "stepaudio2.causal_vocoder.f0_predictor",
    "bounded_vocoder": "stepaudio2.causal_vocoder.bounded_vocoder",
    "token2wav": v106._SUBMODULES["token2wav"],  # last, as before: it imports the rest
}
_modules_cache: types.SimpleNamespace | None = None


def installed_version() -> str | None:
    return workloads.installed_version(RELEASE.dist)


def unavailable_reason() -> str | None:
    """Why the 1.0.7 workload cannot be built here (None when it can)."""
    return workloads.unavailable_reason("token2wav107")


def import_stepaudio2() -> types.SimpleNamespace:
    """The 1.0.7 submodules (``_SUBMODULES`` keys), without ``stepaudio2/__init__.py``."""
    global _modules_cache
    if _modules_cache is None:
        _modules_cache = v106.import_submodules("token2wav107", _SUBMODULES, _STAND_INS)
    return _modules_cache


def neutralise_compile(encoder: torch.nn.Module) -> None:
    """The encoder's ``forward_chunk`` without its dynamo wrapper (``NEUTRALISE_COMPILE``)."""
    original = type(encoder).forward_chunk._torchdynamo_orig_callable
    encoder.__dict__["forward_chunk"] = original.__get__(encoder, type(encoder))


def build_hift(seed: int = 0) -> tuple[torch.nn.Module, list[str]]:
    """The reconstructed CausalHiFTGenerator on the CPU, seeded random weights."""
    m = import_stepaudio2()
    torch.manual_seed(subseed(seed, 1))
    f0 = m.f0_predictor.CausalConvRNNF0Predictor(**HIFT_CONFIG["f0_predictor"])
    hift = m.generator.CausalHiFTGenerator(**HIFT_CONFIG["hift"], f0_predictor=f0)
    refilled = v106._fill_all_zero_params(hift, ZERO_PARAM_FILL_STD)
    return hift, refilled


def build_token2wav(
    seed: int = 0,
    device: Any = "cpu",
    prompt_frames: int = PROMPT_FRAMES,
    before_priming: Any = None,
) -> Any:
    """The vendor 1.0.7 ``Token2wav``, primed by its own ``set_stream_cache``.

    ``before_priming(t2w)`` as in 1.0.6: runs with the modules still on the CPU.
    """
    m = import_stepaudio2()
    device = torch.device(device)
    flow, flow_refilled = v106.build_flow(seed, m)
    neutralise_compile(flow.encoder)
    hift, hift_refilled = build_hift(seed)

    Token2wav = m.token2wav.Token2wav
    t2w = Token2wav.__new__(Token2wav)  # token2wav.py Token2wav.__init__, checkpoints aside
    t2w.float16 = False
    t2w.n_timesteps = N_TIMESTEPS
    t2w.device = device
    t2w.model_path = None
    t2w.audio_tokenizer = None
    t2w.spk_model = None
    t2w.flow = flow
    t2w.hift = hift
    t2w.vocoder_checkpoint = t2w.vocoder_config = t2w.original_vocoder_checkpoint = None
    t2w.original_hift = None
    t2w.sample_rate = 24000
    t2w.hop_samples = 480
    t2w.cache = {}
    t2w.stream_cache = None
    t2w.hift_cache_dict = {}
    t2w._stream_prompt = None
    if before_priming is not None:
        before_priming(t2w)
    t2w.flow = flow.to(device).eval()
    t2w.hift = hift.float().to(device).eval()  # load_causal_vocoder's order
    t2w.bounded_vocoder = m.bounded_vocoder.BoundedVocoder(t2w.hift)
    t2w.vocoder_delay_frames = (
        t2w.hift.f0_predictor.condnet[0].causal_padding + t2w.hift.conv_pre_look_right + 1
    )
    assert t2w.vocoder_delay_frames == 8, t2w.vocoder_delay_frames  # __init__ checks it
    t2w.vocoder_delay_samples = t2w.vocoder_delay_frames * t2w.hop_samples
    t2w.source_cache_len = t2w.vocoder_delay_samples

    t2w.cache[PROMPT_KEY] = make_prompt(seed, prompt_frames, device)
    t2w.set_stream_cache(PROMPT_KEY)
    torch.manual_seed(seed)
    t2w.bench = v106.BenchInfo(
        seed=seed,
        device=device,
        prompt_frames=prompt_frames,
        refilled_params={"flow": flow_refilled, "hift": hift_refilled},
        version=installed_version(),
    )
    return t2w


def stream_chunk(t2w: Any, tokens: list[int], last_chunk: bool) -> np.ndarray:
    """One vendor ``Token2wav.stream(tokens, last_chunk=..., return_waveform=True)``."""
    wav = t2w.stream(list(tokens), last_chunk=last_chunk, return_waveform=True)
    assert wav.dtype == np.float32 and wav.shape[0] == 1, (wav.dtype, wav.shape)
    return wav.reshape(-1)


def carry_lengths(t2w: Any) -> dict[str, int]:
    """Current lengths of the stock carries (mel frames; vocoder caches in frames)."""
    sc, vc = t2w.stream_cache, t2w.hift_cache_dict
    return {
        "estimator": int(sc["estimator_att_cache"].shape[4]),
        "conformer": int(sc["conformer_att_cache"].shape[3]),
        "vocoder_mel": int(vc["mel"].shape[2]),
        "vocoder_source": int(vc["source"].shape[2]) // t2w.hop_samples,
    }
