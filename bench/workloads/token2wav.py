"""Stock streaming Token2Wav (Step-Audio2 / MiniCPM-o 4.5), seeded random weights.

The workload is the released code of PyPI ``minicpmo-utils==1.0.6`` (package
``stepaudio2``, Apache-2.0), imported from the installed distribution; nothing of it
is copied here. DESIGN §5 explains why 1.0.6 is the paper's stock.

What this module adds around the vendor code, and nothing more:

* ``import_stepaudio2()`` imports the flow / HiFT / ``token2wav`` submodules without
  running ``stepaudio2/__init__.py`` (which pulls in torchaudio, onnxruntime,
  s3tokenizer, hyperpyyaml and librosa at import time). It registers a bare parent
  package with the real ``__path__`` and, only while the submodules import, empty
  stand-in modules for those five third-party names (only the attributes the import
  statements bind). The stand-ins are taken out of ``sys.modules`` again afterwards;
  they stay referenced only by module globals that the streaming path never touches
  (``Token2wav.__init__``/``_prepare_prompt``/``__call__`` and an unused
  ``import onnxruntime`` in ``flow_matching.py``).
* ``build_token2wav()`` makes the vendor ``Token2wav`` via ``Token2wav.__new__`` (its
  ``__init__`` loads checkpoints and assumes CUDA) and attaches the real
  ``CausalMaskedDiffWithXvec`` built from the released ``flow.yaml`` hyper-parameters
  (``FLOW_CONFIG``) and the real ``HiFTGenerator()``, seeded random weights, fp32, eval.
* ``stream_chunk()`` runs the vendor's own ``Token2wav.stream`` code object. On the
  current CUDA device it is called as is. Elsewhere (CPU) the same code object runs with
  one global rebound: its module-level name ``torch`` resolves to a thin proxy that maps
  the two hard-coded ``device='cuda'`` token tensors to the object's device and turns
  ``torch.amp.autocast("cuda", dtype=float32)`` into the CPU autocast context that CPU
  itself would apply (disabled: CPU autocast has no float32 mode). Every other name is
  the real ``torch``.
* ``token_stream()`` gives seeded token chunks as a real client feeds ``stream()``.

Seeding (all derived from one ``seed``; ``subseed(seed, k) = 16 * seed + k``):
flow weights and ``rand_noise`` ← ``torch.manual_seed(subseed(seed, 0))``; HiFT weights
← ``torch.manual_seed(subseed(seed, 1))``; the prompt ← a private CPU generator at
``subseed(seed, 2)``; tokens ← a private CPU generator at ``subseed(seed, 3)``; at the
end of the build ``torch.manual_seed(seed)`` seeds the global (CPU and CUDA) generators
that HiFT's SineGen2 / source noise draw from on every call. Weights are always made on
the CPU and then moved, so a CUDA build has bit-identical weights to a CPU build.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bench import workloads
from bench.workloads import register_bare_parent
from bench.workloads import subseed

RELEASE = workloads.RELEASES["token2wav"]

# Speech-token vocabulary (25 Hz S3 tokenizer v2, FSQ 3^8) and the silence token the
# stock set_stream_cache() right-pads the prompt with (token2wav.py:153).
VOCAB_SIZE = 6561
SILENCE_TOKEN = 4218
CHUNK_TOKENS = 25  # stock client: CHUNK_SIZE
PRE_LOOKAHEAD = 3  # flow.pre_lookahead_len == encoder.pre_lookahead_layer.pre_lookahead_len
PROMPT_FRAMES = 302  # mel frames of the prompt (50 Hz) -> 151 prompt tokens (25 Hz)
MEL_BINS = 80
SPK_DIM = 192
SAMPLES_PER_FRAME = 480  # 24 kHz / 50 Hz mel
# Carry that the stock stream() keeps beyond the prompt (token2wav.py:192-204).
STOCK_TAIL_FRAMES = 100

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
# HiFTGenerator is built with no arguments, exactly as Token2wav.__init__ does
# (token2wav.py:87): 24 kHz, upsample [8, 5, 3] x istft hop 4 = 480 samples per frame,
# n_fft 16, 8 harmonics, SourceModuleHnNSF2/SineGen2 (sampling_rate != 22050).
HIFT_KWARGS: dict[str, Any] = {}
N_TIMESTEPS = 10  # Token2wav(..., n_timesteps=10) default, token2wav.py:65
# Std of the normal fill for parameters that are all-zero after the default init
# (DiT.initialize_weights zeroes every adaLN_modulation[-1] and final_layer.linear,
# decoder_dit.py:423-431, which would make every DiT block the identity and the
# estimator output exactly 0, i.e. the solver would return the noise unchanged).
ZERO_PARAM_FILL_STD = 0.02

# Third-party names token2wav.py / utils/audio.py / flow_matching.py bind at import
# time, and the attributes those import statements need.
_IMPORT_STAND_INS: dict[str, tuple[str, ...]] = {
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
_modules_cache: types.SimpleNamespace | None = None


def installed_version() -> str | None:
    """Version of the installed ``minicpmo-utils`` distribution, or None."""
    return workloads.installed_version(RELEASE.dist)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can)."""
    return workloads.unavailable_reason("token2wav")


