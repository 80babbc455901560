"""Stock streaming Token2Wav (Step-Audio2 / MiniCPM-o 4.5), seeded random weights.

The released PyPI ``minicpmo-utils==1.0.6`` (package ``stepaudio2``, Apache-2.0),
imported from the installed distribution; nothing of it is copied here (DESIGN §5 says
why 1.0.6 is the paper's stock). Around the vendor code:

* ``import_stepaudio2()``: the flow / HiFT / ``token2wav`` submodules without running
  ``stepaudio2/__init__.py`` (which imports torchaudio, onnxruntime, s3tokenizer,
  hyperpyyaml, librosa): a bare parent package, and empty stand-ins for those names
  only while the submodules import (the streaming path never touches them).
* ``build_token2wav()``: the vendor ``Token2wav`` via ``__new__`` (its ``__init__``
  loads checkpoints and assumes CUDA) with the real flow of the released ``flow.yaml``
  hyper-parameters (``FLOW_CONFIG``) and the real ``HiFTGenerator()``; fp32, eval.
* ``stream_chunk()``: the vendor's own ``Token2wav.stream`` code object; off the
  current CUDA device its global ``torch`` maps the two hard-coded ``device='cuda'``
  tensors to the object's device and ``autocast("cuda", float32)`` to the disabled
  CPU autocast that CPU itself would apply.
* ``token_stream()``: seeded token chunks as a real client feeds ``stream()``.

Seeds (``subseed(seed, k) = 16 * seed + k``): flow weights and ``rand_noise`` k=0, HiFT
weights k=1, prompt k=2 and tokens k=3 (private CPU generators); at the end of the
build ``torch.manual_seed(seed)`` seeds the generators HiFT's source noise draws from.
Weights are made on the CPU and then moved: CUDA and CPU builds have the same weights.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import sys
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench import workloads
from bench.workloads import register_bare_parent, subseed

RELEASE = workloads.RELEASES["token2wav"]
VOCAB_SIZE = 6561  # 25 Hz S3 tokenizer v2, FSQ 3^8
SILENCE_TOKEN = 4218  # what set_stream_cache() right-pads the prompt with (token2wav.py:153)
CHUNK_TOKENS = 25  # stock client: CHUNK_SIZE
PRE_LOOKAHEAD = 3  # flow.pre_lookahead_len
PROMPT_FRAMES = 302  # mel frames of the prompt (50 Hz) -> 151 prompt tokens (25 Hz)
MEL_BINS, SPK_DIM = 80, 192
SAMPLES_PER_FRAME = 480  # 24 kHz / 50 Hz mel
STOCK_TAIL_FRAMES = 100  # carry the stock stream() keeps beyond the prompt (token2wav.py:192-204)

# The released flow.yaml (Step-Audio2 token2wav/flow.yaml, loaded by hyperpyyaml in
# Token2wav.__init__, token2wav.py:79-81) is not reachable here, so its arguments are
# reconstructed from DESIGN §5, the constructors' signatures and CosyVoice2 conventions.
# Each value is either fixed by DESIGN §5 (D), forced by a shape the streaming code
# hard-codes (S), the constructor default (C), or the CosyVoice2 flow.yaml convention
# (Y). Dropout rates are irrelevant in eval mode.
FLOW_CONFIG: dict[str, dict[str, Any]] = {
    # stepaudio2/cosyvoice2/flow/flow.py:24 CausalMaskedDiffWithXvec
    "flow": dict(
        input_size=512,  # C, D (token embedding = encoder input 512)
        output_size=80,  # C, S (80 mel bins; HiFT in_channels=80)
        spk_embed_dim=192,  # C, S (CAM++ embedding)
        output_type="mel",  # C
        vocab_size=VOCAB_SIZE,  # D (default 5121 is CosyVoice1's)
    ),
    # stepaudio2/cosyvoice2/transformer/upsample_encoder_v2.py:146
    "encoder": dict(
        input_size=512,  # D, S (token embedding width)
        output_size=512,  # D (default 256); S: DiT in 320 = 80 x + 80 mu + 80 spk + 80 cond
        input_layer="linear",  # C, Y (only LinearNoSubsampling is registered)
        pre_lookahead_len=3,  # C, D
        num_blocks=6,  # C, D
        num_up_blocks=4,  # C, D
        up_stride=2,  # C, D
        up_scale_factor=2,  # C, D
        attention_heads=8,  # D (default 4); S: conformer cache last dim 128 = 2 x 512/8
        pos_enc_layer_type="rel_pos_espnet",  # C, Y
        selfattention_layer_type="rel_selfattn",  # C, Y
        key_bias=True,  # C, Y
        linear_units=2048,  # C, Y
        dropout_rate=0.1,  # C, Y
        positional_dropout_rate=0.1,  # C, Y
        attention_dropout_rate=0.1,  # Y (default 0.0; no effect in eval)
        normalize_before=True,  # C, Y
        activation_type="swish",  # C, Y
    ),
    # stepaudio2/cosyvoice2/flow/decoder_dit.py:375 DiT
    "estimator": dict(
        in_channels=320,  # D, S (_init_cuda_graph_chunk allocates (2, 320, chunk))
        out_channels=80,  # S (mel)
        mlp_ratio=4.0,  # C
        depth=16,  # D, S (att_cache_buffer (16, 2, 8, 1000, 128))
        num_heads=8,  # C, D, S (buffer dim 8)
        head_dim=64,  # C, D, S (buffer last dim 128 = 2 x 64)
        hidden_size=512,  # D (default 256); S: static_t1 (2, 1, 512), cnn buffer 1024 = 2 x 512
    ),
    # stepaudio2/cosyvoice2/flow/flow_matching.py:27 CausalConditionalCFM
    "cfm": dict(inference_cfg_rate=0.7),  # C, D
}
# HiFTGenerator() with no arguments, as Token2wav.__init__ (token2wav.py:87): 24 kHz,
# upsample [8, 5, 3] x istft hop 4 = 480 samples per frame, n_fft 16, 8 harmonics.
N_TIMESTEPS = 10  # Token2wav(..., n_timesteps=10) default, token2wav.py:65
# DiT.initialize_weights zeroes every adaLN_modulation[-1] and final_layer.linear
# (decoder_dit.py:423-431): the estimator would output 0; such parameters get N(0, std).
ZERO_PARAM_FILL_STD = 0.02
# Names token2wav.py / utils/audio.py / flow_matching.py bind at import, and the
# attributes those import statements need.
_STAND_INS = {
    "torchaudio": ("compliance",),
    "torchaudio.compliance": ("kaldi",),
    "torchaudio.compliance.kaldi": (),
    "s3tokenizer": (),
    "onnxruntime": (),
    "hyperpyyaml": ("load_hyperpyyaml",),
    "librosa": ("filters",),
    "librosa.filters": ("mel",),
}
_SUBMODULES = {
    "flow": "stepaudio2.cosyvoice2.flow.flow",
    "flow_matching": "stepaudio2.cosyvoice2.flow.flow_matching",
    "decoder_dit": "stepaudio2.cosyvoice2.flow.decoder_dit",
    "upsample_encoder_v2": "stepaudio2.cosyvoice2.transformer.upsample_encoder_v2",
    "hifigan": "stepaudio2.flashcosyvoice.modules.hifigan",
    "token2wav": "stepaudio2.token2wav",
}
_modules: types.SimpleNamespace | None = None


def installed_version() -> str | None:
    return workloads.installed_version(RELEASE.dist)


def unavailable_reason() -> str | None:
    return workloads.unavailable_reason("token2wav")


def _stand_in(name: str, attrs: tuple[str, ...]) -> types.ModuleType:
    mod = types.ModuleType(name, f"duplexcadence import stand-in for {name} (not installed)")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=None)
    mod.__duplexcadence_stand_in__ = True

    def missing(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError(f"{name} is a stand-in: the bench never calls checkpoint/prompt code")

    def __getattr__(attr: str) -> Any:  # PEP 562
        raise AttributeError(f"{name}.{attr}: {name} is an import stand-in (not installed)")

    for attr in attrs:
        setattr(mod, attr, missing)
    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


@contextlib.contextmanager
def _import_stand_ins(stand_ins: dict[str, tuple[str, ...]]) -> Any:
    """Stand-ins for the names not imported for real, taken out again afterwards."""
    mods = {n: _stand_in(n, a) for n, a in stand_ins.items() if n not in sys.modules}
    for name, mod in mods.items():
        sys.modules[name] = mod
        parent, _, child = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], child, mod)
    try:
        yield
    finally:
        for name, mod in mods.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]


def import_stepaudio2() -> types.SimpleNamespace:
    """The stock submodules (attributes as ``_SUBMODULES``), imported without running
    ``stepaudio2/__init__.py``; ImportError when 1.0.6 is not installed."""
    global _modules
    if _modules is None:
        _modules = import_submodules("token2wav", _SUBMODULES, _STAND_INS)
        parent = sys.modules["stepaudio2"]
        if getattr(parent, "__duplexcadence_bare_parent__", False):
            parent.Token2wav = _modules.token2wav.Token2wav  # what the real __init__ exports
    return _modules


def import_submodules(
    release: str, submodules: dict[str, str], stand_ins: dict[str, tuple[str, ...]]
) -> types.SimpleNamespace:
    """``submodules`` (key -> module) of the ``release`` installed (bench/workloads
    RELEASES), imported under a bare ``stepaudio2`` parent with the import
    ``stand_ins``; ImportError if it is missing. 1.0.7 (token2wav107.py) uses it too."""
    reason = workloads.unavailable_reason(release)
    if reason is not None:
        raise ImportError(reason)
    register_bare_parent("stepaudio2")
    # torch._dynamo probes third-party specs (onnxruntime) at import: import it before
    # a stand-in exists.
    importlib.import_module("torch._dynamo")
    with _import_stand_ins(stand_ins):
        mods = {key: importlib.import_module(name) for key, name in submodules.items()}
    return types.SimpleNamespace(**mods)


def _fill_all_zero_params(module: torch.nn.Module, std: float) -> list[str]:
    """Give every all-zero floating parameter N(0, std) values; return their names."""
    names = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.is_floating_point() and not bool(p.any()):
                p.normal_(0.0, std)
                names.append(name)
    return names


def build_flow(seed: int, m: types.SimpleNamespace | None = None) -> tuple[torch.nn.Module, list]:
    """The real flow of FLOW_CONFIG (hyperpyyaml's construction order: encoder,
    estimator, CFM, flow) on the CPU, seeded, and its re-filled parameters. ``m``: the
    imported submodules (default 1.0.6's; 1.0.7's flow is the same code and config)."""
    m = m or import_stepaudio2()
    torch.manual_seed(subseed(seed, 0))
    encoder = m.upsample_encoder_v2.UpsampleConformerEncoderV2(**FLOW_CONFIG["encoder"])
    estimator = m.decoder_dit.DiT(**FLOW_CONFIG["estimator"])
    decoder = m.flow_matching.CausalConditionalCFM(estimator, **FLOW_CONFIG["cfm"])
    flow = m.flow.CausalMaskedDiffWithXvec(encoder=encoder, decoder=decoder, **FLOW_CONFIG["flow"])
    return flow, _fill_all_zero_params(flow, ZERO_PARAM_FILL_STD)


def build_flow_and_hift(seed: int) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    """The flow (``build_flow``) and HiFT on the CPU, seeded; and the re-filled parameters."""
    flow, flow_refilled = build_flow(seed)
    torch.manual_seed(subseed(seed, 1))
    hift = import_stepaudio2().hifigan.HiFTGenerator()
    refilled = {"flow": flow_refilled, "hift": _fill_all_zero_params(hift, ZERO_PARAM_FILL_STD)}
    return flow, hift, refilled


def make_prompt(seed: int, prompt_frames: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``Token2wav.cache`` as ``_prepare_prompt`` returns it, from seeded random values:
    (tokens (1, F/2) int32, their length (1,) int32, spk_emb (1, 192), mels (1, F, 80),
    mel length (1,) int32)."""
    if prompt_frames % 2:
        raise ValueError("prompt_frames must be even (2 mel frames per token)")
    g = torch.Generator().manual_seed(subseed(seed, 2))
    n_tok = prompt_frames // 2
    tokens = torch.randint(0, VOCAB_SIZE, (1, n_tok), generator=g, dtype=torch.int32)
    mels = torch.randn(1, prompt_frames, MEL_BINS, generator=g)
    spk = torch.randn(1, SPK_DIM, generator=g)
    lens = [torch.tensor([n], dtype=torch.int32, device=device) for n in (n_tok, prompt_frames)]
    return tokens.to(device), lens[0], spk.to(device), mels.to(device), lens[1]


