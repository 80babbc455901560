"""Batch invariance, op by op: does row 0 of a batch-B run equal the batch-1 run?

Contract of this layer. Sessions may share one batched call only where every kernel of
that call gives a row the same bits whatever the other rows hold and however many
there are (issue 24: measured on the H200, a bf16 GEMM at one token is invariant up
to B=32 while SDPA at a decode step differs from B=2). Whether it holds is a property
of each kernel at each shape, so it is measured here, not assumed:

* ``RowRecorder`` (a ``TorchDispatchMode``) records every op's outputs of a batch-1
  run, in order, with the module it ran in (op_trace's module hooks);
* ``RowChecker`` runs the same code at width B, whose row 0 holds the batch-1 inputs
  and whose other rows hold anything else. For each op it finds the batch axis of the
  output (the one axis B times the batch-1 length, the others equal; batch-major, as
  PyTorch folds ``(B, H)`` into ``B * H``), compares the row-0 block with the batch-1
  output bit for bit, and *repairs* it (writes the batch-1 values in) when it differs
  (an output of the batch-1 shape, e.g. a mean over the batch, is repaired whole).
  So every op is judged on row-0 inputs equal to the batch-1 ones: the verdicts name
  each kernel that breaks invariance, not the first one and everything downstream.

An output with the batch-1 shape (a step counter, a weight-only op) must be equal as a
whole. Ops whose outputs have no batch axis, or whose sequence differs from the batch-1
run (a branch on the batch size), are reported, never guessed. Outputs past
``keep_bytes`` in total, any one over ``KEEP_TENSOR_BYTES`` and views of a weight are
compared by fingerprint and not repaired (``broken_unrepaired`` counts where that mattered).
Randomness is not invariant under batching (a batch draws a different stream): probe
greedy. A diagnostic run in eager mode, never on the serving path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


from ..engine.module_scope import module_paths
from ..engine.per_row import PerRow, weight_storages
from .op_trace import DATA_OUTPUTS, UNINITIALISED_OPS, OpTrace, fingerprint

# batch-1 outputs kept as clones for comparison and repair; past it, fingerprints only
DEFAULT_KEEP_BYTES = 4 << 30
# a larger output (a whole KV cache written in place) is fingerprinted: its rows come
# from ops that are kept (the projections), so a repair there already fixes it
KEEP_TENSOR_BYTES = 8 << 20


def _leaves(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _leaves(v)]
    if isinstance(out, (torch.Tensor, int, float, bool)):
        return [out]
    return []


def _outputs(func: Any, out: Any) -> list[Any]:
    """The data outputs (tensor leaves and host scalars) of an op's result, in order:
    an attention kernel's bookkeeping (philox seed and offset) is not data
    (op_trace.DATA_OUTPUTS)."""
    return _leaves(out)[: DATA_OUTPUTS.get(str(func.overloadpacket))]


def batch_axis(one: tuple, many: tuple, width: int) -> int | None:
    """The axis along which shape ``many`` holds ``width`` times shape ``one`` (the
    lowest, if several fit), -1 when the shapes are equal (no batch axis: compared
    whole), None when they do not align."""
    if len(one) != len(many):
        return None
    if one == many:
        return -1
    for d in range(len(one)):
        if many[d] == width * one[d] and all(many[k] == one[k] for k in range(len(one)) if k != d):
            return d
    return None


@dataclass
class _Recorded:
    op: str
    module: str
    outputs: list[Any]  # clones (tensors within the budget), fingerprints, or host values
    kept: list[bool]  # a clone (comparable and repairable), not only a fingerprint
    shapes: list[tuple]


class RowRecorder(OpTrace):
    """The batch-1 run: every op's outputs in order (module docstring)."""

    def __init__(self, model: Any, keep_bytes: int = DEFAULT_KEEP_BYTES) -> None:
        super().__init__(model, keep_bytes)
        self.recorded: list[_Recorded] = []
        # a view of a weight (``aten.t`` of a projection) is the same in both runs:
        # fingerprinted, not kept, so the budget goes to activations
        self._weights = weight_storages(model)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in UNINITIALISED_OPS:
            return out
        outputs, kept, shapes = [], [], []
        for t in _outputs(func, out):
            if not isinstance(t, torch.Tensor):
                outputs.append(t)
                kept.append(True)
                shapes.append(())
                continue
            shapes.append(tuple(t.shape))
            nbytes = t.numel() * t.element_size()
            keep = (
                nbytes <= KEEP_TENSOR_BYTES
                and self._kept + nbytes <= self.keep_bytes
                and t.untyped_storage().data_ptr() not in self._weights
            )
            self._kept += nbytes if keep else 0
            outputs.append(t.detach().clone() if keep else fingerprint(t))
            kept.append(keep)
        module = self._stack[-1] if self._stack else ""
        self.recorded.append(_Recorded(str(func), module, outputs, kept, shapes))
        return out


def op_key(op: str, module: str) -> str:
    return f"{op} in {module or '<top>'}"


