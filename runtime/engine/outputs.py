"""Handing replay outputs back to the caller.

Contract of this layer (the output rule): a graph's outputs are *static* tensors —
every replay of that class writes the same addresses. So a replay returns
  * an output whose storage is a declared region or write-through buffer
    **as-is**: it IS the contract-owned state, which by contract is overwritten in
    place by later calls (exactly as eager code overwrites its cache);
  * every other tensor output as a **copy with the eager layout** (fresh memory,
    the same shape, strides and storage offset as the output the captured code
    produced), so a later replay cannot silently overwrite what the caller still
    holds, and a caller that feeds the output back (a conv cache returned as a
    strided view of a wider buffer) passes the layout stock code would: a plain
    ``clone()`` would make a view contiguous, and then every later call's
    signature, and the kernels downstream eager code picks, would differ from
    stock's;
  * non-tensor outputs as captured (the signature keys every scalar input, so a
    scalar output of a class cannot legitimately differ between calls).
Cloning is also what makes ONE pool shared by many graphs safe in any replay
order: a graph captured later may place its outputs in blocks an earlier graph
uses for intermediates, so no pool-backed output may outlive the call that
produced it. Outputs may be nested tuples, lists and dicts. Which leaves are kept is decided
once per class at capture (outputs never move), so a replay only walks the tree.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch


def tree_leaves(x: Any) -> list[Any]:
    out: list[Any] = []

    def walk(y: Any) -> None:
        if type(y) in (tuple, list):
            for i in y:
                walk(i)
        elif type(y) is dict:
            for v in y.values():
                walk(v)
        else:
            out.append(y)

    walk(x)
    return out


def tree_map(f: Callable[[Any], Any], x: Any) -> Any:
    if type(x) in (tuple, list):
        return type(x)(tree_map(f, i) for i in x)
    if type(x) is dict:
        return {k: tree_map(f, v) for k, v in x.items()}
    return f(x)


def copy_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in fresh memory with ``t``'s shape, strides and storage offset.

    The new storage holds ``offset + span`` elements (the part of the storage the view
    can reach), so the pointer's alignment class (signature.py) is ``t``'s as well. The
    reachable range is copied as it lies in storage (which also serves overlapping
    views, e.g. an expanded output); the elements before the offset are zero."""
    offset = t.storage_offset()
    if offset == 0 and t.is_contiguous():
        return t.clone(memory_format=torch.contiguous_format)
    span = 0 if t.numel() == 0 else 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    base = torch.empty(offset + span, dtype=t.dtype, device=t.device)
    base[:offset].zero_()
    base[offset:].copy_(t.as_strided((span,), (1,), offset))
    return base.as_strided(t.shape, t.stride(), offset)


class OutputPlan:
    def __init__(self, outputs: Any, kept_storages: Iterable[int]) -> None:
        keep = set(kept_storages)
        self.outputs = outputs
        self.keep = [
            isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in keep
            for t in tree_leaves(outputs)
        ]

    def hand_back(self) -> Any:
        flags = iter(self.keep)

        def give(t: Any) -> Any:
            keep = next(flags)
            if isinstance(t, torch.Tensor) and not keep:
                return copy_layout(t)
            return t

        return tree_map(give, self.outputs)
