"""Bitwise comparison for audits.

Contract of this layer: decide whether two tensors are *the same bytes* (shape,
dtype and every element's bit pattern) and, if not, locate the first differing
element in row-major order. Floats are compared through an integer view of their
bits, so NaNs copied unchanged compare equal and -0.0 differs from 0.0: the
project's exactness is bit-for-bit, not numeric. Only the audit path calls this
(it reads tensor data and may sync); the replay hot path never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t = t.contiguous()
        if t.dtype.is_complex:
            t = torch.view_as_real(t)
        return t.view(_BITS[t.element_size()])
    return t


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(_as_bits(a), _as_bits(b))


def first_difference(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first differing element, ``None`` if bitwise equal.

    With different shapes the answer is the first index outside the common box,
    or (when one is a prefix box of the other) the first index past it.
    """
    if a.dtype != b.dtype:
        raise TypeError(f"cannot compare {a.dtype} with {b.dtype}")
    if a.shape != b.shape:
        if a.dim() != b.dim():
            return ()
        common = [min(x, y) for x, y in zip(a.shape, b.shape)]
        sl = tuple(slice(0, c) for c in common)
        inner = first_difference(a[sl], b[sl])
        if inner is not None:
            return inner
        # First axis where the extents differ: its first out-of-box index.
        ax = next(i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y)
        return tuple(0 if i != ax else common[ax] for i in range(a.dim()))
    ne = _as_bits(a) != _as_bits(b)
    if not bool(ne.any()):
        return None
    idx = ne.reshape(-1).nonzero()[0].item()
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), a.shape))


@dataclass(frozen=True)
class AuditRecord:
    """One divergence between the writeback and the stock concatenation."""

    region: str
    call: int  # 1-based count of retains on this region
    index: tuple[int, ...] | None  # first differing element (full-tensor index)
    expected_shape: tuple[int, ...]
    actual_shape: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"audit: region {self.region} diverged from the stock retention on call "
            f"{self.call} at index {self.index} (stock shape {self.expected_shape}, "
            f"writeback shape {self.actual_shape})"
        )


def difference_box(a: torch.Tensor, b: torch.Tensor) -> tuple[int, tuple[tuple[int, int], ...]]:
    """For two tensors of one shape and dtype: how many elements differ bitwise, and
    per dim the first and last index at which any does (the box holding every
    difference). Reads tensor data; audit and verification paths only."""
    ne = _as_bits(a) != _as_bits(b)
    count = int(ne.sum())
    if count == 0:
        return 0, ()
    box = []
    for d in range(ne.dim()):
        others = [i for i in range(ne.dim()) if i != d]
        hit = (ne.any(dim=others) if others else ne).nonzero().flatten()
        box.append((int(hit[0]), int(hit[-1])))
    return count, tuple(box)


def named_leaves(x: Any, path: str) -> dict[str, Any]:
    """Leaves of tuples, lists and dicts by the path a user would write."""
    out: dict[str, Any] = {}

    def walk(y: Any, p: str) -> None:
        if type(y) in (tuple, list):
            for i, v in enumerate(y):
                walk(v, f"{p}[{i}]")
        elif type(y) is dict:
            for k, v in y.items():
                walk(v, f"{p}[{k!r}]")
        else:
            out[p] = y

    walk(x, path)
    return out


def first_tree_difference(
    a: Any, b: Any, path: str = "output"
) -> tuple[str, tuple[int, ...] | None] | None:
    """Where two output trees (nested tuples, lists and dicts of tensors and plain
    values) first differ: the leaf's path (``named_leaves``) and, for two tensors of one
    dtype and shape, its first differing element (None: a shape, dtype, type or
    structure difference, or plain values); ``None`` when they are the same bytes."""
    leaves_a, leaves_b = named_leaves(a, path), named_leaves(b, path)
    if list(leaves_a) != list(leaves_b):
        return path, None
    for p, x in leaves_a.items():
        y = leaves_b[p]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if bitwise_equal(x, y):
                continue
            if x.dtype != y.dtype or x.shape != y.shape:
                return p, None
            return p, first_difference(x.detach().cpu(), y.detach().cpu())
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or type(x) is not type(y):
            return p, None
        try:
            equal = bool(x == y)
        except Exception:  # noqa: BLE001 - a value without a usable ==: the same object only
            equal = x is y
        if not equal:
            return p, None
    return None
