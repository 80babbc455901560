"""Stock Kyutai Moshi (Mimi codec + LM + depformer), seeded random weights.

The released PyPI ``moshi==0.2.13``, imported from the installed distribution
(``bench/requirements-moshi.txt``, ``--no-deps``: its ``torch<2.10`` pin is metadata
only); nothing of it is copied here. DESIGN §5 has the facts. Around the vendor code:

* ``build_moshi()``: Mimi by ``loaders.get_mimi`` (fp32, 8 codebooks, as the server's
  ``CheckpointInfo.get_mimi``) and the LM by ``loaders.get_moshi_lm``, the vendor's own
  random init under fixed seeds. Only the quantizer codebooks change: they are zero
  after init (core_vq.py:158-159), which would make every code 0, so each is filled
  with N(0, 1). ``LMGen(lm, use_sampling=False)`` is greedy. Streaming starts as
  ``ServerState.__init__`` does (server.py:59-60), unless ``start=False`` (an adapter
  that replaces the LM's bound methods must do so before the vendor wraps them).
* ``step_frame()``: the server's per-frame loop body (server.py:131-147, 80-81) under
  ``torch.no_grad()`` and the vendor's ``no_compile()`` (compile.py:24-33), so every
  cell runs the same eager kernels (``NO_TORCH_COMPILE=1`` does the same at import).
* ``pcm_stream()``: seeded 1920-sample fp32 frames (80 ms at 24 kHz).

Seeds (``subseed(seed, k) = 16 * seed + k``): Mimi weights k=0, codebooks k=1 (a
private CPU generator), LM weights k=2, PCM k=3 (private); at the end of the build
``torch.manual_seed(seed)`` (only sampling draws from it). The loaders initialise on
the target device (the 7B LM does not fit the host), so CPU and CUDA weights differ.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch

from bench import workloads
from bench.workloads import subseed

RELEASE = workloads.RELEASES["moshi"]
FRAME_SAMPLES = 1920  # 24 kHz / 12.5 Hz
MIMI_CODEBOOKS = 8  # CheckpointInfo.get_mimi: max(dep_q, n_q - dep_q) (loaders.py:282-289)
PCM_STD = 0.1
# What the stock loop needs pinned to reproduce itself, beside cuDNN's deterministic
# convolutions: cuDNN's fused attention off (measured on the H200 with torch 2.11: two
# fresh stock processes part after ~70 frames with it, are identical over 1,000 without;
# the mem-efficient kernel then runs). contracts/moshi.clock pins the same for the
# adapter; every Moshi benchmark cell and session pins it, the references included.
DETERMINISM = {"cuda.cudnn_sdp": False}
# The full 7B config: None makes get_moshi_lm use its default ``_lm_kwargs``.
FULL_7B: dict[str, Any] | None = None
# The tiny LM for CPU tests: the 7B config (its stream layout, delays, cards, norms,
# RoPE, gating, ring KV, depformer) with only the widths and depths shrunk.
TINY_SHRINK = dict(dim=64, num_heads=4, num_layers=2, depformer_dim=64)
TINY_SHRINK.update(depformer_dim_feedforward=264, depformer_num_heads=4, depformer_num_layers=2)


def __getattr__(name: str) -> Any:  # TINY_LM_KWARGS needs the vendor's defaults
    if name == "TINY_LM_KWARGS":
        return {**_loaders()._lm_kwargs, **TINY_SHRINK}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def installed_version() -> str | None:
    return workloads.installed_version(RELEASE.dist)


def unavailable_reason() -> str | None:
    """Why the stock workload cannot be built here (None when it can)."""
    reason = workloads.unavailable_reason("moshi")
    if reason is None:
        try:  # a transitive import (huggingface_hub, ...) may be missing
            importlib.import_module("moshi.models")
        except ImportError as exc:
            hint = f"pip install --no-deps -r {RELEASE.requirements}"
            reason = f"moshi.models does not import: {exc} ({hint})"
    return reason


def _loaders() -> Any:
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    from moshi.models import loaders

    return loaders


def fill_codebooks(mimi: torch.nn.Module, seed: int) -> int:
    """Fill every zero-initialised quantizer codebook with seeded N(0, 1) values; drop
    its cached ``_embedding`` (``cluster_usage`` stays 1: the codebook is the fill)."""
    from moshi.quantization.core_vq import EuclideanCodebook

    g = torch.Generator().manual_seed(subseed(seed, 1))
    books = [m for _, m in sorted(mimi.named_modules()) if isinstance(m, EuclideanCodebook)]
    for module in books:
        buf = module.embedding_sum
        fill = torch.randn(buf.shape, generator=g, dtype=torch.float32)
        with torch.no_grad():
            buf.copy_(fill.to(device=buf.device, dtype=buf.dtype))
        module._embedding = None
    return len(books)


def start_streaming(mimi: Any, lm_gen: Any, batch_size: int = 1) -> None:
    """``ServerState.__init__`` (server.py:59-60): where the vendor wraps the bound
    methods as they resolve *now* and the Mimi modules in ``CUDAGraphed``."""
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

    loaders, device = _loaders(), torch.device(device)
    torch.manual_seed(subseed(seed, 0))
    mimi = loaders.get_mimi(None, device=device, num_codebooks=MIMI_CODEBOOKS)
    assert fill_codebooks(mimi, seed) > 0, "no EuclideanCodebook found in Mimi"
    mimi = mimi.eval()
    torch.manual_seed(subseed(seed, 2))
    kwargs = None if lm_kwargs is None else dict(lm_kwargs)
    lm = loaders.get_moshi_lm(None, lm_kwargs=kwargs, device=device, dtype=dtype)
    lm_gen = LMGen(lm.eval(), use_sampling=not greedy)
    torch.manual_seed(seed)
    if start:
        start_streaming(mimi, lm_gen)
    return mimi, lm_gen


def pcm_stream(seed: int, n_frames: int) -> list[torch.Tensor]:
    """Seeded fp32 input frames [1, 1, 1920] on the CPU (the server moves each chunk)."""
    g = torch.Generator().manual_seed(subseed(seed, 3))
    shape = (1, 1, FRAME_SAMPLES)
    return [torch.randn(shape, generator=g, dtype=torch.float32) * PCM_STD for _ in range(n_frames)]


@torch.no_grad()
def step_frame(mimi: Any, lm_gen: Any, chunk: torch.Tensor, step: Any = None) -> tuple[list, list]:
    """One 80 ms frame, the server's loop body: (tokens, pcm) device tensors, one per
    code step with output (``lm_gen.step`` returns None until ``offset_cpu >
    max_delay``, lm.py:774-776). No host synchronisation. ``step``: what takes the
    user's codes instead of ``lm_gen.step`` (a rolling-wake loop's ``tick``)."""
    from moshi.utils.compile import no_compile

    tokens_out, pcm_out = [], []
    with no_compile():
        codes = mimi.encode(chunk.to(device=next(mimi.parameters()).device))
        for c in range(codes.shape[-1]):
            tokens = (step or lm_gen.step)(codes[:, :, c : c + 1])
            if tokens is not None:
                assert tokens.shape[1] == lm_gen.lm_model.dep_q + 1
                tokens_out.append(tokens)
                pcm_out.append(mimi.decode(tokens[:, 1:]))
    return tokens_out, pcm_out


def run_frames(mimi: Any, lm_gen: Any, frames: list[torch.Tensor]) -> tuple[list, list]:
    """Every frame; per frame None before the first output, else the 9 generated ids
    [text, 8 audio] as ints and the decoded PCM [1, 1, 1920] on the CPU."""
    token_ids: list[list[int] | None] = []
    pcm: list[torch.Tensor | None] = []
    for chunk in frames:
        toks, outs = step_frame(mimi, lm_gen, chunk)
        assert len(toks) <= 1  # one code step per 1920-sample frame
        token_ids.append([int(v) for v in toks[0][0, :, 0].tolist()] if toks else None)
        pcm.append(outs[0].detach().to("cpu").clone() if toks else None)
    return token_ids, pcm


def bind_adapter(
    mimi: Any,
    lm_gen: Any,
    device: Any = None,
    *,
    capture: bool = True,
    progress: bool = False,
    batch: int | None = None,
    proof: Any = None,
) -> Any:
    """Bind the generated adapter (contracts/moshi.clock) as a server would at start-up,
    on a pair whose streaming has started (the sites live in the streaming states), with
    the vendor's graphs off (``NO_CUDA_GRAPH=1``: its ``CUDAGraphed`` wrappers would run
    inside the adapter's graphs). On CUDA the callables are captured here under
    ``no_compile()``; capture runs them on scratch inputs, so the streaming state is then
    reset in place as the server does per connection. ``batch``: bind the contract's
    lockstep at that width (a pair streaming at that batch size), with ``proof`` (a
    ``prove_lockstep`` proof of that width) if given. Returns the ``Binding``."""
    from moshi.utils.compile import _is_cuda_graph_enabled, no_compile

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
    with no_compile():
        binding = adapter.bind(
            model, device=device, capture=False, progress=progress, batch=batch, proof=proof
        )
        if capture and binding.device.type == "cuda":
            binding.capture(progress=progress)
            mimi.reset_streaming()
            lm_gen.reset_streaming()
    return binding


def stream_spec(
    device: str = "cuda",
    lm_kwargs: dict[str, Any] | None = FULL_7B,
    seed: int = 0,
    determinism: dict[str, bool] | None = None,
) -> Any:
    """The stock loop as a ``StreamSpec`` (runtime/tools/streams.py), for ``clockc reproduce``
    and ``clockc verify``: ``build()`` is ``build_moshi`` under the bench's envelope
    (cuDNN deterministic, no benchmark); ``drive()`` runs ``step_frame`` on the seeded
    frames with the vendor's CUDA graphs and ``torch.compile`` off (the eager reference)
    and yields ``{"tokens", "pcm"}`` per frame (None before the LM's first output).
    ``determinism``: the settings pinned at build beside cuDNN's (runtime/engine/determinism.py
    names; default ``DETERMINISM``)."""
    from duplexcadence.runtime.engine.determinism import apply_settings
    from duplexcadence.runtime.tools.streams import StreamSpec

    def build() -> Any:
        apply_settings(
            {"cudnn.deterministic": True, "cudnn.benchmark": False, **(determinism or {})}
        )
        mimi, lm_gen = build_moshi(seed, device, torch.bfloat16, lm_kwargs, greedy=True)
        return types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)

    def drive(model: Any, frames: int):
        from moshi.utils.compile import no_cuda_graph

        for chunk in pcm_stream(seed, frames):
            with no_cuda_graph():
                toks, outs = step_frame(model.mimi, model.lm_gen, chunk)
            yield {"tokens": toks[0] if toks else None, "pcm": outs[0] if outs else None}

    return StreamSpec(build=build, drive=drive, device=device)


def stream_7b() -> Any:
    """The full 7B LM + Mimi on CUDA (``clockc reproduce --stream
    bench.workloads.moshi:stream_7b``)."""
    return stream_spec("cuda", FULL_7B)


def stream_7b_unpinned() -> Any:
    """``stream_7b`` with cuDNN's attention left on (torch's default): the stock loop as
    it ran before the pin, which does not reproduce itself."""
    return stream_spec("cuda", FULL_7B, determinism={})


def stream_tiny() -> Any:
    """The tiny LM + Mimi on the CPU (tests)."""
    return stream_spec("cpu", {**_loaders()._lm_kwargs, **TINY_SHRINK})
