"""ModuleScope: which of a model's modules the current op runs in.

A proof names a kernel that breaks batch invariance together with its module
(``aten.mm.default in lm_gen.lm_model.transformer.layers.0.gating``): at widths 16 and 32
only the gating GEMM of each Moshi LM layer differed, the other three GEMMs of the layer
and the depformer's gave every row its batch-1 bits. A per-row op scoped to a module
(``rows {aten.mm.default in gating by 8}``) runs per block only there, so the rest stays
batched. ``PerRow`` asks this class whether an op runs inside a module whose path holds
the scope as whole components (``gating`` matches ``layers.0.gating`` and
``layers.0.gating.linear_in``, not ``subgating``; ``transformer.layers.*.gating`` the
temporal transformer's gating and not the depformer's).

While entered it holds PyTorch's global module hooks and tracks, for the thread that
entered it only, the named modules being called (``names``: id of a module -> its path,
``module_paths``); other threads' modules and unnamed ones are not tracked. Python runs
these hooks in eager calls, warm-up and capture; a replayed graph holds the kernels they
chose and runs no Python.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any, Mapping

import torch
from torch.nn.modules import module as nn_module


class ModuleScope:
    def __init__(self, names: Mapping[int, str]) -> None:
        self.names = names
        self._stack: list[str] = []
        self._thread: int | None = None
        self._handles: list[Any] = []

    def __enter__(self) -> "ModuleScope":
        self._thread, self._stack = threading.get_ident(), []
        self._handles = [
            nn_module.register_module_forward_pre_hook(self._enter_module),
            nn_module.register_module_forward_hook(self._leave_module, always_call=True),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._stack, self._thread = [], [], None

    def _enter_module(self, module: torch.nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is not None and threading.get_ident() == self._thread:
            self._stack.append(name)

    def _leave_module(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        name = self.names.get(id(module))
        if name is not None and threading.get_ident() == self._thread and self._stack:
            self._stack.pop()

    def inside(self, scope: str) -> bool:
        """Whether the current op runs inside a module whose path holds ``scope`` as
        whole components (``gating`` is in ``layers.0.gating.linear_in``; ``*`` is any one
        component: ``transformer.layers.*.gating``)."""
        pattern = _pattern(scope)
        return any(pattern.search(p) for p in self._stack)


@functools.lru_cache(maxsize=256)
def _pattern(scope: str) -> re.Pattern:
    parts = ["[^.]+" if c == "*" else re.escape(c) for c in scope.split(".")]
    return re.compile(r"(^|\.)" + r"\.".join(parts) + r"(\.|$)")


def named_modules(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """Every module of ``model`` (a module, or an object whose attributes hold modules)
    with its dotted path, each module once (the root module's path is "")."""
    roots: list[tuple[str, torch.nn.Module]] = []
    if isinstance(model, torch.nn.Module):
        roots.append(("", model))
    else:
        for name, value in sorted(vars(model).items()) if hasattr(model, "__dict__") else ():
            if isinstance(value, torch.nn.Module):
                roots.append((name, value))
    seen: set[int] = set()
    out = []
    for prefix, root in roots:
        for name, m in root.named_modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            out.append((".".join(p for p in (prefix, name) if p), m))
    return out


def module_paths(model: Any) -> dict[int, str]:
    """id of each module of ``model`` -> its path
    (``lm_gen.lm_model.transformer.layers.0.gating``)."""
    return {id(m): path for path, m in named_modules(model)}
