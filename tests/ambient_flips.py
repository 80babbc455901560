"""How to change each ambient setting for one call (runtime/engine/ambient.py keys them all).

Shared by tests/test_runtime_ambient.py (CPU, fake backend) and
tests/test_runtime_cuda.py (real graphs). A setting added to ``ambient.SETTINGS``
without a row here fails ``test_every_setting_has_a_flip``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from duplexcadence.runtime.engine import ambient


def _set_attr(name: str, value):
    @contextlib.contextmanager
    def flip():
        setting = ambient.BY_NAME[name]
        saved = ambient.snapshot()
        setting.write(value(setting.read()))
        try:
            yield
        finally:
            ambient.restore(saved)

    return flip


def _toggle(name: str):
    return _set_attr(name, lambda v: not v)


def _other(name: str, choices: tuple[str, ...]):
    return _set_attr(name, lambda v: next(c for c in choices if c != v))


@contextlib.contextmanager
def _setter(get, set_, value):
    before = get()
    set_(value(before))
    try:
        yield
    finally:
        set_(before)


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_cuda = torch.backends.cuda
_det = torch.utils.deterministic
FLIPS = {
    "autocast(cpu)": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "autocast(cuda)": lambda: torch.autocast("cuda", dtype=torch.float16),
    "cudnn.enabled": _toggle("cudnn.enabled"),
    "cudnn.deterministic": _toggle("cudnn.deterministic"),
    "cudnn.benchmark": _toggle("cudnn.benchmark"),
    "cudnn.allow_tf32": _toggle("cudnn.allow_tf32"),
    "cuda.matmul.allow_tf32": _toggle("cuda.matmul.allow_tf32"),
    "cuda.matmul.allow_fp16_reduced_precision_reduction": _toggle(
        "cuda.matmul.allow_fp16_reduced_precision_reduction"
    ),
    "cuda.matmul.allow_bf16_reduced_precision_reduction": _toggle(
        "cuda.matmul.allow_bf16_reduced_precision_reduction"
    ),
    "cuda.matmul.allow_fp16_accumulation": _toggle("cuda.matmul.allow_fp16_accumulation"),
    "fp32_precision": _other("fp32_precision", ("none", "ieee", "tf32")),
    "cuda.matmul.fp32_precision": _other("cuda.matmul.fp32_precision", ("none", "ieee", "tf32")),
    "cudnn.fp32_precision": _other("cudnn.fp32_precision", ("none", "ieee", "tf32")),
    "cudnn.conv.fp32_precision": _other("cudnn.conv.fp32_precision", ("none", "ieee", "tf32")),
    "cudnn.rnn.fp32_precision": _other("cudnn.rnn.fp32_precision", ("none", "ieee", "tf32")),
    "mkldnn.enabled": _toggle("mkldnn.enabled"),
    "mkldnn.deterministic": _toggle("mkldnn.deterministic"),
    "mkldnn.fp32_precision": _other("mkldnn.fp32_precision", ("none", "ieee", "bf16")),
    "opt_einsum.enabled": _toggle("opt_einsum.enabled"),
    "opt_einsum.strategy": _other("opt_einsum.strategy", ("auto", "greedy", "optimal")),
    "float32_matmul_precision": lambda: _setter(
        torch.get_float32_matmul_precision,
        torch.set_float32_matmul_precision,
        lambda v: "high" if v != "high" else "highest",
    ),
    "cuda.preferred_blas_library": lambda: _setter(
        _cuda.preferred_blas_library,
        _cuda.preferred_blas_library,
        lambda v: "cublaslt" if "Lt" not in str(v) else "cublas",
    ),
    "cuda.preferred_linalg_library": lambda: _setter(
        _cuda.preferred_linalg_library,
        _cuda.preferred_linalg_library,
        lambda v: "cusolver" if "Cusolver" not in str(v) else "magma",
    ),
    "cuda.flash_sdp": lambda: _setter(
        _cuda.flash_sdp_enabled, _cuda.enable_flash_sdp, lambda v: not v
    ),
    "cuda.mem_efficient_sdp": lambda: _setter(
        _cuda.mem_efficient_sdp_enabled, _cuda.enable_mem_efficient_sdp, lambda v: not v
    ),
    "cuda.math_sdp": lambda: _setter(
        _cuda.math_sdp_enabled, _cuda.enable_math_sdp, lambda v: not v
    ),
    "cuda.cudnn_sdp": lambda: _setter(
        _cuda.cudnn_sdp_enabled, _cuda.enable_cudnn_sdp, lambda v: not v
    ),
    "cuda.math_sdp_reduced_precision": lambda: _setter(
        _cuda.fp16_bf16_reduction_math_sdp_allowed,
        _cuda.allow_fp16_bf16_reduction_math_sdp,
        lambda v: not v,
    ),
    "deterministic_algorithms": lambda: _setter(
        torch.are_deterministic_algorithms_enabled,
        torch.use_deterministic_algorithms,
        lambda v: not v,
    ),
    "deterministic_warn_only": lambda: _setter(
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        lambda v: (v[0], not v[1]),
    ),
    "deterministic_fill_uninitialized_memory": lambda: _setter(
        lambda: _det.fill_uninitialized_memory,
        lambda v: setattr(_det, "fill_uninitialized_memory", v),
        lambda v: not v,
    ),
    "default_dtype": lambda: _setter(
        torch.get_default_dtype, torch.set_default_dtype, lambda v: torch.float64
    ),
    "torch_function_mode": lambda: torch.device("cpu"),
    "torch_dispatch_modes": _Mode,
}


@contextlib.contextmanager
def flipped(name: str):
    """``name`` changed for the body, then every setting put back exactly (torch's own
    setters do not round-trip: a legacy TF32 write leaves "ieee" where "none" was).
    Skips the test when this build cannot take the changed value."""
    with contextlib.ExitStack() as stack:
        stack.callback(ambient.restore, ambient.snapshot())
        try:
            stack.enter_context(FLIPS[name]())
        except (RuntimeError, ValueError) as exc:
            pytest.skip(f"{name} cannot be changed here: {exc}")
        yield
