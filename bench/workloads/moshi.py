"""Stock Kyutai Moshi (Mimi codec + LM + depformer), seeded random weights.

The workload is the released code of PyPI ``moshi==0.2.13`` (MIT / Apache-2.0),
imported from the installed distribution; nothing of it is copied here. DESIGN §5 has
the facts; ``bench/requirements-moshi.txt`` says how to install it (``--no-deps``: its
``torch<2.10`` pin is metadata only, and the server/client deps are not needed).

What this module adds around the vendor code, and nothing more:

* ``build_moshi()`` makes Mimi with ``loaders.get_mimi(None, device=...)`` (fp32, eval,
  8 codebooks as the server's ``CheckpointInfo.get_mimi`` picks for the Moshi LM) and the
  LM with ``loaders.get_moshi_lm(None, lm_kwargs=..., device=..., dtype=...)``, both with
  the vendor's own random initialisation under a fixed seed. The only thing it changes
  is the quantizer codebooks: every ``EuclideanCodebook.embedding_sum`` is zero after
  init (core_vq.py:158-159), which would make every code 0 and every decoded latent 0,
  so each is filled with N(0, 1) values from a private CPU generator and its cached
  ``_embedding`` is dropped (``cluster_usage`` stays 1, so the codebook *is* the fill,
  core_vq.py:179-186). ``LMGen(lm, use_sampling=False)`` is greedy (argmax,
  sampling.py:103-104); ``greedy=False`` keeps the vendor defaults (temp 0.8 / 0.7,
  top-k 250 / 25) and draws from the global generator seeded at the end of the build.
  Streaming is started exactly as ``moshi.server.ServerState.__init__`` does
  (server.py:59-60), unless ``start_streaming=False`` (an adapter that replaces the
  LM's bound methods must do so *before* ``LMGen._init_streaming_state`` wraps them,
  lm.py:630-632; see ``start_streaming()``).
* ``step_frame()`` / ``run_frames()`` are the body of the server's per-frame loop
  (server.py:131-147 and ``decode_and_send`` server.py:80-81), under ``torch.no_grad()``
  as the server runs (server.py:286): ``codes = mimi.encode(chunk)``; for each code step
  ``tokens = lm_gen.step(codes[:, :, c:c+1])``; if not None, ``mimi.decode(tokens[:, 1:])``.
  The server's connection-level ``mimi.reset_streaming()`` after the first frame of a
  connection (``skip_frames``, server.py:136-142) is not part of the steady per-frame
  path and is not done here. torch.compile is off by default (``compile=False``): the
  vendor wraps ``_rms_norm`` (transformer.py:45), ``apply_rope`` (rope.py:11) and the
  gating kernel (gating.py:13) in ``torch_compile_lazy``, which compiles on first call
  (on CPU too for the LM's ``out_norm``, called outside the per-layer ``no_compile()`` of
  transformer.py:789-791); each frame therefore runs inside the vendor's own
  ``moshi.utils.compile.no_compile()`` (compile.py:24-33, a flag read on every call), so
  every cell runs the same eager kernels. ``NO_TORCH_COMPILE=1`` in the environment
  *before* moshi is imported does the same at decoration time (compile.py:40-41).
* ``pcm_stream()`` gives seeded 1920-sample fp32 frames (80 ms at 24 kHz).

Seeding (all derived from one ``seed``; ``subseed(seed, k) = 16 * seed + k``): Mimi
weights ← ``torch.manual_seed(subseed(seed, 0))``; codebooks ← a private CPU generator
at ``subseed(seed, 1)``; LM weights ← ``torch.manual_seed(subseed(seed, 2))``; PCM ←
a private CPU generator at ``subseed(seed, 3)``; at the end of the build
``torch.manual_seed(seed)`` seeds the global generators (only sampling draws from them).
Weights are initialised on the target device by the vendor loaders (the 7B LM is too
large to build on the host and move), so a CUDA build's weights differ from a CPU
build's; every comparison is between builds on the same device.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from bench import workloads
from bench.workloads import subseed

RELEASE = workloads.RELEASES["moshi"]

SAMPLE_RATE = 24000
FRAME_RATE = 12.5
FRAME_SAMPLES = 1920  # 24 kHz / 12.5 Hz
MIMI_CODEBOOKS = 8  # CheckpointInfo.get_mimi: max(dep_q, n_q - dep_q) = 8 (loaders.py:282-289)
CODEBOOK_FILL_STD = 1.0
PCM_STD = 0.1

# The full Moshi 7B config: ``None`` makes get_moshi_lm use its default ``_lm_kwargs``
# (loaders.py:90-119, 375-376): dim 4096, 32 layers x 32 heads, context 3000, depformer
# 1024-d, 6 layers x 16 heads, 8 steps, 17 streams with delays [0, 0, 1 x7, 0, 1 x7].
FULL_7B: dict[str, Any] | None = None

# A tiny LM for CPU tests that keeps every real code path of the 7B config: the same
# stream layout (n_q 16, dep_q 8 -> 17 codebooks, the same delays), the same card /
# text_card, RMS-norm f32, RoPE, SiLU gating, the LM ring KV of capacity 3000, the
# depformer with multi-linear inputs, weights per step, context 8 and no positional
# embedding. Only the widths and depths shrink.
TINY_LM_KWARGS: dict[str, Any] = {
    "dim": 64,
    "text_card": 32000,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": 2048,
    "num_heads": 4,
    "num_layers": 2,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 64,
    "depformer_dim_feedforward": int(4.125 * 64),
    "depformer_num_heads": 4,
    "depformer_num_layers": 2,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}


def installed_version() -> str | None:
    return workloads.installed_version(RELEASE.dist)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can)."""
    reason = workloads.unavailable_reason("moshi")
    if reason is not None:
        return reason
    try:
        import moshi.models  # noqa: F401
    except ImportError as exc:  # a transitive import of huggingface_hub etc.
        return (
            f"moshi.models does not import: {exc} (pip install --no-deps -r {RELEASE.requirements})"
        )
    return None


