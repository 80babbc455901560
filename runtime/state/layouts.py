"""Moving a view between two layouts of one region: a lane's and a session's.

Contract of this layer. With session parameters (params.py) a region is allocated at
more than one shape: a session's own copy at its value's shape, a lane's at the
largest value the lane serves, the eager scratch at the largest of every lane's. Each
is one contiguous tensor, so an element of the region has one multi-index and, in
each allocation, its own storage offset. State attributes hold *views* of a region
(the carry narrowed to its live extent, say); when the state moves between a lane and
a session the same view is needed in the other allocation. ``moved_view`` gives it
for every view that keeps the region's strides (a narrow of the region along any
dims): storage offset -> multi-index (the source's strides) -> offset (the target's).
Any other view (a reshape, a transpose, an index that drops a dim) has no such
image when the shapes differ: ``None``, and the caller falls back to a storage at
the source's shape (sessions), counted. Nothing here copies or allocates.
"""

from __future__ import annotations

import math

import torch


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


def moved_view(t: torch.Tensor, layout: tuple[int, ...], dst: torch.Tensor) -> torch.Tensor | None:
    """``t`` views a contiguous allocation of shape ``layout``; the same elements'
    view of ``dst`` (a contiguous allocation of the same region), or None."""
    layout = tuple(layout)
    if tuple(dst.shape) == layout:  # the same layout: any view, as it is
        return dst.as_strided(t.shape, t.stride(), dst.storage_offset() + t.storage_offset())
    if t.dim() != len(layout):
        return None
    if t.numel() == 0:
        if any(n > d for n, d in zip(t.shape, dst.shape)):
            return None
        return dst.as_strided(t.shape, dst.stride(), dst.storage_offset())
    strides = contiguous_strides(layout)
    if any(n > 1 and s != w for n, s, w in zip(t.shape, t.stride(), strides)):
        return None
    index, rest = [], t.storage_offset()
    for w, d in zip(strides, layout):
        i = rest // w if w else 0
        index.append(i)
        rest -= i * w
    if rest or any(i + n > d for i, n, d in zip(index, t.shape, dst.shape)):
        return None
    offset = dst.storage_offset() + sum(i * s for i, s in zip(index, dst.stride()))
    return dst.as_strided(t.shape, dst.stride(), offset)


def copy_block(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy ``src`` into ``dst``'s leading block where both have room: the elements
    keep their multi-indices (a region grown to a larger shape keeps its contents)."""
    block = tuple(slice(0, min(a, b)) for a, b in zip(src.shape, dst.shape))
    with torch.no_grad():
        dst[block].copy_(src[block])
