"""prove_lockstep: the proof a batched binding admits before it captures (issue 24).

Contract of this layer. Sessions share a batched call exactly only where every kernel
gives a row its batch-1 bits. A contract's ``rows`` say which kernels run per session
instead; this proves, callable by callable, that with those rows every op of the
batched call gives row 0 the bits of the batch-1 call (``tools/batch_rows.py``: op by
op, each judged on repaired inputs, so a verdict names the kernel that broke, with its
module). The host gives the two runs, since only it knows how its model streams at batch
1 and at width W (Moshi: ``streaming(1)`` and ``streaming(W)``, row 0 the batch-1
stream's input, the other rows other sessions'):

    proof = prove_lockstep(model, DECLARED, width, run_one, run_batched)
    binding = adapter.bind(model, batch=width, proof=proof)

During ``run_one`` each batched callable's site records its ops (batch 1); during
``run_batched`` each call runs the contract's rows at ``width`` (``PerRow``, beneath the
checker, as a batched binding runs them) and is judged against the recording of the same
callable. ``bind(proof=...)`` refuses a proof of another width, of other rows, or one
that does not prove every batched callable (``LockstepNotProven``, naming the broken ops
and their modules), before anything is installed; ``binding.report()`` shows the proof.
Eager and diagnostic, never on the serving path: call it once, before binding.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..engine.module_scope import module_paths, named_modules
from ..engine.per_row import PerRow, weight_storages
from ..state.sites import get_at, set_at
from ..serving.lockstep_proof import CallableProof, LockstepProof
from .batch_rows import DEFAULT_KEEP_BYTES, RowChecker, RowRecorder


def prove_lockstep(
    model: Any,
    decl: Any,
    width: int,
    run_one: Callable[[], Any],
    run_batched: Callable[[], Any],
    *,
    keep_bytes: int = DEFAULT_KEEP_BYTES,
    inputs: str = "",
    warmup: bool = True,
) -> LockstepProof:
    """The proof of ``decl``'s batched callables at ``width`` (module docstring):
    ``run_one()`` streams batch 1, ``run_batched()`` width ``width`` with row 0 the same
    inputs and state. Both call the callables at their sites on ``model`` (unbound), each
    from the same starting state every time it runs (a fresh stream). ``warmup``: run
    ``run_one()`` once first, untraced, so what a model builds on first use (Mimi's
    codebook, computed and cached by its first encode) is not an op of one run only."""
    if type(width) is not int or width < 2:
        raise ValueError(f"prove_lockstep: width must be an int >= 2, got {width!r}")
    at = decl.at_width(width)  # ValueError for a width the contract does not declare
    batched = [k for k in at.callables if k.batch is not None]
    if not batched:
        raise ValueError(f"prove_lockstep: {decl.name} declares no batched callable")
    stock = {k.name: get_at(model, k.site) for k in batched}
    recorders = {k.name: RowRecorder(model, keep_bytes) for k in batched}
    weights, modules = weight_storages(model), module_paths(model)

    def recording(name: str) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            with recorders[name]:
                return stock[name](*args, **kwargs)

        return call

    checkers: dict[str, RowChecker] = {}

    def checking(k: Any) -> Callable:
        rows = k.batch.row_ops()

        def call(*args: Any, **kwargs: Any) -> Any:
            # the checker above PerRow: it judges each op as the model calls it, and
            # PerRow beneath runs the contract's rows as a batched binding does
            with PerRow(rows, width, weights, modules=modules), checkers[k.name]:
                return stock[k.name](*args, **kwargs)

        return call

    try:
        if warmup:
            _with_sites(model, batched, stock, run_one)
        _with_sites(model, batched, {k.name: recording(k.name) for k in batched}, run_one)
        for k in batched:
            checkers[k.name] = RowChecker(model, recorders[k.name], width)
        _with_sites(model, batched, {k.name: checking(k) for k in batched}, run_batched)
    finally:
        for hooks in (*recorders.values(), *checkers.values()):
            hooks.remove()
    return LockstepProof(
        width,
        _device_name(model),
        {k.name: _verdict(k, checkers[k.name]) for k in batched},
        inputs,
    )


def _with_sites(model: Any, callables: list, wrappers: dict, run: Callable[[], Any]) -> None:
    """``run()`` with each callable's site replaced by its wrapper, restored after."""
    saved = {k.name: get_at(model, k.site) for k in callables}
    try:
        for k in callables:
            set_at(model, k.site, wrappers[k.name])
        # no_grad, not inference mode: composite ops (aten.linear) decompose before the
        # recorder and checker see them, so verdicts name the kernels `rows` lists
        with torch.no_grad():
            run()
    finally:
        for k in callables:
            set_at(model, k.site, saved[k.name])


def _verdict(k: Any, checker: RowChecker) -> CallableProof:
    checker.end()
    proof = checker.proof
    diverged = "" if proof.diverged_at is None else f"op {proof.diverged_at} ({proof.diverged})"
    return CallableProof(
        tuple(k.batch.rows_shown()),
        proof.ops,
        proof.by_op(),
        proof.by_op(proof.unaligned),
        diverged,
    )


def _device_name(model: Any) -> str:
    for _, m in named_modules(model):
        for t in m.parameters(recurse=False):
            return torch.cuda.get_device_name(t.device) if t.is_cuda else str(t.device)
    return "cpu"
