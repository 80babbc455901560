"""Ambient state: process- and thread-wide torch settings that change a call's kernels.

Contract of this layer. A captured graph froze the kernels that ran *under the
settings in force at capture*. Eager code re-reads those settings on every call, so
a replay under different settings would return different bytes while counting a hit
(measured: Token2Wav's own ``float16=True`` switch runs the flow under
``autocast("cuda", float16)``; fp32 graphs replayed there). So the settings are part
of the signature: ``ambient_state(device_type)`` reads them (host reads only, no
device sync, a few microseconds) into a tuple the engine records per class at
capture and compares on every call; ``describe_difference`` names the first setting
that differs, for the miss detail.

What is keyed, and why each can change kernels or numerics:
  * autocast on the call's device type and on the CPU (enabled, dtype): casts inside
    the call; contracts declare the autocast states to capture (``Autocast``);
  * cuDNN enabled / deterministic / benchmark / TF32: algorithm choice;
  * cuBLAS TF32, fp16/bf16 reduced-precision reductions, fp16 accumulation, the
    float32 matmul precision, the ``fp32_precision`` knobs of newer torch, the
    preferred BLAS and linalg libraries: GEMM and solver kernels;
  * the scaled-dot-product attention backends (flash, mem-efficient, math, cuDNN) and
    math-SDP reduced precision: which attention kernel runs;
  * oneDNN enabled / deterministic (CPU kernels), opt_einsum (contraction order);
  * deterministic-algorithms mode (and warn-only, and filling uninitialised memory);
  * the default dtype (factory calls without a dtype);
  * the current CUDA device (factory calls with ``device="cuda"``);
  * an active ``TorchFunctionMode`` or ``TorchDispatchMode`` (``with torch.device(...)``,
    profilers' flop counters, user modes): eager dispatch would go through them, a
    replay would not.
Not keyed, and why: grad mode has its own miss reason (``grad_enabled``: a replay
records no autograd history); inference mode changes tensor flags, never a kernel
(the generated wrappers enter it anyway); the autocast cast cache holds values that
are bit-identical to recomputed casts. Settings a torch build lacks are skipped, so
the table is the same concept on every version. The names are the ones a contract's
``determinism`` lines use, where a setting can be pinned.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch


@dataclass(frozen=True)
class Setting:
    """One ambient setting: how to read it and, if a contract may pin it, write it."""

    name: str
    read: Callable[[], Hashable]
    write: Callable[[Any], None] | None = None


def _attr(owner_path: str, attr: str) -> Setting | None:
    """A setting that is a plain attribute of a ``torch.backends`` object."""
    owner: Any = torch
    for part in owner_path.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if not hasattr(owner, attr):
        return None
    name = f"{owner_path}.{attr}".removeprefix("backends.")

    def read() -> Hashable:
        try:
            return getattr(owner, attr)
        except RuntimeError:
            # torch refuses to read a legacy TF32 flag once the new fp32_precision API
            # gave conv and RNN different values; the new knobs are keyed beside it
            return _UNREADABLE

    def write(value: Any) -> None:
        # Writing a TF32 flag flips torch's legacy/new precision API even when the
        # value is unchanged: write only what differs.
        if read() != value:
            setattr(owner, attr, value)

    return Setting(name, read, write)


def _call(name: str, fn: Callable[[], Hashable] | None) -> Setting | None:
    if fn is None:
        return None
    try:
        fn()
    except Exception:  # noqa: BLE001 - a getter this build cannot answer is skipped
        return None
    return Setting(name, fn)


def _optional(obj: Any, name: str) -> Any:
    return getattr(obj, name, None)


def _sdp(name: str, backend: str) -> Setting | None:
    """An attention backend switch: ``torch.backends.cuda.<backend>_sdp_enabled()`` read,
    ``enable_<backend>_sdp(value)`` written (a contract may pin one off: Moshi's LM step
    runs cuDNN attention, which did not reproduce itself on the H200)."""
    read = getattr(_b.cuda, f"{backend}_sdp_enabled", None)
    write = getattr(_b.cuda, f"enable_{backend}_sdp", None)
    setting = _call(name, read)
    if setting is None or write is None:
        return setting
    return Setting(name, read, lambda value: write(bool(value)) if read() != value else None)


_b = torch.backends
_CANDIDATES = (
    _attr("backends.cudnn", "enabled"),
    _attr("backends.cudnn", "deterministic"),
    _attr("backends.cudnn", "benchmark"),
    _attr("backends.cudnn", "allow_tf32"),
    _attr("backends.cuda.matmul", "allow_tf32"),
    _attr("backends.cuda.matmul", "allow_fp16_reduced_precision_reduction"),
    _attr("backends.cuda.matmul", "allow_bf16_reduced_precision_reduction"),
    _attr("backends.cuda.matmul", "allow_fp16_accumulation"),
    _attr("backends", "fp32_precision"),
    _attr("backends.cuda.matmul", "fp32_precision"),
    _attr("backends.cudnn", "fp32_precision"),
    _attr("backends.cudnn.conv", "fp32_precision"),
    _attr("backends.cudnn.rnn", "fp32_precision"),
    _attr("backends.mkldnn", "enabled"),
    _attr("backends.mkldnn", "deterministic"),
    _attr("backends.mkldnn", "fp32_precision"),
    _attr("backends.opt_einsum", "enabled"),
    _attr("backends.opt_einsum", "strategy"),
    _call("float32_matmul_precision", torch.get_float32_matmul_precision),
    _call("cuda.preferred_blas_library", _optional(_b.cuda, "preferred_blas_library")),
    _call("cuda.preferred_linalg_library", _optional(_b.cuda, "preferred_linalg_library")),
    _sdp("cuda.flash_sdp", "flash"),
    _sdp("cuda.mem_efficient_sdp", "mem_efficient"),
    _sdp("cuda.math_sdp", "math"),
    _sdp("cuda.cudnn_sdp", "cudnn"),
    _call(
        "cuda.math_sdp_reduced_precision",
        _optional(_b.cuda, "fp16_bf16_reduction_math_sdp_allowed"),
    ),
    _call("deterministic_algorithms", torch.are_deterministic_algorithms_enabled),
    _call("deterministic_warn_only", torch.is_deterministic_algorithms_warn_only_enabled),
    _call(
        "deterministic_fill_uninitialized_memory",
        lambda: bool(torch.utils.deterministic.fill_uninitialized_memory),  # type: ignore[attr-defined]
    ),
    _call("default_dtype", torch.get_default_dtype),
    _call("torch_function_mode", torch._C._is_torch_function_mode_enabled),
    _call("torch_dispatch_modes", torch._C._len_torch_dispatch_stack),
)
SETTINGS: tuple[Setting, ...] = tuple(s for s in _CANDIDATES if s is not None)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# What a contract's `determinism` lines may pin (compiler/validate.py keeps the same
# names; tests/test_runtime_ambient.py ties the two lists).
PINNABLE = (
    "cudnn.deterministic",
    "cudnn.benchmark",
    "cudnn.allow_tf32",
    "cuda.matmul.allow_tf32",
    "cuda.cudnn_sdp",
    "cuda.flash_sdp",
    "cuda.mem_efficient_sdp",
)


_UNREADABLE = "unreadable (mixed TF32 APIs)"


def snapshot() -> dict[str, Hashable]:
    """The values of every writable setting, for ``restore``."""
    return {s.name: s.read() for s in SETTINGS if s.write is not None}


def restore(saved: dict[str, Hashable]) -> None:
    """Write ``saved`` back in table order. The order matters: writing a legacy TF32
    flag also rewrites the new ``fp32_precision`` knobs (``allow_tf32 = False`` leaves
    ``"ieee"`` where ``"none"`` was), and those come later in the table, so the exact
    previous values win."""
    for s in SETTINGS:
        if s.write is not None and s.name in saved and saved[s.name] != _UNREADABLE:
            s.write(saved[s.name])


def _autocast(device_type: str) -> tuple[bool, str]:
    return torch.is_autocast_enabled(device_type), str(torch.get_autocast_dtype(device_type))


def _cuda_device() -> int:
    return torch.cuda.current_device() if torch.cuda.is_initialized() else -1


def names(device_type: str) -> tuple[str, ...]:
    """The setting names in the order ``ambient_state`` reads them."""
    types = _autocast_types(device_type)
    return (
        *(f"autocast({t})" for t in types),
        "cuda.current_device",
        *(s.name for s in SETTINGS),
    )


def _autocast_types(device_type: str) -> tuple[str, ...]:
    return ("cpu",) if device_type == "cpu" else (device_type, "cpu")


def ambient_state(device_type: str) -> tuple:
    """Every keyed setting's current value, in ``names(device_type)`` order."""
    return (
        *(_autocast(t) for t in _autocast_types(device_type)),
        _cuda_device(),
        *(s.read() for s in SETTINGS),
    )


