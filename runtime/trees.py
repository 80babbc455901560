"""Tensor leaves of plain Python containers, mapped in place.

Contract of this layer: ``map_tensors(x, fn)`` returns ``x`` with every tensor leaf of
its dicts, lists and tuples replaced by ``fn(leaf)``. Dicts and lists are updated in
place (stock code may hold them: a vendor's ``stream_cache`` dict is the session's
state), tuples are rebuilt only when a leaf changed. Other objects are leaves that
are left alone. Used to move state between lanes and sessions (lane.py, sessions.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def map_tensors(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if type(x) is dict:
        for k, v in list(x.items()):
            new = map_tensors(v, fn)
            if new is not v:
                x[k] = new
        return x
    if type(x) is list:
        for i, v in enumerate(x):
            new = map_tensors(v, fn)
            if new is not v:
                x[i] = new
        return x
    if type(x) is tuple:
        items = tuple(map_tensors(v, fn) for v in x)
        return x if all(a is b for a, b in zip(items, x)) else items
    return x
