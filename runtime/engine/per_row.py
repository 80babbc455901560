"""PerRow: named ops run one row (or one block of rows) at a time inside a batched call.

Sessions share one batched call only where each kernel gives a row the bits it gives
that row alone (``runtime/tools/batch_rows.py`` proves it op by op). Where a kernel
does not (measured on the H200: RMSNorm's ``aten.mean.dim`` from width 2, fp32
convolutions and GEMMs from 2, bf16 GEMMs from 16), that op alone falls back: its
batched arguments are split into their per-session blocks, each block runs as the
batch-1 call (same shapes, same kernel, same bits) and the results are concatenated;
the rest of the call stays batched. An op may instead run on blocks of N sessions
(``rows {aten.mm.default by 8}``) where the proof found it invariant up to N: a bf16
GEMM then reads its weights W/N times a call, not W times. A batched binding
(``bind(batch=W)``) runs its callables' declared ``rows`` ops this way in eager calls,
warm-up and capture, so the captured graph holds the per-row kernels and replays them
with no Python.

On CUDA the blocks of one op may run on side streams (``streams``): each block's kernel
is the same call on the same shapes (the same bits), but the blocks no longer wait for
each other, so a captured graph holds them as parallel branches. A per-row kernel is
small (RMSNorm's mean of one row is one thread block), and W of them in a chain leave
the GPU idle between launches; as branches they overlap. The streams wait for the
current stream before the first block and it waits for them before the results are
joined, so nothing outside the op sees the fork.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .module_scope import ModuleScope, module_paths, named_modules

# side streams a batched binding on CUDA gives its per-row blocks (0: inline)
ROW_STREAMS = 16


class PerRow(TorchDispatchMode):
    """Runs the named ops (``str(func)``, as a proof names them: ``aten.mean.dim``) on
    blocks of sessions: ``ops`` maps each op to the sessions one call of it takes (1:
    one session at a time; a set of names means 1 for each). The op's batch axis is the
    first axis of its first tensor argument whose extent is a multiple of ``width``
    (sessions stack batch-major: ``(B, ...)``, ``B * T`` rows folded, or ``[1, B * T,
    D]`` as ``torch.cdist`` passes them); every tensor argument with that extent on that
    axis is split, each block's call is the batch-1 (or batch-N) call, and the results
    are concatenated on it. Weights (``weights``: their storages) are never split; an op
    with no batched argument runs whole. An op named with a scope (``aten.mm.default in
    gating``) runs so only inside a module whose path holds it (``modules``: id of
    each module -> its path, module_scope.py); elsewhere its unscoped entry, if any,
    decides."""

    def __init__(
        self,
        ops: Mapping[str, int] | set[str] | frozenset[str],
        width: int,
        weights: set[int] = frozenset(),
        streams: Sequence[torch.cuda.Stream] = (),
        modules: Mapping[int, str] | None = None,
    ) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"PerRow: width must be at least 1, got {width}")
        blocks = dict(ops) if isinstance(ops, Mapping) else dict.fromkeys(ops, 1)
        bad = {op: n for op, n in blocks.items() if n < 1 or width % n}
        if bad:
            raise ValueError(f"PerRow: blocks {bad} must be >= 1 and divide the width {width}")
        self.blocks, self.width, self.weights = blocks, width, weights
        # "op in scope" -> [(scope, block)] per op; the plain entries stay in blocks
        self.scoped: dict[str, list[tuple[str, int]]] = {}
        for name, n in list(blocks.items()):
            op, _, scope = name.partition(" in ")
            if scope:
                self.scoped.setdefault(op, []).append((scope, n))
                del blocks[name]
        if self.scoped and modules is None:
            raise ValueError(
                f"PerRow: ops scoped to modules ({sorted(self.scoped)}) need the model's "
                "module paths (modules=module_paths(model))"
            )
        self.scope = ModuleScope(modules) if self.scoped else None
        self._depth = 0  # nested entries (__enter__)
        self.streams = list(streams)  # side streams for the blocks of one op; [] inline
        self.calls = 0  # ops run in blocks

    @property
    def ops(self) -> frozenset[str]:
        scoped = {f"{op} in {scope}" for op, pairs in self.scoped.items() for scope, _ in pairs}
        return frozenset(self.blocks) | scoped

    def __enter__(self) -> "PerRow":
        # the mode re-enters itself to decompose a composite op: the scope is entered
        # once, by the outermost entry, and keeps tracking modules meanwhile
        self._depth += 1
        if self.scope is not None and self._depth == 1:
            self.scope.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._depth -= 1
        if self.scope is not None and self._depth == 0:
            self.scope.__exit__(*exc)

    def _block(self, op: str) -> int | None:
        """The sessions one call of ``op`` takes here: its scoped entry where the op runs
        inside that module, else its plain entry; None: the op runs whole."""
        for scope, n in self.scoped.get(op, ()):
            if self.scope.inside(scope):
                return n
        return self.blocks.get(op)

    def _axis(self, args: tuple) -> tuple[int, int] | None:
        """(axis, extent) the sessions stack on in this op's arguments, from its first
        tensor argument that is not a weight; None: nothing to split."""
        for a in args:
            if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() not in self.weights:
                for d, n in enumerate(a.shape):
                    if n > 0 and n % self.width == 0:
                        return d, n
                return None
        return None

    def _split(self, a: Any, axis: int, extent: int) -> bool:
        return (
            isinstance(a, torch.Tensor)
            and a.dim() > axis
            and a.shape[axis] == extent
            and a.untyped_storage().data_ptr() not in self.weights
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        block = self._block(str(func))
        if block is None and _composite(func):
            # under inference mode (how a binding calls its callables) a mode sees
            # composite ops whole (aten.linear, aten.conv1d, aten.cdist); their own
            # decomposition, the code that runs anyway, shows the kernels a proof names
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if block is None or block == self.width:
            return func(*args, **kwargs)
        found = self._axis(args)
        if found is None:
            return func(*args, **kwargs)
        axis, extent = found
        split = [self._split(a, axis, extent) for a in args]
        self.calls += 1
        n = extent // self.width * block  # elements of one block on the axis
        calls = [
            [a.narrow(axis, start, n) if s else a for a, s in zip(args, split)]
            for start in range(0, extent, n)
        ]
        parts = self._run_blocks(func, calls, kwargs, args)
        if not all(isinstance(t, torch.Tensor) for t in parts):
            raise TypeError(f"PerRow: {func} returns no tensor; it cannot run per row")
        return torch.cat(parts, dim=axis)

    def _run_blocks(self, func: Any, calls: list[list], kwargs: dict, args: tuple) -> list:
        """Each block's call, inline or round-robin on the side streams (module
        docstring): the streams join the current stream's work first, and it waits for
        them before anything reads the parts."""
        on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if not self.streams or not on_cuda or len(calls) == 1:
            return [func(*block_args, **kwargs) for block_args in calls]
        main = torch.cuda.current_stream()
        used = self.streams[: len(calls)]
        for s in used:
            s.wait_stream(main)
        parts = []
        for i, block_args in enumerate(calls):
            with torch.cuda.stream(used[i % len(used)]):
                parts.append(func(*block_args, **kwargs))
        for s in used:
            main.wait_stream(s)
        return parts


@dataclass
class RowSetup:
    """What a batched binding's per-row ops need from its model, found once at bind: the
    weights' storages (never split), CUDA side streams for the blocks (``ROW_STREAMS``)
    and the model's module paths (for row ops scoped to a module)."""

    weights: set[int] = field(default_factory=set)
    streams: list = field(default_factory=list)
    modules: dict[int, str] | None = None

    @classmethod
    def for_model(cls, model: Any, rows: Sequence[str], device: torch.device) -> "RowSetup":
        if not rows:
            return cls()
        streams = []
        if device.type == "cuda":  # the blocks of one op as parallel branches of the graph
            streams = [torch.cuda.Stream(device) for _ in range(ROW_STREAMS)]
        return cls(weight_storages(model), streams, module_paths(model))

    def mode(self, ops: Mapping[str, int], width: int) -> PerRow:
        return PerRow(ops, width, self.weights, self.streams, self.modules)


_COMPOSITE: dict[Any, bool] = {}


def _composite(func: Any) -> bool:
    """Whether ``func`` runs as its CompositeImplicitAutograd decomposition (no kernel of
    its own for a backend): then decomposing it changes nothing but what a mode sees."""
    known = _COMPOSITE.get(func)
    if known is None:
        has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(  # noqa: E731
            func.name(), getattr(torch._C.DispatchKey, key)
        )
        own = ("CompositeExplicitAutograd", "CPU", "CUDA", "Meta")
        known = _COMPOSITE[func] = has("CompositeImplicitAutograd") and not any(map(has, own))
    return known


def weight_storages(model: Any) -> set[int]:
    """The storages of ``model``'s parameters and buffers (a weight, a codebook, a
    rotary table: the same in every row, never split). ``model`` is a module or an
    object whose attributes hold modules."""
    tensors = [
        t
        for _, m in named_modules(model)
        for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    ]
    return {t.untyped_storage().data_ptr() for t in tensors}
