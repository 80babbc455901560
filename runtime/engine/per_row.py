"""PerRow: named ops run one row at a time inside a batched call.

Sessions share one batched call only where each kernel gives a row the bits it gives
that row alone (``runtime/tools/batch_rows.py`` proves it op by op). Where a kernel
does not (measured on the H200: RMSNorm's ``aten.mean.dim`` from width 2, fp32
convolutions and GEMMs from 2, bf16 GEMMs from 16), that op alone falls back: its
batched arguments are split into their per-session blocks, each block runs as the
batch-1 call (same shapes, same kernel, same bits) and the results are concatenated;
the rest of the call stays batched. A batched binding (``bind(batch=W)``) runs its
callables' declared ``rows`` ops this way in eager calls, warm-up and capture, so the
captured graph holds the per-row kernels and replays them with no Python.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class PerRow(TorchDispatchMode):
    """Runs the named ops (``str(func)``, as a proof names them: ``aten.mean.dim``) one
    row at a time: a tensor argument whose leading axis is ``width`` blocks long
    (batch-major: ``(B, ...)`` or ``B * T`` rows folded) is split into its ``width``
    blocks, each block's call is the batch-1 call, and the results are concatenated.
    Weights (``weights``: their storages) are never split; an op with no batched
    argument runs whole."""

    def __init__(
        self, ops: set[str] | frozenset[str], width: int, weights: set[int] = frozenset()
    ) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"PerRow: width must be at least 1, got {width}")
        self.ops, self.width, self.weights = frozenset(ops), width, weights
        self.calls = 0  # ops run per row

    def _batched(self, a: Any) -> bool:
        return (
            isinstance(a, torch.Tensor)
            and a.dim() > 0
            and a.shape[0] % self.width == 0
            and a.untyped_storage().data_ptr() not in self.weights
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if str(func) not in self.ops:
            return func(*args, **kwargs)
        batched = [self._batched(a) for a in args]
        if not any(batched):
            return func(*args, **kwargs)
        self.calls += 1
        rows = []
        for r in range(self.width):
            row_args = [
                a[r * (n := a.shape[0] // self.width) : (r + 1) * n] if b else a
                for a, b in zip(args, batched)
            ]
            rows.append(func(*row_args, **kwargs))
        if not all(isinstance(t, torch.Tensor) for t in rows):
            raise TypeError(f"PerRow: {func} returns no tensor; it cannot run per row")
        return torch.cat(rows)


def weight_storages(model: Any) -> set[int]:
    """The storages of ``model``'s parameters and buffers (a weight, a codebook, a
    rotary table: the same in every row, never split). ``model`` is a module or an
    object whose attributes hold modules."""
    roots = [model] if isinstance(model, torch.nn.Module) else []
    if not roots and hasattr(model, "__dict__"):
        roots = [v for v in vars(model).values() if isinstance(v, torch.nn.Module)]
    tensors = [t for root in roots for t in (*root.parameters(), *root.buffers())]
    return {t.untyped_storage().data_ptr() for t in tensors}
