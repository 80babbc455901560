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


class SharedState:
    """State that lives in shared objects — a vendor's streaming modules keep their
    caches in attributes of the modules themselves (Moshi) — swapped in place.

    ``roots()`` returns the objects that hold one stream's state (e.g. every module's
    streaming-state object). ``save(snapshot)`` copies the live state into a session's
    snapshot (cloned the first time) and ``load(snapshot)`` copies it back in place:
    tensors with ``copy_`` (graphs captured over them keep their addresses), plain
    scalars (a host step counter, a flag) by assignment. Leaves are found by one
    deterministic walk — dataclasses and plain objects by attribute name, dicts by
    key, lists and tuples in order; modules, callables and classes are not entered —
    and a snapshot is only loaded into a structure with the same leaves."""

    def __init__(self, roots: Callable[[], list]) -> None:
        self.roots = roots

    def save(self, snapshot: list | None) -> list:
        leaves = self._leaves()
        if snapshot is None:
            return [v.clone() if isinstance(v, torch.Tensor) else v for _, _, v in leaves]
        self._check(leaves, snapshot)
        for i, (_, _, v) in enumerate(leaves):
            if isinstance(v, torch.Tensor):
                snapshot[i].copy_(v)
            else:
                snapshot[i] = v
        return snapshot

    def load(self, snapshot: list) -> None:
        leaves = self._leaves()
        self._check(leaves, snapshot)
        for (owner, key, v), saved in zip(leaves, snapshot):
            if isinstance(v, torch.Tensor):
                v.copy_(saved)
            elif owner is not None:
                if isinstance(owner, (dict, list)):
                    owner[key] = saved
                else:
                    setattr(owner, key, saved)

    def nbytes(self, snapshot: list | None) -> int:
        if snapshot is None:
            return 0
        return sum(t.numel() * t.element_size() for t in snapshot if isinstance(t, torch.Tensor))

    @staticmethod
    def _check(leaves: list, snapshot: list) -> None:
        if len(leaves) != len(snapshot) or any(
            isinstance(v, torch.Tensor) != isinstance(s, torch.Tensor)
            or (isinstance(v, torch.Tensor) and v.shape != s.shape)
            for (_, _, v), s in zip(leaves, snapshot)
        ):
            raise RuntimeError(
                "shared state changed structure since the session's snapshot "
                f"({len(snapshot)} leaves saved, {len(leaves)} live): a stock call rebuilt "
                "its state objects; this model cannot be served as sessions"
            )

    def _leaves(self) -> list[tuple[Any, Any, Any]]:
        out: list[tuple[Any, Any, Any]] = []
        seen: set[int] = set()

        def walk(x: Any, owner: Any, key: Any) -> None:
            if isinstance(x, torch.Tensor):
                out.append((owner, key, x))
                return
            if x is None or type(x) in _SCALARS:
                if not isinstance(owner, tuple):
                    out.append((owner, key, x))
                return
            if id(x) in seen:
                return
            seen.add(id(x))
            if type(x) is dict:
                for k in sorted(x, key=repr):
                    walk(x[k], x, k)
            elif type(x) in (list, tuple):
                for i, v in enumerate(x):
                    walk(v, x, i)
            elif _enterable(x):
                for k in sorted(vars(x)):
                    walk(vars(x)[k], x, k)

        for root in self.roots():
            walk(root, None, None)
        return out


_SCALARS = (bool, int, float, str)


def _enterable(x: Any) -> bool:
    """Plain state objects: dataclasses and instances with attributes, not modules,
    callables (a vendor's graph wrapper, a callback) or classes."""
    return hasattr(x, "__dict__") and not isinstance(x, (torch.nn.Module, type)) and not callable(x)
