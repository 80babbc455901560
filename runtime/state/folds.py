"""Weights folded once at bind (the contract's `fold` statement).

Contract of this layer. A `fold NAME { site PATH  by weight_norm }` says: every module
under the site whose forward recomputes its weight from fixed parameters (weight
normalisation, ``w = g * v / ||v||``) gets that weight computed once, here, and kept
as the module's plain ``Parameter``. The stock recomputation is a constant on the call
clock: it runs every forward (inside every captured graph) and keeps a second copy of
every weight alive. Folding computes each weight with the very function the stock's
forward calls (the old hook's ``compute_weight``, the parametrization's forward), on
the same inputs and device, so the weight has the same bits and every output stays
bit-identical to the stock.

Two styles of weight norm are recognised:
  * old: ``torch.nn.utils.weight_norm`` - a ``WeightNorm`` forward pre-hook and
    parameters ``<name>_g``, ``<name>_v`` (the hook sets ``<name>`` every forward);
  * new: ``torch.nn.utils.parametrizations.weight_norm`` - ``parametrizations.<name>``
    holding one ``_WeightNorm`` (``original0`` = g, ``original1`` = v).

The originals (the g and v ``Parameter`` objects themselves) move to the host, which
frees their device memory; ``restore()`` (``Binding.unbind``) moves them back and puts
the hook or parametrization back where it was, with the same parameter, submodule and
hook order. `plan_folds` resolves and checks every site before anything changes: a
site without a weight-normed module, or with a weight-norm mixed with other
parametrizations, is a ``FoldError`` (fail closed). Model-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import _WeightNorm
from torch.nn.utils.weight_norm import WeightNorm

from .sites import format_path, get_at

HOST = torch.device("cpu")


class FoldError(ValueError):
    """A fold's site holds nothing it can fold (raised at bind, before any change)."""


def _old_style_hooks(module: torch.nn.Module) -> list[tuple[int, WeightNorm]]:
    return [(k, h) for k, h in module._forward_pre_hooks.items() if isinstance(h, WeightNorm)]


def _new_style_names(module: torch.nn.Module, where: str) -> list[str]:
    """The tensors of ``module`` weight-normed by a parametrization; FoldError when a
    weight norm shares the module with another parametrization (not folded: its value
    would depend on more than g and v)."""
    if not parametrize.is_parametrized(module):
        return []
    lists = dict(module.parametrizations.items())
    normed = [n for n, p in lists.items() if len(p) == 1 and isinstance(p[0], _WeightNorm)]
    if normed and len(normed) != len(lists):
        others = sorted(set(lists) - set(normed))
        raise FoldError(
            f"{where}: a weight norm shares the module with other parametrizations "
            f"({', '.join(others)}); only modules whose parametrizations are all weight "
            "norms are folded"
        )
    return normed


def _device_bytes(t: torch.Tensor) -> int:
    return t.nbytes if t.device.type != HOST.type else 0


def _host(p: torch.nn.Parameter) -> torch.device:
    """Move ``p``'s data to the host (the Parameter object stays); its old device."""
    device = p.device
    p.data = p.data.to(HOST)
    return device


def _reorder(d: dict, order: list) -> None:
    """Put ``d``'s keys back in ``order`` (keys not in it last), in place."""
    items = dict(d)
    d.clear()
    for k in order:
        if k in items:
            d[k] = items.pop(k)
    d.update(items)


@dataclass
class _FoldedModule:
    """What one module looked like before its weights were folded, to put it back."""

    module: torch.nn.Module
    param_order: list[str]
    module_order: list[str]
    hook_order: list[int]
    names: list[str] = field(default_factory=list)  # the folded tensors
    originals: list[tuple[torch.nn.Parameter, torch.device]] = field(default_factory=list)
    hooks: list[tuple[int, WeightNorm]] = field(default_factory=list)  # old style
    hook_params: dict[str, torch.nn.Parameter] = field(default_factory=dict)  # old style
    cls: type | None = None  # new style: the parametrized class
    parametrizations: Any = None  # new style: the ModuleDict
    # device bytes: what the stock kept there that the fold dropped (the originals, and
    # the weight the old hook keeps as an attribute), and the folded weights it added
    dropped: int = 0
    added: int = 0

    def restore(self) -> None:
        m = self.module
        for p, device in self.originals:
            p.data = p.data.to(device)
        for name in self.names:
            del m._parameters[name]
        if self.parametrizations is not None:
            m.__class__ = self.cls  # type: ignore[assignment]
            m._modules["parametrizations"] = self.parametrizations
        for name, p in self.hook_params.items():
            m.register_parameter(name, p)
        for key, hook in self.hooks:
            m._forward_pre_hooks[key] = hook
            with torch.no_grad():  # as weight_norm() left it; every forward resets it
                setattr(m, hook.name, hook.compute_weight(m))
        _reorder(m._parameters, self.param_order)
        _reorder(m._modules, self.module_order)
        _reorder(m._forward_pre_hooks, self.hook_order)