def _loaders():
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    from moshi.models import loaders

    return loaders


def fill_codebooks(mimi: torch.nn.Module, seed: int, std: float = CODEBOOK_FILL_STD) -> int:
    """Fill every zero-initialised quantizer codebook with seeded N(0, std) values."""
    from moshi.quantization.core_vq import EuclideanCodebook

    g = torch.Generator().manual_seed(subseed(seed, 1))
    n = 0
    for _, module in sorted(mimi.named_modules(), key=lambda kv: kv[0]):
        if isinstance(module, EuclideanCodebook):
            buf = module.embedding_sum
            fill = torch.randn(buf.shape, generator=g, dtype=torch.float32) * std
            with torch.no_grad():
                buf.copy_(fill.to(device=buf.device, dtype=buf.dtype))
            module._embedding = None  # the cached embedding_sum / cluster_usage
            n += 1
    return n


def build_mimi(seed: int, device: str | torch.device) -> torch.nn.Module:
    loaders = _loaders()
    device = torch.device(device)
    torch.manual_seed(subseed(seed, 0))
    mimi = loaders.get_mimi(None, device=device, num_codebooks=MIMI_CODEBOOKS)
    n = fill_codebooks(mimi, seed)
    assert n > 0, "no EuclideanCodebook found in Mimi"
    return mimi.eval()


def build_lm(
    seed: int,
    device: str | torch.device,
    dtype: torch.dtype = torch.bfloat16,
    lm_kwargs: dict[str, Any] | None = FULL_7B,
) -> torch.nn.Module:
    loaders = _loaders()
    torch.manual_seed(subseed(seed, 2))
    lm = loaders.get_moshi_lm(
        None,
        lm_kwargs=None if lm_kwargs is None else dict(lm_kwargs),
        device=torch.device(device),
        dtype=dtype,
    )
    return lm.eval()


def start_streaming(mimi: Any, lm_gen: Any, batch_size: int = 1) -> None:
    """What ``ServerState.__init__`` does (server.py:59-60). This is where the vendor
    wraps ``lm_model.forward_text`` / ``lm_gen.depformer_step`` (the bound methods as they
    resolve *now*) and the Mimi encoder/decoder modules in ``CUDAGraphed``."""
    mimi.streaming_forever(batch_size)
    lm_gen.streaming_forever(batch_size)


def build_moshi(
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    lm_kwargs: dict[str, Any] | None = FULL_7B,
    greedy: bool = True,
    *,
    start: bool = True,
) -> tuple[Any, Any]:
    """(mimi, lm_gen): seeded random weights, filled codebooks, streaming started
    (unless ``start=False``: then call ``start_streaming`` after binding)."""
    from moshi.models import LMGen

    mimi = build_mimi(seed, device)
    lm = build_lm(seed, device, dtype, lm_kwargs)
    lm_gen = LMGen(lm, use_sampling=not greedy)
    torch.manual_seed(seed)
    if start:
        start_streaming(mimi, lm_gen)
    return mimi, lm_gen


