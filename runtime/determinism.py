"""The determinism envelope every exactness comparison runs under.

Contract of this layer: ``pin_determinism()`` sets the backend flags that make
repeated eager calls bit-identical (on the H200, cuDNN's default ConvTranspose1d
algorithm differs run to run by ~1e-5 unless ``cudnn.deterministic`` is set) and
puts every flag back in ``finally``, even if the body raises.
``determinism_settings()`` returns what is in force as a plain dict, to be
recorded beside every result (torch/CUDA/cuDNN versions, flags, device name).
TF32 flags are only touched when asked (``None`` = leave as found), because
changing them changes the stock numbers too.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def _flags() -> dict:
    return {
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }


def _set_flags(f: dict) -> None:
    torch.backends.cudnn.deterministic = f["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = f["cudnn_benchmark"]
    # Writing allow_tf32 unconditionally would turn on torch's legacy-API path
    # even where nothing changed; only write what differs.
    if torch.backends.cuda.matmul.allow_tf32 != f["matmul_allow_tf32"]:
        torch.backends.cuda.matmul.allow_tf32 = f["matmul_allow_tf32"]
    if torch.backends.cudnn.allow_tf32 != f["cudnn_allow_tf32"]:
        torch.backends.cudnn.allow_tf32 = f["cudnn_allow_tf32"]


@contextmanager
def pin_determinism(
    cudnn_deterministic: bool = True,
    cudnn_benchmark: bool = False,
    matmul_allow_tf32: bool | None = None,
    cudnn_allow_tf32: bool | None = None,
) -> Iterator[dict]:
    """Pin the flags for the body; yields ``determinism_settings()`` as pinned."""
    saved = _flags()
    want = dict(saved)
    want["cudnn_deterministic"] = cudnn_deterministic
    want["cudnn_benchmark"] = cudnn_benchmark
    if matmul_allow_tf32 is not None:
        want["matmul_allow_tf32"] = matmul_allow_tf32
    if cudnn_allow_tf32 is not None:
        want["cudnn_allow_tf32"] = cudnn_allow_tf32
    try:
        _set_flags(want)
        yield determinism_settings()
    finally:
        _set_flags(saved)


def determinism_settings(device: torch.device | str | None = None) -> dict:
    cuda = torch.cuda.is_available()
    name = None
    if cuda:
        name = torch.cuda.get_device_name(torch.device(device) if device is not None else None)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        **_flags(),
        "device": name if name is not None else "cpu",
    }
