"""The objects of a model's tree, and the host scalars they hold.

Contract of this layer. ``walk(model)`` visits what ``sites.py`` paths can reach from a
model object (a module's parameters, buffers and submodules, a plain object's
attributes, dict entries by string key, list and tuple items), each object once, to a
fixed depth: the objects by id with their paths and the tensors with theirs (the draft
records a stock run with it, ``tools/trace_draft.py``). ``HostScalars`` saves the
scalars (ints, floats, bools, strings, None) held as attributes or string-keyed dict
entries of those objects and puts back the ones that changed: what capture uses to be
transparent to host state the contract does not declare (an offset the body advances, a
"first call" flag), since the probe, warm-up and capture calls run the body three times
(``serving/capture_section.py``). Tensors are never put back: a graph may read them.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator

import torch

from .sites import Step

MAX_DEPTH = 12
_RUNTIME = __name__.split(".")[0] + "."  # "duplexcadence."
_SCALARS = (int, float, bool, str, type(None))
_MISSING = object()


def children(obj: Any) -> Iterator[tuple[Step, Any]]:
    """(step, child) of one object of the tree."""
    if isinstance(obj, torch.nn.Module):
        for table in ("_parameters", "_buffers", "_modules"):
            for k, v in obj.__dict__.get(table, {}).items():
                if v is not None:
                    yield ("attr", k), v
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                yield ("key", k), v
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield ("index", i), v
        return
    for k, v in (getattr(obj, "__dict__", None) or {}).items():
        if (
            isinstance(k, str)
            and not k.startswith("__")
            and k not in ("_parameters", "_buffers", "_modules")
        ):
            yield ("attr", k), v


def _leaf(obj: Any) -> bool:
    """Nothing of the tree below it: scalars, routines, modules, classes, and the
    runtime's own objects (a bound model holds its Dispatchers, and through them the
    binding: its engines' state is not the model's)."""
    return (
        isinstance(obj, (str, bytes, int, float, bool, type(None)))
        or inspect.isroutine(obj)
        or inspect.ismodule(obj)
        or inspect.isclass(obj)
        or type(obj).__module__.startswith(_RUNTIME)
    )


def walk(
    model: Any, ints: dict[tuple[Step, ...], int] | None = None
) -> tuple[dict[int, tuple[Step, ...]], list[tuple[tuple[Step, ...], torch.Tensor]]]:
    """(objects of the tree by id -> path, tensors of the tree with their paths); the
    host ints held as attributes (not bools) go into ``ints`` by path when given."""
    objects: dict[int, tuple[Step, ...]] = {}
    tensors: list[tuple[tuple[Step, ...], torch.Tensor]] = []
    stack: list[tuple[tuple[Step, ...], Any]] = [((), model)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if not isinstance(obj, torch.nn.Parameter):
                tensors.append((path, obj))
            continue
        if (
            ints is not None
            and type(obj) is int
            and path
            and path[-1][0] == "attr"
            and path not in ints
        ):
            ints[path] = obj
            continue
        if id(obj) in objects or len(path) > MAX_DEPTH or _leaf(obj):
            continue
        objects[id(obj)] = path
        stack.extend((path + (step,), child) for step, child in children(obj))
    return objects, tensors


class HostScalars:
    """The scalar attributes and string-keyed dict entries of a model's objects, saved;
    ``restore`` puts back each one that changed since (module docstring)."""

    def __init__(self, model: Any) -> None:
        self.saved: list[tuple[Any, str, str, Any]] = []  # (owner, "attr"|"key", name, value)
        seen: set[int] = set()
        stack: list[tuple[int, Any]] = [(0, model)]
        while stack:
            depth, obj = stack.pop()
            if id(obj) in seen or depth > MAX_DEPTH or _leaf(obj) or isinstance(obj, torch.Tensor):
                continue
            seen.add(id(obj))
            for (kind, name), child in children(obj):
                if isinstance(child, _SCALARS) and kind in ("attr", "key"):
                    self.saved.append((obj, kind, name, child))
                else:
                    stack.append((depth + 1, child))

    def restore(self) -> int:
        """Put back what changed; the number of scalars put back."""
        put_back = 0
        for owner, kind, name, value in self.saved:
            table = owner if kind == "key" else getattr(owner, "__dict__", {})
            now = table.get(name, _MISSING)
            if now is value or (type(now) is type(value) and now == value):
                continue
            if kind == "key":
                owner[name] = value
            else:
                setattr(owner, name, value)
            put_back += 1
        return put_back