def pcm_stream(seed: int, n_frames: int) -> list[torch.Tensor]:
    """Seeded fp32 input frames [1, 1, 1920] on the CPU (the server moves each chunk)."""
    g = torch.Generator().manual_seed(subseed(seed, 3))
    return [
        torch.randn((1, 1, FRAME_SAMPLES), generator=g, dtype=torch.float32) * PCM_STD
        for _ in range(n_frames)
    ]


def _device_of(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _compile_guard(compile: bool):
    if compile:
        return contextlib.nullcontext()
    from moshi.utils.compile import no_compile

    return no_compile()


@torch.no_grad()
def step_frame(
    mimi: Any, lm_gen: Any, chunk: torch.Tensor, *, compile: bool = False
) -> tuple[list, list]:
    """One 80 ms frame, the server's loop body (server.py:131-147, 80-81).

    Returns (tokens, pcm): device tensors, one per code step that produced output
    (``lm_gen.step`` returns None until ``offset_cpu > max_delay``, lm.py:774-776).
    No host synchronisation. ``compile=False`` runs it under the vendor's
    ``no_compile()`` (see the module docstring)."""
    with _compile_guard(compile):
        return _step_frame(mimi, lm_gen, chunk)


def _step_frame(mimi: Any, lm_gen: Any, chunk: torch.Tensor) -> tuple[list, list]:
    chunk = chunk.to(device=_device_of(mimi))
    codes = mimi.encode(chunk)
    tokens_out: list[torch.Tensor] = []
    pcm_out: list[torch.Tensor] = []
    for c in range(codes.shape[-1]):
        tokens = lm_gen.step(codes[:, :, c : c + 1])
        if tokens is None:
            continue
        assert tokens.shape[1] == lm_gen.lm_model.dep_q + 1
        main_pcm = mimi.decode(tokens[:, 1:])
        tokens_out.append(tokens)
        pcm_out.append(main_pcm)
    return tokens_out, pcm_out


def run_frames(
    mimi: Any, lm_gen: Any, frames: list[torch.Tensor], *, compile: bool = False
) -> tuple[list, list]:
    """Run every frame; (token ids, pcm): per frame, None before the first output, else
    the 9 generated ids [text, 8 audio] as ints and the decoded PCM [1, 1, 1920] on CPU."""
    token_ids: list[list[int] | None] = []
    pcm: list[torch.Tensor | None] = []
    for chunk in frames:
        toks, outs = step_frame(mimi, lm_gen, chunk, compile=compile)
        assert len(toks) <= 1  # one code step per 1920-sample frame
        if not toks:
            token_ids.append(None)
            pcm.append(None)
            continue
        token_ids.append([int(v) for v in toks[0][0, :, 0].tolist()])
        pcm.append(outs[0].detach().to("cpu").clone())
    return token_ids, pcm


def bind_adapter(
    mimi: Any,
    lm_gen: Any,
    device: str | torch.device | None = None,
    *,
    capture: bool = True,
    progress: bool = False,
) -> Any:
    """Bind the generated adapter (contracts/moshi.clock) as a server would at start-up.

    Call it on a built pair whose streaming has started (``build_moshi(start=True)``):
    the contract's sites live in the streaming states. The vendor's own graphs must be
    off (``NO_CUDA_GRAPH=1``), since its ``CUDAGraphed`` wrappers run inside the
    adapter's graphs as plain calls. On CUDA the callables are captured here under the
    vendor's ``no_compile()`` (every cell runs the same eager kernels); capture runs
    them on scratch inputs, so the streaming state is then reset in place exactly as
    the server does for each new connection (``mimi.reset_streaming()``,
    ``lm_gen.reset_streaming()``). Returns the ``Binding``.
    """
    import types

    from moshi.utils.compile import _is_cuda_graph_enabled

    if _is_cuda_graph_enabled():
        raise RuntimeError(
            "bind_adapter: the vendor's CUDA graphs are on; set NO_CUDA_GRAPH=1 (or run "
            "inside moshi.utils.compile.no_cuda_graph()) so they do not capture inside the "
            "adapter's graphs"
        )
    if lm_gen._streaming_state is None or mimi._streaming_state is None:
        raise RuntimeError("bind_adapter: start streaming first (build_moshi(start=True))")
    from duplexcadence.generated import moshi as adapter

    model = types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)
    with _compile_guard(False):
        binding = adapter.bind(model, device=device, capture=False, progress=progress)
        if capture and binding.device.type == "cuda":
            binding.capture(progress=progress)
            mimi.reset_streaming()
            lm_gen.reset_streaming()
    return binding