def set_stream_cache(t2w: Any) -> tuple[dict, dict]:
    """Token2wav.set_stream_cache (token2wav.py:145-170) minus its prints and
    _prepare_prompt, from ``t2w.cache``: (stream_cache, hift_cache_dict) for the caller
    to assign, as the vendor's."""
    tokens, _lens, spk_emb, mels, _mel_lens = t2w.cache
    device = tokens.device
    pad = torch.ones(1, 3, device=device, dtype=tokens.dtype) * SILENCE_TOKEN
    stream_cache = t2w.flow.setup_cache(
        torch.cat([tokens, pad], dim=1), mels, spk_emb, n_timesteps=t2w.n_timesteps
    )
    hift_cache_dict = dict(
        mel=torch.zeros(1, mels.shape[2], 0, device=device),
        source=torch.zeros(1, 1, 0, device=device),
        speech=torch.zeros(1, 0, device=device),
    )
    return stream_cache, hift_cache_dict


@dataclass
class BenchInfo:
    seed: int
    device: torch.device
    prompt_frames: int
    refilled_params: dict[str, list[str]]
    version: str | None


def build_token2wav(
    seed: int = 0,
    device: Any = "cpu",
    prompt_frames: int = PROMPT_FRAMES,
    before_priming: Any = None,
) -> Any:
    """The vendor ``Token2wav``, ready for ``stream()``, with seeded random weights: the
    attributes ``Token2wav.__init__`` sets (token2wav.py:65-100; the checkpoint-only
    ``audio_tokenizer`` and ``spk_model`` None), a seeded prompt as ``cache``, and
    ``stream_cache`` / ``hift_cache_dict`` as the stock client sets them; ``t2w.bench``
    holds our bookkeeping. ``before_priming(t2w)`` runs while the modules are still on
    the CPU: an adapter's ``bind(t2w, capture=False)`` there replaces the stock buffers
    by its demand-sized regions, so the stock envelopes never occupy the device."""
    m, device = import_stepaudio2(), torch.device(device)
    flow, hift, refilled = build_flow_and_hift(seed)
    t2w = m.token2wav.Token2wav.__new__(m.token2wav.Token2wav)
    t2w.float16, t2w.n_timesteps = False, N_TIMESTEPS
    t2w.audio_tokenizer = t2w.spk_model = t2w.cache = None
    t2w.flow, t2w.hift = flow, hift
    t2w.mel_cache_len = 8  # token2wav.py:95
    t2w.source_cache_len = int(t2w.mel_cache_len * 480)  # token2wav.py:96
    # token2wav.py:97 -- float64, as np.hamming gives; fade_in_out computes in float64
    t2w.speech_window = torch.from_numpy(np.hamming(2 * t2w.source_cache_len)).to(device)
    t2w.hift_cache_dict = {}
    if before_priming is not None:
        before_priming(t2w)
    t2w.flow, t2w.hift = flow.to(device).eval(), hift.to(device).eval()
    t2w.cache = make_prompt(seed, prompt_frames, device)
    t2w.stream_cache, t2w.hift_cache_dict = set_stream_cache(t2w)
    torch.manual_seed(seed)  # the per-call device RNG HiFT's source module draws from
    t2w.bench = BenchInfo(seed, device, prompt_frames, refilled, installed_version())
    return t2w


