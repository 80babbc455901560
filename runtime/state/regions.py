"""Address-stable state regions.

Contract of this layer: a region is allocated exactly once, at its declared
envelope (demand) shape, on its target device, and keeps the same storage (and so
the same ``data_ptr``) for its whole lifetime. Consumers read *views* of it at the
attended extent (a narrow along the clock axis starting at 0, never a copy), and a
turn-boundary reset zeroes it in place. Nothing here reallocates: that address
stability is what lets a captured CUDA graph alias the region instead of staging
it, and what lets admission check it with one integer comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .layouts import moved_view


class LayoutError(ValueError):
    """A view of one allocation of a region that another allocation cannot hold."""


LIFETIMES = frozenset({"operator", "chunk", "unit", "turn", "session", "process"})
MUTABILITIES = frozenset({"immutable", "mutable", "copy-on-write"})


@dataclass(frozen=True)
class RegionSpec:
    """Declared shape of one state region.

    ``shape`` is the *envelope*: what storage must hold in flight. ``axis`` is the
    clock-extent axis along which attended views are narrowed (``None`` for a region
    with no clock axis, e.g. a constant).
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    axis: int | None
    lifetime: str
    mutability: str

    def __post_init__(self) -> None:
        # Generated code may spell copy_on_write with underscores; normalise once
        # here so comparisons elsewhere are plain string equality.
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "mutability", self.mutability.replace("_", "-"))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"region {self.name}: negative dimension in {self.shape}")
        if self.axis is not None:
            if not -len(self.shape) <= self.axis < len(self.shape):
                raise ValueError(f"region {self.name}: axis {self.axis} out of range")
            object.__setattr__(self, "axis", self.axis % len(self.shape))
        if self.lifetime not in LIFETIMES:
            raise ValueError(
                f"region {self.name}: lifetime {self.lifetime!r} not in {sorted(LIFETIMES)}"
            )
        if self.mutability not in MUTABILITIES:
            raise ValueError(
                f"region {self.name}: mutability {self.mutability!r} not in {sorted(MUTABILITIES)}"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        # itemsize from an empty tensor works for every dtype, including bool
        # and the float8 family, without a lookup table.
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def capacity(self) -> int | None:
        """Envelope length along the clock axis (``None`` if there is no axis)."""
        return None if self.axis is None else self.shape[self.axis]


class Region:
    """One allocation, one address, for the region's declared lifetime."""

    def __init__(self, spec: RegionSpec, tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
            raise ValueError(
                f"region {spec.name}: tensor {tuple(tensor.shape)}/{tensor.dtype} does not "
                f"match spec {spec.shape}/{spec.dtype}"
            )
        self.spec = spec
        self.tensor = tensor
        # Recorded once: every later check compares against this integer.
        self._ptr = tensor.data_ptr()

    @classmethod
    def allocate(cls, spec: RegionSpec, device: torch.device | str) -> "Region":
        return cls(spec, torch.zeros(spec.shape, dtype=spec.dtype, device=device))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def storage_ptr(self) -> int:
        """Base pointer of the backing storage (views of the region share it)."""
        return self.tensor.untyped_storage().data_ptr()

    def address_stable(self) -> bool:
        return self.tensor.data_ptr() == self._ptr

    def view(self, extent: int) -> torch.Tensor:
        """The attended view: ``extent`` frames from 0 along the clock axis, no copy."""
        axis = self.spec.axis
        if axis is None:
            raise ValueError(f"region {self.name} has no clock axis to take an extent on")
        cap = self.spec.shape[axis]
        if not 0 <= extent <= cap:
            raise ValueError(f"region {self.name}: extent {extent} outside [0, {cap}]")
        return self.tensor.narrow(axis, 0, extent)

    def reset(self) -> None:
        """Zero in place (turn boundary): the address does not change."""
        self.tensor.zero_()

    def moved_view(self, t: torch.Tensor, layout: tuple[int, ...]) -> torch.Tensor | None:
        """This region's view of the elements ``t`` views in an allocation of this region
        at shape ``layout`` (a session's copy, another lane's: layouts.py), or None."""
        return moved_view(t, layout, self.tensor)

    def load(
        self, t: torch.Tensor, host_state: tuple | None, layout: tuple[int, ...] | None = None
    ) -> torch.Tensor:
        """Copy ``t`` (a view of another allocation of this region, at shape ``layout``;
        default: this region's) into the same place here, take its host state (a carry's
        live length), return the view. This is how a session's state enters a lane
        (sessions.py)."""
        view = self.moved_view(t, layout or self.spec.shape)
        if view is None:
            raise LayoutError(
                f"region {self.name}: a view {tuple(t.shape)} stride {t.stride()} of its "
                f"{layout} allocation has no image in this {self.spec.shape} one (it does not "
                "keep the region's strides): serve such a contract on lanes of one shape"
            )
        view.copy_(t, non_blocking=True)  # from pinned host memory too: ordered on the stream
        if host_state is not None:
            self._set_host_state(host_state)
        return view

    # Host-side bookkeeping beside the bytes (a carry's live length, say), so a
    # transparent capture can rewind it together with the contents.
    def _host_state(self) -> tuple:
        return ()

    def _set_host_state(self, state: tuple) -> None:
        pass

    def stats(self) -> dict:
        return {
            "kind": "region",
            "name": self.name,
            "shape": self.spec.shape,
            "dtype": str(self.spec.dtype).removeprefix("torch."),
            "nbytes": self.nbytes,
            "lifetime": self.spec.lifetime,
            "mutability": self.spec.mutability,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, shape={self.spec.shape}, "
            f"dtype={self.spec.dtype}, device={self.device})"
        )


def adopt_prefix(region: Any, tensor: Any) -> Any:
    """An aliased fixed-shape region handed a stock tensor: copy its leading part in.

    Returns the region's own tensor, so the call reads the state at the region's
    address (a replay admits it) with the same values the stock tensor held.
    """
    target = region.tensor
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if tensor.data_ptr() == target.data_ptr() and tensor.shape == target.shape:
        return tensor
    leading = leading_part(tensor, tuple(target.shape))
    if leading is None:
        return tensor  # not this region's state: leave it; admission decides
    with torch.no_grad():
        target.copy_(leading)
    return target


def leading_part(stock: Any, shape: tuple[int, ...]) -> Any:
    """The leading `shape` block of a (possibly larger) stock tensor, or None if it
    cannot hold that shape. Only the leading part of a stock envelope is ever read."""
    if stock.dim() != len(shape) or any(s < t for s, t in zip(stock.shape, shape)):
        return None
    return stock[tuple(slice(0, n) for n in shape)]