@dataclass
class OpVerdict:
    index: int  # position in the run's op sequence
    op: str
    module: str
    shape: tuple  # the batch-1 output's shape
    axis: int | None  # the batch axis found (-1: none, compared whole)
    repaired: bool  # the row-0 block was overwritten with the batch-1 values


@dataclass
class RowProof:
    width: int
    ops: int = 0  # ops compared
    compared: dict[str, int] = field(default_factory=dict)  # "op in module" -> times
    broken: list[OpVerdict] = field(default_factory=list)  # row 0 differed
    unaligned: list[OpVerdict] = field(default_factory=list)  # no batch axis to compare
    diverged_at: int | None = None  # the op sequence left the batch-1 one here
    diverged: str = ""  # what was there instead

    @property
    def proven(self) -> bool:
        return not self.broken and not self.unaligned and self.diverged_at is None

    def by_op(self, verdicts: list[OpVerdict] | None = None) -> dict[str, int]:
        """Broken ops (or ``verdicts``) counted by (op, module) name: what to call per
        session."""
        counts: dict[str, int] = {}
        for v in self.broken if verdicts is None else verdicts:
            key = op_key(v.op, v.module)
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "proven": self.proven,
            "ops": self.ops,
            "broken": len(self.broken),
            # broken where only a fingerprint was kept: the ops after it ran on a row 0
            # that was not repaired, so their verdicts may be this one's consequence
            "broken_unrepaired": sum(not v.repaired for v in self.broken),
            "unaligned": len(self.unaligned),
            "diverged_at": self.diverged_at,
            "diverged": self.diverged,
            "broken_by_op": self.by_op(),
            "unaligned_by_op": self.by_op(self.unaligned),
        }


class RowChecker(OpTrace):
    """The batch-B run, judged op by op against a ``RowRecorder`` (module docstring)."""

    def __init__(self, model: Any, reference: RowRecorder, width: int) -> None:
        super().__init__(model, keep_bytes=0)
        self.reference = reference.recorded
        self.proof = RowProof(width)
        self._next = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if str(func.overloadpacket) in UNINITIALISED_OPS or self.proof.diverged_at is not None:
            return out
        index, self._next = self._next, self._next + 1
        module = self._stack[-1] if self._stack else ""
        if index >= len(self.reference) or self.reference[index].op != str(func):
            self.proof.diverged_at, self.proof.diverged = index, f"{func} in {module}"
            return out
        ref = self.reference[index]
        self.proof.ops += 1
        key = op_key(ref.op, ref.module)
        self.proof.compared[key] = self.proof.compared.get(key, 0) + 1
        for k, got in enumerate(_outputs(func, out)):
            if k < len(ref.outputs):
                self._judge(index, ref, k, got)
        return out

    def end(self) -> None:
        """The batched run is over: fewer ops than the batch-1 run is a divergence too."""
        if self.proof.diverged_at is None and self._next < len(self.reference):
            self.proof.diverged_at = self._next
            self.proof.diverged = "the batched run ended early"

    def _judge(self, index: int, ref: _Recorded, k: int, got: Any) -> None:
        want, kept, shape = ref.outputs[k], ref.kept[k], ref.shapes[k]
        if not isinstance(got, torch.Tensor):  # a host value: equal or broken
            if got != want:
                self.proof.broken.append(OpVerdict(index, ref.op, ref.module, (), None, False))
            return
        axis = batch_axis(shape, tuple(got.shape), self.proof.width)
        if axis is None:
            self.proof.unaligned.append(OpVerdict(index, ref.op, ref.module, shape, None, False))
            return
        block = got if axis == -1 else got.narrow(axis, 0, got.shape[axis] // self.proof.width)
        if kept:
            equal = block.dtype == want.dtype and torch.equal(block, want)
        else:
            equal = torch.equal(fingerprint(block), want)
        if equal:
            return
        repaired = kept  # a fingerprint holds no values to write back
        if repaired:
            block.copy_(want)
        self.proof.broken.append(OpVerdict(index, ref.op, ref.module, shape, axis, repaired))


def prove_rows(
    model: Any,
    run_one: Callable[[], Any],
    run_batched: Callable[[], Any],
    width: int,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
    per_row: set[str] | frozenset[str] = frozenset(),
) -> RowProof:
    """Run ``run_one()`` (batch 1) and ``run_batched()`` (width ``width``, row 0 holding
    the same inputs and state) under the recorder and the checker; the proof. The ops
    in ``per_row`` run one row at a time in the batched run (``PerRow``, beneath the
    checker, so each is judged as the one op it replaces)."""
    if width < 2:
        raise ValueError(f"width must be at least 2, got {width}")
    recorder = RowRecorder(model, keep_bytes)
    try:
        with recorder:
            run_one()
    finally:
        recorder.remove()
    checker = RowChecker(model, recorder, width)
    try:
        modules = module_paths(model)  # for per-row ops scoped to a module
        with PerRow(per_row, width, weight_storages(model), modules=modules), checker:
            run_batched()
    finally:
        checker.remove()
    checker.end()
    return checker.proof
