"""Handing replay outputs back to the caller.

Contract of this layer (the output rule): a graph's outputs are *static* tensors —
every replay of that class writes the same addresses. So a replay returns
  * an output whose storage is a declared region or write-through buffer
    **as-is**: it IS the contract-owned state, which by contract is overwritten in
    place by later calls (exactly as eager code overwrites its cache);
  * every other tensor output as a **clone** (fresh memory, same strides for
    dense tensors), so a later replay cannot silently overwrite what the caller
    still holds;
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
                return t.clone()
            return t

        return tree_map(give, self.outputs)