def describe_difference(device_type: str, captured: tuple, live: tuple) -> str:
    """Every setting that differs, as 'name: captured X, now Y; ...' (one change of a
    torch knob can show in several keyed names: the legacy TF32 flags mirror the new
    fp32_precision API, for instance)."""
    diffs = [
        f"{name}: captured {_show(was)}, now {_show(now)}"
        for name, was, now in zip(names(device_type), captured, live)
        if was != now
    ]
    return "; ".join(diffs) or "no difference"


def _show(v: Any) -> str:
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], bool):
        enabled, dtype = v
        return f"enabled {dtype.removeprefix('torch.')}" if enabled else "disabled"
    return str(v)


@dataclass(frozen=True)
class Autocast:
    """An autocast state a contract declares its callable is called under.

    ``dtype=None`` is autocast off. The engine captures every class once per
    declared state, inside ``context(device_type)``, and the state becomes part of
    the class's ambient key."""

    dtype: torch.dtype | None = None

    def context(self, device_type: str) -> AbstractContextManager:
        if self.dtype is None:
            return torch.autocast(device_type, enabled=False)
        return torch.autocast(device_type, dtype=self.dtype)

    @property
    def label(self) -> str:
        return "off" if self.dtype is None else str(self.dtype).removeprefix("torch.")


AUTOCAST_OFF = Autocast(None)
