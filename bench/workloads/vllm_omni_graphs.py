"""vllm-omni 0.30.0's CUDA-graph wrappers bound to stock decoders (controls): the CFM DiT
wrapper on the stock Token2Wav, the Code2Wav decoder wrapper on the stock Qwen3-Omni
Code2Wav.

``vllm_omni/model_executor/models/minicpmo_4_5/cuda_graph_wrapper.py`` and
``vllm_omni/model_executor/models/qwen3_tts/cuda_graph_decoder_wrapper.py`` (Apache-2.0)
are loaded from the installed wheel, never copied:

    pip install --no-deps --target .vendor/vllm-omni-0.30.0 vllm-omni==0.30.0

Each is loaded as a lone file (``spec_from_file_location``), so none of the
``vllm_omni`` package ``__init__`` files run (they import vLLM, Ray, transformers...).
Each file itself imports only ``torch`` (and the standard library) and two names of
vLLM, which are given stand-ins here, in ``sys.modules`` only while it loads:

* ``vllm.logger.init_logger(name)`` -> ``logging.getLogger(name)``;
* ``vllm.platforms.current_platform.get_global_graph_pool()`` -> one
  ``torch.cuda.graph_pool_handle()`` per process (vLLM's is also one per process).

Exact mode only: ``CFMGraphWrapper`` keys each estimator step by its exact signature
(tensor shapes, dtypes, devices), up to 32 graphs, all flushed when full. It is bound
where vllm-omni's ``BatchedToken2Wav`` binds it, on ``DiT.blocks_forward_chunk``; the
stock ``DiT.forward_chunk`` then receives the replayed output, and the new caches that
the wrapper returns (clones of its static buffers) are copied into the stock
``cnn_cache_buffer`` / ``att_cache_buffer`` the stock code reads next. The padded mode
(``cfm_graph_bucket_frames``) is not a property of the wrapper: ``BatchedToken2Wav``
pads mu/cond/noise and masks inside its own solver loop, which replaces
``Token2wav.stream()``; it cannot be bound to the stock streaming path.

Code2Wav: ``CUDAGraphDecoderWrapper`` is what vllm-omni's own ``Qwen3OmniMoeCode2Wav.
enable_cudagraph`` builds (qwen3_omni_code2wav.py:140-179: ``decoder=self``, the config's
``num_quantizers``, then ``warmup`` with the stage's ``codec_chunk_frames`` /
``codec_left_context_frames``, 25 / 25 in deploy/qwen3_omni_moe.yaml). Its ``decoder``
only has to be a module called as ``decoder(codes)`` with a ``total_upsample``, which
the stock transformers ``Qwen3OmniMoeCode2Wav`` is, so it wraps the stock instance. It
captures one graph per batch x window bucket (capture sizes 2, 4, 8, 16, 25, 32, 50, 64,
128, 256, 325 frames for 25 / 25) and replays a window in the smallest bucket that holds
it, zero-padding the codes and trimming the output; a window past 325 runs eager.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from pathlib import Path
from typing import Any

VERSION = "0.30.0"
VENDOR_DIR = Path(__file__).resolve().parents[2] / ".vendor" / f"vllm-omni-{VERSION}"
WRAPPER_FILE = "vllm_omni/model_executor/models/minicpmo_4_5/cuda_graph_wrapper.py"
CODE2WAV_WRAPPER_FILE = "vllm_omni/model_executor/models/qwen3_tts/cuda_graph_decoder_wrapper.py"
_pool: Any = None


def unavailable_reason(wrapper_file: str = WRAPPER_FILE) -> str | None:
    if not (VENDOR_DIR / wrapper_file).is_file():
        return (
            f"vllm-omni {VERSION} is not installed: pip install --no-deps --target "
            f".vendor/vllm-omni-{VERSION} vllm-omni=={VERSION}"
        )
    return None


def _global_graph_pool() -> Any:
    import torch

    global _pool
    if _pool is None:
        _pool = torch.cuda.graph_pool_handle()
    return _pool


def import_wrapper_module(wrapper_file: str = WRAPPER_FILE) -> types.ModuleType:
    """The vendor file ``wrapper_file`` with stand-ins for ``vllm.logger`` and
    ``vllm.platforms``."""
    reason = unavailable_reason(wrapper_file)
    if reason is not None:
        raise ImportError(reason)
    vllm = types.ModuleType("vllm")
    logger_mod = types.ModuleType("vllm.logger")
    logger_mod.init_logger = logging.getLogger
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(get_global_graph_pool=_global_graph_pool)
    vllm.logger, vllm.platforms = logger_mod, platforms
    stand_ins = {"vllm": vllm, "vllm.logger": logger_mod, "vllm.platforms": platforms}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(
            f"vllm_omni_{Path(wrapper_file).stem}", VENDOR_DIR / wrapper_file
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


def bind_cfm_graphs(t2w: Any, max_graphs: int = 32) -> Any:
    """Route the stock estimator's ``blocks_forward_chunk`` through ``CFMGraphWrapper``."""
    est = t2w.flow.decoder.estimator
    wrapper = import_wrapper_module().CFMGraphWrapper(
        est.blocks_forward_chunk, max_graphs=max_graphs
    )

    def blocks_forward_chunk(x, t, mask, cnn_cache, att_cache, cnn_buffer, att_buffer):
        out, new_cnn, new_att = wrapper.replay(
            x, t, cnn_cache, att_cache, cnn_buffer, att_buffer, mask
        )
        if new_cnn is not cnn_buffer:  # replayed: the caches are in the wrapper's buffers
            cnn_buffer.copy_(new_cnn)
            att_buffer.copy_(new_att)
        return out

    est.blocks_forward_chunk = blocks_forward_chunk
    return wrapper


def bind_code2wav_graphs(
    model: Any, device: Any, codec_chunk_frames: int, codec_left_context_frames: int
) -> Any:
    """``CUDAGraphDecoderWrapper`` on the stock Code2Wav, warmed up (its graphs captured) as
    vllm-omni's ``Qwen3OmniMoeCode2Wav.enable_cudagraph`` does. Its ``decode(codes)`` is
    the per-window call of vllm-omni's ``chunked_decode_streaming``. On a CPU device the
    vendor's ``warmup`` captures nothing and ``decode`` runs the model eagerly."""
    import torch

    module = import_wrapper_module(CODE2WAV_WRAPPER_FILE)
    wrapper = module.CUDAGraphDecoderWrapper(
        decoder=model, num_quantizers=model.config.num_quantizers, enabled=True
    )
    wrapper.warmup(
        torch.device(device),
        dtype=torch.long,
        codec_chunk_frames=codec_chunk_frames,
        codec_left_context_frames=codec_left_context_frames,
    )
    return wrapper