def _fold_module(m: torch.nn.Module, normed: list[str]) -> _FoldedModule:
    record = _FoldedModule(m, list(m._parameters), list(m._modules), list(m._forward_pre_hooks))
    weights: dict[str, torch.Tensor] = {}
    requires_grad: dict[str, bool] = {}
    with torch.no_grad():  # the same kernel on the same inputs: grad mode changes no bits
        for key, hook in _old_style_hooks(m):
            weights[hook.name] = hook.compute_weight(m)  # what the hook runs every forward
            g, v = m._parameters[f"{hook.name}_g"], m._parameters[f"{hook.name}_v"]
            requires_grad[hook.name] = g.requires_grad or v.requires_grad
            record.hooks.append((key, hook))
        for name in normed:
            weights[name] = getattr(m, name)  # through the parametrization, as forward does
            requires_grad[name] = m.parametrizations[name].original0.requires_grad
    for key, hook in record.hooks:
        del m._forward_pre_hooks[key]
        for name in (f"{hook.name}_g", f"{hook.name}_v"):
            record.hook_params[name] = m._parameters.pop(name)
        record.dropped += _device_bytes(getattr(m, hook.name))
        delattr(m, hook.name)  # the plain tensor the hook set
    if normed:
        record.cls, record.parametrizations = type(m), m._modules.pop("parametrizations")
        m.__class__ = record.cls.__bases__[0]  # as remove_parametrizations() does
    originals = list(record.hook_params.values())
    originals += [p for name in normed for p in record.parametrizations[name].parameters()]
    record.dropped += sum(_device_bytes(p) for p in originals)
    record.originals = [(p, _host(p)) for p in originals]
    for name, w in weights.items():
        m.register_parameter(name, torch.nn.Parameter(w, requires_grad=requires_grad[name]))
        record.added += _device_bytes(w)
        record.names.append(name)
    return record


@dataclass
class FoldedSite:
    """One fold applied: its modules' undo records and what it freed."""

    name: str
    site: str
    modules: list[_FoldedModule]
    # net: the originals (and old-style cached weights) dropped from the device, less
    # the folded weights installed there; 0 on the host. A new-style weight norm keeps
    # no weight between calls, so its net is about g alone: its gain is the kernels
    # (and, inside a captured graph, the pool memory) of the per-call recomputation.
    device_bytes_freed: int
    host_bytes_kept: int

    def stats(self) -> dict:
        return {
            "modules": len(self.modules),
            "device_bytes_freed": self.device_bytes_freed,
            "host_bytes_kept": self.host_bytes_kept,
        }

    def report_line(self) -> str:
        mib = self.device_bytes_freed / 2**20
        return (
            f"  fold {self.name}: weight norm folded in {len(self.modules)} modules under "
            f"{self.site}, {mib:.1f} MiB freed on the device"
        )

    def restore(self) -> None:
        for record in reversed(self.modules):
            record.restore()


@dataclass
class FoldPlan:
    """The modules each fold will change, found (and checked) before any change."""

    folds: list[tuple[Any, str, list[tuple[torch.nn.Module, list[str]]]]]


def plan_folds(model: Any, folds: Any) -> FoldPlan:
    """Resolve every fold's site and find its weight-normed modules; FoldError when a
    site is not a module or holds none (nothing is changed either way)."""
    planned = []
    seen: dict[int, str] = {}  # module -> the fold that takes it
    for f in folds:
        where = f"fold {f.name} at {format_path(f.site)}"
        root = get_at(model, f.site)
        if not isinstance(root, torch.nn.Module):
            raise FoldError(f"{where}: the site is a {type(root).__name__}, not a torch module")
        found = []
        for path, m in root.named_modules():
            normed = _new_style_names(m, f"{where}, module {path or '(the site)'}")
            if normed or _old_style_hooks(m):
                if id(m) in seen:
                    raise FoldError(f"{where}: module {path} is folded by {seen[id(m)]} too")
                seen[id(m)] = f"fold {f.name}"
                found.append((m, normed))
        if not found:
            raise FoldError(
                f"{where}: no module under the site is weight-normed (neither a "
                "torch.nn.utils.weight_norm hook nor a parametrizations.weight_norm): "
                "nothing to fold"
            )
        planned.append((f, format_path(f.site), found))
    return FoldPlan(planned)


def apply_folds(plan: FoldPlan) -> list[FoldedSite]:
    """Fold every planned module (see the module docstring)."""
    out = []
    for f, site, found in plan.folds:
        records = [_fold_module(m, normed) for m, normed in found]
        out.append(
            FoldedSite(
                f.name,
                site,
                records,
                device_bytes_freed=sum(r.dropped - r.added for r in records),
                host_bytes_kept=sum(p.nbytes for r in records for p, _ in r.originals),
            )
        )
    return out
