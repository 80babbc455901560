"""Model tensors a contract does not declare, written by its callables.

Contract of this layer: ``watching_undeclared_writes(model, declared)`` is a context for
a capture that runs the callables eagerly (a second replay lane's). Every tensor of the
model that is neither a parameter nor a contract region (module buffers, tensor
attributes of modules) is filled with a sentinel for the duration and restored after;
one that no longer holds the sentinel was written: scratch every lane's graphs would
share, so concurrent replays would corrupt each other's bytes. It raises ``LaneError``
naming those tensors (measured: Token2Wav's undeclared DiT conv-cache buffer cost 4 lanes
their exactness).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


def _loose_tensors(model: Any, declared: dict[int, Any]) -> dict[str, torch.Tensor]:
    """The model's tensors that are neither parameters nor contract regions:
    module buffers and tensor attributes of the modules reachable from ``model``."""
    modules: list[tuple[str, torch.nn.Module]] = []
    if isinstance(model, torch.nn.Module):
        modules.append(("", model))
    else:
        for name, v in vars(model).items():
            if isinstance(v, torch.nn.Module):
                modules.append((name, v))
    out: dict[str, torch.Tensor] = {}
    for prefix, top in modules:
        for mname, m in top.named_modules(prefix=prefix):
            params = {id(p) for p in m.parameters(recurse=False)}
            for attr, v in vars(m).items():
                if attr == "_buffers":
                    items = list(v.items())
                elif isinstance(v, torch.Tensor) and id(v) not in params:
                    items = [(attr, v)]
                else:
                    continue
                for name, t in items:
                    if t is None or t.numel() == 0:
                        continue
                    if t.untyped_storage().data_ptr() in declared:
                        continue
                    out[f"{mname}.{name}" if mname else name] = t
    return out


@contextmanager
def watching_undeclared_writes(model: Any, declared: dict[int, Any]) -> Iterator[None]:
    """A second lane's capture runs the callables eagerly. Every model tensor that is
    no contract region is filled with a sentinel for it (and restored after): one that
    no longer holds the sentinel was written — scratch every lane's graphs would share,
    so concurrent replays would corrupt each other's bytes. Refuse, naming it."""
    loose = _loose_tensors(model, declared)
    with torch.inference_mode():  # buffers made under inference mode take no other writes
        saved = {n: t.clone() for n, t in loose.items()}
        for t in loose.values():
            t.fill_(_sentinel(t))
    try:
        yield
        written = sorted(n for n, t in loose.items() if not bool((t == _sentinel(t)).all()))
    finally:
        with torch.inference_mode():
            for n, t in loose.items():
                t.copy_(saved[n])
    if written:
        from .lane_engines import LaneError

        raise LaneError(
            "the callables write model tensors the contract does not declare: "
            + ", ".join(written[:8])
            + (f" and {len(written) - 8} more" if len(written) > 8 else "")
            + "; declare them as regions (lifetime operator) so every lane gets its own, "
            "or serve sessions on one lane"
        )


def _sentinel(t: torch.Tensor) -> Any:
    if t.dtype == torch.bool:
        return True
    if t.is_floating_point() or t.is_complex():
        return 12345.0  # finite, so a graph that reads it stays finite; unlikely as a result
    return 12345
