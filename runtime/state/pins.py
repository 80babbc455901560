"""Pinned regions: stock attributes the stock code rebinds on every call.

Some stock state is not updated in place but replaced (``state.offsets =
torch.where(...)`` in Moshi's LMGen, the conv ``first`` flag). A graph captured
over such code reads the tensor that was at the attribute during capture and
writes the new value somewhere in its pool, so the next replay would read a stale
value. A pinned region fixes one tensor at the site: after every call of a
callable that writes it, ``pin_at`` copies the new value into the pinned tensor and
puts the pinned tensor back. Inside a capture the copy is recorded into the graph,
so every replay updates the pinned tensor in place, at one address.
"""

from __future__ import annotations

from typing import Any

import torch

from .regions import Region
from .sites import get_at, set_at


def pin_at(model: Any, steps: tuple, region: Region) -> None:
    now = get_at(model, steps)
    if now is region.tensor:
        return
    if not isinstance(now, torch.Tensor) or now.shape != region.tensor.shape:
        raise TypeError(
            f"pinned region {region.spec.name}: the stock code put "
            f"{type(now).__name__}{tuple(getattr(now, 'shape', ()))} at its site, "
            f"expected a tensor of shape {tuple(region.tensor.shape)}"
        )
    region.tensor.copy_(now)
    set_at(model, steps, region.tensor)