def _stand_in(name: str, attrs: tuple[str, ...]) -> types.ModuleType:
    mod = types.ModuleType(name, f"duplexcadence import stand-in for {name} (not installed)")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=None)
    mod.__duplexcadence_stand_in__ = True

    def _missing(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError(
            f"{name} is a stand-in: the bench Token2Wav never calls checkpoint/prompt code"
        )

    for attr in attrs:
        setattr(mod, attr, _missing)

    def __getattr__(attr: str) -> Any:  # PEP 562
        raise AttributeError(f"{name}.{attr}: {name} is an import stand-in (not installed)")

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


@contextlib.contextmanager
def _import_stand_ins(stand_ins: dict[str, tuple[str, ...]] = _IMPORT_STAND_INS):
    inserted: list[str] = []
    mods: dict[str, types.ModuleType] = {}
    for name, attrs in stand_ins.items():
        if name in sys.modules:  # already imported for real: use that
            continue
        mods[name] = _stand_in(name, attrs)
        sys.modules[name] = mods[name]
        inserted.append(name)
    for name, mod in mods.items():  # wire parent.child attributes among stand-ins
        parent, _, child = name.rpartition(".")
        if parent in mods:
            setattr(mods[parent], child, mod)
    try:
        yield
    finally:
        for name in inserted:
            if sys.modules.get(name) is mods[name]:
                del sys.modules[name]


def import_stepaudio2() -> types.SimpleNamespace:
    """The stock submodules, imported without running ``stepaudio2/__init__.py``.

    Returns a namespace with attributes flow, flow_matching, decoder_dit,
    upsample_encoder_v2, hifigan, token2wav (the real modules). Raises ImportError
    when the distribution is missing or is not version 1.0.6.
    """
    global _modules_cache
    if _modules_cache is None:
        _modules_cache = import_submodules("token2wav", _SUBMODULES, _IMPORT_STAND_INS)
        parent = sys.modules["stepaudio2"]
        if getattr(parent, "__duplexcadence_bare_parent__", False):
            parent.Token2wav = _modules_cache.token2wav.Token2wav  # what __init__ exports
    return _modules_cache


def import_submodules(
    release: str, submodules: dict[str, str], stand_ins: dict[str, tuple[str, ...]]
) -> types.SimpleNamespace:
    """``submodules`` (key -> module) of the ``release`` installed, imported under a bare
    ``stepaudio2`` parent with the import ``stand_ins``; ImportError if it is missing."""
    reason = workloads.unavailable_reason(release)
    if reason is not None:
        raise ImportError(reason)
    register_bare_parent("stepaudio2")
    # upsample_encoder_v2.py imports torch._dynamo, whose import probes third-party
    # specs (trace_rules.THIRDPARTY_SKIPLIST names onnxruntime): import it first so it
    # never sees a stand-in.
    importlib.import_module("torch._dynamo")
    with _import_stand_ins(stand_ins):
        mods = {key: importlib.import_module(name) for key, name in submodules.items()}
    return types.SimpleNamespace(**mods)


# --------------------------------------------------------------------------- build


def _fill_all_zero_params(module: torch.nn.Module, std: float) -> list[str]:
    """Give every all-zero floating parameter N(0, std) values; return their names."""
    names = []
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.is_floating_point() and not bool(p.any()):
                p.normal_(0.0, std)
                names.append(name)
    return names


def build_flow(
    seed: int = 0, m: types.SimpleNamespace | None = None
) -> tuple[torch.nn.Module, list[str]]:
    """The real CausalMaskedDiffWithXvec of FLOW_CONFIG on the CPU, seeded random weights.

    Construction order is hyperpyyaml's for flow.yaml (encoder, estimator, CFM, flow).
    ``m``: the imported submodules (default: this release's); 1.0.7 passes its own, whose
    flow is the same code and the same flow.yaml. Returns (flow, names of the parameters
    re-filled because they were all zero).
    """
    m = m or import_stepaudio2()
    torch.manual_seed(subseed(seed, 0))
    encoder = m.upsample_encoder_v2.UpsampleConformerEncoderV2(**FLOW_CONFIG["encoder"])
    estimator = m.decoder_dit.DiT(**FLOW_CONFIG["estimator"])
    decoder = m.flow_matching.CausalConditionalCFM(estimator, **FLOW_CONFIG["cfm"])
    flow = m.flow.CausalMaskedDiffWithXvec(encoder=encoder, decoder=decoder, **FLOW_CONFIG["flow"])
    refilled = _fill_all_zero_params(flow, ZERO_PARAM_FILL_STD)
    return flow, refilled


def build_hift(seed: int = 0) -> tuple[torch.nn.Module, list[str]]:
    """The real HiFTGenerator() (no arguments, as Token2wav.__init__), seeded, on the CPU."""
    m = import_stepaudio2()
    torch.manual_seed(subseed(seed, 1))
    hift = m.hifigan.HiFTGenerator(**HIFT_KWARGS)
    refilled = _fill_all_zero_params(hift, ZERO_PARAM_FILL_STD)
    return hift, refilled


def make_prompt(seed: int, prompt_frames: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """``Token2wav.cache`` as ``_prepare_prompt`` returns it, from seeded random values.

    (prompt_speech_tokens (1, F/2) int32, prompt_speech_tokens_lens (1,) int32,
    spk_emb (1, 192) fp32, prompt_mels (1, F, 80) fp32, prompt_mels_lens (1,) int32).
    """
    if prompt_frames % 2:
        raise ValueError("prompt_frames must be even (2 mel frames per token)")
    g = torch.Generator().manual_seed(subseed(seed, 2))
    n_tok = prompt_frames // 2
    tokens = torch.randint(0, VOCAB_SIZE, (1, n_tok), generator=g, dtype=torch.int32)
    mels = torch.randn(1, prompt_frames, MEL_BINS, generator=g)
    spk = torch.randn(1, SPK_DIM, generator=g)
    return (
        tokens.to(device),
        torch.tensor([n_tok], dtype=torch.int32, device=device),
        spk.to(device),
        mels.to(device),
        torch.tensor([prompt_frames], dtype=torch.int32, device=device),
    )


def set_stream_cache(t2w: Any) -> tuple[dict, dict]:
    """Token2wav.set_stream_cache (token2wav.py:145-170) minus its prints and _prepare_prompt.

    Uses ``t2w.cache``; returns (stream_cache, hift_cache_dict) like the vendor method
    (which, like it, the caller assigns to the object).
    """
    prompt_speech_tokens, _lens, spk_emb, prompt_mels, _mel_lens = t2w.cache
    device = prompt_speech_tokens.device
    right_pad_speech_tokens = (
        torch.ones(1, 3, device=device, dtype=prompt_speech_tokens.dtype) * SILENCE_TOKEN
    )
    stream_cache = t2w.flow.setup_cache(
        torch.cat([prompt_speech_tokens, right_pad_speech_tokens], dim=1),
        prompt_mels,
        spk_emb,
        n_timesteps=t2w.n_timesteps,
    )
    hift_cache_dict = dict(
        mel=torch.zeros(1, prompt_mels.shape[2], 0, device=device),
        source=torch.zeros(1, 1, 0, device=device),
        speech=torch.zeros(1, 0, device=device),
    )
    return stream_cache, hift_cache_dict


def build_token2wav(
    seed: int = 0,
    device: Any = "cpu",
    prompt_frames: int = PROMPT_FRAMES,
    before_priming: Any = None,
) -> Any:
    """The vendor ``Token2wav`` object, ready for ``stream()``, with seeded random weights.

    Attributes are those ``Token2wav.__init__`` sets (token2wav.py:65-100) with the
    checkpoint-only ones (``audio_tokenizer``, ``spk_model``) set to None, plus ``cache``
    (a seeded random prompt) and ``stream_cache``/``hift_cache_dict`` as the stock client
    sets them after ``set_stream_cache``. Extra bookkeeping lives in ``t2w.bench``.

    ``before_priming(t2w)``, if given, runs while the modules are still on the CPU,
    before anything reaches ``device`` and before the prompt is primed: an adapter's
    ``bind(t2w, device=..., capture=False)`` there replaces the stock buffers by its
    demand-sized regions, so the stock envelopes never occupy the device.
    """
    m = import_stepaudio2()
    device = torch.device(device)
    flow, flow_refilled = build_flow(seed)
    hift, hift_refilled = build_hift(seed)

    Token2wav = m.token2wav.Token2wav
    t2w = Token2wav.__new__(Token2wav)
    t2w.float16 = False
    t2w.n_timesteps = N_TIMESTEPS
    t2w.audio_tokenizer = None
    t2w.spk_model = None
    t2w.flow = flow
    t2w.hift = hift
    t2w.cache = None
    t2w.mel_cache_len = 8  # token2wav.py:95
    t2w.source_cache_len = int(t2w.mel_cache_len * 480)  # token2wav.py:96
    # token2wav.py:97 -- float64, as np.hamming gives; fade_in_out computes in float64.
    t2w.speech_window = torch.from_numpy(np.hamming(2 * t2w.source_cache_len)).to(device)
    t2w.hift_cache_dict = {}
    if before_priming is not None:
        before_priming(t2w)
    t2w.flow = flow.to(device).eval()
    t2w.hift = hift.to(device).eval()

    t2w.cache = make_prompt(seed, prompt_frames, device)
    t2w.stream_cache, t2w.hift_cache_dict = set_stream_cache(t2w)
    torch.manual_seed(seed)  # the per-call device RNG HiFT's source module draws from
    t2w.bench = BenchInfo(
        seed=seed,
        device=device,
        prompt_frames=prompt_frames,
        refilled_params={"flow": flow_refilled, "hift": hift_refilled},
        version=installed_version(),
    )
    return t2w


@dataclass
class BenchInfo:
    seed: int
    device: torch.device
    prompt_frames: int
    refilled_params: dict[str, list[str]] = field(default_factory=dict)
    version: str | None = None


# -------------------------------------------------------------------------- driving


class _AutocastOnDevice:
    """``torch.amp`` whose ``autocast("cuda", ...)`` means the object's device."""

    def __init__(self, device: torch.device):
        self._device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.amp, name)

    def autocast(self, device_type: str, dtype: torch.dtype | None = None, **kwargs: Any):
        if device_type == "cuda" and self._device.type != "cuda":
            device_type = self._device.type
            # What torch itself does on CPU for an unsupported fast dtype (fp32): disable
            # (autocast_mode.py warns and sets enabled=False); said here to skip the warning.
            if dtype not in (torch.float16, torch.bfloat16):
                kwargs["enabled"] = False
        return torch.amp.autocast(device_type, dtype=dtype, **kwargs)


class _TorchOnDevice(types.ModuleType):
    """The real ``torch`` except that device='cuda' in factory calls means ``device``."""

    _FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange")

    def __init__(self, device: torch.device):
        super().__init__("torch")
        self._device = device
        self.amp = _AutocastOnDevice(device)
        for fname in self._FACTORIES:
            setattr(self, fname, self._mapped(getattr(torch, fname)))

    def _map(self, dev: Any) -> Any:
        if dev is not None and torch.device(dev).type == "cuda":
            return self._device
        return dev

    def _mapped(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = self._map(kwargs["device"])
            return fn(*args, **kwargs)

        call.__name__ = fn.__name__
        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


_stream_on_device_cache: dict[torch.device, Any] = {}


def vendor_stream_on(device: Any) -> Any:
    """``Token2wav.stream``'s own code object, with its global ``torch`` bound for ``device``.

    On the current CUDA device this is the vendor function itself.
    """
    m = import_stepaudio2()
    vendor = m.token2wav.Token2wav.stream
    device = torch.device(device)
    if device.type == "cuda" and (
        device.index is None or device.index == torch.cuda.current_device()
    ):
        return vendor
    fn = _stream_on_device_cache.get(device)
    if fn is None:
        g = dict(vendor.__globals__)
        g["torch"] = _TorchOnDevice(device)
        fn = types.FunctionType(
            vendor.__code__, g, vendor.__name__, vendor.__defaults__, vendor.__closure__
        )
        fn.__kwdefaults__ = vendor.__kwdefaults__
        fn.__qualname__ = vendor.__qualname__
        _stream_on_device_cache[device] = fn
    return fn


def stream_chunk(t2w: Any, tokens: list[int], last_chunk: bool) -> np.ndarray:
    """One stock ``Token2wav.stream(tokens, prompt_wav=None, last_chunk, return_waveform=True)``.

    Runs on ``t2w.bench.device``; returns the chunk's PCM as a 1-D float32 array.
    """
    fn = vendor_stream_on(t2w.bench.device)
    wav = fn(t2w, list(tokens), None, last_chunk=last_chunk, return_waveform=True)
    assert wav.dtype == np.float32 and wav.shape[0] == 1, (wav.dtype, wav.shape)
    return wav.reshape(-1)


@dataclass(frozen=True)
class TokenChunk:
    tokens: list[int]
    last_chunk: bool


def token_stream(
    seed: int, n_chunks: int, chunk_tokens: int = CHUNK_TOKENS, lookahead: int = PRE_LOOKAHEAD
) -> list[TokenChunk]:
    """Seeded token chunks exactly as a streaming client passes them to ``stream()``.

    The stock client (Step-Audio2 examples) keeps a buffer and, while it holds
    ``chunk_tokens + lookahead`` tokens, calls ``stream(buffer[:28])`` and drops the first
    ``chunk_tokens``; at the end it calls ``stream(buffer, last_chunk=True)`` on what is
    left. Here the utterance is ``n_chunks * chunk_tokens + lookahead`` tokens and the
    end of speech is known when the last window fills, so every call gets 28 tokens:
    calls 0..n-2 are ``tokens[25 i : 25 i + 28]`` with ``last_chunk=False`` (the encoder
    drops the 3 lookahead tokens: 25 tokens -> 50 mel frames), and call n-1 is
    ``tokens[25 (n-1) :]`` (28 tokens) with ``last_chunk=True`` (the encoder zero-pads 3
    lookahead frames instead: 28 tokens -> 56 mel frames). Consecutive calls overlap by
    the 3 lookahead tokens.
    """
    if n_chunks < 1:
        raise ValueError("n_chunks must be >= 1")
    g = torch.Generator().manual_seed(subseed(seed, 3))
    total = n_chunks * chunk_tokens + lookahead
    ids = torch.randint(0, VOCAB_SIZE, (total,), generator=g).tolist()
    return [
        TokenChunk(
            tokens=ids[i * chunk_tokens : i * chunk_tokens + chunk_tokens + lookahead],
            last_chunk=(i == n_chunks - 1),
        )
        for i in range(n_chunks)
    ]


def carry_lengths(t2w: Any) -> dict[str, int]:
    """Current attended lengths of the stock carries (mel frames)."""
    sc = t2w.stream_cache
    return {
        "estimator": int(sc["estimator_att_cache"].shape[4]),
        "conformer": int(sc["conformer_att_cache"].shape[3]),
        "hift_mel": int(t2w.hift_cache_dict["mel"].shape[2]),
        "hift_source": int(t2w.hift_cache_dict["source"].shape[2]),
        "hift_speech": int(t2w.hift_cache_dict["speech"].shape[1]),
    }
