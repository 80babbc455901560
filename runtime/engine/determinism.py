"""The determinism envelope every exactness comparison runs under.

Contract of this layer: the one implementation of "pin the backend flags that make
repeated eager calls bit-identical, record them, put them back". On the H200,
cuDNN's default ConvTranspose1d algorithm differs run to run by ~1e-5 unless
``cudnn.deterministic`` is set (DESIGN §6b). The flags themselves, their names and
how to read and write them live in ``ambient.py`` (they are ambient settings that
replay keys on); this module only sets, records and restores them:

* ``apply_settings(settings)`` — what a generated ``bind()`` does with the contract's
  ``determinism`` lines: set them, return a record of what is now in force together
  with the values they replaced, which ``Binding.unbind()`` hands to
  ``restore_settings``.
* ``pin_determinism()`` — the same as a context manager for benchmarks and tests,
  restored in ``finally`` even if the body raises. TF32 flags are only touched when
  asked (``None`` = leave as found), because changing them changes the stock numbers.
* ``determinism_settings()`` — what is in force as a plain dict, recorded beside every
  result (torch/CUDA/cuDNN versions, flags, device name).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

import torch

from . import ambient
from .ambient import BY_NAME, PINNABLE

KNOWN_SETTINGS = frozenset(PINNABLE)


def read_settings(names: tuple[str, ...] = PINNABLE) -> dict:
    return {n: BY_NAME[n].read() for n in names if n in BY_NAME}


def apply_settings(settings: Mapping[str, bool]) -> dict:
    """Set ``settings``; return {"in_force", "previous", "torch", "cuda"} (``previous``:
    every writable ambient setting as found, for ``restore_settings``)."""
    unknown = sorted(set(settings) - KNOWN_SETTINGS)
    if unknown:
        raise ValueError(f"unknown determinism setting(s) {unknown}; known: {sorted(PINNABLE)}")
    previous = ambient.snapshot()
    for name, value in settings.items():
        BY_NAME[name].write(value)  # type: ignore[misc]
    return {
        "in_force": read_settings(tuple(settings)),
        "previous": previous,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def restore_settings(previous: Mapping[str, bool]) -> None:
    """Put back what ``apply_settings`` found (every writable ambient setting: a TF32
    flag written through the legacy API also moves the new precision knobs)."""
    ambient.restore(dict(previous))


@contextmanager
def pin_determinism(
    cudnn_deterministic: bool = True,
    cudnn_benchmark: bool = False,
    matmul_allow_tf32: bool | None = None,
    cudnn_allow_tf32: bool | None = None,
    extra: Mapping[str, bool] | None = None,
) -> Iterator[dict]:
    """Pin the flags for the body; yields ``determinism_settings()`` as pinned.
    ``extra``: more pinnable settings by name (a workload's own, e.g.
    ``{"cuda.cudnn_sdp": False}`` for Moshi)."""
    want = {"cudnn.deterministic": cudnn_deterministic, "cudnn.benchmark": cudnn_benchmark}
    want.update(extra or {})
    if matmul_allow_tf32 is not None:
        want["cuda.matmul.allow_tf32"] = matmul_allow_tf32
    if cudnn_allow_tf32 is not None:
        want["cudnn.allow_tf32"] = cudnn_allow_tf32
    record = apply_settings(want)
    try:
        yield determinism_settings()
    finally:
        restore_settings(record["previous"])


def determinism_settings(device: torch.device | str | None = None) -> dict:
    cuda = torch.cuda.is_available()
    name = None
    if cuda:
        name = torch.cuda.get_device_name(torch.device(device) if device is not None else None)
    flags = read_settings()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        # the historical keys of the results JSONs
        "cudnn_deterministic": flags["cudnn.deterministic"],
        "cudnn_benchmark": flags["cudnn.benchmark"],
        "matmul_allow_tf32": flags["cuda.matmul.allow_tf32"],
        "cudnn_allow_tf32": flags["cudnn.allow_tf32"],
        "device": name if name is not None else "cpu",
        "pinnable": flags,  # every setting a contract may pin, by its name
    }
