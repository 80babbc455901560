"""Effect classification: which random streams a callable draws from.

Contract of this layer: snapshot and compare the *host* random state (torch's CPU
generator, Python's ``random``, NumPy's global generator if NumPy is loaded) so a
probe call can tell whether a callable draws host randomness, and rewind it
afterwards so the probe is invisible. Device generator state is read and written
by the graph backend (it owns the device). A callable that draws host randomness
would have its draws frozen into a graph as constants, so it is rejected for good;
device randomness is admitted because the graph reads the generator's seed and
offset at replay time and advances the offset exactly as eager calls do.
"""

from __future__ import annotations

import enum
import random
import sys
from dataclasses import dataclass
from typing import Any

import torch


class Effect(enum.Enum):
    NONE = "none"
    DEVICE_RNG = "device_rng"
    HOST_RNG = "host_rng"


@dataclass
class HostRngState:
    torch_state: torch.Tensor
    python_state: Any
    numpy_state: Any | None


def host_rng_snapshot() -> HostRngState:
    np = sys.modules.get("numpy")  # only if already imported: never import it ourselves
    return HostRngState(
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state() if np is not None else None,
    )


def host_rng_restore(s: HostRngState) -> None:
    torch.set_rng_state(s.torch_state)
    random.setstate(s.python_state)
    np = sys.modules.get("numpy")
    if np is not None and s.numpy_state is not None:
        np.random.set_state(s.numpy_state)


def _numpy_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    np = sys.modules["numpy"]
    return a[0] == b[0] and bool(np.array_equal(a[1], b[1])) and tuple(a[2:]) == tuple(b[2:])


def host_rng_equal(a: HostRngState, b: HostRngState) -> bool:
    return (
        torch.equal(a.torch_state, b.torch_state)
        and a.python_state == b.python_state
        and _numpy_equal(a.numpy_state, b.numpy_state)
    )


def classify(
    host_before: HostRngState,
    host_after: HostRngState,
    device_before: torch.Tensor | None,
    device_after: torch.Tensor | None,
) -> Effect:
    """Host randomness dominates: one host draw is enough to reject."""
    if not host_rng_equal(host_before, host_after):
        return Effect.HOST_RNG
    if device_before is not None and device_after is not None:
        if not torch.equal(device_before, device_after):
            return Effect.DEVICE_RNG
    return Effect.NONE