class _TorchOnDevice(types.ModuleType):
    """The real ``torch``, except that ``device='cuda'`` in factory calls and
    ``amp.autocast("cuda", ...)`` mean ``device``."""

    def __init__(self, device: torch.device):
        super().__init__("torch")
        self._device = device
        self.amp = types.SimpleNamespace(autocast=self._autocast)
        for name in ("tensor", "zeros", "ones", "empty", "full", "arange"):
            setattr(self, name, self._mapped(getattr(torch, name)))

    def _mapped(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            dev = kwargs.get("device")
            if dev is not None and torch.device(dev).type == "cuda":
                kwargs["device"] = self._device
            return fn(*args, **kwargs)

        call.__name__ = fn.__name__
        return call

    def _autocast(self, device_type: str, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
        if device_type == "cuda" and self._device.type != "cuda":
            device_type = self._device.type
            # what torch does on CPU for an unsupported fast dtype (fp32): disable; said
            # here to skip autocast_mode.py's warning
            if dtype not in (torch.float16, torch.bfloat16):
                kwargs["enabled"] = False
        return torch.amp.autocast(device_type, dtype=dtype, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_stream_on: dict[torch.device, Any] = {}


def vendor_stream_on(device: Any) -> Any:
    """``Token2wav.stream``'s own code object with its global ``torch`` bound for
    ``device``; on the current CUDA device, the vendor function itself."""
    vendor, device = import_stepaudio2().token2wav.Token2wav.stream, torch.device(device)
    if device.type == "cuda" and device.index in (None, torch.cuda.current_device()):
        return vendor
    if device not in _stream_on:
        g = {**vendor.__globals__, "torch": _TorchOnDevice(device)}
        code, name = vendor.__code__, vendor.__name__
        fn = types.FunctionType(code, g, name, vendor.__defaults__, vendor.__closure__)
        fn.__kwdefaults__, fn.__qualname__ = vendor.__kwdefaults__, vendor.__qualname__
        _stream_on[device] = fn
    return _stream_on[device]


def stream_chunk(t2w: Any, tokens: list[int], last_chunk: bool) -> np.ndarray:
    """One stock ``Token2wav.stream(tokens, None, last_chunk, return_waveform=True)`` on
    ``t2w.bench.device``; the chunk's PCM as a 1-D float32 array."""
    fn = vendor_stream_on(t2w.bench.device)
    wav = fn(t2w, list(tokens), None, last_chunk=last_chunk, return_waveform=True)
    assert wav.dtype == np.float32 and wav.shape[0] == 1, (wav.dtype, wav.shape)
    return wav.reshape(-1)


@dataclass(frozen=True)
class TokenChunk:
    tokens: list[int]
    last_chunk: bool


def token_stream(seed: int, n_chunks: int) -> list[TokenChunk]:
    """Seeded token chunks as a streaming client passes them to ``stream()``: the stock
    client (Step-Audio2 examples) calls ``stream(buffer[:28])`` while its buffer holds
    25 + 3 lookahead tokens and drops the first 25; at the end ``stream(buffer,
    last_chunk=True)``. Here the utterance is ``25 n + 3`` tokens, so every call gets
    28: calls 0..n-2 ``tokens[25 i : 25 i + 28]`` (the encoder drops the lookahead: 50
    mel frames), call n-1 with ``last_chunk=True`` (3 zero-padded frames: 56)."""
    if n_chunks < 1:
        raise ValueError("n_chunks must be >= 1")
    g = torch.Generator().manual_seed(subseed(seed, 3))
    ids = torch.randint(0, VOCAB_SIZE, (n_chunks * CHUNK_TOKENS + PRE_LOOKAHEAD,), generator=g)
    ids, size = ids.tolist(), CHUNK_TOKENS + PRE_LOOKAHEAD
    return [
        TokenChunk(ids[i * CHUNK_TOKENS : i * CHUNK_TOKENS + size], i == n_chunks - 1)
        for i in range(n_chunks)
    ]


def carry_lengths(t2w: Any) -> dict[str, int]:
    """Current attended lengths of the stock carries (mel frames)."""
    sc, hc = t2w.stream_cache, t2w.hift_cache_dict
    return {
        "estimator": int(sc["estimator_att_cache"].shape[4]),
        "conformer": int(sc["conformer_att_cache"].shape[3]),
        "hift_mel": int(hc["mel"].shape[2]),
        "hift_source": int(hc["source"].shape[2]),
        "hift_speech": int(hc["speech"].shape[1]),
    }
