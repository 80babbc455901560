"""Tensor leaves of plain Python containers, mapped.

Contract of this layer: ``map_tensors(x, fn)`` returns ``x`` with every tensor leaf of
its dicts, lists and tuples replaced by ``fn(leaf)``. By default dicts and lists are
updated in place (stock code may hold them: a vendor's ``stream_cache`` dict is the
session's state) and tuples rebuilt only when a leaf changed; ``copy=True`` builds new
containers throughout and leaves ``x`` untouched (a kept snapshot must never share a
container with live state, which stock code and the binder mutate). Other objects are
leaves that are left alone. Used to move state between lanes and sessions.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def map_tensors(x: Any, fn: Callable[[torch.Tensor], torch.Tensor], copy: bool = False) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if copy:
        if type(x) is dict:
            return {k: map_tensors(v, fn, True) for k, v in x.items()}
        if type(x) in (list, tuple):
            return type(x)(map_tensors(v, fn, True) for v in x)
        return x
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
