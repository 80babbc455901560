"""LockstepProof: what a batched binding admits before it captures (issue 24).

A proof (``tools/lockstep_proof.py``'s ``prove_lockstep``) says, per batched callable,
whether every op of the batched call gave row 0 the bits of the batch-1 call with the
contract's ``rows`` run per session, and if not, which ops (with their modules) broke.
``bind(batch=W, proof=...)`` admits it here, before anything is installed: another
width, other rows, or a callable not proven is ``LockstepNotProven`` (fail closed);
``binding.report()`` shows the admitted proof.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LockstepNotProven(ValueError):
    """A batched binding was given a proof that does not cover it."""


@dataclass(frozen=True)
class CallableProof:
    """One batched callable's verdict: ``ops`` compared over its calls, the ops whose
    row 0 differed (``broken``: "op in module" -> times), ops with no batch axis to
    compare (``unaligned``) and where the batched op sequence left the batch-1 one."""

    rows: tuple[str, ...]  # the per-row ops it ran with, as the contract writes them
    ops: int
    broken: dict[str, int] = field(default_factory=dict)
    unaligned: dict[str, int] = field(default_factory=dict)
    diverged: str = ""

    @property
    def proven(self) -> bool:
        return self.ops > 0 and not self.broken and not self.unaligned and not self.diverged


@dataclass(frozen=True)
class LockstepProof:
    width: int
    device: str
    callables: dict[str, CallableProof]
    inputs: str = ""  # what the runs streamed, in the host's words

    @property
    def proven(self) -> bool:
        return all(c.proven for c in self.callables.values())

    def summary(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "device": self.device,
            "inputs": self.inputs,
            "proven": self.proven,
            "callables": {
                name: {"proven": c.proven, "ops": c.ops, "rows": list(c.rows),
                       "broken": c.broken, "unaligned": c.unaligned, "diverged": c.diverged}
                for name, c in self.callables.items()
            },
        }  # fmt: skip


def admit(proof: Any, decl: Any, width: int) -> LockstepProof:
    """``bind(batch=width, proof=...)``: the proof, if it covers this binding; else
    ``LockstepNotProven`` (a TypeError for something that is not a proof)."""
    if not isinstance(proof, LockstepProof):
        raise TypeError(f"proof must be a LockstepProof (prove_lockstep), got {proof!r}")
    where = f"{decl.name} at batch={width}"
    if proof.width != width:
        raise LockstepNotProven(f"{where}: the proof is of width {proof.width}")
    for k in decl.callables:
        if k.batch is None:
            continue
        got = proof.callables.get(k.name)
        if got is None:
            raise LockstepNotProven(f"{where}: the proof has no verdict on '{k.name}'")
        if got.rows != tuple(k.batch.rows_shown()):
            raise LockstepNotProven(
                f"{where}: '{k.name}' was proven with rows {{{', '.join(got.rows)}}}, the "
                f"contract runs {{{', '.join(k.batch.rows_shown())}}}"
            )
        if not got.proven:
            raise LockstepNotProven(f"{where}: '{k.name}' is not proven: {_why(got)}")
    return proof


def _why(c: CallableProof) -> str:
    if c.diverged:
        return f"the batched run left the batch-1 op sequence at {c.diverged}"
    if not c.ops:
        return "it was never called"
    parts = [f"{op} ({n}x)" for op, n in {**c.broken, **c.unaligned}.items()]
    shown = ", ".join(parts[:6]) + (f" and {len(parts) - 6} more" if len(parts) > 6 else "")
    return f"row 0 differed from batch 1 at {shown}: run them per row (`rows`) or bind at batch 1"
